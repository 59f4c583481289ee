"""Hang diagnosis of one server session: a snapshot, hints, and a bundle (DESIGN §4).

`diagnose(session)` collects, in a couple of seconds, what the seeds spent an hour gathering by hand: the
phase and how long the log has been silent, the last lines, the process tree (CPU, RSS, threads, compiler
children), the port and ``/ready``, GPU memory per process, the py-spy stack of every rank (in parallel,
each with a timeout), the comparison with the last good start of the same profile, and hints from the
data-driven catalogue (``sessions/data/known_causes*.toml``) plus the causes only a live process tree can
show: a rank stuck in an NCCL collective while the others are elsewhere, a rank idle while the others
spin, ranks missing from ``Load weight end``, a compiler child at work, py-spy missing or not allowed.

Everything in a `Diagnosis` is already redacted (profile env values whose names look secret, values after
secret flags, credential-shaped strings), so the CLI, the screen and `write_bundle` can show it as is.
"""
from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions import history, stacks, stall, start_facts
from sessions.hints import HintEvidence
from sessions.home import atomic_write_bytes
from sessions.logs import LogFileError, read_tail
from sessions.phases import StartupSummary
from sessions.redaction import (
    REDACTED,
    SECRET_FLAGS,
    Redactor,
    collect_secrets,
    is_secret_name,
    redact_text,
    secret_values,
)
from sessions.safe_files import SpecialFileError, read_regular_text

DEFAULT_STACK_TIMEOUT_S = 10.0
CPU_INTERVAL_S = 0.5
LAST_LINES = 40
HINT_LOG_BYTES = 8 << 20  # hints read at most the last 8 MiB of a log
BUNDLE_LOG_BYTES = 4 << 20

# Environment that explains hangs (NCCL, CUDA, proxies, SGLang switches); the rest stays out of bundles.
_RELEVANT_ENV = re.compile(
    r"^(NCCL_|CUDA_|SGLANG_|SGL_|TORCH_|TORCHINDUCTOR_|GLOO_|FLASHINFER_|TRITON_|HF_|NVIDIA_|OMP_|MASTER_"
    r"|PYTORCH_|DG_|DEEPGEMM_|TP_|WORLD_SIZE|RANK|LOCAL_RANK|PYTHONPATH$|LD_LIBRARY_PATH$|PATH$|VIRTUAL_ENV$"
    r"|EAGLE3_)|^(http_proxy|https_proxy|all_proxy|no_proxy)$",
    re.IGNORECASE,
)
SPIN_CPU_PERCENT = 20.0  # a rank above this is busy
IDLE_CPU_PERCENT = 1.0  # a rank below this does nothing


@dataclass(frozen=True)
class HintView:
    """A hint as the diagnosis shows it (same fields as `sessions.hints.Hint`)."""

    id: str
    title: str
    detail: str
    # Matched on this session's own evidence (a log line, a stack, a child process, a flag, a check),
    # not only on its phase or state: such hints come first.
    evidence: bool = True

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, "detail": self.detail, "evidence": self.evidence}


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

    @property
    def label(self) -> str:
        if self.role == "scheduler" and self.rank is not None:
            return f"TP{self.rank}"
        return self.role

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "title": self.title,
            "role": self.role,
            "rank": self.rank,
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
        fmt = history.format_duration_s
        text = f"{self.session_id} (profile {self.profile}) is {self.state} in phase {self.phase}"
        if self.state in ("starting", "stalled"):
            text += f", log silent for {fmt(self.silent_for_s)}"
            if self.stall_limit_s not in (None, float("inf")):
                text += f" (limit {fmt(self.stall_limit_s)})"
        return text

    def rank_process(self, rank: int) -> ProcessReport | None:
        for proc in self.processes:
            if proc.role == "scheduler" and proc.rank == rank:
                return proc
        return None

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
            "baseline": _baseline_json(self.baseline),
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


def _baseline_json(baseline: history.Baseline | None) -> dict | None:
    if baseline is None:
        return None
    return {
        "session_id": baseline.session_id,
        "outcome": baseline.outcome,
        "line_count": baseline.line_count,
        "ready_line": baseline.ready_line,
        "ready_after_s": baseline.ready_after_s,
        "phases": {m.phase: {"line": m.line, "at_s": m.at_s} for m in baseline.phases},
    }


