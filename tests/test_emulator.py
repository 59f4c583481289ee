"""The SGLang emulator as a real server: processes, titles, log lines, port, endpoints, faults, signals.

Every test runs ``python -m sessions.emulator`` as a real process tree (its own session, cwd in tmp_path,
stderr and stdout to separate files), talks to it over real HTTP, and kills what it started by pid.
Expected lines come from sglang-facts §1.3-1.5 (the 0.5.23 formats), matched with the facts' own regexes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from _extract_support import wait_for
from _hang_support import wait_until_parked
from conftest import KIMI_LIKE_CONFIG, SMALL_CONFIG

from sessions.emulator.pacing import Pacing

REPO_ROOT = Path(__file__).resolve().parent.parent
SCALE = "0.002"
WAIT_S = 90.0  # a hang guard for slow CI machines, not a speed assertion
# sglang-facts §1.3: the generic line regex
LINE_RE = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?)"
    r"(?P<ranks>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\] "
    r"(?P<msg>.*)$"
)
LOAD_WEIGHT_END_RE = re.compile(
    r"^Load weight end\. elapsed=(?P<s>[\d.]+) s, type=(?P<cls>\w+), (?:(?P<quant>quant=.*?), )?"
    r"avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<use>[\d.]+) GB\.$"
)
WEIGHT_BAR_RE = re.compile(
    r"(?P<desc>Multi-thread loading shards):\s+(?P<pct>\d+)% Completed \| (?P<n>\d+)/(?P<total>\d+) "
    r"\[(?P<elapsed>[^<]+)<(?P<remaining>[^,]+),"
)
DECODE_BAR_RE = re.compile(
    r"Capturing batches \(bs=(?P<bs>\d+) avail_mem=(?P<gb>[\d.]+) GB\):\s+(?P<pct>\d+)%\|.*?\| "
    r"(?P<n>\d+)/(?P<total>\d+)"
)
STARTUP_TIMINGS_RE = re.compile(
    r"^Engine startup timings \(s\): load_weight=([\d.]+), kv_cache_allocation=([\d.]+), "
    r"scheduler_e2e=([\d.]+), "
    r"cuda_graph=\{([^}]*)\}, tokenizer_e2e=([\d.]+)$"
)
KV_RE = re.compile(r"^(?:.+ )?KV Cache (?:is allocated|VA upper bound)\. dtype: (\S+), #tokens: (\d+), ")



# -- helpers ---------------------------------------------------------------------------------------------


def get_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, deadline_s: float = WAIT_S, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value (a hang guard, not a speed assertion)."""
    return wait_for(predicate, what, deadline_s, interval_s=0.05)


def write_model_dir(root: Path, name: str, config: dict[str, Any]) -> Path:
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


