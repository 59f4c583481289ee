"""Which good start a failed start is compared with, and how it is named (DESIGN §4, issue 21).

The baseline of a start is, in order:

1. the last good start (one that reached ready) of the same profile;
2. failing that, the last good start of any profile that ran the same model (the sha256 of its
   ``config.json``), the same TP/PP/DP sizes and the same SGLang version: a new profile made to chase a
   hang is compared with the profile that works;
3. or a start picked by hand (``eagle3-tui diagnose SESSION --baseline SESSION2``, ``p`` on the
   diagnosis screen), which must have reached ready.

`BaselineChoice.describe` names it in the words the report uses ("baseline: good start of kimi-k25-tp8
at 22:10, same model, TP/PP/DP and SGLang version"), so a reader knows what the changes are relative to.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessions.history import StartRecord, all_records, last_good
from sessions.home import Home
from sessions.start_facts import argv_value

# SGLang's flags for each parallel size (server_args.py: the long name and its short alias).
_SIZE_FLAGS = {
    "tp": ("--tp-size", "--tensor-parallel-size"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "dp": ("--dp-size", "--data-parallel-size"),
}
SAME_SHAPE = "same model, TP/PP/DP and SGLang version"
MAX_CANDIDATES = 30


class BaselineError(ValueError):
    """A baseline asked for by hand cannot be used; the message names the session and why."""


@dataclass(frozen=True)
class StartShape:
    """What two starts must share to be compared although their profiles differ."""

    model_config_sha256: str | None
    tp: str
    pp: str
    dp: str
    sglang_version: str | None

    @classmethod
    def of(cls, facts: Mapping[str, Any] | None) -> StartShape | None:
        """The shape of a start from its recorded facts (`sessions.start_facts`); None without facts."""
        if not facts:
            return None
        argv = [str(a) for a in facts.get("argv") or []]
        sizes = {k: argv_value(argv, *flags) or "1" for k, flags in _SIZE_FLAGS.items()}
        return cls(facts.get("model_config_sha256"), sizes["tp"], sizes["pp"], sizes["dp"],
                   facts.get("sglang_version"))

    def matches(self, other: StartShape | None) -> bool:
        """Same model, sizes and version; an unknown model hash or version never matches."""
        return (
            other is not None
            and self.model_config_sha256 is not None
            and self.sglang_version is not None
            and self == other
        )

    @property
    def sizes(self) -> str:
        return f"TP{self.tp}" + (f" PP{self.pp}" if self.pp != "1" else "") + (f" DP{self.dp}" if self.dp != "1" else "")


@dataclass(frozen=True)
class BaselineChoice:
    """A good start to compare with, and why it was picked: ``how`` is ``profile`` (the last good start
    of this profile), ``same-shape`` (of another profile with the same model, sizes and version) or
    ``chosen`` (picked by hand)."""

    record: StartRecord
    how: str
    same_shape: bool = False  # (for ``chosen``): it also has this start's model, sizes and version

    @property
    def when(self) -> str:
        return start_time_text(self.record.started_at or self.record.recorded_at)

    def describe(self, with_id: bool = True) -> str:
        """"good start of kimi-k25-tp8 at 22:10, same model, TP/PP/DP and SGLang version (<session id>)"."""
        where = f"good start of {self.record.profile} at {self.when}"
        if self.how == "profile":
            text = f"the last {where} (this profile)"
        elif self.how == "same-shape":
            text = f"{where}, {SAME_SHAPE}"
        else:
            text = f"{where}, picked by hand" + (f", {SAME_SHAPE}" if self.same_shape else "")
        return text + (f" ({self.record.session_id})" if with_id else "")

    def to_json(self) -> dict[str, Any]:
        return {"session_id": self.record.session_id, "profile": self.record.profile, "how": self.how,
                "same_shape": self.same_shape, "started_at": self.record.started_at,
                "description": self.describe()}


def start_time_text(epoch: float | None) -> str:
    """``22:10`` today, ``2026-11-30 22:10`` on another day, ``?`` unknown (local time, as logs are)."""
    if epoch is None:
        return "?"
    local = time.localtime(epoch)
    if time.strftime("%Y-%m-%d", local) == time.strftime("%Y-%m-%d", time.localtime()):
        return time.strftime("%H:%M", local)
    return time.strftime("%Y-%m-%d %H:%M", local)


def _newest_first(records: list[StartRecord]) -> list[StartRecord]:
    return sorted(records, key=lambda r: r.started_at or r.recorded_at or 0.0, reverse=True)


def good_starts(home: Home, exclude_session_id: str | None = None) -> list[StartRecord]:
    """Every start of every profile that reached ready, newest first."""
    return _newest_first(
        [r for r in all_records(home) if r.reached_ready and r.session_id != exclude_session_id]
    )


def choose_baseline(home: Home, profile: str, session_id: str | None,
                    facts: Mapping[str, Any] | None) -> BaselineChoice | None:
    """The baseline of a start of ``profile`` that ran with ``facts`` (see the module docstring)."""
    own = last_good(home, profile, exclude_session_id=session_id)
    if own is not None:
        return BaselineChoice(own, "profile")
    shape = StartShape.of(facts)
    if shape is None:
        return None
    for record in good_starts(home, exclude_session_id=session_id):
        if shape.matches(StartShape.of(record.facts)):
            return BaselineChoice(record, "same-shape")
    return None


def find_start(home: Home, ref: str) -> StartRecord:
    """The recorded start whose session id is ``ref`` or starts with it (any profile); `BaselineError`
    when there is none, several, or it never reached ready."""
    ref = ref.strip()
    if not ref:
        raise BaselineError("--baseline: empty session id")
    records = {r.session_id: r for r in all_records(home)}
    if ref in records:
        found = records[ref]
    else:
        hits = sorted(sid for sid in records if sid.startswith(ref))
        if not hits:
            raise BaselineError(f"--baseline {ref}: no recorded start has that session id (the history under "
                                f"{home.history_dir} keeps the starts that ended or reached ready)")
        if len(hits) > 1:
            raise BaselineError(f"--baseline {ref}: the prefix fits {len(hits)} starts ({', '.join(hits[:5])}); "
                                "give more of the id")
        found = records[hits[0]]
    if not found.reached_ready:
        raise BaselineError(f"--baseline {ref}: start {found.session_id} of {found.profile} never reached ready "
                            f"(outcome {found.outcome}): a baseline must be a good start")
    return found


def chosen_baseline(home: Home, ref: str, facts: Mapping[str, Any] | None) -> BaselineChoice:
    """The baseline picked by hand (``--baseline``); raises `BaselineError` as `find_start` does."""
    record = find_start(home, ref)
    shape = StartShape.of(facts)
    return BaselineChoice(record, "chosen", same_shape=shape is not None and shape.matches(StartShape.of(record.facts)))


def candidates(home: Home, profile: str, session_id: str | None,
               facts: Mapping[str, Any] | None) -> list[BaselineChoice]:
    """The good starts a user may pick from: this profile's first, then those of the same model, sizes and
    version, then the rest; each group newest first, at most `MAX_CANDIDATES`."""
    shape = StartShape.of(facts)
    picked: list[tuple[int, BaselineChoice]] = []
    for record in good_starts(home, exclude_session_id=session_id):
        same = shape is not None and shape.matches(StartShape.of(record.facts))
        group = 0 if record.profile == profile else (1 if same else 2)
        picked.append((group, BaselineChoice(record, "chosen", same_shape=same)))
    picked.sort(key=lambda item: item[0])  # stable: newest first within each group
    return [choice for _, choice in picked[:MAX_CANDIDATES]]
