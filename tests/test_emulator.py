"""The SGLang emulator as a real server: a healthy start (processes, titles, log lines), the port, and the
endpoints.  Faults and signals are in test_emulator_faults.py, the command line and the pieces in
test_emulator_cli.py.

Every test runs ``python -m sessions.emulator`` as a real process tree (tests/_emulator_support.py), talks
to it over real HTTP, and kills what it started by pid.  Expected lines come from sglang-facts §1.3-1.5
(the 0.5.23 formats), matched with the facts' own regexes.
"""

from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

import psutil
from _emulator_support import (
    DECODE_BAR_RE,
    KV_RE,
    LINE_RE,
    LOAD_WEIGHT_END_RE,
    STARTUP_TIMINGS_RE,
    WEIGHT_BAR_RE,
    Emulator,
    http,
    http_json,
    port_refuses,
    pyspy_stack,
    titled,
    wait_gone,
    wait_until,
)
from _hang_support import wait_until_parked
from conftest import SMALL_CONFIG

# -- a healthy TP4 start -----------------------------------------------------------------------------------


def test_tp4_start_prints_sglang_0523_sequence_and_serves(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["kimi"], tp=4)
    emulators.append(emu)
    emu.wait_ready()
    log = emu.stderr
    assert "UserWarning: 'python -m sglang.launch_server' is still supported" in log
    main_msgs = [m for r, m in emu.messages() if r == ""]
    assert main_msgs[0].startswith("server_args={'model_path': ") and "'tp_size': 4" in main_msgs[0]
    # every rank logs its own phase lines, in SGLang's order
    for rank in range(4):
        msgs = [m for _, m in emu.messages(f"TP{rank}")]
        order = [
            "Init parallel begin.",
            "Init parallel ends. elapsed=",
            "Memory baseline taken. mem usage=",
            "Load weight begin. avail mem=",
            "Load weight end.",
            "KV Cache is allocated.",
            "Memory pool end. avail mem=",
            "Capture target prefill CUDA graph begin. backend=breakable",
            "Capture target prefill CUDA graph end. elapsed=",
            "Capture target decode CUDA graph begin. backend=full",
            "Capture target decode CUDA graph end. bs=[1, 2, 4, 8,",
        ]
        positions = [next(i for i, m in enumerate(msgs) if m.startswith(marker)) for marker in order]
        assert positions == sorted(positions), (rank, msgs)
        end = next(LOAD_WEIGHT_END_RE.match(m) for m in msgs if m.startswith("Load weight end."))
        assert end and end["cls"] == "DeepseekV3ForCausalLM"
        assert any(KV_RE.match(m) for m in msgs)
    # the KV pool is sized by an all-reduce over the group: every rank has the same #tokens
    tokens = {KV_RE.match(m).group(2) for _, m in emu.messages() if KV_RE.match(m)}
    assert len(tokens) == 1
    summary = [(r, m) for r, m in emu.messages() if m.startswith("max_total_num_tokens=")]
    assert [r for r, _ in summary] == ["TP0"] and f"max_total_num_tokens={tokens.pop()}," in summary[0][1]
    assert any(STARTUP_TIMINGS_RE.match(m) for m in main_msgs)
    uvicorn = [m for m in main_msgs if m.startswith("INFO:     ")]
    assert uvicorn[:4] == [
        f"INFO:     Started server process [{emu.proc.pid}]",
        "INFO:     Waiting for application startup.",
        "INFO:     Application startup complete.",
        f"INFO:     Uvicorn running on http://127.0.0.1:{emu.port} (Press CTRL+C to quit)",
    ]
    assert main_msgs[-1] == "The server is fired up and ready to roll!"
    # tqdm bars: \r-separated, no prefix, weights from rank 0 only, decode sizes largest first
    assert "\rMulti-thread loading shards:   0% Completed | 0/64 [00:00<?, ?it/s]" in log
    bars = [WEIGHT_BAR_RE.search(line) for line in emu.lines()]
    bars = [b for b in bars if b]
    assert bars[-1]["pct"] == "100" and bars[-1]["n"] == bars[-1]["total"] == "64"
    assert all(not LINE_RE.match(line) for line in emu.lines() if WEIGHT_BAR_RE.search(line))
    assert log.count("Multi-thread loading shards:   0% Completed") == 1  # one bar: rank 0's
    decode = [int(m["bs"]) for m in (DECODE_BAR_RE.search(line) for line in emu.lines()) if m]
    assert decode[0] == 512 and decode[-1] == 1 and decode == sorted(decode, reverse=True)
    assert "\r  0%|          | 0/52 [00:00<?, ?it/s]" in log  # the first graph render has no description
    # warmup: the access log goes to stdout, never to stderr
    assert re.search(r'INFO:     127\.0\.0\.1:\d+ - "GET /model_info HTTP/1\.1" 200 OK', emu.stdout)
    assert re.search(r'INFO:     127\.0\.0\.1:\d+ - "POST /generate HTTP/1\.1" 200 OK', emu.stdout)
    assert '"POST /generate' not in log
    assert any(
        m.startswith("Prefill batch, #new-seq: 1, #new-token: ") for r, m in emu.messages() if r == "TP0"
    )
    status, _ = http("GET", emu.url("/ready"))
    assert status == 200


