"""Past starts of each profile, and the baseline a new start is compared with (DESIGN §4).

One JSON object per start in ``<home.history_dir>/<profile>.jsonl`` (0600, rewritten atomically under a
lock, at most `MAX_RECORDS` kept): when each phase was entered (wall-clock seconds from launch and the log
line number), the outcome and the line count.  `last_good` is the latest start that reached ready;
`compare` turns it into the sentence that took the seeds an hour to assemble by hand: "the good start
reached ready at line 641 after 6m12s; this one stopped at line 217 in weights_loaded, silent for 12m".
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions import safe_files, start_facts
from sessions.home import Home, atomic_write_text, ensure_private_dir
from sessions.phases import StartupPhase, StartupSummary
from sessions.redaction import redact_record

RECORD_VERSION = 1
MAX_RECORDS = 200  # per profile; the oldest go first

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_LOG_TIME_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f")


@dataclass(frozen=True)
class PhaseMark:
    """When one start entered ``phase``: seconds from launch and the 1-based log line (either may be None)."""

    phase: str
    at_s: float | None
    line: int | None

    def to_json(self) -> dict:
        return {"phase": self.phase, "at_s": self.at_s, "line": self.line}


@dataclass(frozen=True)
class StartRecord:
    """One start of a profile as kept in its history file."""

    session_id: str
    profile: str
    outcome: str  # "ready", "crashed", "stalled", "stopped", "exited", "incomplete", ...
    line_count: int
    phases: tuple[PhaseMark, ...]  # in phase order
    started_at: float | None = None
    recorded_at: float | None = None
    # What the start ran with (`sessions.start_facts`: command, env, versions, GPUs, ...), redacted; None
    # for records written before these were kept.
    facts: dict[str, Any] | None = None
    # The crash, as the exception that raised it and its rank (`sessions.phases.error_headline`), redacted
    error: str | None = None

    def mark(self, phase: str | StartupPhase) -> PhaseMark | None:
        name = str(phase)
        for mark in self.phases:
            if mark.phase == name:
                return mark
        return None

    @property
    def reached_ready(self) -> bool:
        return self.outcome == "ready" or self.mark(StartupPhase.READY) is not None

    @property
    def ready_line(self) -> int | None:
        """The log line of ready; when ready was seen over HTTP before the log said so, the line count."""
        mark = self.mark(StartupPhase.READY)
        if mark is None:
            return None
        return mark.line if mark.line is not None else (self.line_count or None)

    @property
    def ready_after_s(self) -> float | None:
        mark = self.mark(StartupPhase.READY)
        return mark.at_s if mark else None

    def phase_duration_s(self, phase: str | StartupPhase) -> float | None:
        """Seconds this start spent in ``phase``: from entering it to entering the next phase it reached."""
        name = str(phase)
        for i, mark in enumerate(self.phases):
            if mark.phase != name:
                continue
            if mark.at_s is None or i + 1 >= len(self.phases):
                return None
            following = self.phases[i + 1].at_s
            return None if following is None else max(0.0, following - mark.at_s)
        return None

    def to_json(self) -> dict:
        return {
            "v": RECORD_VERSION,
            "session_id": self.session_id,
            "profile": self.profile,
            "outcome": self.outcome,
            "line_count": self.line_count,
            "started_at": self.started_at,
            "recorded_at": self.recorded_at,
            "phases": [m.to_json() for m in self.phases],
            **({"facts": self.facts} if self.facts else {}),
            **({"error": self.error} if self.error else {}),
        }

    @classmethod
    def from_json(cls, obj: Mapping) -> StartRecord:
        """A record from one parsed line, its fields checked (`sessions.safe_files`' typed fields): a
        field of the wrong type is left out, a line without a session id is a ValueError (skipped)."""
        if not isinstance(obj, Mapping):
            raise TypeError("not a JSON object")
        session_id = safe_files.text(obj.get("session_id"), 255)
        if not session_id:
            raise ValueError("no session_id")
        raw_phases = obj.get("phases")
        phases = tuple(
            PhaseMark(p["phase"], safe_files.finite(p.get("at_s"), 0.0), safe_files.integer(p.get("line"), 0))
            for p in (raw_phases if isinstance(raw_phases, list) else ())
            if isinstance(p, Mapping) and isinstance(p.get("phase"), str)
        )
        facts = obj.get("facts")
        return cls(
            session_id=session_id,
            profile=safe_files.text(obj.get("profile"), 255) or "",
            outcome=safe_files.text(obj.get("outcome"), 64) or "incomplete",
            line_count=safe_files.integer(obj.get("line_count"), 0) or 0,
            phases=_in_phase_order(phases),
            started_at=safe_files.epoch(obj.get("started_at")),
            recorded_at=safe_files.epoch(obj.get("recorded_at")),
            facts=start_facts.checked(facts) if isinstance(facts, dict) else None,
            error=safe_files.text(obj.get("error"), 4096),
        )


# The last good start: a StartRecord that reached ready.
Baseline = StartRecord


@dataclass(frozen=True)
class PhaseComparison:
    """One row of the baseline table: the good start and this one at ``phase``."""

    phase: str
    good_at_s: float | None
    good_line: int | None
    this_at_s: float | None
    this_line: int | None

    def to_json(self) -> dict:
        return {
            "phase": self.phase,
            "good_at_s": self.good_at_s,
            "good_line": self.good_line,
            "this_at_s": self.this_at_s,
            "this_line": self.this_line,
        }


def format_duration_s(seconds: float | None) -> str:
    """``45s``, ``6m12s``; from 10 minutes on, whole minutes (``12m``); from an hour, ``1h05m``."""
    if seconds is None:
        return "?"
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    if total < 600:
        minutes, secs = divmod(total, 60)
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    minutes = total // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def history_path(home: Home, profile_name: str) -> Path:
    return home.history_dir / f"{_SAFE_NAME.sub('_', profile_name) or '_'}.jsonl"


def _in_phase_order(marks: tuple[PhaseMark, ...]) -> tuple[PhaseMark, ...]:
    order = {p.value: p.order for p in StartupPhase}
    return tuple(sorted(marks, key=lambda m: order.get(m.phase, len(order))))


def _log_time_epoch(log_time: str | None) -> float | None:
    """The wall clock of a log line's own timestamp (SGLang logs local time, sglang/srt/utils/common.py:2618)."""
    if not log_time:
        return None
    for fmt in _LOG_TIME_FORMATS:
        try:
            return time.mktime(time.strptime(log_time.strip(), fmt))
        except ValueError:
            continue
    return None


def _phase_marks(
    summary: StartupSummary | None, phase_entered_at: Mapping[str, float], started_at: float | None
) -> tuple[PhaseMark, ...]:
    lines: dict[str, int] = {}
    log_epochs: dict[str, float] = {}
    for event in summary.events if summary else ():
        name = str(event.phase)
        if name not in lines:
            lines[name] = event.line_no
            epoch = _log_time_epoch(event.log_time)
            if epoch is not None:
                log_epochs[name] = epoch
    names = set(lines) | {str(k) for k in phase_entered_at}
    marks = []
    for name in names:
        at_s = None
        if started_at is not None:
            # The session notices a phase when it polls (>= the truth); the log line's own timestamp is
            # the truth to the second.  The earliest evidence wins, so a session first watched after ready
            # still gets real phase times.
            candidates = [t - started_at for t in (phase_entered_at.get(name), log_epochs.get(name)) if t]
            if candidates:
                at_s = round(max(0.0, min(candidates)), 3)
        marks.append(PhaseMark(name, at_s, lines.get(name)))
    if StartupPhase.LAUNCHING.value not in names and started_at is not None:
        marks.append(PhaseMark(StartupPhase.LAUNCHING.value, 0.0, None))
    return _in_phase_order(tuple(marks))


def _launch_time(phase_entered_at: Mapping[str, float], started_at: float | None) -> float | None:
    if started_at is not None:
        return float(started_at)
    if StartupPhase.LAUNCHING.value in phase_entered_at:
        return float(phase_entered_at[StartupPhase.LAUNCHING.value])
    values = [float(v) for v in phase_entered_at.values() if v]
    return min(values) if values else None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    ensure_private_dir(path.parent)
    lock_path = path.with_name(f".{path.name}.lock")
    # O_NONBLOCK|O_NOFOLLOW: a FIFO or a symlink planted as the lock file is never waited on or followed
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_lines(path: Path) -> list[str]:
    """The history file's lines; none when it is missing or refused (a FIFO, a device, a hard link, over
    the cap: `sessions.safe_files`), so a bad history never stops a start or a diagnosis."""
    try:
        return safe_files.read_lines(path, safe_files.START_HISTORY)
    except OSError:
        return []


def _parsed(line: str) -> Any:
    """One line's JSON, or None when it is not JSON or nests too deeply."""
    try:
        return safe_files.parse_json(line, "start history line", safe_files.START_HISTORY.max_depth)
    except safe_files.FileRefused:
        return None


def _merge(old: StartRecord, new: StartRecord) -> StartRecord:
    """A later record of the same start keeps what the earlier one knew (phases, lines)."""
    marks = {m.phase: m for m in old.phases}
    for mark in new.phases:
        before = marks.get(mark.phase)
        marks[mark.phase] = PhaseMark(
            mark.phase,
            mark.at_s if mark.at_s is not None else (before.at_s if before else None),
            mark.line if mark.line is not None else (before.line if before else None),
        )
    return StartRecord(
        session_id=new.session_id,
        profile=new.profile,
        outcome=new.outcome,
        line_count=max(old.line_count, new.line_count),
        phases=_in_phase_order(tuple(marks.values())),
        started_at=new.started_at if new.started_at is not None else old.started_at,
        recorded_at=new.recorded_at,
        facts=new.facts if new.facts is not None else old.facts,
        error=new.error if new.error is not None else old.error,
    )


def _error_of(summary: StartupSummary | None) -> str | None:
    """The crash of a start for its record: the exception and its rank, secrets redacted by shape."""
    from sessions.phases import error_headline
    from sessions.redaction import redact_text

    headline = error_headline(summary) if summary is not None else None
    return redact_text(headline) if headline else None


def record_start(
    home: Home,
    profile_name: str,
    session_id: str,
    summary: StartupSummary | None,
    phase_entered_at: Mapping[str, float],
    outcome: str,
    *,
    started_at: float | None = None,
    facts: Mapping[str, Any] | None = None,
) -> StartRecord:
    """Keep this start's phase timings; calling again for the same session updates its one record.

    ``started_at`` is the launch wall clock; without it, the ``launching`` entry of ``phase_entered_at``
    (or its earliest time) stands in.  ``facts`` are what the start ran with (`sessions.start_facts`),
    already redacted.  Lines of the file that are not valid records are kept as they are.
    """
    t0 = _launch_time(phase_entered_at, started_at)
    record = StartRecord(
        session_id=session_id,
        profile=profile_name,
        outcome=outcome,
        line_count=summary.line_count if summary else 0,
        phases=_phase_marks(summary, phase_entered_at, t0),
        started_at=t0,
        recorded_at=time.time(),
        # Kept redacted only, whoever gathered them (a second pass is a no-op on redacted facts).
        facts=redact_record(dict(facts)) if facts else None,
        error=_error_of(summary),
    )
    path = history_path(home, profile_name)
    with _locked(path):
        kept: list[str] = []
        for line in _read_lines(path):
            obj = _parsed(line)
            is_this = isinstance(obj, dict) and obj.get("session_id") == session_id
            if is_this:
                try:
                    record = _merge(StartRecord.from_json(obj), record)
                except (KeyError, TypeError, ValueError):
                    pass
                continue
            kept.append(line)
        kept.append(json.dumps(record.to_json(), sort_keys=True))
        atomic_write_text(path, "\n".join(kept[-MAX_RECORDS:]) + "\n")
    return record


def load_history(home: Home, profile_name: str) -> list[StartRecord]:
    """Every readable record of the profile, oldest first (unreadable lines are skipped, not fatal)."""
    records = []
    for line in _read_lines(history_path(home, profile_name)):
        if not line.strip():
            continue
        try:
            records.append(StartRecord.from_json(_parsed(line)))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return records


def all_records(home: Home) -> list[StartRecord]:
    """Every readable record of every profile's history (each file oldest first, files by name)."""
    records = []
    try:
        files = sorted(home.history_dir.glob("*.jsonl"))
    except OSError:
        return []
    for path in files:
        try:
            lines = _read_lines(path)
        except OSError:
            continue  # one unreadable history must not hide the others
        for line in lines:
            if not line.strip():
                continue
            try:
                records.append(StartRecord.from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                continue
    return records


def last_good(home: Home, profile_name: str, exclude_session_id: str | None = None) -> Baseline | None:
    """The latest start of the profile that reached ready (other than ``exclude_session_id``)."""
    for record in reversed(load_history(home, profile_name)):
        if record.reached_ready and record.session_id != exclude_session_id:
            return record
    return None


def _this_marks(
    summary: StartupSummary | None, phase_entered_at: Mapping[str, float], started_at: float | None
) -> dict[str, PhaseMark]:
    t0 = _launch_time(phase_entered_at, started_at)
    return {m.phase: m for m in _phase_marks(summary, phase_entered_at, t0)}


def compare_rows(
    baseline: Baseline | None,
    summary: StartupSummary | None,
    phase_entered_at: Mapping[str, float],
    *,
    started_at: float | None = None,
) -> list[PhaseComparison]:
    """Per phase: when (seconds, line) the good start and this one entered it, for the screen's table."""
    this = _this_marks(summary, phase_entered_at, started_at)
    good = {m.phase: m for m in baseline.phases} if baseline else {}
    rows = []
    for phase in StartupPhase:
        g, t = good.get(phase.value), this.get(phase.value)
        if g is None and t is None:
            continue
        good_line = g.line if g else None
        if phase is StartupPhase.READY and baseline is not None:
            good_line = baseline.ready_line  # ready seen over HTTP before the log said so: its line count
        rows.append(
            PhaseComparison(
                phase.value,
                g.at_s if g else None,
                good_line,
                t.at_s if t else None,
                t.line if t else None,
            )
        )
    return rows


def compare(
    baseline: Baseline | None,
    summary: StartupSummary | None,
    phase_entered_at: Mapping[str, float],
    silent_for_s: float,
    *,
    started_at: float | None = None,
) -> str:
    """The seed's sentence: where the good start got to, and where this one stopped."""
    if baseline is not None and baseline.reached_ready:
        ready_line = baseline.ready_line if baseline.ready_line is not None else baseline.line_count
        good = f"the good start reached ready at line {ready_line}"
        if baseline.ready_after_s is not None:
            good += f" after {format_duration_s(baseline.ready_after_s)}"
    else:
        good = "no earlier start of this profile reached ready"
    phase = str(summary.phase) if summary else StartupPhase.LAUNCHING.value
    line_count = summary.line_count if summary else 0
    if phase == StartupPhase.READY.value:
        mark = _this_marks(summary, phase_entered_at, started_at).get(phase)
        this = f"this one reached ready at line {mark.line if mark and mark.line else line_count}"
        if mark and mark.at_s is not None:
            this += f" after {format_duration_s(mark.at_s)}"
    else:
        this = f"this one stopped at line {line_count} in {phase}, silent for {format_duration_s(silent_for_s)}"
    return f"{good}; {this}"


def changes_since(
    baseline: Baseline | None,
    facts: Mapping[str, Any] | None,
    implications: Iterable[start_facts.Implication] = (),
    hinted: Iterable[str] = (),
) -> list[start_facts.Change]:
    """What changed from the last good start to a start that ran with ``facts``: flags, env, versions,
    config hashes, GPUs, driver, CUDA_VISIBLE_DEVICES, emulator settings; each marked with the known
    causes (``implications``) that name it.  Empty when either side has no facts (older records)."""
    if baseline is None:
        return []
    return start_facts.mark(start_facts.diff(baseline.facts, facts), implications, hinted)
