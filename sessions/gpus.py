"""GPU readings: `GpuSample` snapshots from NVML (`NvmlSource`) or from the emulator (`EmulatedSource`).

As in nvitop, a failing NVML call yields None ("n/a" on screen) for that field, never an exception, and a
GPU that fell off the bus becomes its own "lost" row instead of ending the whole reading.

NVML is initialised lazily, in a background thread, on the first `snapshot()`: `nvmlInit()` can stall
for a long time (go-nvml#152, H200 + driver 570) and a driver ioctl can sit in D-state.  So `snapshot()`
only ever waits a bounded time for the sampler thread; when the thread is stuck, the last reading comes
back marked `stale`, and the caller (the TUI's poll worker) carries on with the rest of its work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from sessions import safe_files
from sessions.profiles.fields import dp_replicas_of

if TYPE_CHECKING:
    from sessions.home import Home
    from sessions.profiles import LaunchProfile


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_percent: float | None
    temperature_c: float | None = None
    power_w: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    lost: bool = False  # the GPU fell off the bus / NVML lost it
    # Emulated only: the emulator sessions together claim more memory than the GPU has (each emulator
    # assumes the GPUs are its own).  ``memory_used_bytes`` is then clamped to the total.
    oversubscribed: bool = False


@dataclass(frozen=True)
class GpuSnapshot:
    samples: tuple[GpuSample, ...]
    source: str  # "nvml" | "emulated" | "none"
    available: bool
    message: str | None  # e.g. "NVML not available: driver library not found"
    taken_at: float  # time.time()
    stale: bool = False


def snapshot_to_json(snapshot: GpuSnapshot) -> dict[str, Any]:
    """`gpus --json`: the snapshot as plain JSON (another host's panel reads it back with `snapshot_from_json`)."""
    return dataclasses.asdict(snapshot)


def snapshot_from_json(data: Any) -> GpuSnapshot:
    """A `GpuSnapshot` from `snapshot_to_json`'s object; `ValueError` naming what is wrong otherwise."""
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise ValueError("not a GPU snapshot object (no 'samples' array)")  # noqa: TRY004 - bad input, one kind
    samples = []
    for i, raw in enumerate(data["samples"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("index"), int):
            raise ValueError(f"samples[{i}] is not a GPU reading")  # noqa: TRY004 - bad input, one kind
        known = {f.name for f in dataclasses.fields(GpuSample)}
        values = {k: v for k, v in raw.items() if k in known}
        values["processes"] = tuple(
            GpuProcess(int(p["pid"]), p.get("used_bytes")) for p in raw.get("processes") or ()
            if isinstance(p, dict) and isinstance(p.get("pid"), int)
        )
        samples.append(GpuSample(**values))
    return GpuSnapshot(
        tuple(samples), str(data.get("source", "none")), bool(data.get("available")),
        data.get("message") if isinstance(data.get("message"), str) else None,
        float(data.get("taken_at") or 0.0), bool(data.get("stale")),
    )


# --- GpuSource, NvmlSource, EmulatedSource: owned by the TUI work (issue 4) -----------------------------


class GpuSource(Protocol):
    """Anything that can hand out the latest `GpuSnapshot` without blocking for long."""

    def snapshot(self) -> GpuSnapshot: ...

    def close(self) -> None: ...


# NVML return codes that mean "no driver here", with the sentence a user should see.
_NVML_UNAVAILABLE_REASONS = {
    12: "the NVIDIA driver library (libnvidia-ml.so.1) was not found",  # NVML_ERROR_LIBRARY_NOT_FOUND
    9: "the NVIDIA driver is not loaded",  # NVML_ERROR_DRIVER_NOT_LOADED
    4: "no permission to query the GPUs",  # NVML_ERROR_NO_PERMISSION
}
_NVML_GPU_IS_LOST = 15
_NVML_INIT_RETRY_S = 30.0


class NvmlSource:
    """GPU readings from NVML (nvidia-ml-py), taken in a background thread.

    ``library`` is the ``pynvml`` module (import deferred to the sampler thread); tests may pass a module
    with the same functions.  ``wait_s`` bounds how long `snapshot()` waits for a fresh reading;
    a reading older than ``stale_after_s`` is marked stale.
    """

    source_name = "nvml"

    def __init__(
        self,
        library: ModuleType | None = None,
        wait_s: float = 0.5,
        stale_after_s: float = 5.0,
        fallback: GpuSource | None = None,
    ) -> None:
        self._library = library
        self._wait_s = wait_s
        self._stale_after_s = stale_after_s
        self._fallback = fallback
        self._cond = threading.Condition()
        self._wanted = False
        self._closed = False
        self._generation = 0
        self._latest: GpuSnapshot | None = None
        self._thread: threading.Thread | None = None
        self._initialised = False
        self._init_error: str | None = None
        self._init_failed_at = 0.0
        self._devices: dict[int, tuple[Any, Any]] = {}  # index -> (handle, name), while NVML is initialised

    # -- the caller's side ------------------------------------------------------------------------------

    def snapshot(self) -> GpuSnapshot:
        """The freshest reading available within ``wait_s``; never raises."""
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
                self._thread.start()
            generation = self._generation
            self._wanted = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._generation > generation or self._closed, timeout=self._wait_s)
            latest = self._latest
        now = time.time()
        if latest is None:
            return GpuSnapshot(
                (), "nvml", False, "NVML: waiting for the first reading from the driver", now, stale=True
            )
        if not latest.available and self._fallback is not None:
            fallback = self._fallback.snapshot()
            if fallback.samples:
                note = f"{latest.message}; showing emulated GPUs from running emulator sessions"
                return replace(fallback, message=note)
        if now - latest.taken_at > self._stale_after_s:
            return replace(latest, stale=True)
        return latest

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._fallback is not None:
            self._fallback.close()

    # -- the sampler thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._wanted or self._closed)
                    if self._closed:
                        break
                    self._wanted = False
                reading = self._read()
                with self._cond:
                    self._latest = reading
                    self._generation += 1
                    self._cond.notify_all()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._initialised and self._library is not None:
            with contextlib.suppress(Exception):  # shutting down a broken driver must not raise
                self._library.nvmlShutdown()
            self._initialised = False

    def _init(self) -> str | None:
        """Initialise NVML once; the reason it is unavailable, or None."""
        if self._initialised:
            return None
        if self._init_error is not None and time.time() - self._init_failed_at < _NVML_INIT_RETRY_S:
            return self._init_error
        if self._library is None:
            try:
                import pynvml  # nvidia-ml-py: a single module, importable without a driver
            except ImportError:
                return self._fail("NVML not available: the nvidia-ml-py package is not installed")
            self._library = pynvml
        nvml = self._library
        if not hasattr(nvml, "nvmlInit"):  # another package overwrote pynvml.py (nvitop's check)
            return self._fail("NVML not available: pynvml is not nvidia-ml-py (reinstall nvidia-ml-py)")
        try:
            self._devices.clear()  # handles of an earlier initialisation are not this one's
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - every failure here means "no GPU readings"
            code = getattr(exc, "value", None)  # NVMLError's return code; other exceptions have none
            known = _NVML_UNAVAILABLE_REASONS.get(code) if isinstance(code, int) else None
            reason = known or str(exc) or type(exc).__name__
            return self._fail(f"NVML not available: {reason}")
        self._initialised = True
        self._init_error = None
        return None

    def _fail(self, message: str) -> str:
        self._init_error = message
        self._init_failed_at = time.time()
        return message

    def _read(self) -> GpuSnapshot:
        error = self._init()
        if error is not None:
            return GpuSnapshot((), "nvml", False, error, time.time())
        nvml = self._library
        assert nvml is not None
        count = _query(nvml.nvmlDeviceGetCount)
        if count is None:
            return GpuSnapshot((), "nvml", False, "NVML not available: cannot count the GPUs", time.time())
        samples = tuple(self._read_device(nvml, index) for index in range(count))
        return GpuSnapshot(samples, "nvml", True, None, time.time())

    def _read_device(self, nvml: ModuleType, index: int) -> GpuSample:
        # A device's handle and name do not change while NVML is initialised: asked once, not every
        # second (a quarter of the driver calls of a reading).  A device whose memory cannot be read is
        # asked for its handle again, which says when it is lost.
        known = self._devices.get(index)
        if known is None:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:  # noqa: BLE001
                lost = getattr(exc, "value", None) == _NVML_GPU_IS_LOST
                name = "ERROR: GPU is lost" if lost else f"ERROR: {exc}"
                return GpuSample(index, name, None, None, None, lost=True)
            name = _query(nvml.nvmlDeviceGetName, handle)
            if isinstance(name, bytes):
                name = name.decode("utf-8", errors="replace")
        else:
            handle, name = known
        memory = _query(nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is None and known is not None:
            self._devices.pop(index, None)
            return self._read_device(nvml, index)
        if memory is not None and name is not None:
            self._devices[index] = (handle, name)
        utilization = _query(nvml.nvmlDeviceGetUtilizationRates, handle)
        temperature = _query(nvml.nvmlDeviceGetTemperature, handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        power_mw = _query(nvml.nvmlDeviceGetPowerUsage, handle)
        processes: dict[int, int | None] = {}
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            listed = _query(getattr(nvml, getter, None), handle) or ()
            for proc in listed:
                used = getattr(proc, "usedGpuMemory", None)  # None under MIG / when NVML can't tell
                previous = processes.get(proc.pid)
                processes[proc.pid] = used if previous is None else previous + (used or 0)
        return GpuSample(
            index=index,
            name=name,
            memory_used_bytes=getattr(memory, "used", None),
            memory_total_bytes=getattr(memory, "total", None),
            utilization_percent=_float_or_none(getattr(utilization, "gpu", None)),
            temperature_c=_float_or_none(temperature),
            power_w=None if power_mw is None else power_mw / 1000.0,
            processes=tuple(GpuProcess(pid, used) for pid, used in sorted(processes.items())),
        )


def _query(function: Callable[..., Any] | None, *args: Any) -> Any:
    """nvitop's sentinel idea: one failing driver call becomes None for its cell, never an exception."""
    if function is None:
        return None
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported, _FunctionNotFound, _Unknown, ...
        return None


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


# --- emulated GPUs ---------------------------------------------------------------------------------------

EMULATED_GPUS_FILE = "emulated_gpus.json"
# The emulator rewrites its file about once a second; older than this and the reading is stale.
_EMULATED_STALE_AFTER_S = 5.0
# Older than this, the file belongs to a session that ended without cleaning up (or a reused pid).
_EMULATED_IGNORE_AFTER_S = 60.0
# An H200 as NVML reports it (143771 MiB): used for idle demo GPUs before any emulator runs.
_IDLE_GPU_TOTAL_BYTES = 143771 * 1024 * 1024


class EmulatedSource:
    """GPU numbers published by live emulator sessions (`emulated_gpus.json` in their session dirs).

    Several emulator sessions on the same "machine" add up per GPU index, up to the GPU's total: more
    than that is shown as the total with ``oversubscribed`` set.  Files of sessions whose main
    process is gone are ignored.  With ``idle_gpus`` > 0 (demo mode), that many idle GPUs are shown while
    no emulator runs, so the panel has its shape from the first frame.
    """

    source_name = "emulated"

    def __init__(self, home: Home, idle_gpus: int = 0) -> None:
        self._home = home
        self._idle_gpus = idle_gpus

    def snapshot(self) -> GpuSnapshot:
        now = time.time()
        readings = list(self._live_readings())
        if not readings:
            samples = tuple(
                GpuSample(i, "emulated H200", 0, _IDLE_GPU_TOTAL_BYTES, 0.0) for i in range(self._idle_gpus)
            )
            message = (
                "emulated GPUs (no emulator session running)"
                if samples
                else ("no emulated GPUs: no emulator session is running")
            )
            return GpuSnapshot(samples, "emulated", bool(samples), message, now)
        merged: dict[int, GpuSample] = {}
        oldest = now
        for updated_at, gpus in readings:
            oldest = min(oldest, updated_at)
            for gpu in gpus:
                merged[gpu.index] = _add_samples(merged.get(gpu.index), gpu)
        merged = {index: _clamped(sample) for index, sample in merged.items()}
        stale = now - oldest > _EMULATED_STALE_AFTER_S
        message = f"emulated GPUs from {len(readings)} emulator session{'s' if len(readings) != 1 else ''}"
        return GpuSnapshot(tuple(merged[i] for i in sorted(merged)), "emulated", True, message, now, stale)

    def close(self) -> None:
        pass

    def _live_readings(self):
        sessions_dir = self._home.sessions_dir
        try:
            entries = list(os.scandir(sessions_dir))
        except FileNotFoundError:
            return
        for entry in entries:
            path = Path(entry.path) / EMULATED_GPUS_FILE
            try:
                data = safe_files.read_json(path, safe_files.SESSION_RECORD)
            except OSError:
                continue
            reading = _parse_emulated(data)
            if reading is not None and time.time() - reading[0] < _EMULATED_IGNORE_AFTER_S:
                yield reading


def _running(pid: int) -> bool:
    """The process exists and is not a zombie: a killed emulator's main process stays a zombie until its
    parent reaps it, and its last file would otherwise still hold the GPUs (and refuse the next launch)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _parse_emulated(data: Any) -> tuple[float, list[GpuSample]] | None:
    """One emulator file -> (updated_at, samples), or None when malformed or its process is gone."""
    if not isinstance(data, dict):
        return None
    pid = data.get("pid")
    if not isinstance(pid, int) or not _running(pid):
        return None
    samples = []
    for gpu in data.get("gpus") or ():
        if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
            continue
        processes = tuple(
            GpuProcess(int(p["pid"]), _int_or_none(p.get("used_bytes")))
            for p in gpu.get("processes") or ()
            if isinstance(p, dict) and isinstance(p.get("pid"), int)
        )
        samples.append(
            GpuSample(
                index=gpu["index"],
                name=gpu.get("name") or "emulated GPU",
                memory_used_bytes=_int_or_none(gpu.get("memory_used_bytes")),
                memory_total_bytes=_int_or_none(gpu.get("memory_total_bytes")),
                utilization_percent=_float_or_none(gpu.get("utilization_percent")),
                processes=processes,
            )
        )
    updated_at = data.get("updated_at")
    return (float(updated_at) if isinstance(updated_at, (int, float)) else 0.0), samples


def _add_samples(a: GpuSample | None, b: GpuSample) -> GpuSample:
    if a is None:
        return b
    used = (
        None
        if a.memory_used_bytes is None or b.memory_used_bytes is None
        else (a.memory_used_bytes + b.memory_used_bytes)
    )
    util = max((u for u in (a.utilization_percent, b.utilization_percent) if u is not None), default=None)
    return replace(
        a,
        memory_used_bytes=used,
        memory_total_bytes=a.memory_total_bytes or b.memory_total_bytes,
        utilization_percent=util,
        processes=a.processes + b.processes,
    )


def _clamped(sample: GpuSample) -> GpuSample:
    """No real GPU shows more used than total memory: clamp, and say the GPU is oversubscribed."""
    used, total = sample.memory_used_bytes, sample.memory_total_bytes
    if used is None or not total or used <= total:
        return sample
    return replace(sample, memory_used_bytes=total, oversubscribed=True)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def default_gpu_source(home: Home, demo: bool = False) -> GpuSource:
    """Demo: emulated GPUs only.  Otherwise NVML, falling back to live emulator sessions without a driver."""
    if demo:
        return EmulatedSource(home, idle_gpus=8)
    return NvmlSource(fallback=EmulatedSource(home))


# --- the GPU-busy check before a launch ------------------------------------------------------------------

MIB = 1024 * 1024
# NVML's "used" on an idle GPU is the driver's own reservation (a few hundred MiB on an H200); memory above
# this on a GPU whose processes NVML does not list (a container hides other pids) counts as held.
UNLISTED_USED_THRESHOLD_BYTES = 2048 * MIB
_FIRST_READING_WAIT_S = 5.0


@dataclass(frozen=True)
class GpuHolder:
    """A process holding memory on a GPU: ``who`` is its session id or process name."""

    pid: int | None
    who: str
    used_bytes: int | None

    def text(self) -> str:
        size = f"{self.used_bytes // MIB:,} MiB" if self.used_bytes is not None else "memory"
        if self.pid is None:
            return f"{size} by {self.who}"
        return f"{size} by pid {self.pid} ({self.who})"


@dataclass(frozen=True)
class BusyGpu:
    """A GPU that a launch would use while other processes hold memory on it."""

    index: int
    used_bytes: int | None
    total_bytes: int | None
    holders: tuple[GpuHolder, ...]

    def text(self) -> str:
        used = ""
        if self.used_bytes is not None and self.total_bytes:
            used = f" ({self.used_bytes // MIB:,} of {self.total_bytes // MIB:,} MiB used)"
        return f"GPU{self.index}{used}: " + ", ".join(h.text() for h in self.holders)

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.index,
            "used_mib": None if self.used_bytes is None else self.used_bytes // MIB,
            "total_mib": None if self.total_bytes is None else self.total_bytes // MIB,
            "holders": [
                {"pid": h.pid, "who": h.who, "used_mib": None if h.used_bytes is None else h.used_bytes // MIB}
                for h in self.holders
            ],
        }


def _flag_value(args: tuple[str, ...] | list[str], *names: str) -> str | None:
    """The last value of ``--flag value`` / ``--flag=value`` in ``args`` (argparse keeps the last)."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in names:
            if eq:
                value = inline
            elif i + 1 < len(args):
                value = args[i + 1]
    return value


def _int_flag(args: tuple[str, ...] | list[str], default: int, *names: str) -> int:
    value = _flag_value(args, *names)
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def launch_gpu_ids(profile: LaunchProfile) -> list[int]:
    """The GPU ids (as CUDA numbers them, after ``CUDA_VISIBLE_DEVICES``) a launch of ``profile`` uses.

    SGLang on one node: ``gpu_id = base_gpu_id + (pp_rank % pp) * tp + (tp_rank % tp) * gpu_id_step``
    (engine.py:935-939); a DP controller without attention-DP starts ``dp_size`` such groups side by side.
    """
    server = profile.server
    args = tuple(server.extra_args)
    tp = max(1, int(server.tp_size))
    pp = max(1, _int_flag(args, 1, "--pp-size", "--pipeline-parallel-size"))
    dp = dp_replicas_of(server)  # attention-DP splits the TP group's GPUs, it adds none
    base = _int_flag(args, 0, "--base-gpu-id")
    step = max(1, _int_flag(args, 1, "--gpu-id-step"))
    # One node of a multi-node server holds its share (engine.py _calculate_rank_ranges): pp_per_node PP
    # stages of tp_per_node TP ranks each.
    nnodes = max(1, _int_flag(args, 1, "--nnodes"), int(getattr(server, "nnodes", 1) or 1))
    nodes_per_pp_rank = max(nnodes // pp, 1)
    pp, tp = max(pp // nnodes, 1), max(1, tp // nodes_per_pp_rank)
    ids = []
    for d in range(dp):
        for p in range(pp):
            for t in range(tp):
                ids.append(base + d * tp * pp + p * tp + t * step)
    return sorted(set(ids))


def physical_gpu_indices(gpu_ids: list[int], cuda_visible_devices: str | None) -> list[int] | None:
    """NVML indices of CUDA's ``gpu_ids`` under ``cuda_visible_devices``; None when the list cannot be
    mapped here (UUIDs): then every GPU is checked."""
    if cuda_visible_devices is None:
        return list(gpu_ids)
    visible: list[int] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if not entry:
            break
        if not entry.isdigit():
            return None
        visible.append(int(entry))
    return [visible[i] for i in gpu_ids if i < len(visible)]


def first_reading(source: GpuSource, wait_s: float = _FIRST_READING_WAIT_S) -> GpuSnapshot:
    """A snapshot that is not the "waiting for the first reading" placeholder (NVML initialises lazily)."""
    deadline = time.monotonic() + wait_s
    while True:
        snapshot = source.snapshot()
        if snapshot.available or not snapshot.stale or time.monotonic() >= deadline:
            return snapshot


def busy_gpus_for_launch(
    profile: LaunchProfile,
    home: Home,
    source: GpuSource | None = None,
    describe_pid: Callable[[int], str] | None = None,
    gpu_ids: list[int] | None = None,
) -> list[BusyGpu]:
    """The GPUs a launch of ``profile`` would use where other processes already hold memory.

    ``gpu_ids`` replaces the profile's own GPU ids (a group of replicas checks all its members' at once).

    The GPU source is the GPU panel's (`default_gpu_source`): NVML, else emulated GPUs of running
    emulator sessions (the demo's GPUs).  No readings at all: nothing to report (the launch goes on).
    """
    own = source is None
    source = source or default_gpu_source(home, demo=home.demo)
    try:
        snapshot = first_reading(source)
    finally:
        if own:
            source.close()
    if not snapshot.available or not snapshot.samples:
        return []
    ids = launch_gpu_ids(profile) if gpu_ids is None else list(gpu_ids)
    if snapshot.source == "nvml":
        cvd = profile.server.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
        wanted = physical_gpu_indices(ids, cvd)
    else:
        wanted = ids  # the emulator numbers its GPUs as SGLang's gpu_id, without CUDA_VISIBLE_DEVICES
    describe = describe_pid or process_name
    busy = []
    for sample in snapshot.samples:
        if wanted is not None and sample.index not in wanted:
            continue
        holders = tuple(
            GpuHolder(p.pid, describe(p.pid), p.used_bytes)
            for p in sample.processes
            if p.used_bytes is None or p.used_bytes > 0
        )
        if not holders and (sample.memory_used_bytes or 0) > UNLISTED_USED_THRESHOLD_BYTES:
            holders = (GpuHolder(None, "processes NVML does not list", sample.memory_used_bytes),)
        if holders:
            busy.append(BusyGpu(sample.index, sample.memory_used_bytes, sample.memory_total_bytes, holders))
    return busy


def process_name(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return proc.name() or "?"
    except (psutil.Error, OSError):
        return "gone"


def format_busy(profile_name: str, busy: list[BusyGpu], retry: str | None = None) -> str:
    """The refusal, with advice that exists for the command that refused: the sessions to stop by id, and
    ``retry`` (default: the launch command with its --force)."""
    gpus = ", ".join(f"GPU{b.index}" for b in busy)
    lines = [f"profile '{profile_name}' would use {gpus}, where other processes hold memory:"]
    lines += [f"  {b.text()}" for b in busy]
    holders = sorted({h.who.removeprefix("session ") for b in busy for h in b.holders if h.who.startswith("session ")})
    stop = f" ({'; '.join(f'eagle3-tui stop {s}' for s in holders)})" if holders else ""
    again = retry or f"launch anyway with eagle3-tui launch {profile_name} --force"
    lines.append(f"a server started there may run out of memory; stop those first{stop}, or {again}")
    return "\n".join(lines)
