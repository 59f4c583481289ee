"""Startup phases of an SGLang server (DESIGN §3, contract) and the StartupTracker that reads them from a log.

The tracker is pure: lines in, events and a summary out, no I/O.
"""
from __future__ import annotations

from enum import Enum


class StartupPhase(str, Enum):
    """Ordered startup phases. A phase may be skipped; the phase of a log is the furthest any rank reached."""

    LAUNCHING = "launching"
    DIST_INIT = "dist_init"
    LOADING_WEIGHTS = "loading_weights"
    WEIGHTS_LOADED = "weights_loaded"
    KV_CACHE = "kv_cache"
    CUDA_GRAPH = "cuda_graph"
    WARMUP = "warmup"
    READY = "ready"

    @property
    def order(self) -> int:
        return _ORDER[self]

    def __str__(self) -> str:  # so f-strings and JSON get the contract name
        return self.value


_ORDER = {p: i for i, p in enumerate(StartupPhase)}

# --- StartupTracker: owned by the log-reader work (issue 3) ------------------------------------------

from dataclasses import dataclass, field  # noqa: E402


@dataclass(frozen=True)
class PhaseEvent:
    """The log entered ``phase`` at ``line_no`` (1-based); ``log_time`` is the line's own timestamp text."""

    phase: StartupPhase
    line_no: int
    log_time: str | None = None


@dataclass(frozen=True)
class PhaseProgress:
    """Progress inside the current phase, e.g. ("shards", 12, 64) or ("cuda graph bs", 3, 52)."""

    label: str
    done: int
    total: int | None


@dataclass(frozen=True)
class LogError:
    line_no: int
    kind: str  # "traceback", "oom", "nccl", "gloo", "cuda_graph", "watchdog", "warmup", "address_in_use", ...
    text: str
    fatal: bool = True


@dataclass(frozen=True)
class StartupSummary:
    """Everything the tracker knows after the lines fed so far (an immutable snapshot)."""

    phase: StartupPhase = StartupPhase.LAUNCHING
    outcome: str = "incomplete"  # "ready" | "crashed" | "incomplete"
    error: str | None = None  # first fatal error line
    error_line: int | None = None
    errors: tuple[LogError, ...] = ()
    events: tuple[PhaseEvent, ...] = ()
    progress: PhaseProgress | None = None
    ranks_expected: int | None = None
    # marker name ("init_parallel_end", "load_weight_end", ...) -> global TP ranks that logged it
    rank_arrival: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ranks_loaded: tuple[int, ...] = ()
    capture_layers: tuple[int, ...] | None = None  # from our capture plugin's "capture active" line
    line_count: int = 0
    last_log_time: str | None = None