class Emulator:
    """One ``python -m sessions.emulator`` process tree, started in its own session."""

    def __init__(
        self,
        workdir: Path,
        model_dir: Path,
        *flags: str,
        tp: int = 2,
        fault: str = "none",
        scale: str = SCALE,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = get_free_port()
        self.err_path, self.out_path = workdir / "stderr.log", workdir / "stdout.log"
        self.argv = [
            sys.executable,
            "-m",
            "sessions.emulator",
            "--model-path",
            str(model_dir),
            "--tp-size",
            str(tp),
            "--port",
            str(self.port),
            "--time-scale",
            scale,
            "--emulate-fault",
            fault,
            *flags,
        ]
        run_env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), **(env or {}))
        with open(self.err_path, "wb") as err, open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=workdir,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=run_env,
            )
        self.known: dict[int, float] = {}  # pid -> create_time of everything seen in the tree
        self.remember()

    @property
    def stderr(self) -> str:
        return self.err_path.read_bytes().decode(errors="replace")  # bytes: keep tqdm's \r as it is

    @property
    def stdout(self) -> str:
        return self.out_path.read_bytes().decode(errors="replace")

    def lines(self) -> list[str]:
        """stderr split the way a log reader must split it: on \\n, on tqdm's \\r, and where another rank's
        line starts right after a bar render that has no newline yet (as in fixture 27)."""
        return [
            line
            for line in re.split(r"[\r\n]|(?=\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})", self.stderr)
            if line
        ]

    def messages(self, ranks: str | None = None) -> list[tuple[str, str]]:
        """(rank prefix, message) of every prefixed log line."""
        out = []
        for line in self.lines():
            match = LINE_RE.match(line)
            if match and (ranks is None or match["ranks"].strip() == ranks):
                out.append((match["ranks"].strip(), match["msg"]))
        return out

    def remember(self) -> None:
        try:
            main = psutil.Process(self.proc.pid)
            for proc in [main, *main.children(recursive=True)]:
                self.known.setdefault(proc.pid, proc.create_time())
        except psutil.Error:
            pass

    def children(self) -> list[psutil.Process]:
        self.remember()
        return psutil.Process(self.proc.pid).children(recursive=True)

    def wait_for(self, text: str | re.Pattern[str], count: int = 1, deadline_s: float = WAIT_S) -> str:
        """Wait until stderr holds ``text`` ``count`` times; fail if the server exits first."""
        end = time.monotonic() + deadline_s
        while True:
            log = self.stderr
            found = len(re.findall(text, log)) if isinstance(text, re.Pattern) else log.count(text)
            if found >= count:
                self.remember()
                return log
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"emulator exited {self.proc.returncode} before {text!r}:\n{log[-3000:]}"
                )
            if time.monotonic() > end:
                raise AssertionError(f"no {text!r} after {deadline_s}s:\n{log[-3000:]}")
            time.sleep(0.02)

    def wait_ready(self) -> None:
        self.wait_for("The server is fired up and ready to roll!")

    def wait_exit(self, deadline_s: float = WAIT_S) -> int:
        try:
            return self.proc.wait(deadline_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"emulator still running after {deadline_s}s:\n{self.stderr[-3000:]}"
            ) from None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def kill(self) -> None:
        """SIGKILL every process of the tree that we saw, by (pid, create_time), and reap the main one."""
        self.remember()
        for pid, created in self.known.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created:
                    proc.kill()
            except psutil.Error:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def gone(pid: int, created: float) -> bool:
    """The process no longer runs (reaped, or a zombie waiting for its new parent to reap it)."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() != created or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(identities: dict[int, float], deadline_s: float = WAIT_S) -> list[int]:
    """Pids still running after the deadline (empty when every process ended)."""
    end = time.monotonic() + deadline_s
    while True:
        alive = [pid for pid, created in identities.items() if not gone(pid, created)]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, timeout_s: float = 30.0
) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_json(method: str, url: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    status, raw = http(method, url, body, **kwargs)
    return status, json.loads(raw) if raw else None


def port_refuses(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2.0)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def pyspy_stack(pid: int, needle: str) -> str:
    """py-spy's dump of ``pid`` once it shows ``needle`` (a rank may still be a step before its block)."""
    exe = Path(sys.executable).with_name("py-spy")
    end = time.monotonic() + WAIT_S
    while True:
        result = subprocess.run(
            [str(exe), "dump", "--pid", str(pid)], check=False, capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0 and "ermission" in (result.stderr + result.stdout):
            pytest.skip(f"py-spy may not attach here (ptrace not permitted): {result.stderr.strip()[:200]}")
        assert result.returncode == 0, result.stderr
        if needle in result.stdout or time.monotonic() > end:
            return result.stdout
        time.sleep(0.1)


def titled(emulator: Emulator) -> dict[str, psutil.Process]:
    out = {}
    for proc in emulator.children():
        try:
            out[" ".join(proc.cmdline()).strip()] = proc
        except psutil.Error:
            pass
    return out


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    kimi_k25 = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {k: v for k, v in KIMI_LIKE_CONFIG.items() if k != "architectures"},
        "vision_config": {"model_type": "moonvit", "hidden_size": 1152},
    }
    return {
        "kimi": write_model_dir(tmp_path / "models", "kimi-like", KIMI_LIKE_CONFIG),
        "small": write_model_dir(tmp_path / "models", "small", SMALL_CONFIG),
        "kimi_k25": write_model_dir(tmp_path / "models", "kimi-k25", kimi_k25),
    }


@pytest.fixture
def emulators():
    started: list[Emulator] = []
    try:
        yield started
    finally:
        for emulator in started:
            emulator.kill()


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