# --- collection -----------------------------------------------------------------------------------------


class _Redactor:
    """Every string of a diagnosis passes through here: known secret values first (the session's secrets
    file and profile, the live environment, the argv), in every escaped form, then secret shapes."""

    def __init__(self, known: Iterable[str], session: Any = None) -> None:
        base = Redactor.for_session(session) if session is not None else Redactor()
        self.known = base.with_values(known).known

    def text(self, text: str) -> str:
        return redact_text(text, self.known)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: (REDACTED if is_secret_name(k) and v else self.text(v)) for k, v in env.items()}


def _secret_argv_values(argv: Sequence[str]) -> list[str]:
    values = []
    for i, arg in enumerate(argv):
        if arg.startswith("--") and "=" in arg:
            flag, _, value = arg.partition("=")
            if flag in SECRET_FLAGS or is_secret_name(flag):
                values.append(value)
        elif (arg in SECRET_FLAGS or (arg.startswith("--") and is_secret_name(arg))) and i + 1 < len(argv):
            values.append(argv[i + 1])
    return values


def _process_environ(pid: int | None) -> dict[str, str]:
    """The server's real environment (ours to read: we launched it); {} when it cannot be read."""
    if not pid:
        return {}
    try:
        import psutil

        return dict(psutil.Process(pid).environ())
    except Exception:  # noqa: BLE001 - gone, or not readable: the profile env is the fallback
        return {}


def _tail_texts(path: Path, max_bytes: int, *, follow_symlinks: bool = True) -> list[str]:
    """The shown text of the log's last lines within ``max_bytes``, read by the log core; a log that is
    not a regular file (a FIFO, a device: never waited on) gives one line saying so."""
    try:
        return [line.text for line in read_tail(path, max_bytes, follow_symlinks=follow_symlinks)]
    except LogFileError as exc:
        return [f"(log not read: {exc})"]
    except OSError:
        return []


def _gpu_snapshot(session: Any, home: Any) -> Any:
    """GPU readings from the source that fits the session: emulated numbers for an emulator session, NVML
    (falling back to emulated) otherwise.  Never raises."""
    try:
        from sessions import gpus as gpu_module

        session_dir = Path(getattr(session, "session_dir", "."))
        if (session_dir / getattr(gpu_module, "EMULATED_GPUS_FILE", "emulated_gpus.json")).is_file():
            source = gpu_module.EmulatedSource(home)
        elif getattr(home, "demo", False):
            source = gpu_module.default_gpu_source(home, demo=True)
        else:
            source = gpu_module.NvmlSource(wait_s=3.0, fallback=gpu_module.EmulatedSource(home))
        try:
            return source.snapshot()
        finally:
            source.close()
    except Exception as exc:  # noqa: BLE001 - GPU readings are optional for a diagnosis
        from sessions.gpus import GpuSnapshot

        return GpuSnapshot((), "none", False, f"GPU readings not available: {exc}", time.time())


def _gpu_reports(snapshot: Any, labels: Mapping[int, str]) -> tuple[GpuReport, ...]:
    reports = []
    for sample in getattr(snapshot, "samples", ()) or ():
        reports.append(
            GpuReport(
                index=sample.index,
                name=sample.name,
                memory_used_bytes=sample.memory_used_bytes,
                memory_total_bytes=sample.memory_total_bytes,
                utilization_percent=sample.utilization_percent,
                processes=tuple(
                    GpuProcessReport(p.pid, p.used_bytes, labels.get(p.pid)) for p in sample.processes
                ),
            )
        )
    return tuple(reports)


def _dump_targets(tree: Sequence[Any]) -> list[int]:
    """The main process and SGLang's children (schedulers, detokenizer, DP controller), not compilers."""
    return [p.pid for p in tree if p.role in ("main", "scheduler", "detokenizer", "dp_controller")]