def test_tp4_children_are_titled_like_sglang_and_share_the_process_group(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["kimi"], tp=4)
    emulators.append(emu)
    emu.wait_ready()
    procs = titled(emu)
    titles = set(procs)
    expected = {f"sglang::scheduler_TP{i}" for i in range(4)} | {"sglang::detokenizer"}
    assert expected <= titles, titles
    main = psutil.Process(emu.proc.pid)
    assert "sessions.emulator" in " ".join(main.cmdline())  # the main process keeps its command line
    pgid = os.getpgid(emu.proc.pid)
    for title in expected:
        assert procs[title].ppid() == emu.proc.pid
        assert os.getpgid(procs[title].pid) == pgid  # no setsid in the children

    # emulated GPU numbers: one file in the working dir (rewritten about once a second), rank pids on
    # GPUs 0-3 holding weights + KV pool once loaded, GPUs 4-7 idle
    def loaded_board():
        board = json.loads((emu.workdir / "emulated_gpus.json").read_text())
        gpus = board["gpus"][:4]
        return board if all(g["memory_used_bytes"] > 0.5 * g["memory_total_bytes"] for g in gpus) else None

    board = wait_until(loaded_board, what="emulated_gpus.json showing the loaded ranks")
    assert board["pid"] == emu.proc.pid and len(board["gpus"]) == 8
    for rank in range(4):
        assert [p["pid"] for p in board["gpus"][rank]["processes"]] == [
            procs[f"sglang::scheduler_TP{rank}"].pid
        ]
    assert all(not gpu["processes"] and gpu["memory_used_bytes"] == 0 for gpu in board["gpus"][4:])


def test_tp1_has_no_rank_suffix_and_reads_a_nested_kimi_k25_config(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["kimi_k25"], tp=1)
    emulators.append(emu)
    emu.wait_ready()
    assert "sglang::scheduler" in titled(emu)  # scheduler.py: the _TP suffix only with tp > 1
    end = [LOAD_WEIGHT_END_RE.match(m) for r, m in emu.messages("") if m.startswith("Load weight end.")]
    assert end and end[0]["cls"] == "KimiK25ForConditionalGeneration"
    assert not [r for r, _ in emu.messages() if r]  # no rank prefix anywhere at TP1
    assert "[Gloo] Rank 0 is connected to 0 peer ranks." in emu.stderr
    status, info = http_json("GET", emu.url("/model_info"))
    assert status == 200
    assert (
        info["architectures"] == ["KimiK25ForConditionalGeneration"]
        and info["has_image_understanding"] is True
    )


# -- the port ----------------------------------------------------------------------------------------------


def test_port_is_not_bound_until_every_rank_is_loaded(tmp_path, models, emulators):
    """hang-after-weights: all ranks logged Load weight end, none gets further, and the port refuses."""
    emu = Emulator(tmp_path / "run", models["kimi"], tp=2, fault="hang-after-weights")
    emulators.append(emu)
    emu.wait_for(re.compile(r"\] Load weight end\."), count=2)
    # Both ranks block in the collective and the main process has read their arrivals: nothing can bind
    # the port or log another line now (tests/_hang_support.py), so one look is the final one.
    wait_until_parked(emu.proc, {0: "init_memory_pool", 1: "init_memory_pool"},
                      lambda: emu.stderr[-1500:] if "KV Cache is allocated" in emu.stderr else None)
    assert port_refuses(emu.port)
    assert emu.proc.poll() is None
    log = emu.stderr
    assert "Uvicorn running" not in log and "KV Cache is allocated" not in log
    ranks = {title: proc for title, proc in titled(emu).items() if title.startswith("sglang::scheduler_TP")}
    for proc in ranks.values():
        stack = pyspy_stack(proc.pid, "init_memory_pool")
        assert "init_memory_pool" in stack and "all_reduce" in stack and "ModelRunner.__init__" in stack
    # SIGTERM before the event loop runs: the default action, and the ranks die with their parent
    emu.proc.send_signal(signal.SIGTERM)
    assert emu.wait_exit() == -signal.SIGTERM
    assert wait_gone({p.pid: p.create_time() for p in ranks.values()}) == []


# -- endpoints ---------------------------------------------------------------------------------------------