# -- faults ------------------------------------------------------------------------------------------------


def test_rank_missing_leaves_the_last_rank_in_weight_loading(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["kimi"], tp=3, fault="rank-missing")
    emulators.append(emu)
    emu.wait_for(re.compile(r"\] Load weight end\."), count=2)
    emu.wait_for("Multi-thread loading shards: 100% Completed")
    ends = {r for r, m in emu.messages() if m.startswith("Load weight end.")}
    assert ends == {"TP0", "TP1"}
    # TP2 stuck reading a shard, the others waiting for it, the main process idle: nothing can follow.
    stacks = wait_until_parked(emu.proc, {0: "init_memory_pool", 1: "init_memory_pool", 2: "block_forever"},
                               lambda: emu.stderr[-1500:] if "KV Cache is allocated" in emu.stderr else None)
    assert "_read_shard" in stacks[2].text and "init_memory_pool" in stacks[0].text
    assert port_refuses(emu.port)
    assert "Load weight end." not in "".join(m for r, m in emu.messages("TP2"))


def test_hang_in_graph_capture_stops_mid_bar_in_capture_one_batch_size(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["kimi"], tp=4, fault="hang-in-graph-capture")
    emulators.append(emu)
    emu.wait_for(re.compile(r"Capturing batches \(bs=480 "))
    # bs=480 is the third batch size: every rank passed the first two collectives, so parked is final.
    stacks = wait_until_parked(emu.proc, {r: "capture_one_batch_size" for r in range(4)},
                               lambda: emu.stderr[-1500:] if "decode CUDA graph end" in emu.stderr else None)
    stack = stacks[0].text
    assert "capture_one_batch_size" in stack and "CudaGraphRunner.capture" in stack
    last = [m for m in (DECODE_BAR_RE.search(line) for line in emu.lines()) if m][-1]
    assert (last["bs"], last["n"], last["total"]) == ("480", "2", "52")
    assert "Capture target decode CUDA graph end" not in emu.stderr and port_refuses(emu.port)


def test_oom_kv_cache_crashes_every_rank_and_the_server_like_sglang(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["kimi"], tp=2, fault="oom-kv-cache")
    emulators.append(emu)
    emu.wait_for("Load weight begin")
    ranks = {p.pid: p.create_time() for p in emu.children() if "scheduler" in " ".join(p.cmdline())}
    assert emu.wait_exit() == -signal.SIGKILL  # kill_process_tree(include_parent=True)
    log = emu.stderr
    assert log.count("Scheduler hit an exception: Traceback (most recent call last):") >= 1
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in log
    assert "in init_memory_pool" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "KV Cache is allocated" not in log
    assert wait_gone(ranks) == []


def test_scheduler_exception_during_weights_kills_the_tree(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["kimi"], tp=2, fault="scheduler-exception")
    emulators.append(emu)
    emu.wait_for("Load weight begin", count=2)
    assert emu.wait_exit() == -signal.SIGKILL
    failing = [(r, m) for r, m in emu.messages() if m.startswith("Scheduler hit an exception")]
    assert [r for r, _ in failing] == ["TP1"]
    log = emu.stderr
    assert (
        "safetensors_rust.SafetensorError: Error while deserializing header" in log
        and "in _read_shard" in log
    )
    assert "Received sigquit from a child process" in log
    assert not [m for r, m in emu.messages("TP1") if m.startswith("Load weight end")]
    assert wait_gone(emu.known) == []


def test_address_in_use_fails_at_uvicorn_bind_after_loading(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["small"], tp=2, fault="address-in-use")
    emulators.append(emu)
    emu.wait_for("Load weight begin")
    emu.remember()
    assert emu.wait_exit() == 1
    main_msgs = [m for r, m in emu.messages() if r == ""]
    error = (
        f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {emu.port}): "
        "address already in use"
    )
    assert error in main_msgs
    assert main_msgs.index("INFO:     Application startup complete.") < main_msgs.index(error)
    assert main_msgs.index(error) < main_msgs.index("INFO:     Application shutdown complete.")
    assert not any("Uvicorn running" in m for m in main_msgs)
    assert wait_gone(emu.known) == []