# Markers every TP rank logs (sglang-facts §1.4); our capture plugin's line comes from some ranks only.
_EVERY_RANK_MARKERS = (
    "init_parallel_begin", "init_parallel_end", "load_weight_begin", "load_weight_end",
    "kv_cache_allocated", "memory_pool_end", "cuda_graph_begin", "cuda_graph_end",
)


def _rank_analysis(
    summary: StartupSummary, expected: int | None, local_ranks: Iterable[int], state: str
) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...], tuple[int, ...]]:
    """(lagging ranks per marker, ranks missing from Load weight end, silent ranks).

    The ranks to expect are those this node's log or process tree shows (a multi-node log only has its
    own ranks), or all ``expected`` when neither shows any.
    """
    universe = set(summary.ranks_seen or ()) | set(local_ranks)
    if not universe and expected:
        universe = set(range(expected))
    lagging: dict[str, tuple[int, ...]] = {}
    for marker in _EVERY_RANK_MARKERS:
        arrived = (summary.rank_arrival or {}).get(marker, ())
        missing = tuple(sorted(universe - set(arrived)))
        if arrived and missing:
            lagging[marker] = missing
    missing_lwe = lagging.get("load_weight_end", ())
    lagging_all = sorted({r for ranks in lagging.values() for r in ranks})
    if lagging_all:
        silent = tuple(lagging_all)
    elif state == "stalled":
        silent = tuple(sorted(universe))  # the whole log is silent: so is every rank
    else:
        silent = ()
    return lagging, missing_lwe, silent


def _fmt_ranks(ranks: Iterable[int]) -> str:
    return ", ".join(f"TP{r}" for r in ranks)


@dataclass(frozen=True)
class RuntimeEvidence(HintEvidence):
    """`HintEvidence` plus what only a live session shows; the runtime predicates below read these fields,
    so causes built on them never match a static log (``inspect-log``)."""

    processes: tuple[ProcessReport, ...] = ()
    dumps: Mapping[int, stacks.StackDump] = field(default_factory=dict)
    with_stacks: bool = False


def _schedulers(ev: HintEvidence) -> list[ProcessReport]:
    if not isinstance(ev, RuntimeEvidence):
        return []
    return sorted((p for p in ev.processes if p.role == "scheduler" and p.rank is not None),
                  key=lambda p: p.rank)


def collective_with_rank_elsewhere(ev: HintEvidence) -> Mapping[str, str] | None:
    """Predicate: some ranks wait inside a collective while others (with a stack) are somewhere else."""
    waiting, elsewhere = [], []
    for p in _schedulers(ev):
        if p.stack is None or not p.stack.ok:
            continue
        (waiting if p.stack.collective_frame is not None else elsewhere).append(p)
    if not waiting or not elsewhere:
        return None
    frames = sorted({str(p.stack.collective_frame) for p in waiting})
    return {
        "waiting": _fmt_ranks(p.rank for p in waiting),
        "collective": "; ".join(frames),
        "others": "; ".join(f"TP{p.rank} in {p.stack.blocked_in}" for p in elsewhere),
    }


def all_ranks_in_collective(ev: HintEvidence) -> Mapping[str, str] | None:
    """Predicate: every scheduler rank of this node has a stack and waits in a collective."""
    ranks = _schedulers(ev)
    if len(ranks) < 2 or any(p.stack is None or not p.stack.ok or p.stack.collective_frame is None
                             for p in ranks):
        return None
    frames = sorted({str(p.stack.collective_frame) for p in ranks})
    callers = sorted({_caller_of(p.stack) for p in ranks} - {""})
    return {"ranks": _fmt_ranks(p.rank for p in ranks), "collective": "; ".join(frames),
            "callers": "; ".join(callers) or "?"}


_DISTRIBUTED_MACHINERY = re.compile(r"torch/distributed/|parallel_state\.py|communication_op\.py|pynccl")


def _caller_of(dump: stacks.StackDump) -> str:
    """The first frame outside the collective machinery (torch.distributed, SGLang's parallel_state and
    communicators): what the rank was doing when it entered the collective."""
    seen_collective = False
    for frame in dump.frames:
        if frame.is_collective or _DISTRIBUTED_MACHINERY.search(frame.file):
            seen_collective = seen_collective or frame.is_collective
            continue
        if seen_collective and not frame.is_plumbing:
            return str(frame)
    return ""


