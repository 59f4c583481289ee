"""GPU sources: NVML's sentinel behaviour, lost GPUs, staleness, the no-driver line, emulated GPUs.

`_FakeNvml` stands in for the NVIDIA driver library (the same functions `pynvml` exposes); it is the
driver that is faked, never our code.  The real NVML path runs in `benches/gpu_tui_vs_nvitop.py` on a
GPU machine; here, without a driver, `test_without_a_driver_*` exercises the real `pynvml`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from sessions.gpus import EmulatedSource, GpuSnapshot, NvmlSource, default_gpu_source


class _NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class _FakeNvml:
    """A driver with ``count`` GPUs; ``fail`` maps function name -> error code; ``lost`` GPU indices."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(
        self,
        count: int = 2,
        fail: dict[str, int] | None = None,
        lost: set[int] | None = None,
        init_error: int | None = None,
    ) -> None:
        self.count = count
        self.fail = fail or {}
        self.lost = lost or set()
        self.init_error = init_error
        self.block = threading.Event()
        self.block.set()
        self.shutdowns = 0
        self.calls: dict[str, int] = {}

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise _NvmlError(self.fail[name])

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _NvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self.block.wait()  # a driver call stuck in D-state
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int):
        self.calls["handle"] = self.calls.get("handle", 0) + 1
        if index in self.lost:
            raise _NvmlError(15)  # NVML_ERROR_GPU_IS_LOST
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        self.calls["name"] = self.calls.get("name", 0) + 1
        self._maybe_fail("name")
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        if handle in self.lost:  # every call on a lost GPU fails, as the driver's do
            raise _NvmlError(15)
        self._maybe_fail("memory")
        return SimpleNamespace(total=143771 * 2**20, used=(handle + 1) * 10 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        self._maybe_fail("utilization")
        return SimpleNamespace(gpu=50 + handle)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._maybe_fail("temperature")
        return 40

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._maybe_fail("power")
        return 350_000

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int):
        self._maybe_fail("processes")
        return [
            SimpleNamespace(pid=1000 + handle, usedGpuMemory=9 * 2**30),
            SimpleNamespace(pid=2000, usedGpuMemory=None),
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int):
        return []


def test_nvml_readings_become_samples_with_processes():
    source = NvmlSource(library=_FakeNvml(count=2))
    try:
        snapshot = source.snapshot()
    finally:
        source.close()
    assert snapshot.available and snapshot.source == "nvml" and not snapshot.stale
    assert [s.index for s in snapshot.samples] == [0, 1]
    gpu1 = snapshot.samples[1]
    assert gpu1.name == "NVIDIA H200"
    assert gpu1.memory_used_bytes == 20 * 2**30
    assert gpu1.utilization_percent == 51.0
    assert gpu1.power_w == 350.0
    assert {(p.pid, p.used_bytes) for p in gpu1.processes} == {(1001, 9 * 2**30), (2000, None)}


def test_a_failing_call_is_na_for_its_cell_only():
    source = NvmlSource(library=_FakeNvml(count=1, fail={"utilization": 3, "temperature": 3, "memory": 999}))
    try:
        sample = source.snapshot().samples[0]
    finally:
        source.close()
    assert sample.utilization_percent is None
    assert sample.temperature_c is None
    assert sample.memory_used_bytes is None and sample.memory_total_bytes is None
    assert sample.name == "NVIDIA H200" and sample.power_w == 350.0  # the rest still reads


def test_a_devices_handle_and_name_are_asked_once_and_a_gpu_lost_later_is_seen():
    nvml = _FakeNvml(count=2)
    source = NvmlSource(library=nvml)
    try:
        readings = [source.snapshot() for _ in range(3)]
        assert all(r.available and [s.name for s in r.samples] == ["NVIDIA H200"] * 2 for r in readings)
        assert nvml.calls == {"handle": 2, "name": 2}  # once per device, not once per reading
        nvml.lost.add(1)
        generation = readings[-1].taken_at
        later = source.snapshot()
        while later.taken_at == generation:  # a reading taken after the loss
            later = source.snapshot()
    finally:
        source.close()
    assert [s.lost for s in later.samples] == [False, True]


def test_a_lost_gpu_gets_its_own_row_and_the_others_still_read():
    source = NvmlSource(library=_FakeNvml(count=3, lost={1}))
    try:
        samples = source.snapshot().samples
    finally:
        source.close()
    assert [s.lost for s in samples] == [False, True, False]
    assert "lost" in (samples[1].name or "").lower()
    assert samples[2].memory_used_bytes == 30 * 2**30


def test_a_stuck_driver_returns_the_last_reading_marked_stale():
    nvml = _FakeNvml(count=1)
    source = NvmlSource(library=nvml, wait_s=0.2, stale_after_s=0.3)
    try:
        first = source.snapshot()
        assert first.available and not first.stale
        nvml.block.clear()  # the next driver call never returns
        deadline = time.monotonic() + 10
        stale = source.snapshot()
        while not stale.stale and time.monotonic() < deadline:
            stale = source.snapshot()
        assert stale.stale
        assert stale.samples == first.samples  # the old numbers, flagged
    finally:
        nvml.block.set()
        source.close()


