"""What the startup tracker says about a log: the phases of an SGLang server start (DESIGN §3, contract), the
events, progress and errors found on the way, and the immutable `StartupSummary` the rest of the engine reads.

No parsing lives here: the lines are read by `sessions.phases.catalogue` and `sessions.phases.tracker`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from sessions.phases.topology import rank_name


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


@dataclass(frozen=True)
class PhaseEvent:
    """The log entered ``phase`` at ``line_no`` (1-based); ``log_time`` is the line's own timestamp text."""

    phase: StartupPhase
    line_no: int
    log_time: str | None = None


@dataclass(frozen=True)
class PhaseProgress:
    """Progress inside the current phase, e.g. ("shards", 12, 64) or ("cuda graph bs", 3, 52).

    ``detail`` is the bar's own description when it says more, e.g. "bs=512 avail_mem=20.51 GB".
    """

    label: str
    done: int
    total: int | None
    detail: str | None = None


@dataclass(frozen=True)
class LogError:
    line_no: int
    kind: str  # "traceback", "oom", "nccl", "gloo", "cuda_graph", "watchdog", "warmup", "address_in_use", ...
    text: str
    fatal: bool = True
    rank: int | None = None  # global TP rank of the line, when it has one
    detail: str | None = None  # the exception line that ended the traceback under this line, if any
    detail_line: int | None = None  # its line number
    # the first exception of a chained traceback ("During handling of the above exception ...", "The above
    # exception was the direct cause ..."): the root cause, when ``detail`` is the last one
    cause: str | None = None
    cause_line: int | None = None
    while_serving: bool = False  # its traceback ran through the serving loop (the server was up)

    @property
    def exception(self) -> str:
        """What the error says: the exception line that ended its traceback, else the line itself."""
        return self.detail or self.text

    @property
    def exception_line(self) -> int:
        return self.detail_line if self.detail is not None and self.detail_line is not None else self.line_no


@dataclass(frozen=True)
class StartupSummary:
    """Everything the tracker knows after the lines fed so far (an immutable snapshot)."""

    phase: StartupPhase = StartupPhase.LAUNCHING
    outcome: str = "incomplete"  # "ready" | "crashed" | "incomplete"
    # The first fatal error, as the exception that raised it: its exception line (type and message) when
    # a traceback ended in one, else the error line itself; never a "... hit an exception: Traceback" header
    error: str | None = None
    error_line: int | None = None
    error_rank: int | None = None  # the global rank that raised it (None: the main process or unknown)
    error_cause: str | None = None  # a chained traceback's root cause (``error`` is then the last exception)
    error_cause_line: int | None = None
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
    # --- added by the log reader (compatible extensions) ---
    ranks_seen: tuple[int, ...] = ()  # every global rank that logged any line with a rank prefix
    server_args: dict[str, object] = field(default_factory=dict)  # selected keys of the server_args line
    capture_dir: str | None = None
    errors_dropped: int = 0  # errors beyond the kept ones (a runtime log can hold thousands)

    def rank_name(self, rank: int) -> str:
        """``DP1 TP0`` for a plain-DP server's global rank, else ``TP5`` (`topology.rank_name`)."""
        return rank_name(rank, self.server_args)


def error_headline(summary: StartupSummary) -> str | None:
    """The crash in one line for people (card, diagnosis, history, notification): the exception, the rank
    that raised it, and a chained traceback's root cause, e.g. ``TP1: RuntimeError: Not enough memory ...``
    or ``TP0: RuntimeError: boom (root cause: KeyError: 'x')``."""
    if summary.error is None:
        return None
    who = f"{summary.rank_name(summary.error_rank)}: " if summary.error_rank is not None else ""
    cause = f" (root cause: {summary.error_cause})" if summary.error_cause else ""
    return f"{who}{summary.error}{cause}"


# Arrival markers in startup order (the TUI shows them in this order).
ARRIVAL_MARKERS = (
    "init_parallel_begin",
    "init_parallel_end",
    "load_weight_begin",
    "load_weight_end",
    "kv_cache_allocated",
    "memory_pool_end",
    "cuda_graph_begin",
    "cuda_graph_end",
    "capture_active",
)

# Error kinds that end a server even after it was ready; any other kind after ready is a logged, survived
# error (a bad request's traceback, say).  Errors before ready stop counting once ready is reached.
HARD_FATAL_KINDS = frozenset(
    {"scheduler_exception", "process_exception", "sigquit", "killed", "watchdog", "nccl_watchdog",
     "subprocess_crashed", "scheduler_died", "crash", "exit"}
)
# Errors that a start may survive (a logged traceback, one failed allocation): when the log goes on at
# least two phases further than where the error happened, the start evidently went on without it.  Two,
# because the other ranks of a start whose one rank died can still finish the phase they were in.
SOFT_ERROR_KINDS = frozenset({"traceback", "oom", "negative_kv", "c10d"})