def rank_idle_while_others_spin(ev: HintEvidence) -> Mapping[str, str] | None:
    """Predicate: a rank at ~0% CPU while at least one other rank is busy."""
    ranks = [p for p in _schedulers(ev) if p.cpu_percent is not None]
    busy = [p for p in ranks if p.cpu_percent >= SPIN_CPU_PERCENT]
    idle = [p for p in ranks if p.cpu_percent < IDLE_CPU_PERCENT]
    if not busy or not idle:
        return None
    return {"idle": _fmt_ranks(p.rank for p in idle), "busy": _fmt_ranks(p.rank for p in busy)}


def pyspy_permission_denied(ev: HintEvidence) -> Mapping[str, str] | None:
    """Predicate: py-spy is installed but may not attach to the ranks (ptrace)."""
    if not isinstance(ev, RuntimeEvidence):
        return None
    denied = [d for d in ev.dumps.values() if d.error_kind == stacks.PERMISSION]
    if not denied:
        return None
    return {"count": str(len(denied)), "message": denied[0].error or ""}


def pyspy_not_installed(ev: HintEvidence) -> bool:
    """Predicate: stacks were asked for and py-spy is missing."""
    return isinstance(ev, RuntimeEvidence) and ev.with_stacks and ev.pyspy_available is False


def rank_process_not_running(ev: HintEvidence) -> Mapping[str, str] | None:
    """Predicate: a rank or the main process is stopped (T), traced, in D state or a zombie."""
    if not isinstance(ev, RuntimeEvidence):
        return None
    odd = [p for p in ev.processes if p.role in ("main", "scheduler")
           and p.status in ("stopped", "tracing-stop", "disk-sleep", "zombie")]
    if not odd:
        return None
    return {"procs": ", ".join(f"{p.label} (pid {p.pid}) is {p.status}" for p in odd)}


def _match_hints(evidence: RuntimeEvidence) -> list[HintView]:
    """Hints from every ``known_causes*.toml``; a broken catalogue becomes a hint, not a failed diagnosis."""
    from sessions.hints import KnownCausesError, match_hints

    try:
        found = match_hints(evidence)
    except KnownCausesError as exc:
        return [HintView("known-causes-unreadable", "The known-causes catalogue could not be read", str(exc))]
    return [HintView(h.id, h.title, h.detail) for h in found]


