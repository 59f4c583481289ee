"""Hang diagnosis of one server session: a snapshot, hints, and a bundle (DESIGN §4).

`diagnose(session)` collects, in a couple of seconds, what the seeds spent an hour gathering by hand: the
phase and how long the log has been silent, the last lines, the process tree (CPU, RSS, threads, compiler
children), the port and ``/ready``, GPU memory per process, the py-spy stack of every rank (in parallel,
each with a timeout), the comparison with a baseline (the last good start of the same profile, else of
the same model and sizes: `sessions.baseline`), and hints from the
data-driven catalogue (``sessions/data/known_causes*.toml``) plus the causes only a live process tree can
show: a rank stuck in an NCCL collective while the others are elsewhere, a rank idle while the others
spin, ranks missing from ``Load weight end``, a compiler child at work, py-spy missing or not allowed.

Everything in a `Diagnosis` is already redacted (profile env values whose names look secret, values after
secret flags, credential-shaped strings), so the CLI, the screen and `write_bundle` can show it as is.

* `sessions.diagnosis.model`: `Diagnosis` and its parts (data only);
* `sessions.diagnosis.evidence`: each piece of evidence (secrets, env, log tail, GPUs, ranks, hints, changes);
* `sessions.diagnosis.predicates`: `RuntimeEvidence` and the runtime known-causes predicates;
* `sessions.diagnosis.collect`: `diagnose`, which gathers them into one `Diagnosis`;
* `sessions.diagnosis.ranking`: the order of the hints (changed since the baseline first, advice last);
* `sessions.diagnosis.report` and `sessions.diagnosis.bundle`: the text report and the tar.gz bundle;
* `sessions.diagnosis.stall_report`: `save_stall_report`, the report a stall saves once in the session.

The names below are the package's public ones; ``from sessions.diagnosis import ...`` is the way in.
"""

from sessions.diagnosis.bundle import default_bundle_path, write_bundle
from sessions.diagnosis.collect import diagnose
from sessions.diagnosis.evidence import split_progress
from sessions.diagnosis.model import (
    BUNDLE_LOG_BYTES,
    CPU_INTERVAL_S,
    DEFAULT_STACK_TIMEOUT_S,
    HINT_LOG_BYTES,
    IDLE_CPU_PERCENT,
    LAST_LINES,
    SPIN_CPU_PERCENT,
    Diagnosis,
    GpuProcessReport,
    GpuReport,
    HintView,
    ProcessReport,
)
from sessions.diagnosis.predicates import (
    RuntimeEvidence,
    all_ranks_in_collective,
    collective_with_rank_elsewhere,
    pyspy_not_installed,
    pyspy_permission_denied,
    rank_idle_while_others_spin,
    rank_process_not_running,
)
from sessions.diagnosis.ranking import RANKS, evidence_first, rank_hints
from sessions.diagnosis.report import format_changes, format_report
from sessions.diagnosis.stall_report import save_stall_report, stall_report_path

__all__ = [
    "BUNDLE_LOG_BYTES",
    "CPU_INTERVAL_S",
    "DEFAULT_STACK_TIMEOUT_S",
    "HINT_LOG_BYTES",
    "IDLE_CPU_PERCENT",
    "LAST_LINES",
    "RANKS",
    "SPIN_CPU_PERCENT",
    "Diagnosis",
    "GpuProcessReport",
    "GpuReport",
    "HintView",
    "ProcessReport",
    "RuntimeEvidence",
    "all_ranks_in_collective",
    "collective_with_rank_elsewhere",
    "default_bundle_path",
    "diagnose",
    "evidence_first",
    "format_changes",
    "format_report",
    "pyspy_not_installed",
    "pyspy_permission_denied",
    "rank_hints",
    "rank_idle_while_others_spin",
    "rank_process_not_running",
    "save_stall_report",
    "split_progress",
    "stall_report_path",
    "write_bundle",
]
