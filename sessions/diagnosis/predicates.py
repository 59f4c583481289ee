"""The causes only a live process tree shows, as known-causes predicates (``check = "..."`` in
``sessions/data/known_causes_runtime.toml``): a rank stuck in a collective while the others are elsewhere,
a rank idle while the others spin, a process stopped or in D state, py-spy missing or not allowed.

They read `RuntimeEvidence`, so causes built on them never match a static log (``inspect-log``).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sessions import stacks
from sessions.diagnosis.model import IDLE_CPU_PERCENT, SPIN_CPU_PERCENT, ProcessReport, _fmt_ranks
from sessions.hints import HintEvidence


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