def diagnose(
    session: Any,
    with_stacks: bool = True,
    stack_timeout_s: float = DEFAULT_STACK_TIMEOUT_S,
    *,
    cpu_interval_s: float = CPU_INTERVAL_S,
    pyspy: str | None = None,
) -> Diagnosis:
    """Collect everything about ``session`` (a `ServerSession`) now; never raises for what it probes."""
    from sessions import probes

    start = time.monotonic()
    taken_at = time.time()
    status = session.status(probe_http=True)
    problems = [status.problem] if status.problem else []
    try:
        profile = session.profile
    except Exception as exc:  # noqa: BLE001 - a damaged snapshot is reported, the rest is still diagnosed
        profile = None
        problems.append(f"the profile snapshot {Path(session.session_dir) / 'profile.toml'} cannot be read: {exc}")
    server = getattr(profile, "server", None)
    rec = session.state_record
    argv = list(rec.get("argv") or _command_argv(session))
    profile_env = dict(getattr(server, "env", {}) or {})
    environ = _process_environ(status.pid if status.alive else None)
    redactor = _Redactor(
        secret_values(profile_env) + collect_secrets((), environ) + _secret_argv_values(argv), session
    )

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="diagnose") as pool:
        gpu_future = pool.submit(_gpu_snapshot, session, session.home)
        tree = (
            probes.process_tree(status.pid, status.create_time, cpu_interval_s=cpu_interval_s)
            if status.alive and status.pid
            else []
        )
        gpu_snapshot = gpu_future.result()

    pyspy_state = stacks.pyspy_status(pyspy)
    dumps: dict[int, stacks.StackDump] = {}
    if with_stacks and tree:
        dumps = stacks.dump_stacks(_dump_targets(tree), timeout_s=stack_timeout_s, pyspy=pyspy_state.path)

    processes = tuple(
        ProcessReport(
            pid=p.pid,
            title=redactor.text(p.title),
            role=p.role,
            rank=p.rank if p.role == "scheduler" else None,
            status=p.status,
            cpu_percent=p.cpu_percent,
            rss_bytes=p.rss_bytes,
            num_threads=p.num_threads,
            children=tuple(p.children),
            stack=_redact_dump(dumps.get(p.pid), redactor),
        )
        for p in tree
    )
    labels = {p.pid: p.label for p in processes}
    summary: StartupSummary = status.summary
    expected = summary.ranks_expected or getattr(server, "tp_size", None)
    lagging, missing_lwe, silent_ranks = _rank_analysis(
        summary, expected, [p.rank for p in processes if p.role == "scheduler" and p.rank is not None],
        status.state,
    )

    compilers = tuple(
        f"{p.name} (pid {p.pid})" for p in tree if stall.is_compiler_name(p.name)
    )
    schedulers = [p for p in processes if p.role == "scheduler" and p.rank is not None]
    busy = [p for p in schedulers if (p.cpu_percent or 0.0) >= SPIN_CPU_PERCENT]
    idle_ranks = tuple(
        sorted(p.rank for p in schedulers if p.cpu_percent is not None and p.cpu_percent < IDLE_CPU_PERCENT)
    ) if busy else ()
    collective = {
        p.rank: str(p.stack.collective_frame)
        for p in schedulers
        if p.stack is not None and p.stack.ok and p.stack.collective_frame is not None
    }

    last_lines_all = _tail_texts(status.log_path, HINT_LOG_BYTES, follow_symlinks=False)  # ours: never a link
    log_only, progress = split_progress(last_lines_all)
    last_lines = tuple(redactor.text(line) for line in log_only[-LAST_LINES:])
    progress_lines = tuple(redactor.text(line) for line in progress)

    baseline = history.last_good(session.home, status.profile, exclude_session_id=status.session_id)
    compare_text = history.compare(
        baseline, summary, status.phase_entered_at, status.silent_for_s, started_at=status.started_at
    )
    # The table compares with a good start; without one it would be a column of blanks.
    rows = tuple(
        history.compare_rows(baseline, summary, status.phase_entered_at, started_at=status.started_at)
        if baseline is not None and baseline.reached_ready
        else ()
    )

    hint_list = _match_hints(
        RuntimeEvidence(
            log_lines=list(last_lines_all),
            summary=summary,
            stacks={pid: d.text for pid, d in dumps.items() if d.ok},
            argv=argv,
            env={**environ, **profile_env},
            children=[p.name for p in tree if p.role == "other"],
            state=status.state,
            pyspy_available=pyspy_state.available,
            processes=processes,
            dumps=dumps,
            with_stacks=with_stacks and bool(tree),
        )
    )
    seen: set[str] = set()
    unique_hints = []
    for hint in evidence_first(hint_list):
        if hint.id not in seen:
            seen.add(hint.id)
            unique_hints.append(
                HintView(hint.id, redactor.text(hint.title), redactor.text(hint.detail), hint.evidence)
            )

    changes, changes_note = _changes_since_last_good(session, baseline, unique_hints, redactor)
    env_shown = redactor.env({k: v for k, v in ({**environ, **profile_env}).items() if
                              k in profile_env or _RELEVANT_ENV.search(k)})
    return Diagnosis(
        session_id=status.session_id,
        profile=status.profile,
        state=status.state,
        phase=status.phase,
        silent_for_s=status.silent_for_s,
        stall_limit_s=status.stall_limit_s,
        last_lines=last_lines,
        port_listening=status.port_listening,
        ready=status.ready,
        processes=processes,
        gpus=_gpu_reports(gpu_snapshot, labels),
        gpu_source=getattr(gpu_snapshot, "source", "none"),
        gpu_message=getattr(gpu_snapshot, "message", None),
        baseline=baseline,
        hints=tuple(unique_hints),
        compare=compare_text,
        phase_rows=rows,
        ranks_expected=expected,
        silent_ranks=silent_ranks,
        lagging_ranks=lagging,
        missing_load_weight_end=missing_lwe,
        compile_children=compilers,
        idle_ranks=idle_ranks,
        collective_ranks=collective,
        pyspy=pyspy_state,
        with_stacks=with_stacks,
        log_path=str(status.log_path),
        line_count=summary.line_count,
        error=redactor.text(summary.error) if summary.error else None,
        error_line=summary.error_line,
        argv=tuple(redactor.text(a) for a in _redact_argv_values(argv)),
        env=dict(sorted(env_shown.items())),
        taken_at=taken_at,
        collect_s=time.monotonic() - start,
        progress_lines=progress_lines,
        problem="; ".join(problems) if problems else None,
        host=status.host,
        port=status.port,
        changes_since_last_good=changes,
        changes_note=changes_note,
    )


