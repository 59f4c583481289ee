"""The SGLang emulator's faults and signals, each as SGLang 0.5.23 shows it: a rank missing, hangs, OOM,
exceptions, a port in use, crashes while serving, slow weights; SIGKILL and SIGTERM of the main process or
a rank.  Each test runs ``python -m sessions.emulator`` as a real process tree (tests/_emulator_support.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.error
import urllib.request

import pytest
from _emulator_support import (
    DECODE_BAR_RE,
    LOAD_WEIGHT_END_RE,
    WEIGHT_BAR_RE,
    Emulator,
    http,
    port_refuses,
    titled,
    wait_gone,
    wait_until,
)
from _hang_support import wait_until_parked

from sessions.emulator.pacing import Pacing

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