def test_crash_while_serving_fails_the_first_request_and_takes_sglangs_sigquit_path(
    tmp_path, models, emulators
):
    emu = Emulator(tmp_path / "run", models["small"], tp=2, fault="crash-while-serving")
    emulators.append(emu)
    emu.wait_ready()
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        http("POST", emu.url("/generate"), {"text": "hello", "sampling_params": {"max_new_tokens": 2}})
    assert emu.wait_exit() == -signal.SIGKILL
    log = emu.stderr
    assert "[" in log and re.search(r"\d TP1\] Scheduler hit an exception: Traceback", log)
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log
    assert "SIGQUIT received. signum=3, frame=" in log and "It usually means one child failed." in log
    assert "Waiting 60.0 seconds for CUDA coredumps before exiting." in log
    assert wait_gone(emu.known) == []


def test_crash_while_serving_without_traffic_fails_a_while_after_ready(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["small"], tp=1, fault="crash-while-serving")
    emulators.append(emu)
    emu.wait_ready()
    assert emu.wait_exit() == -signal.SIGKILL  # no request needed: the rank faults on its own
    log = emu.stderr
    assert "Scheduler hit an exception: Traceback" in log and "in self_check_during_idle" in log
    assert "SIGQUIT received. signum=3" in log


def test_gpu_memory_flag_without_cuda_falls_back_to_emulated_numbers(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["small"], "--emulate-gpu-memory-gb", "1", tp=1)
    emulators.append(emu)
    emu.wait_ready()
    note = re.search(r"\[emulator\] GPU memory: (.*)", emu.stderr)
    assert note, "the rank says what it did with --emulate-gpu-memory-gb"
    board = emu.workdir / "emulated_gpus.json"
    if note.group(1).startswith("holding"):  # a machine with CUDA: NVML shows the real memory instead
        assert not board.exists()
    else:
        assert "publishing emulated numbers" in note.group(1)
        rank_pid = titled(emu)["sglang::scheduler"].pid
        wait_until(
            lambda: any(p["pid"] == rank_pid for p in json.loads(board.read_text())["gpus"][0]["processes"]),
            what="the rank on emulated GPU 0",
        )


def test_slow_weights_keeps_the_bar_moving_and_still_gets_ready(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["small"], tp=1, fault="slow-weights", scale="0.01")
    emulators.append(emu)
    emu.wait_ready()
    ends = [m for _, m in emu.messages() if m.startswith("Load weight end")]
    assert len(ends) == 1 and LOAD_WEIGHT_END_RE.match(ends[0]), ends
    bars = [b for b in (WEIGHT_BAR_RE.search(line) for line in emu.lines()) if b]
    assert bars[-1]["pct"] == "100"
    # How much longer the load takes is the pacing plan's business (the test below); the wall-clock
    # figure is printed by benches/bench_emulator_pacing.py.


class _PlannedPacing(Pacing):
    """The emulator's pacing with its sleeps recorded (in scaled seconds) instead of slept."""

    def __init__(self, time_scale: float) -> None:
        super().__init__(time_scale)
        object.__setattr__(self, "slept", [])

    def sleep(self, reference_s: float) -> None:
        self.slept.append(self.scaled(reference_s))


@pytest.mark.parametrize("weights_gb", [0.05, 74.0], ids=["under-the-minimum", "kimi-slice"])
def test_slow_weights_plans_five_times_the_load_over_the_same_shards(models, weights_gb):
    """slow-weights: the same shards and bar updates, each shard read SLOW_WEIGHTS_FACTOR times slower."""
    from types import SimpleNamespace

    from sessions.emulator import pacing
    from sessions.emulator.faults import Fault
    from sessions.emulator.model_config import load_model_config
    from sessions.emulator.ranks import DefaultModelLoader

    model = load_model_config(models["kimi"])

    def planned(fault: Fault) -> tuple[list[float], list[float]]:
        paced, reports = _PlannedPacing(0.01), []
        runner = SimpleNamespace(model=model, plan=SimpleNamespace(weights_gb=weights_gb), fault=fault,
                                 tp_size=2, tp_rank=1, console=None, pacing=paced,
                                 report_memory=lambda phase, done, _gb: reports.append(done))
        DefaultModelLoader(runner).load_model()
        return paced.slept, reports

    (normal, normal_reports), (slow, slow_reports) = planned(Fault.NONE), planned(Fault.SLOW_WEIGHTS)
    assert len(normal) == len(slow) == model.shard_count() > 1
    assert normal_reports == slow_reports and slow_reports[-1] == 1.0  # the bar's steps: one per shard
    expected = max(pacing.WEIGHT_LOAD_MIN_S, weights_gb / pacing.WEIGHT_LOAD_GB_PER_S) * 0.01
    assert sum(normal) == pytest.approx(expected)
    assert sum(slow) == pytest.approx(pacing.SLOW_WEIGHTS_FACTOR * expected)