# Conditions that only say "this phase / state" (argv_none: "a flag is absent") fit every session there:
# a hint matched on nothing else is generic advice, listed after the hints this session's evidence backs.
_GENERIC_CONDITIONS = frozenset({"phase_in", "state_in", "argv_none"})
_TQDM_FRAME = re.compile(r"\d{1,3}%\|[^|]*\|\s*\d+/\d+\s*\[")


def evidence_first(hints: Sequence[HintView]) -> list[HintView]:
    """``hints`` with those backed by this session's evidence first (each group in catalogue order)."""
    from sessions.hints import KnownCausesError, load_causes

    try:
        present = {c.id: c.present for c in load_causes()}
    except KnownCausesError:
        present = {}
    marked = []
    for hint in hints:
        keys = present.get(hint.id)
        generic = keys is not None and bool(keys) and keys <= _GENERIC_CONDITIONS
        marked.append(HintView(hint.id, hint.title, hint.detail, evidence=not generic))
    return [h for h in marked if h.evidence] + [h for h in marked if not h.evidence]


def split_progress(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    """(log lines, progress bars): a tqdm frame is not a log line; of each bar only its last frame is
    kept (a bar is named by its description, the text before the percentage)."""
    log_lines: list[str] = []
    bars: dict[str, str] = {}
    for line in lines:
        match = _TQDM_FRAME.search(line)
        if match is None:
            log_lines.append(line)
            continue
        bars.pop(line[: match.start()].strip(), None)
        bars[line[: match.start()].strip()] = line
    return log_lines, list(bars.values())


def _changes_since_last_good(
    session: Any, baseline: history.Baseline | None, hints: Sequence[HintView], redactor: _Redactor
) -> tuple[tuple[start_facts.Change, ...] | None, str | None]:
    """The changes from the last good start to this one, each marked with the known causes naming it."""
    if baseline is None:
        return None, "no earlier start of this profile reached ready: nothing to compare with"
    facts = start_facts.read(Path(getattr(session, "session_dir", "") or "."))
    if facts is None:
        return None, "this start's settings were not recorded (launched by an older eagle3-tui)"
    if not baseline.facts:
        return None, (f"the last good start ({baseline.session_id}) was recorded before settings were kept: "
                      "its flags and environment are not known")
    from sessions.hints import KnownCausesError, implications

    try:
        rules = implications()
    except KnownCausesError:
        rules = []  # the broken catalogue is a hint already; the changes are still worth showing
    changes = history.changes_since(baseline, facts, rules, [h.id for h in hints])
    cleaned = tuple(
        start_facts.Change(c.what, redactor.text(c.before) if c.before is not None else None,
                           redactor.text(c.after) if c.after is not None else None, c.kind, c.name,
                           c.implicated_by, c.hinted_by)
        for c in changes
    )
    return cleaned, None if cleaned else f"nothing changed since the last good start ({baseline.session_id})"


def _redact_argv_values(argv: Sequence[str]) -> list[str]:
    from sessions.redaction import redact_argv

    return redact_argv(argv)


def _command_argv(session: Any) -> list[str]:
    try:
        data = json.loads((Path(session.session_dir) / "command.json").read_text())
        return [str(a) for a in data.get("argv", [])]
    except (OSError, ValueError, AttributeError):
        return []


def _redact_dump(dump: stacks.StackDump | None, redactor: _Redactor) -> stacks.StackDump | None:
    if dump is None:
        return None
    from dataclasses import replace

    return replace(
        dump,
        text=redactor.text(dump.text),
        error=redactor.text(dump.error) if dump.error else None,
    )


# --- text report and bundle -----------------------------------------------------------------------------


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / (1 << 20):,.0f} MiB"


