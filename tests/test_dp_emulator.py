"""The emulator's ``--dp-size N`` (SGLang 0.5.23's DP controller, no DP attention) as a real process tree.

What is checked comes from 0.5.23's source (``data_parallel_controller.py``, ``scheduler.py:6257-6300``,
``engine.py:907-988``; docs/sglang-facts.md §1.2-1.3): the controller is the schedulers' parent, replica k
runs on GPUs from ``k * tp_size``, every scheduler line carries `` DPk TPm`` (m local to the replica),
requests are dispatched round robin by default (the warmup request takes the first turn), and the
emulated GPU board places each replica's ranks on its own GPUs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from _emulator_support import LINE_RE, REPO_ROOT, Emulator, http, wait_until, write_model_dir
from conftest import SMALL_CONFIG

PREFILL = "Prefill batch, #new-seq: 1"


def generate(emu: Emulator, text: str, **extra: object) -> tuple[int, dict]:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, **extra}
    status, raw = http("POST", emu.url("/generate"), body)
    return status, json.loads(raw)


def title(process: psutil.Process) -> str:
    return " ".join(process.cmdline()).strip()  # setproctitle pads the title over the old command line


def prefill_ranks(emu: Emulator) -> list[str]:
    """The rank prefix of every prefill stats line, in log order (one per request here)."""
    return [ranks for ranks, msg in emu.messages() if msg.startswith(PREFILL)]


@pytest.fixture
def dp_server(tmp_path: Path):
    model = write_model_dir(tmp_path, "small", SMALL_CONFIG)
    emu = Emulator(tmp_path / "run", model, "--dp-size", "2", "--emulate-gpus", "8", tp=2)
    try:
        emu.wait_ready()
        yield emu
    finally:
        emu.kill()


def test_dp2_runs_a_controller_that_starts_one_tp_group_per_replica_on_its_own_gpus(dp_server: Emulator) -> None:
    emu = dp_server
    main = psutil.Process(emu.proc.pid)
    children = [p for p in main.children() if title(p).startswith("sglang::")]  # not the resource tracker
    assert sorted(title(p) for p in children) == ["sglang::data_parallel_controller", "sglang::detokenizer"]
    controller = next(p for p in children if title(p) == "sglang::data_parallel_controller")
    schedulers = sorted(title(p) for p in controller.children())
    assert schedulers == [
        "sglang::scheduler_DP0_TP0", "sglang::scheduler_DP0_TP1",
        "sglang::scheduler_DP1_TP0", "sglang::scheduler_DP1_TP1",
    ]

    log = emu.stderr
    assert "Launch DP0 starting at GPU #0." in log and "Launch DP1 starting at GPU #2." in log
    # Every scheduler line names its replica and its TP rank inside it; the main process's lines have none.
    prefixes = {ranks for ranks, _ in emu.messages() if ranks}
    assert prefixes == {"DP0 TP0", "DP0 TP1", "DP1 TP0", "DP1 TP1"}, prefixes
    for prefix in prefixes:
        assert any(msg.startswith("Load weight end.") for _, msg in emu.messages(prefix)), prefix
    assert "'dp_size': 2" in log and "'load_balance_method': 'round_robin'" in log  # auto -> round_robin

    # The emulated GPU board: replica 1's ranks hold GPUs 2 and 3, by the schedulers' own pids.
    pid_of = {title(p): p.pid for p in controller.children()}

    def board() -> dict[int, set[int]] | None:
        data = json.loads((emu.workdir / "emulated_gpus.json").read_text())
        held = {g["index"]: {p["pid"] for p in g["processes"]} for g in data["gpus"] if g["processes"]}
        return held if len(held) == 4 else None

    held = wait_until(board, what="4 GPUs held on the emulated board")
    assert held == {
        0: {pid_of["sglang::scheduler_DP0_TP0"]}, 1: {pid_of["sglang::scheduler_DP0_TP1"]},
        2: {pid_of["sglang::scheduler_DP1_TP0"]}, 3: {pid_of["sglang::scheduler_DP1_TP1"]},
    }
    status, raw = http("GET", emu.url("/server_info"))
    info = json.loads(raw)
    assert status == 200 and [s["tp_rank"] for s in info["internal_states"]] == [0, 0]  # one per DP rank


def test_round_robin_alternates_the_replicas_as_each_ranks_log_lines_show(dp_server: Emulator) -> None:
    emu = dp_server
    assert prefill_ranks(emu) == ["DP0 TP0"]  # the warmup request took replica 0's turn
    served = []
    for i in range(4):
        status, body = generate(emu, f"question number {i}")
        assert status == 200, body
        wait_until(lambda n=i: len(prefill_ranks(emu)) == n + 2, what=f"prefill line of request {i}")
        rank = prefill_ranks(emu)[-1]
        assert rank == f"DP{body['meta_info']['dp_rank']} TP0"  # the replica that logged it answered it
        served.append(body["meta_info"]["dp_rank"])
    assert served == [1, 0, 1, 0]


def test_a_request_pinned_with_routed_dp_rank_goes_there_and_a_bad_pin_is_refused(dp_server: Emulator) -> None:
    emu = dp_server
    for _ in range(2):
        status, body = generate(emu, "pinned", routed_dp_rank=0)
        assert status == 200 and body["meta_info"]["dp_rank"] == 0
    status, body = generate(emu, "pinned too far", routed_dp_rank=2)
    assert status == 400 and "routed_dp_rank=2 out of range [0, 2)" in json.dumps(body), body


def test_total_requests_sends_a_new_request_to_the_replica_with_fewer_in_flight(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path, "small", SMALL_CONFIG)
    emu = Emulator(tmp_path / "run", model, "--dp-size", "2", "--load-balance-method", "total_requests", tp=1)
    try:
        emu.wait_ready()
        # A long request pinned to replica 0 keeps it busy; the next unpinned ones must go to replica 1.
        import threading

        long_done = threading.Event()

        def long_request() -> None:
            http("POST", emu.url("/generate"), {"text": "long", "routed_dp_rank": 0,
                                                 "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}},
                 timeout_s=120)
            long_done.set()

        thread = threading.Thread(target=long_request, daemon=True)
        thread.start()
        wait_until(lambda: len(prefill_ranks(emu)) == 2, what="the long request's prefill")
        assert prefill_ranks(emu)[-1] == "DP0"
        for _ in range(2):
            status, body = generate(emu, "short")
            assert status == 200 and body["meta_info"]["dp_rank"] == 1
        assert not long_done.is_set()  # otherwise the check above says nothing
        thread.join(120)
    finally:
        emu.kill()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--tp-size", "4", "--dp-size", "3"], "--tp-size 4 --dp-size 3 would use GPU 11, but there are 8 GPUs"),
        (["--tp-size", "2", "--dp-size", "2", "--attn-dp-size", "2"],
         "--dp-size 2 with --attn-dp-size 2: data-parallel replicas combined with attention data parallelism"),
        (["--tp-size", "1", "--dp-size", "2", "--load-balance-method", "shortest_queue"],
         "argument --load-balance-method: invalid choice: 'shortest_queue'"),
    ],
)
def test_dp_layouts_sglang_refuses_are_refused_with_its_reason(tmp_path: Path, flags: list[str], named: str) -> None:
    model = write_model_dir(tmp_path, "small", SMALL_CONFIG)
    result = subprocess.run(
        [sys.executable, "-m", "sessions.emulator", "--model-path", str(model), "--emulate-gpus", "8",
         "--time-scale", "0.002", *flags],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert result.returncode != 0 and named in result.stderr, result.stderr[-2000:]
    assert not re.search(r"sglang::scheduler", result.stderr)
    assert not any(LINE_RE.match(line) and "DP1" in line for line in result.stderr.splitlines())