# -- signals -----------------------------------------------------------------------------------------------


def test_sigkill_of_the_main_process_takes_every_rank_down(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["small"], tp=4)
    emulators.append(emu)
    emu.wait_ready()
    children = {p.pid: p.create_time() for p in emu.children()}
    assert len([p for p in emu.children() if "scheduler" in " ".join(p.cmdline())]) == 4
    os.kill(emu.proc.pid, signal.SIGKILL)
    assert emu.wait_exit() == -signal.SIGKILL
    assert wait_gone(children) == []  # PDEATHSIG; the resource tracker sees EOF and leaves too
    assert port_refuses(emu.port)


def test_sigterm_after_ready_drains_and_exits_zero(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["small"], tp=2)
    emulators.append(emu)
    emu.wait_ready()
    children = {p.pid: p.create_time() for p in emu.children()}
    emu.proc.send_signal(signal.SIGTERM)
    assert emu.wait_exit() == 0
    log = emu.stderr
    assert "SIGTERM received. signum=15 frame=" in log and "Draining requests and shutting down..." in log
    assert (
        "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]." in log
    )
    assert log.rstrip().endswith(f"INFO:     Finished server process [{emu.proc.pid}]")
    assert wait_gone(children) == []
    assert port_refuses(emu.port)
    assert not (emu.workdir / "emulated_gpus.json").exists()


def test_sigterm_to_one_rank_takes_the_watchdog_and_sigquit_path(tmp_path, models, emulators):
    emu = Emulator(tmp_path / "run", models["small"], tp=2)
    emulators.append(emu)
    emu.wait_ready()
    rank = titled(emu)["sglang::scheduler_TP1"]
    rank.send_signal(signal.SIGTERM)
    assert emu.wait_exit() == -signal.SIGKILL
    log = emu.stderr
    assert (
        f"Subprocess scheduler_1 (pid={rank.pid}) crashed with exit code -15. "
        "Triggering SIGQUIT for cleanup..." in log
    )
    assert "SIGQUIT received. signum=3" in log and "Sleeping 5 seconds before crash diagnostics" in log
    assert wait_gone(emu.known) == []


# -- the command line --------------------------------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessions.emulator", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )


def test_unknown_and_ambiguous_flags_exit_2_like_sglang(tmp_path, models):
    result = run_cli("--model-path", str(models["small"]), "--bogus-flag", cwd=tmp_path)
    assert (
        result.returncode == 2
        and "sglang serve: error: unrecognized arguments: --bogus-flag" in result.stderr
    )
    result = run_cli("--model-path", str(models["small"]), "--cuda-graph-max-bs", "8", cwd=tmp_path)
    assert result.returncode == 2 and "ambiguous option: --cuda-graph-max-bs could match" in result.stderr
    result = run_cli("--model-path", str(models["small"]), "--emulate-fault", "melt", cwd=tmp_path)
    assert result.returncode == 2 and "invalid choice: 'melt'" in result.stderr