def test_driver_library_missing_says_nvml_not_available():
    source = NvmlSource(library=_FakeNvml(init_error=12))
    try:
        snapshot = source.snapshot()
    finally:
        source.close()
    assert not snapshot.available and snapshot.samples == ()
    assert snapshot.message.startswith("NVML not available")
    assert "libnvidia-ml" in snapshot.message


def test_without_a_driver_the_real_pynvml_path_says_nvml_not_available():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver; the no-driver path cannot be exercised here")
    source = NvmlSource()
    try:
        snapshot = source.snapshot()
    finally:
        source.close()
    assert not snapshot.available
    assert snapshot.message.startswith("NVML not available")


def _write_emulated(session_dir, pid: int, gpus: list[dict], updated_at: float | None = None) -> None:
    session_dir.mkdir(parents=True, exist_ok=True)
    (session_dir / "emulated_gpus.json").write_text(
        json.dumps(
            {"updated_at": time.time() if updated_at is None else updated_at, "pid": pid, "gpus": gpus}
        )
    )


def _gpu(index: int, used_gib: int, pid: int) -> dict:
    return {
        "index": index,
        "name": "emulated H200",
        "memory_total_bytes": 140 * 2**30,
        "memory_used_bytes": used_gib * 2**30,
        "utilization_percent": 10.0,
        "processes": [{"pid": pid, "used_bytes": used_gib * 2**30}],
    }


def test_emulated_source_merges_live_sessions_and_ignores_dead_ones(home):
    me = os.getpid()
    _write_emulated(home.sessions_dir / "a", me, [_gpu(0, 10, 111), _gpu(1, 20, 112)])
    _write_emulated(home.sessions_dir / "b", me, [_gpu(0, 5, 211)])
    dead_pid = 2**22 + 12345  # above the default pid_max: never a live process
    _write_emulated(home.sessions_dir / "c", dead_pid, [_gpu(0, 99, 311)])
    (home.sessions_dir / "d").mkdir()
    (home.sessions_dir / "d" / "emulated_gpus.json").write_text("{not json")
    snapshot = EmulatedSource(home).snapshot()
    assert snapshot.source == "emulated" and snapshot.available and not snapshot.stale
    gpu0, gpu1 = snapshot.samples
    assert gpu0.memory_used_bytes == 15 * 2**30
    assert {p.pid for p in gpu0.processes} == {111, 211}
    assert gpu1.memory_used_bytes == 20 * 2**30


def test_emulated_source_marks_an_old_file_stale(home):
    _write_emulated(home.sessions_dir / "a", os.getpid(), [_gpu(0, 10, 111)], updated_at=time.time() - 20)
    assert EmulatedSource(home).snapshot().stale


def test_demo_source_shows_idle_emulated_gpus_before_any_emulator_runs(home):
    source = default_gpu_source(home, demo=True)
    snapshot = source.snapshot()
    assert isinstance(source, EmulatedSource)
    assert len(snapshot.samples) == 8 and all(s.memory_used_bytes == 0 for s in snapshot.samples)
    assert snapshot.source == "emulated"


def test_default_source_falls_back_to_emulators_only_without_nvml(home):
    source = default_gpu_source(home, demo=False)
    try:
        snapshot = source.snapshot()
        assert isinstance(snapshot, GpuSnapshot)
        if snapshot.source == "nvml" and snapshot.available:
            pytest.skip("this machine has NVML")
        assert snapshot.samples == ()  # no emulator runs: only the "not available" line
        _write_emulated(home.sessions_dir / "a", os.getpid(), [_gpu(3, 7, 333)])
        snapshot = source.snapshot()
        assert snapshot.source == "emulated" and [s.index for s in snapshot.samples] == [3]
        assert "NVML not available" in snapshot.message
    finally:
        source.close()


def test_emulated_sessions_sharing_a_gpu_never_show_more_than_it_has(home):
    # Two demo TP8 sessions each claim 100 GiB of a 140 GiB GPU: the panel shows 140/140, oversubscribed.
    me = os.getpid()
    _write_emulated(home.sessions_dir / "a", me, [_gpu(0, 100, 111), _gpu(1, 30, 112)])
    _write_emulated(home.sessions_dir / "b", me, [_gpu(0, 100, 211), _gpu(1, 30, 212)])
    gpu0, gpu1 = EmulatedSource(home).snapshot().samples
    assert gpu0.memory_used_bytes == gpu0.memory_total_bytes == 140 * 2**30 and gpu0.oversubscribed
    assert gpu1.memory_used_bytes == 60 * 2**30 and not gpu1.oversubscribed
    assert [p.used_bytes for p in gpu0.processes] == [100 * 2**30, 100 * 2**30]  # each claim as reported


def test_the_panel_says_oversubscribed_for_an_emulated_gpu_over_its_total(home):
    from widgets.gpu_panel import OVERSUBSCRIBED, GpuPanel

    _write_emulated(home.sessions_dir / "a", os.getpid(), [_gpu(0, 100, 111)])
    panel = GpuPanel()
    panel.snapshot = EmulatedSource(home).snapshot()
    assert OVERSUBSCRIBED not in panel.title()
    _write_emulated(home.sessions_dir / "b", os.getpid(), [_gpu(0, 100, 211)])
    panel.snapshot = EmulatedSource(home).snapshot()
    assert OVERSUBSCRIBED in panel.title()