def test_endpoints_answer_with_sglang_shapes_behind_the_api_key(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["small"], "--api-key", "s3cret", tp=2)
    emulators.append(emu)
    emu.wait_ready()
    auth = {"authorization": "Bearer s3cret"}
    assert http("GET", emu.url("/model_info"))[0] == 401
    assert http("GET", emu.url("/health"))[0] == 200  # exempt from the key, and Up after warmup
    assert http("GET", emu.url("/ready"), headers=auth)[0] == 200
    status, info = http_json("GET", emu.url("/model_info"), headers=auth)
    assert status == 200 and info["model_path"] == str(models["small"]) and info["is_generation"] is True
    assert {
        "served_model_name",
        "tokenizer_path",
        "weight_version",
        "architectures",
        "model_type",
    } <= info.keys()
    status, server = http_json("GET", emu.url("/server_info"), headers=auth)
    assert status == 200 and server["tp_size"] == 2 and server["version"] == "0.5.23"
    assert server["chunked_prefill_size"] == 8192 and server["internal_states"][0]["world_size"] == 2
    assert server["max_total_num_tokens"] > 0
    body = {
        "text": "Hello from a test of the emulator",
        "rid": "req-1",
        "sampling_params": {"max_new_tokens": 6},
    }
    status, out = http_json("POST", emu.url("/generate"), body, headers=auth)
    assert status == 200 and set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["id"] == "req-1" and meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["completion_tokens"] == len(out["output_ids"]) == 6 and meta["prompt_tokens"] > 0
    assert meta["cached_tokens"] == 0 and meta["e2e_latency"] >= 0
    # the same prompt again: the radix cache serves all but the last token; the output is deterministic
    status, again = http_json("POST", emu.url("/generate"), dict(body, rid="req-2"), headers=auth)
    assert (
        again["output_ids"] == out["output_ids"]
        and again["meta_info"]["cached_tokens"] == meta["prompt_tokens"] - 1
    )
    status, batch = http_json(
        "POST",
        emu.url("/generate"),
        {"input_ids": [[5, 6, 7], [8, 9]], "rid": ["a", "b"], "sampling_params": {"max_new_tokens": 2}},
        headers=auth,
    )
    assert status == 200 and [r["meta_info"]["id"] for r in batch] == ["a", "b"]
    assert [r["meta_info"]["prompt_tokens"] for r in batch] == [3, 2]
    status, err = http_json(
        "POST", emu.url("/generate"), {"input_ids": [1, 2], "return_hidden_states": True}, headers=auth
    )
    assert status == 400 and "not configured to return hidden states" in err["error"]["message"]
    status, err = http_json("POST", emu.url("/generate"), {"sampling_params": {}}, headers=auth)
    assert status == 400 and "input_ids" in err["error"]
    status, text = http("POST", emu.url("/flush_cache"), headers=auth)
    assert status == 200 and text.startswith(b"Cache flushed.")
    status, after = http_json("POST", emu.url("/generate"), dict(body, rid="req-3"), headers=auth)
    assert after["meta_info"]["cached_tokens"] == 0
    assert http("GET", emu.url("/nope"), headers=auth)[0] == 404
    status, models_list = http_json("GET", emu.url("/v1/models"), headers=auth)
    assert models_list["data"][0]["id"] == str(models["small"])
    assert "Cache flushed successfully!" in emu.stderr


def test_concurrent_requests_at_tp2_all_complete(tmp_path, models, emulators):
    """Every rank must see the requests in one order, or two forwards would wait on each other."""
    from concurrent.futures import ThreadPoolExecutor

    emu = Emulator(tmp_path / "run", models["small"], tp=2)
    emulators.append(emu)
    emu.wait_ready()

    def one(i: int) -> tuple[int, Any]:
        body = {
            "input_ids": [i + 10, i + 11, i + 12],
            "rid": f"c-{i}",
            "sampling_params": {"max_new_tokens": 2},
        }
        return http_json("POST", emu.url("/generate"), body, timeout_s=60)

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(one, range(48)))
    assert [status for status, _ in results] == [200] * 48
    assert sorted(out["meta_info"]["id"] for _, out in results) == sorted(f"c-{i}" for i in range(48))


def test_aux_capture_flags_shape_hidden_states_and_graphs_can_be_off(tmp_path, models, emulators):
    emu = Emulator(
        tmp_path / "run",
        models["small"],
        "--enable-return-aux-hidden-states",
        "--speculative-algorithm",
        "EAGLE3",
        "--disable-cuda-graph",
        "--chunked-prefill-size",
        "4",
        tp=1,
    )
    emulators.append(emu)
    emu.wait_ready()
    log = emu.stderr
    assert "Capture target" not in log and "Capturing batches" not in log  # graphs off: no graph phase
    assert "--disable-cuda-graph is deprecated" in log
    args = next(m for _, m in emu.messages() if m.startswith("server_args="))
    assert "'aux_hidden_state_capture': 'eagle3'" in args and "'speculative_algorithm': None" in args
    status, out = http_json(
        "POST",
        emu.url("/generate"),
        {
            "input_ids": list(range(10, 20)),
            "return_hidden_states": True,
            "sampling_params": {"max_new_tokens": 3},
        },
    )
    assert status == 200
    hidden = out["meta_info"]["hidden_states"]
    # SGLang's layout: the last prefill chunk's rows (10 tokens in chunks of 4 -> 2 rows), then one row
    # per decode step
    assert len(hidden) == 1 + 2 and len(hidden[0]) == 2
    assert all(len(row) == 3 * SMALL_CONFIG["hidden_size"] for row in [*hidden[0], *hidden[1:]])
    prefill_lines = [m for _, m in emu.messages() if m.startswith("Prefill batch")]
    assert [re.search(r"#new-token: (\d+)", m).group(1) for m in prefill_lines[-3:]] == ["4", "4", "2"]