def test_help_works_and_a_missing_model_dir_is_named(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0 and "--emulate-fault" in result.stdout and "--tp-size" in result.stdout
    result = run_cli("--model-path", str(tmp_path / "absent"), cwd=tmp_path)
    assert (
        result.returncode == 1 and f"model path '{tmp_path / 'absent'}' is not a directory" in result.stderr
    )
    (tmp_path / "empty").mkdir()
    result = run_cli("--model-path", str(tmp_path / "empty"), cwd=tmp_path)
    assert result.returncode == 1 and "has no config.json" in result.stderr


def test_parse_args_accepts_sglang_spellings():
    from sessions.emulator.args import parse_args

    ns, options = parse_args(
        [
            "--model",
            "/m",
            "--tp",
            "8",
            "--ep",
            "8",
            "--return-aux-hidden-state-layer-ids",
            "2",
            "30",
            "58",
            "--context-length",
            "128Ki",
            "--emulate-gpus",
            "16",
        ]
    )
    assert ns.model_path == "/m" and ns.tp_size == 8 and ns.ep_size == 8
    assert ns.return_aux_hidden_state_layer_ids == [2, 30, 58] and ns.context_length == 131072
    assert options.gpus == 16 and options.time_scale == 0.05 and str(options.fault) == "none"


def test_capture_flag_errors_are_sglangs(models):
    from sessions.emulator.args import parse_args, resolve_server_args
    from sessions.emulator.model_config import load_model_config

    model = load_model_config(models["small"])
    for argv, message in [
        (["--return-aux-hidden-state-layer-ids", "1"], "requires --enable-return-aux-hidden-states"),
        (
            ["--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids", "2", "2"],
            "duplicates",
        ),
        (
            [
                "--enable-return-aux-hidden-states",
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "/d",
            ],
            "capture-only",
        ),
        (["--mem-fraction-static", "1.5"], "must be in (0, 1)"),
    ]:
        ns, _ = parse_args(["--model-path", str(models["small"]), *argv])
        with pytest.raises(ValueError, match=re.escape(message)):
            resolve_server_args(ns, model)


def test_importing_the_emulator_pulls_no_torch():
    code = (
        "import sys, sessions.emulator.startup, sessions.emulator.ranks, sessions.emulator.http; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert result.stdout.strip() == "False", result.stderr


# -- pieces ------------------------------------------------------------------------------------------------


def test_progress_bars_render_exactly_like_tqdm():
    from tqdm import tqdm

    from sessions.emulator.console import WEIGHT_BAR_FORMAT, format_meter

    for n, total, elapsed, desc, fmt in [
        (0, 64, 0.0, "Multi-thread loading shards", WEIGHT_BAR_FORMAT),
        (1, 1, 1 / 2.76, "Multi-thread loading shards", WEIGHT_BAR_FORMAT),
        (74, 163, 42.5, "Multi-thread loading shards", WEIGHT_BAR_FORMAT),
        (0, 58, 0.0, None, None),
        (1, 52, 0.5, "Capturing batches (bs=512 avail_mem=20.51 GB)", None),
        (37, 52, 3700.0, "Capturing batches (bs=16 avail_mem=20.51 GB)", None),
        (52, 52, 61.0, "Capturing prefill shape (num_tokens=4 avail_mem=9.20 GB)", None),
    ]:
        assert format_meter(n, total, elapsed, desc, fmt) == tqdm.format_meter(
            n, total, elapsed, prefix=desc or "", bar_format=fmt
        )


def test_fixed_backend_is_deterministic_and_caches_prefixes(models):
    from sessions.emulator.backend import FixedBackend, RequestError

    flags = {"chunked_prefill_size": 8192, "time_scale": 0}
    backend = FixedBackend(str(models["small"]), flags)
    first = backend.generate(
        {"input_ids": [1, 2, 3, 4], "rid": "x", "sampling_params": {"max_new_tokens": 4}}
    )
    again = backend.generate(
        {"input_ids": [1, 2, 3, 4, 5], "rid": "y", "sampling_params": {"max_new_tokens": 4}}
    )
    other = FixedBackend(str(models["small"]), flags).generate(
        {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 4}}
    )
    assert first["output_ids"] == other["output_ids"] and first["text"] == other["text"]
    assert first["meta_info"]["cached_tokens"] == 0 and again["meta_info"]["cached_tokens"] == 4
    no_cache = FixedBackend(str(models["small"]), dict(flags, disable_radix_cache=True))
    no_cache.generate({"input_ids": [1, 2, 3]})
    assert no_cache.generate({"input_ids": [1, 2, 3]})["meta_info"]["cached_tokens"] == 0
    with pytest.raises(RequestError, match="max_new_tokens"):
        backend.generate({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}})
    with pytest.raises(RequestError, match="context length"):
        backend.generate({"input_ids": [1] * SMALL_CONFIG["max_position_embeddings"]})
