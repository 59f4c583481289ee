"""What a diagnosis is, in data: the processes, GPUs and hints it saw, and its verdict (DESIGN §4).

Everything in a `Diagnosis` is already redacted, so the CLI, the screen and the bundle show it as is.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sessions import history, stacks, start_facts
from sessions.baseline import BaselineChoice

DEFAULT_STACK_TIMEOUT_S = 10.0
CPU_INTERVAL_S = 0.5
LAST_LINES = 40
HINT_LOG_BYTES = 8 << 20  # hints read at most the last 8 MiB of a log
BUNDLE_LOG_BYTES = 4 << 20

SPIN_CPU_PERCENT = 20.0  # a rank above this is busy
IDLE_CPU_PERCENT = 1.0  # a rank below this does nothing


@dataclass(frozen=True)
class HintView:
    """A hint as the diagnosis shows it (same fields as `sessions.hints.Hint`)."""

    id: str
    title: str
    detail: str
    # Matched on more than the phase or state (a log line, a stack, a child process, a flag, a check):
    # False for general advice, which comes last.
    evidence: bool = True
    # Where it ranks (`sessions.diagnosis.ranking.RANKS`: changed, observed, setting, unchanged, generic)
    # and why, when the baseline decided it ("changed since the baseline: ...", "the good start ... also").
    rank: str = "observed"
    why: str | None = None

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, "detail": self.detail, "evidence": self.evidence,
                "rank": self.rank, "why": self.why}


@dataclass(frozen=True)
class ProcessReport:
    """One process of the server tree as the diagnosis saw it."""

    pid: int
    title: str
    role: str  # main, scheduler, detokenizer, dp_controller, other
    rank: int | None
    status: str
    cpu_percent: float | None
    rss_bytes: int | None
    num_threads: int | None
    children: tuple[str, ...]
    stack: stacks.StackDump | None
    dp_rank: int | None = None  # the replica under SGLang's DP controller (title sglang::scheduler_DP1_TP0)

    @property
    def label(self) -> str:
        if self.role == "scheduler" and self.rank is not None:
            return f"TP{self.rank}" if self.dp_rank is None else f"DP{self.dp_rank} TP{self.rank}"
        return self.role

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "title": self.title,
            "role": self.role,
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "status": self.status,
            "cpu_percent": self.cpu_percent,
            "rss_bytes": self.rss_bytes,
            "num_threads": self.num_threads,
            "children": list(self.children),
            "stack": self.stack.to_json() if self.stack is not None else None,
        }


@dataclass(frozen=True)
class GpuProcessReport:
    pid: int
    used_bytes: int | None
    label: str | None  # "TP3", "main", ... for this session's processes; None for others

    def to_json(self) -> dict:
        return {"pid": self.pid, "used_bytes": self.used_bytes, "label": self.label,
                "session": self.label is not None}


@dataclass(frozen=True)
class GpuReport:
    index: int
    name: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_percent: float | None
    processes: tuple[GpuProcessReport, ...]

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_bytes": self.memory_total_bytes,
            "utilization_percent": self.utilization_percent,
            "processes": [p.to_json() for p in self.processes],
        }


@dataclass(frozen=True)
class Diagnosis:
    """One diagnosis of a session (immutable, redacted); ``to_json`` keeps the DESIGN §4 field names."""

    session_id: str
    profile: str
    state: str
    phase: str
    silent_for_s: float
    stall_limit_s: float | None
    last_lines: tuple[str, ...]
    port_listening: bool
    ready: bool | None
    processes: tuple[ProcessReport, ...]
    gpus: tuple[GpuReport, ...]
    gpu_source: str
    gpu_message: str | None
    baseline: history.Baseline | None
    hints: tuple[HintView, ...]
    compare: str
    phase_rows: tuple[history.PhaseComparison, ...]
    ranks_expected: int | None
    silent_ranks: tuple[int, ...]
    lagging_ranks: dict[str, tuple[int, ...]]  # marker -> ranks that did not log it while others did
    missing_load_weight_end: tuple[int, ...]
    compile_children: tuple[str, ...]
    idle_ranks: tuple[int, ...]
    collective_ranks: dict[int, str]  # rank -> the collective frame it waits in
    pyspy: stacks.PySpyStatus
    with_stacks: bool
    log_path: str
    line_count: int
    error: str | None
    error_line: int | None
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    taken_at: float = 0.0
    collect_s: float = 0.0
    # What changed since the last good start of the profile (flags, env, versions, GPUs, ...), marked with
    # the known causes that name each change; None when that cannot be told (no good start, or one of the
    # two starts was recorded before their settings were kept).
    changes_since_last_good: tuple[start_facts.Change, ...] | None = None
    changes_note: str | None = None  # why there is no list, in words
    progress_lines: tuple[str, ...] = ()  # the last frame of each progress bar (tqdm), apart from log lines
    problem: str | None = None  # what is wrong with the session's own files (damaged state.json, ...)
    host: str = "127.0.0.1"
    port: int | None = None
    # Which good start ``baseline`` is and why it was picked (this profile's, one of the same model and
    # sizes, or picked by hand); None when there is none.
    baseline_choice: BaselineChoice | None = None

    @property
    def baseline_line(self) -> str:
        """"baseline: good start of kimi-k25-tp8 at 22:10, same model, TP/PP/DP and SGLang version (id)"."""
        return self.baseline_text(with_id=True)

    def baseline_text(self, with_id: bool = True) -> str:
        if self.baseline_choice is None:
            return "baseline: none (no good start of this profile or of the same model, TP/PP/DP and version)"
        return f"baseline: {self.baseline_choice.describe(with_id)}"

    @property
    def silence(self) -> str | None:
        """"log silent for 1m52s (limit 2m)" while the start is not over; None once ready or ended (an
        idle ready server is quiet, not silent)."""
        if self.state not in ("starting", "stalled"):
            return None
        text = f"log silent for {history.format_duration_s(self.silent_for_s)}"
        if self.stall_limit_s not in (None, float("inf")):
            text += f" (limit {history.format_duration_s(self.stall_limit_s)})"
        return text

    @property
    def has_baseline(self) -> bool:
        """A good start of this profile exists to compare with (else there is no baseline table)."""
        return self.baseline is not None and self.baseline.reached_ready

    @property
    def headline(self) -> str:
        """The verdict in one plain sentence."""
        if self.state == "ready":
            where = f" on {self.host}:{self.port}" if self.port else ""
            return f"{self.session_id} is ready: the server answers{where} (/ready 200)" if self.ready else (
                f"{self.session_id} is ready{where}: its log says it is fired up and ready to roll"
            )
        text = f"{self.session_id} (profile {self.profile}) is {self.state} in phase {self.phase}"
        return text + (f", {self.silence}" if self.silence else "")


    def to_json(self) -> dict:
        limit = self.stall_limit_s
        return {
            # DESIGN §4 / issue 5 contract
            "state": self.state,
            "phase": self.phase,
            "silent_for_s": round(self.silent_for_s, 3),
            "last_lines": list(self.last_lines),
            "port_listening": self.port_listening,
            "ready": self.ready,
            "processes": [p.to_json() for p in self.processes],
            "gpus": [g.to_json() for g in self.gpus],
            "baseline": _baseline_json(self.baseline, self.baseline_choice),
            "hints": [h.to_json() for h in self.hints],
            # extras
            "headline": self.headline,
            "problem": self.problem,
            "progress_lines": list(self.progress_lines),
            "has_baseline": self.has_baseline,
            "session_id": self.session_id,
            "profile": self.profile,
            "stall_limit_s": limit if limit is not None and limit != float("inf") else None,
            "compare": self.compare,
            "phase_rows": [r.to_json() for r in self.phase_rows],
            "ranks_expected": self.ranks_expected,
            "silent_ranks": list(self.silent_ranks),
            "lagging_ranks": {k: list(v) for k, v in self.lagging_ranks.items()},
            "missing_load_weight_end": list(self.missing_load_weight_end),
            "compile_children": list(self.compile_children),
            "idle_ranks": list(self.idle_ranks),
            "collective_ranks": {str(k): v for k, v in self.collective_ranks.items()},
            "gpu_source": {"source": self.gpu_source, "message": self.gpu_message},
            "pyspy": {"available": self.pyspy.available, "path": self.pyspy.path, "message": self.pyspy.message},
            "with_stacks": self.with_stacks,
            "log_path": self.log_path,
            "line_count": self.line_count,
            "error": self.error,
            "error_line": self.error_line,
            "argv": list(self.argv),
            "taken_at": self.taken_at,
            "collect_s": round(self.collect_s, 3),
            "changes_since_last_good": (
                None if self.changes_since_last_good is None
                else start_facts.to_json_list(self.changes_since_last_good)
            ),
            "changes_note": self.changes_note,
        }


def _baseline_json(baseline: history.Baseline | None, choice: BaselineChoice | None) -> dict | None:
    if baseline is None:
        return None
    return {
        "session_id": baseline.session_id,
        "profile": baseline.profile,
        "how": choice.how if choice is not None else None,
        "description": choice.describe() if choice is not None else None,
        "outcome": baseline.outcome,
        "line_count": baseline.line_count,
        "ready_line": baseline.ready_line,
        "ready_after_s": baseline.ready_after_s,
        # ready seen over HTTP before the log said so has no line of its own: its line count, as the table
        "phases": {m.phase: {"line": baseline.ready_line if m.phase == "ready" else m.line, "at_s": m.at_s}
                   for m in baseline.phases},
    }


def _fmt_ranks(ranks: Iterable[int]) -> str:
    return ", ".join(f"TP{r}" for r in ranks)