def format_report(d: Diagnosis) -> str:
    """The human report (CLI default output, ``report.txt`` in the bundle)."""
    out = [d.headline]
    if d.problem:
        out.append(f"problem: {d.problem}")
    out += [
        f"port {'listening' if d.port_listening else 'closed'}; /ready: "
        + {True: "200", False: "not ready", None: "not asked (port closed)"}[d.ready],
        d.compare,
    ]
    out.extend(format_changes(d))
    if d.error:
        out.append(f"first error (line {d.error_line}): {d.error}")
    if d.silent_ranks:
        out.append(f"silent ranks: {_fmt_ranks(d.silent_ranks)}")
    if d.missing_load_weight_end:
        out.append(f"missing from Load weight end: {_fmt_ranks(d.missing_load_weight_end)}")
    out.append("")
    out.append(f"{'proc':<12} {'pid':>7} {'status':<10} {'cpu%':>6} {'rss':>10} {'thr':>4}  blocked in")
    for p in d.processes:
        cpu = "n/a" if p.cpu_percent is None else f"{p.cpu_percent:.0f}"
        if p.stack is None:
            where = "" if p.role == "other" else "(no stack taken)"
        elif p.stack.ok:
            where = str(p.stack.blocked_in or "?")
        else:
            where = f"[{p.stack.error_kind}] {p.stack.error}"
        name = p.label if p.role != "other" else (p.title.split(" ")[0].rsplit("/", 1)[-1] or "?")
        # SGLang's own children are rows of the table already; name only the others (compilers, helpers).
        others = [c for c in p.children if not c.startswith("sglang::")]
        children = f"  children: {', '.join(others)}" if others else ""
        out.append(
            f"{name[:12]:<12} {p.pid:>7} {p.status[:10]:<10} {cpu:>6} {_mib(p.rss_bytes):>10} "
            f"{p.num_threads if p.num_threads is not None else 'n/a':>4}  {where}{children}"
        )
    if not d.processes:
        out.append("(no live processes)")
    out.append("")
    if d.gpus:
        out.append(f"GPUs ({d.gpu_source}{': ' + d.gpu_message if d.gpu_message else ''}):")
        for g in d.gpus:
            procs = ", ".join(f"{p.label or p.pid} {_mib(p.used_bytes)}" for p in g.processes)
            out.append(f"  GPU{g.index} {_mib(g.memory_used_bytes)} / {_mib(g.memory_total_bytes)}  {procs}")
    else:
        out.append(f"GPUs: {d.gpu_message or 'no readings'}")
    if d.has_baseline and d.phase_rows:
        out.append("")
        out.append(f"{'phase':<22} {'good start':>16} {'this start':>16}")
        for row in d.phase_rows:
            out.append(f"{row.phase:<22} {_at(row.good_at_s, row.good_line):>16} {_at(row.this_at_s, row.this_line):>16}")
    for title, group in (
        ("hints from this session's evidence:", [h for h in d.hints if h.evidence]),
        ("other possible causes in this phase (generic):", [h for h in d.hints if not h.evidence]),
    ):
        if not group:
            continue
        out.append("")
        out.append(title)
        for h in group:
            out.append(f"  [{h.id}] {h.title}")
            if h.detail:
                out.append(f"      {h.detail}")
    if d.progress_lines:
        out.append("")
        out.append("progress bars (last frame of each):")
        out.extend(f"  {line}" for line in d.progress_lines[-5:])
    if d.last_lines:
        out.append("")
        out.append("last log lines:")
        out.extend(f"  {line}" for line in d.last_lines[-10:])
    return "\n".join(out) + "\n"


