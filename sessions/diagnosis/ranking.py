"""The order of a diagnosis's hints: what this start's evidence says first, general advice last (issue 21).

Every matched hint gets a rank from what made its cause match (`sessions.hints.KnownCause.triggers` and
`.observed`) and from what changed since the baseline (`sessions.baseline`):

1. ``changed``   a setting the cause needs or names (its triggers, its ``implicates``) differs from the
                 baseline: the likeliest suspect, first (a cause that fired on that setting before the
                 causes that only name it);
2. ``observed``  matched on something this session did (a log line, a stack, a child, a check on them);
3. ``setting``   matched on a setting alone, with no baseline to judge it by;
4. ``unchanged`` matched on a setting alone that the good start had too: it did not fail because of it,
                 so the hint is demoted and says so ("the good start of kimi-k25-tp8 at 22:10 also used
                 --attention-backend flashinfer");
5. ``generic``   matched on the phase or state only: general advice, true of every start there.

Within a rank the catalogue's order is kept.  This is one rule over the catalogue's data: no hint is
special-cased.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sessions import start_facts
from sessions.baseline import BaselineChoice
from sessions.diagnosis.model import HintView

RANKS = ("changed", "observed", "setting", "unchanged", "generic")
# The three groups a diagnosis shows its hints in (the report and the TUI's screen): what this start's
# evidence backs, what its baseline speaks against (the good start had the same settings), general advice.
EVIDENCE_RANKS = ("changed", "observed", "setting")
DEMOTED_RANKS = ("unchanged",)
ADVICE_RANKS = ("generic",)
_SETTING_KINDS = ("flag", "env", "cuda_visible_devices")


def _names_change(change: start_facts.Change, patterns: Sequence[str]) -> bool:
    return change.kind in _SETTING_KINDS and any(fnmatch.fnmatchcase(change.name, p) for p in patterns)


def _baseline_values(triggers: Sequence[str], argv_none: Sequence[str], facts: Mapping[str, Any]) -> list[str]:
    """How the baseline stood on each trigger: "--attention-backend flashinfer", "no --disable-x", "NCCL_X=1"."""
    flags, _ = start_facts.parse_flags([str(a) for a in facts.get("argv") or []])
    env = facts.get("env") or {}
    absent_ok = {f.partition("=")[0] for f in argv_none}
    said = []
    for name in triggers:
        if name.startswith("-"):
            value = flags.get(name)
            if value is not None:
                said.append(name if value == "(set)" else f"{name} {value}")
            elif name in absent_ok:
                said.append(f"no {name}")
        else:
            hits = sorted(k for k in env if fnmatch.fnmatchcase(k, name))
            said += [f"{k}={env[k]}" for k in hits] or ([f"no {name}"] if not any(c in name for c in "*?") else [])
    return said


def rank_hints(hints: Sequence[HintView], changes: Sequence[start_facts.Change] | None,
               baseline: BaselineChoice | None) -> list[HintView]:
    """``hints`` with their rank and reason filled in, best first (see the module docstring).

    ``changes`` are those since ``baseline`` (None: unknown, e.g. no baseline or no recorded settings)."""
    from sessions.hints import KnownCausesError, load_causes

    try:
        causes = {c.id: c for c in load_causes()}
    except KnownCausesError:
        causes = {}
    facts = baseline.record.facts if baseline is not None else None
    judged = changes is not None and bool(facts)
    ranked: list[tuple[int, int, HintView]] = []  # (rank, 0 when its own triggers changed, hint)
    for hint in hints:
        cause = causes.get(hint.id)
        if cause is None:  # not from the catalogue (the catalogue's own error): what this session shows
            ranked.append((RANKS.index("observed"), 1, replace(hint, rank="observed", evidence=True)))
            continue
        triggers = cause.triggers
        changed = [c for c in changes or () if _names_change(c, (*triggers, *cause.implicates))]
        why: str | None = None
        if judged and changed:
            rank = "changed"
            why = "changed since the baseline: " + "; ".join(c.describe() for c in changed)
        elif cause.observed:
            rank = "observed"
        elif not triggers:
            rank = "generic"
        elif judged and facts is not None and baseline is not None:
            rank = "unchanged"
            values = _baseline_values(triggers, cause.argv_none, facts) or ["the same settings"]
            why = (f"the good start of {baseline.record.profile} at {baseline.when} also used "
                   f"{', '.join(values)}, so that is not what changed")
        else:
            rank = "setting"
        own = 0 if any(_names_change(c, triggers) for c in changed) else 1
        ranked.append((RANKS.index(rank), own, replace(hint, rank=rank, why=why, evidence=rank != "generic")))
    # stable: catalogue order within a rank; a hint that fired on the changed setting before those naming it
    return [hint for _, _, hint in sorted(ranked, key=lambda item: item[:2])]


def evidence_first(hints: Sequence[HintView]) -> list[HintView]:
    """``hints`` ranked without a baseline: observed evidence first, general advice last."""
    return rank_hints(hints, None, None)
