"""Housekeeping: remove ended sessions' folders, never a running one, and keep the baselines' good starts.

Stopped sessions pile up (13 in a day).  `plan_prune` picks the folders to remove, `prune` removes them:

* never a session whose server runs: its main process is checked by (pid, create_time), as everywhere in
  the project, and by the session marker in running processes' environments (a damaged record); nor a
  launch still in flight (``launch_state`` "launching", younger than the stale limit);
* by default never the good starts that baselines use: the latest start that reached ready of each
  profile, and of each model and SGLang version (a baseline across profiles compares those);
  ``include_baselines`` removes them too (their history records stay);
* ``older_than_s``: only sessions that ended at least that long ago; ``keep``: the newest ``keep`` ended
  sessions of each profile stay.

Removal runs under the home's launch lock, and each session's liveness is checked again just before its
folder goes: a launch or a restart cannot start a server in a folder being removed.
"""
from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions import probes
from sessions.history import load_history
from sessions.home import Home
from sessions.server.launch_lock import LAUNCH_LOCK_TIMEOUT_S, launch_lock
from sessions.server.model import LAUNCH_LOCK_FILE, LAUNCH_STALE_S
from sessions.server.record import find_marked_servers
from sessions.server.session import ServerSession, list_sessions

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "": 86400.0}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (a bare number is days) -> seconds; ValueError names it."""
    match = _DURATION.match(text or "")
    if match is None:
        raise ValueError(f"{text!r} is not a duration: use a number and s, m, h, d or w (7d, 12h, 30m)")
    return float(match.group(1)) * _UNIT_S[match.group(2).lower()]


@dataclass(frozen=True)
class PruneItem:
    """One ended session and what prune does with it: ``remove`` or keep, and why."""

    session_id: str
    profile: str
    state: str
    ended_at: float | None
    remove: bool
    why: str
    path: Path

    def to_json(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "profile": self.profile, "state": self.state,
                "ended_at": self.ended_at, "removed": self.remove, "why": self.why, "path": str(self.path)}


@dataclass
class PrunePlan:
    items: list[PruneItem] = field(default_factory=list)
    running: list[str] = field(default_factory=list)  # sessions left alone because their server runs

    @property
    def to_remove(self) -> list[PruneItem]:
        return [i for i in self.items if i.remove]

    @property
    def kept(self) -> list[PruneItem]:
        return [i for i in self.items if not i.remove]


def baseline_session_ids(home: Home) -> set[str]:
    """The good starts baselines use: the latest start that reached ready of each profile, and of each
    (model path, SGLang version) across profiles."""
    latest_by_key: dict[Any, tuple[float, str]] = {}
    try:
        files = sorted(home.history_dir.glob("*.jsonl"))
    except OSError:
        files = []
    for path in files:
        for record in load_history(home, path.stem):
            if not record.reached_ready:
                continue
            at = float(record.started_at or record.recorded_at or 0.0)
            facts = record.facts if isinstance(record.facts, dict) else {}
            keys: list[Any] = [("profile", record.profile)]
            if facts.get("model_path"):
                keys.append(("model", str(facts.get("model_path")), str(facts.get("sglang_version"))))
            for key in keys:
                if key not in latest_by_key or at >= latest_by_key[key][0]:
                    latest_by_key[key] = (at, record.session_id)
    return {session_id for _at, session_id in latest_by_key.values()}


def _ended_at(session: ServerSession) -> float | None:
    rec = session.state_record
    for key in ("stopped_at", "ended_at", "started_at"):
        value = rec.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    try:
        return session.session_dir.stat().st_mtime
    except OSError:
        return None


def _is_running(session: ServerSession, marked: dict[str, tuple[int, float]]) -> bool:
    """The session's server (or a launch of it) may be alive: never prune it."""
    if session.is_alive():
        return True
    ident = marked.get(session.session_id)
    if ident is not None and probes.process_alive(*ident):
        return True
    rec = session.state_record
    started = rec.get("started_at")
    return rec.get("launch_state") == "launching" and (
        not isinstance(started, (int, float)) or time.time() - float(started) < LAUNCH_STALE_S
    )


def plan_prune(
    home: Home, *, older_than_s: float | None = None, keep: int = 0, include_baselines: bool = False,
    now: float | None = None,
) -> PrunePlan:
    """What `prune` would remove and keep (nothing is touched)."""
    now = time.time() if now is None else now
    marked = find_marked_servers(home)
    baselines = set() if include_baselines else baseline_session_ids(home)
    plan = PrunePlan()
    ended: list[tuple[ServerSession, float | None]] = []
    for session in list_sessions(home):
        if _is_running(session, marked):
            plan.running.append(session.session_id)
            continue
        ended.append((session, _ended_at(session)))
    ended.sort(key=lambda pair: pair[1] or 0.0, reverse=True)  # newest first: --keep counts from the top
    seen_per_profile: dict[str, int] = {}
    for session, ended_at in ended:
        profile = session.profile_name
        rank = seen_per_profile.get(profile, 0)
        seen_per_profile[profile] = rank + 1
        state = str(session.state_record.get("outcome") or session.state_record.get("start_outcome") or "ended")
        if session.session_id in baselines:
            remove, why = False, "a baseline's good start (--include-baselines removes it)"
        elif rank < keep:
            remove, why = False, f"one of the {keep} newest of {profile} (--keep)"
        elif older_than_s is not None and ended_at is not None and now - ended_at < older_than_s:
            remove, why = False, "ended less than --older-than ago"
        else:
            remove, why = True, "ended"
        plan.items.append(PruneItem(session.session_id, profile, state, ended_at, remove, why, session.session_dir))
    return plan


def prune(home: Home, plan: PrunePlan, lock_timeout_s: float | None = LAUNCH_LOCK_TIMEOUT_S) -> tuple[list[str], list[str]]:
    """Remove the plan's folders; returns (removed ids, problems).  Under the launch lock, each session is
    checked again first: one that runs now (restarted, adopted) is left alone and named in problems."""
    removed: list[str] = []
    problems: list[str] = []
    with launch_lock(home.state_root / LAUNCH_LOCK_FILE, lock_timeout_s):
        marked = find_marked_servers(home)
        for item in plan.to_remove:
            folder = item.path
            if folder.parent != home.sessions_dir or folder.is_symlink() or not folder.is_dir():
                problems.append(f"{item.session_id}: {folder} is not a session folder of {home.sessions_dir}; left alone")
                continue
            if _is_running(ServerSession(folder, home), marked):
                problems.append(f"{item.session_id}: its server runs now; left alone")
                continue
            try:
                shutil.rmtree(folder)
            except OSError as exc:
                problems.append(f"{item.session_id}: could not remove {folder}: {exc.strerror or exc}")
                continue
            removed.append(item.session_id)
    return removed, problems
