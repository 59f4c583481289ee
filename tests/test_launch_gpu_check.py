"""The GPU-busy check before a launch: the GPUs the launch would use, who holds memory there, and the
CLI's refusal (exit 2 unless --force).  Emulated GPUs of running emulator sessions count, as in the panel.
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from _extract_support import wait_for

from sessions.gpus import (
    BusyGpu,
    GpuProcess,
    GpuSample,
    GpuSnapshot,
    busy_gpus_for_launch,
    launch_gpu_ids,
    physical_gpu_indices,
)
from sessions.server import GpuBusy, ServerSession

MIB = 1 << 20


class FixedSource:
    """A GPU reading as NVML would give it: for the index mapping only (no driver in CI)."""

    def __init__(self, samples: tuple[GpuSample, ...]) -> None:
        self.samples = samples

    def snapshot(self) -> GpuSnapshot:
        return GpuSnapshot(self.samples, "nvml", True, None, time.time())

    def close(self) -> None:
        pass


def nvml_like(held: dict[int, list[tuple[int, int]]], count: int = 8) -> FixedSource:
    return FixedSource(tuple(
        GpuSample(i, "NVIDIA H200", sum(m for _, m in held.get(i, [])) * MIB + 500 * MIB, 143771 * MIB, 0.0,
                  processes=tuple(GpuProcess(pid, mib * MIB) for pid, mib in held.get(i, [])))
        for i in range(count)
    ))


def test_the_gpus_a_launch_uses_follow_sglangs_placement(make_emulator_profile):
    assert launch_gpu_ids(make_emulator_profile("a", tp=8)) == list(range(8))
    assert launch_gpu_ids(make_emulator_profile("b", tp=4, extra_args=["--base-gpu-id", "4"])) == [4, 5, 6, 7]
    assert launch_gpu_ids(make_emulator_profile("c", tp=2, extra_args=["--base-gpu-id=1", "--gpu-id-step",
                                                                          "2"])) == [1, 3]
    assert physical_gpu_indices([0, 1, 2, 3], "4,5,6,7") == [4, 5, 6, 7]
    assert physical_gpu_indices([0, 1], "GPU-3f2a,GPU-77b1") is None  # UUIDs: every GPU is checked
    assert physical_gpu_indices([0, 1], None) == [0, 1]


def test_cuda_visible_devices_decides_which_nvml_gpus_are_checked(make_emulator_profile, home):
    source = nvml_like({0: [(4242, 90_000)], 3: [(4243, 90_000)]})
    tp8 = make_emulator_profile("tp8", tp=8)
    busy = busy_gpus_for_launch(tp8, home, source=source, describe_pid=lambda pid: f"p{pid}")
    assert [b.index for b in busy] == [0, 3]
    assert busy[0].text() == "GPU0 (90,500 of 143,771 MiB used): 90,000 MiB by pid 4242 (p4242)"
    elsewhere = make_emulator_profile("tp4-hi", tp=4, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert busy_gpus_for_launch(elsewhere, home, source=source) == []
    low = make_emulator_profile("tp2-lo", tp=2, env={"CUDA_VISIBLE_DEVICES": "3,4"})
    assert [b.index for b in busy_gpus_for_launch(low, home, source=source)] == [3]


def test_memory_on_a_gpu_whose_processes_nvml_hides_still_counts(make_emulator_profile, home):
    hidden = FixedSource((GpuSample(0, "NVIDIA H200", 133_000 * MIB, 143771 * MIB, 0.0),))
    busy = busy_gpus_for_launch(make_emulator_profile("x", tp=1), home, source=hidden)
    assert busy == [BusyGpu(0, 133_000 * MIB, 143771 * MIB, busy[0].holders)]
    assert "processes NVML does not list" in busy[0].text()


def test_a_launch_onto_gpus_held_by_another_session_is_refused_naming_them(
    tp4_holding_gpus_0_to_3, launched, make_emulator_profile, home, cli_env
):
    holder = tp4_holding_gpus_0_to_3
    tp8 = make_emulator_profile("big", tp=8)
    with pytest.raises(GpuBusy) as refused:
        ServerSession.launch(tp8, home)
    assert [b.index for b in refused.value.busy] == [0, 1, 2, 3]
    assert f"session {holder.session_id}" in str(refused.value)

    result = subprocess.run([sys.executable, "-m", "app", "launch", "big"], env=cli_env, capture_output=True,
                            text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and result.stdout == ""
    assert "GPU0" in result.stderr and "GPU3" in result.stderr and "GPU4" not in result.stderr
    assert "by pid" in result.stderr and f"session {holder.session_id}" in result.stderr
    assert "--force" in result.stderr
    assert [p.name for p in home.sessions_dir.iterdir() if p.name.startswith("big-")] == []  # nothing started

    beside = make_emulator_profile("beside", tp=4, extra_args=["--base-gpu-id", "4"])
    launched.launch(beside)  # GPUs 4-7 are free: no question asked
    forced = subprocess.run([sys.executable, "-m", "app", "launch", "big", "--force"], env=cli_env,
                            capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert forced.returncode == 0, forced.stderr
    launched.track(forced.stdout.strip())


def test_already_running_is_checked_before_the_gpus(tp4_holding_gpus_0_to_3, home):
    from sessions.profiles import load_profile
    from sessions.server import AlreadyRunning

    with pytest.raises(AlreadyRunning):
        ServerSession.launch(load_profile(home.profiles_dir / "holder.toml"), home)


def test_a_killed_emulators_last_file_holds_no_gpu_while_its_process_is_a_zombie(home):
    """kill -9 leaves the emulator's main process a zombie until its parent reaps it, and its last
    `emulated_gpus.json` behind: neither the panel nor the launch check may count that memory (a relaunch
    onto the same GPU was refused as busy in a clean-clone run)."""
    import json
    import os
    import signal

    import psutil

    from sessions.gpus import EmulatedSource

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        session_dir = home.sessions_dir / "killed-session"
        session_dir.mkdir(parents=True)
        reading = {"updated_at": time.time(), "pid": child.pid, "gpus": [
            {"index": 0, "name": "NVIDIA H200", "memory_used_bytes": 140_000 * MIB,
             "memory_total_bytes": 143_771 * MIB, "processes": [{"pid": child.pid, "used_bytes": 140_000 * MIB}]}]}
        (session_dir / "emulated_gpus.json").write_text(json.dumps(reading))
        assert [s.memory_used_bytes for s in EmulatedSource(home).snapshot().samples] == [140_000 * MIB]
        os.kill(child.pid, signal.SIGKILL)
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, "a zombie", 10)
        snap = EmulatedSource(home).snapshot()
        assert snap.samples == () and "no emulator session is running" in (snap.message or "")
    finally:
        child.kill()
        child.wait(10)
