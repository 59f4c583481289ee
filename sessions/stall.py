"""When a starting server counts as stalled (DESIGN §3 `state`, §4).

SGLang has no startup hang detector (sglang-facts §6), so the panel decides: a session is stalled when
it is not ready and its log has been silent longer than a limit.  The limit knows the phases whose
silence is legitimate:

* weight loading of a 1T model takes tens of minutes, but rank 0's tqdm bar redraws while shards load
  (sglang/srt/model_loader/weight_utils.py:1369-1375), so ``silent_for_s`` — seconds since the log last
  grew by any byte, ``\\r`` redraws included — stays small and a moving bar is never stalled;
* DeepGEMM's JIT pre-compile is "typically 10-20 mins" and says so in the log
  (sglang/srt/layers/deep_gemm_wrapper/compile_utils.py:168-183): it gets `DEEPGEMM_LIMIT_S`;
* flashinfer's JIT compiles in a child process (ninja, nvcc, cc1plus, cicc): while one is alive the
  start is working, not stalled (hang-catalog row 4), up to `COMPILE_LIMIT_S` of silence (a compiler
  that has printed nothing for an hour is itself stuck, e.g. on a stale lock);
* with a baseline (the last good start of the profile), a phase may stay silent up to
  `BASELINE_FACTOR` times as long as it took then.

All seconds are wall-clock seconds, never scaled by the emulator's time scale (DESIGN §3).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessions.history import Baseline, format_duration_s
from sessions.phases import StartupPhase, StartupSummary

DEFAULT_STALL_AFTER_S = 300.0
DEEPGEMM_LIMIT_S = 30 * 60.0  # "typically 10-20 mins" plus margin for the slowest node
BASELINE_FACTOR = 2.0
COMPILE_LIMIT_S = 3600.0  # finite, so the limit stays a JSON number

# Processes that mean "a JIT compile is running" (flashinfer / torch extensions / triton / DeepGEMM).
COMPILER_NAMES = frozenset(
    {"ninja", "nvcc", "cc1plus", "cc1", "cicc", "ptxas", "nvlink", "fatbinary", "cudafe++", "c++", "g++",
     "gcc", "cc", "clang", "clang++", "ld", "ld.lld", "hipcc"}
)
_DEEPGEMM_RE = re.compile(r"deep_?gemm", re.IGNORECASE)


@dataclass(frozen=True)
class StallVerdict:
    """Whether a session is stalled, the limit used, and why that limit (for the status line)."""

    stalled: bool
    limit_s: float
    silent_for_s: float
    reason: str


def is_compiler_name(name: str) -> bool:
    """True for a compiler/build-tool process name or argv[0] (a path is reduced to its file name)."""
    base = name.strip().split()[0].rsplit("/", 1)[-1] if name.strip() else ""
    return base in COMPILER_NAMES


def deepgemm_active(summary: StartupSummary | None, last_lines: Sequence[str] = ()) -> bool:
    """The start is inside DeepGEMM's JIT: the tracker's current progress or the latest lines say so."""
    if summary is not None and summary.progress is not None and _DEEPGEMM_RE.search(summary.progress.label):
        return True
    recent = [line for line in last_lines if line.strip()][-3:]
    return any(_DEEPGEMM_RE.search(line) for line in recent)


def _stall_after_s(profile: Any) -> float:
    watch = getattr(profile, "watch", None)
    value = getattr(watch, "stall_after_s", None)
    return DEFAULT_STALL_AFTER_S if value is None else float(value)


def _verdict_limit(
    profile: Any,
    summary: StartupSummary | None,
    baseline: Baseline | None,
    has_compile_child: bool,
    last_lines: Sequence[str],
) -> tuple[float, str]:
    base = _stall_after_s(profile)
    if base <= 0:
        return math.inf, "stall detection is off (stall_after_s <= 0)"
    limit, reason = base, f"stall_after_s={base:g}"
    if has_compile_child and COMPILE_LIMIT_S > limit:
        limit, reason = COMPILE_LIMIT_S, "a compiler child is alive (JIT compile in progress)"
    if deepgemm_active(summary, last_lines) and DEEPGEMM_LIMIT_S > limit:
        limit, reason = DEEPGEMM_LIMIT_S, "DeepGEMM JIT pre-compile (typically 10-20 min)"
    if baseline is not None and summary is not None:
        took_s = baseline.phase_duration_s(summary.phase)
        if took_s is not None and BASELINE_FACTOR * took_s > limit:
            limit = BASELINE_FACTOR * took_s
            reason = f"the good start spent {format_duration_s(took_s)} in {summary.phase}"
    return limit, reason


def stall_limit_s(
    profile: Any,
    summary: StartupSummary | None,
    baseline: Baseline | None,
    has_compile_child: bool,
    *,
    last_lines: Sequence[str] = (),
) -> float:
    """Seconds of log silence after which this start counts as stalled (``math.inf``: never).

    ``max(stall_after_s, 2 x the good start's time in this phase)``, at least `DEEPGEMM_LIMIT_S` inside
    DeepGEMM's JIT, at least `COMPILE_LIMIT_S` while a compiler child is alive, and ``math.inf`` when
    ``stall_after_s <= 0`` (stall detection off).
    ``last_lines`` (optional) are the log's latest lines, for DeepGEMM markers the tracker may not report.
    """
    return _verdict_limit(profile, summary, baseline, has_compile_child, last_lines)[0]


def _finished(summary: StartupSummary | None, ready: bool | None) -> bool:
    if ready is True:
        return True
    if summary is None:
        return False
    # Ready servers go quiet when idle; a crashed start is "crashed", not "stalled".
    return summary.phase == StartupPhase.READY or summary.outcome in ("ready", "crashed")


def stall_verdict(
    profile: Any,
    summary: StartupSummary | None,
    silent_for_s: float,
    ready: bool | None,
    baseline: Baseline | None,
    has_compile_child: bool,
    *,
    last_lines: Sequence[str] = (),
) -> StallVerdict:
    """Whether this start is stalled: not over (ready or crashed) and silent beyond `stall_limit_s`.

    ``limit_s`` is the limit of the start's phase even once it is over (a status still shows it).
    """
    limit, reason = _verdict_limit(profile, summary, baseline, has_compile_child, last_lines)
    if _finished(summary, ready):
        return StallVerdict(False, limit, silent_for_s, "the start is over (ready or crashed)")
    return StallVerdict(silent_for_s > limit, limit, silent_for_s, reason)
