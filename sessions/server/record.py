"""A session's folder and record: ``state.json`` read fresh, written under a lock, and the main process
that it names or that carries the session's marker in its environment.

`SessionRecord` is what every other part of a session builds on (`ServerSession` is one): the status
reading writes the facts it learns through `SessionRecord._update_state`, the lifecycle its pids and stops.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from sessions import probes
from sessions.home import Home, atomic_write_json
from sessions.profiles import LaunchProfile, load_profile
from sessions.server.model import LOG_FILE, PROFILE_FILE, SESSION_ENV, SESSIONS_DIR_ENV, STATE_FILE
from sessions.state_file import StateRead, read_state

_SAFE_SESSION_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


class SessionRecord:
    """One session's folder and ``state.json``, and the identity of its main process."""

    def __init__(self, session_dir: Path, home: Home) -> None:
        self.session_dir = Path(session_dir)
        self.session_id = self.session_dir.name
        self.home = home
        self.log_path = self.session_dir / LOG_FILE
        self._profile: LaunchProfile | None = None
        self._marked: tuple[int, float] | None = None  # the main found by its session marker

    # -- what is on disk -------------------------------------------------------------------------------

    @property
    def state_read(self) -> StateRead:
        """The current ``state.json`` with what is wrong with it (read fresh: another process may have
        stopped the session); never raises for a damaged or missing file."""
        return read_state(self.session_dir)

    @property
    def state_record(self) -> dict[str, Any]:
        """The trusted fields of the current ``state.json`` (always a dict; see `state_read`)."""
        return self.state_read.record

    @property
    def profile_name(self) -> str:
        """The profile's name from the record, else from the session id (``<profile>-<date>-<time>-<hex>``)."""
        return self.profile_name_in(self.state_record)

    def profile_name_in(self, rec: dict[str, Any]) -> str:
        """`profile_name` from a record already read (a status reads state.json once)."""
        name = rec.get("profile")
        if name:
            return str(name)
        parts = self.session_id.rsplit("-", 3)
        return parts[0] if len(parts) == 4 else self.session_id

    def main_identity(self, rec: dict[str, Any] | None = None) -> tuple[int, float] | None:
        """(pid, create_time) of the main process: from state.json (``rec`` when the caller read it), else
        from the session marker in a running process's environment (the record is damaged, deleted, or the
        launcher died before it wrote the pid)."""
        rec = self.state_record if rec is None else rec
        if rec.get("pid") and rec.get("create_time") is not None:
            return int(rec["pid"]), float(rec["create_time"])
        if self._marked is not None and probes.process_alive(*self._marked):
            return self._marked
        found = _marked_main(self.home, self.session_id)
        self._marked = found
        return found

    @property
    def profile(self) -> LaunchProfile:
        """The profile as launched (the snapshot in the session folder)."""
        if self._profile is None:
            profile = load_profile(self.session_dir / PROFILE_FILE)
            name = self.state_record.get("profile")
            if name and getattr(profile, "name", name) != name:
                profile = dataclasses.replace(profile, name=name)
            self._profile = profile
        return self._profile

    @property
    def pid(self) -> int | None:
        ident = self.main_identity()
        return ident[0] if ident else None

    def current_profile(self) -> LaunchProfile:
        """The profile a restart would launch: the source file as it is now, else the snapshot."""
        source = self.state_record.get("profile_source")
        if source and Path(source).is_file():
            profile = load_profile(Path(source))
            if profile.name != self.profile.name:
                profile = dataclasses.replace(profile, name=self.profile.name)
            return profile
        return self.profile

    # -- state.json ------------------------------------------------------------------------------------

    def _update_state(self, mutate: Callable[[dict], None], repair: bool = False) -> dict:
        """Read-modify-write state.json under a lock: the TUI and a CLI may write at the same time.

        A damaged state.json is left alone (it is the evidence), unless ``repair``: then its bytes are
        kept as ``state.json.damaged`` and the fields that could be read are written back with the change.
        """
        if not self.session_dir.is_dir():
            return self.state_record
        with _locked(self.session_dir / ".state.lock"):
            read = self.state_read
            if read.damaged:
                if not repair:
                    return read.record
                if not read.missing:
                    _keep_damaged_copy(self.session_dir / STATE_FILE)
            rec = read.record
            if read.damaged:
                rec.setdefault("session_id", self.session_id)
                rec.setdefault("profile", self.profile_name)
                if self._marked and not rec.get("pid"):
                    rec.update(pid=self._marked[0], create_time=self._marked[1])
            mutate(rec)
            atomic_write_json(self.session_dir / STATE_FILE, rec)
        return rec


def find_marked_servers(home: Home) -> dict[str, tuple[int, float]]:
    """session id -> (pid, create_time) of every running server of ``home`` found by its session marker
    (`SESSION_ENV` and `SESSIONS_DIR_ENV` in its environment): the topmost marked process of each session.

    SGLang's ranks overwrite their environment with their title (setproctitle), so this finds the main
    process (and helpers such as multiprocessing's resource tracker, whose parent is marked too).
    """
    wanted_dir = str(home.sessions_dir)
    marked: dict[int, tuple[str, float, int | None]] = {}
    me = os.getpid()
    for pid in psutil.pids():
        if pid == me:
            continue
        try:
            proc = psutil.Process(pid)
            env = proc.environ()
            session_id = env.get(SESSION_ENV)
            if not session_id or env.get(SESSIONS_DIR_ENV) != wanted_dir or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            marked[pid] = (session_id, proc.create_time(), proc.ppid())
        except (psutil.Error, OSError):
            continue
    found: dict[str, tuple[int, float]] = {}
    for pid, (session_id, create_time, ppid) in sorted(marked.items(), key=lambda kv: kv[1][1]):
        parent = marked.get(ppid) if ppid else None
        if parent is not None and parent[0] == session_id:
            continue  # a child of the session's main
        if _SAFE_SESSION_ID.fullmatch(session_id):
            found.setdefault(session_id, (pid, create_time))
    return found


def has_state_entry(session_dir: Path) -> bool:
    """Whether ``session_dir`` has a ``state.json`` entry of any kind: a FIFO, a folder or a link to
    ``/dev/zero`` there is still a session, listed with its problem, never one that silently vanishes."""
    try:
        os.lstat(Path(session_dir) / STATE_FILE)
    except OSError:
        return False
    return True


def _marked_main(home: Home, session_id: str) -> tuple[int, float] | None:
    return find_marked_servers(home).get(session_id)


def _keep_damaged_copy(path: Path) -> None:
    """Keep a damaged state.json's bytes next to it (once) before it is rewritten: it is evidence."""
    target = path.with_name(path.name + ".damaged")
    if target.exists():
        return
    with contextlib.suppress(OSError):
        os.link(path, target)


def _create_time_of(pid: int) -> float:
    return psutil.Process(pid).create_time()


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