def _at(at_s: float | None, line: int | None) -> str:
    if at_s is None and line is None:
        return "-"
    when = history.format_duration_s(at_s) if at_s is not None else "?"
    return f"{when} (line {line})" if line is not None else when


def format_changes(d: Diagnosis) -> list[str]:
    """The "what changed since the last good start" lines: implicated changes first, each with the known
    causes that name it (``*`` marks a cause that matches this start now)."""
    if d.changes_since_last_good is None or not d.changes_since_last_good:
        return [f"changes since the last good start: {d.changes_note}"] if d.changes_note else []
    base = d.baseline.session_id if d.baseline else "?"
    out = [f"changes since the last good start ({base}):"]
    for c in d.changes_since_last_good:
        line = f"  {'!' if c.implicated_by else '-'} {c.describe()}"
        if c.implicated_by:
            causes = ", ".join(f"{i}*" if i in c.hinted_by else i for i in c.implicated_by)
            line += f"   [known causes: {causes}]"
        out.append(line)
    if any(c.implicated_by for c in d.changes_since_last_good):
        out.append("  (! = a known cause points at this change; * = that cause matches this start now)")
    return out


def _stack_file_name(p: ProcessReport) -> str:
    return f"stacks/{p.label}-{p.pid}.txt"


def write_bundle(diagnosis: Diagnosis, session: Any, path: str | Path) -> Path:
    """Write a tar.gz (0600) with the diagnosis, report, log tail, stacks, profile, command and env.

    Every file is redacted again on the way in, with the secrets known from the profile env, the server's
    environment and its argv.  ``path`` may be a folder: the bundle is named after the session then.
    """
    target = Path(path)
    if target.is_dir():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(diagnosis.taken_at or time.time()))
        target = target / f"eagle3-diagnosis-{diagnosis.session_id}-{stamp}.tar.gz"
    try:
        profile_env = dict(getattr(getattr(session.profile, "server", None), "env", {}) or {})
    except Exception:  # noqa: BLE001 - a damaged snapshot: the diagnosis already says so
        profile_env = {}
    # Only a live, verified (pid, create_time) is read: a reused pid would leak a stranger's environment.
    environ = _process_environ(session.pid) if session.is_alive() else {}
    argv = _command_argv(session)
    redactor = _Redactor(secret_values(profile_env) + collect_secrets((), environ) + _secret_argv_values(argv),
                         session)
    session_dir = Path(session.session_dir)

    files: dict[str, str] = {
        "diagnosis.json": json.dumps(diagnosis.to_json(), indent=2, sort_keys=True) + "\n",
        "report.txt": format_report(diagnosis),
        "server.log.tail": "\n".join(
            _tail_texts(Path(diagnosis.log_path), BUNDLE_LOG_BYTES, follow_symlinks=False)  # no symlink followed
        ) + "\n",
        "env.txt": "".join(f"{k}={v}\n" for k, v in sorted(diagnosis.env.items())),
    }
    for name in ("profile.toml", "command.json", "state.json"):
        # Regular files only, never through a link: a planted symlink must not carry /etc/shadow into the tar.
        try:
            files[name] = read_regular_text(session_dir / name, name, nofollow=True, errors="replace")
        except SpecialFileError as exc:
            files[f"{name}.refused"] = f"{exc.strerror}\n"
        except OSError:
            pass
    for p in diagnosis.processes:
        if p.stack is not None:
            files[_stack_file_name(p)] = (
                p.stack.text if p.stack.ok else f"no stack: [{p.stack.error_kind}] {p.stack.error}\n"
            )

    buffer = io.BytesIO()
    now = time.time()
    prefix = f"eagle3-diagnosis-{diagnosis.session_id}"
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = redactor.text(text).encode("utf-8")
            info = tarfile.TarInfo(f"{prefix}/{name}")
            info.size = len(data)
            info.mode = 0o600
            info.mtime = int(now)
            tar.addfile(info, io.BytesIO(data))
    atomic_write_bytes(target, buffer.getvalue(), mode=0o600)
    return target


def default_bundle_path(session: Any, taken_at: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(taken_at or time.time()))
    return Path(session.session_dir) / f"diagnosis-{stamp}.tar.gz"

