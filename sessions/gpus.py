"""GPU readings: `GpuSample` snapshots from NVML (`NvmlSource`) or from the emulator (`EmulatedSource`).

As in nvitop, a failing NVML call yields None ("n/a" on screen) for that field, never an exception.
"""
from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class GpuSnapshot:
    samples: tuple[GpuSample, ...]
    source: str  # "nvml" | "emulated" | "none"
    available: bool
    message: str | None  # e.g. "NVML not available: driver library not found"
    taken_at: float  # time.time()
    stale: bool = False

# --- GpuSource, NvmlSource, EmulatedSource: owned by the TUI work (issue 4) -----------------------------
