"""The lifecycle of a server session: launch, stop, restart, and finding sessions (DESIGN §2, §3).

The server runs in its own session and process group (it outlives the TUI, SSH drops and SIGHUP) and is
identified by (pid, create_time).  A launch writes the folder first and starts the server second, so a
launcher killed at any point leaves a server that `list_sessions` lists and ``stop`` stops.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from sessions import probes, start_facts
from sessions.home import Home, atomic_write_json, atomic_write_text, ensure_private_dir, resolve_home
from sessions.phases import StartupPhase
from sessions.profiles import LaunchProfile, Problem, build_command, validate_profile
from sessions.redaction import Redactor, collect_secrets, redact_argv, redact_env, write_secrets_file
from sessions.remote.hosts import host_env_of
from sessions.server.diff import flag_diff
from sessions.server.group import (
    GROUP_KEY,
    GroupInfo,
    member_port_problems,
    member_profile,
    member_profiles,
    new_group_id,
    with_replicas,
)
from sessions.server.launch_lock import LAUNCH_LOCK_TIMEOUT_S, LaunchCancelled, launch_lock
from sessions.server.model import (
    COMMAND_FILE,
    KILL_WAIT_S,
    LAUNCH_LOCK_FILE,
    LOG_FILE,
    PROFILE_FILE,
    SESSION_ENV,
    SESSIONS_DIR_ENV,
    STATE_FILE,
    STATE_VERSION,
    AlreadyRunning,
    GpuBusy,
    LaunchError,
    SessionError,
    SessionNotFound,
    SessionsFolderError,
    SessionStatus,
    StopReport,
)
from sessions.server.record import (
    _SAFE_SESSION_ID,
    _create_time_of,
    _pgid_of,
    find_marked_servers,
    has_state_entry,
)
from sessions.server.status import SessionReader
from sessions.server.stopping import _gpu_pids_left, _identities, _stop_message, _wait_gone

_SAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


class ServerSession(SessionReader):
    """A server launched by eagle3-tui, live or ended, rebuilt from its folder."""

    def __init__(self, session_dir: Path, home: Home) -> None:
        super().__init__(session_dir, home)
        self._popen: subprocess.Popen | None = None  # set when this process launched it (to reap it)
        self.restart_diff: list[str] = []

    def __repr__(self) -> str:
        return f"ServerSession({self.session_id!r})"

    # -- construction ----------------------------------------------------------------------------------

    @classmethod
    def load(cls, session_id: str, home: Home | None = None) -> ServerSession:
        """Reattach to a session by its exact id."""
        home = home or resolve_home()
        session_dir = home.sessions_dir / session_id
        if not session_id or "/" in session_id or len(session_id) > 255 or not has_state_entry(session_dir):
            raise SessionNotFound(f"no session '{session_id}' in {home.sessions_dir}")
        return cls(session_dir, home)

    @classmethod
    def launch(
        cls,
        profile: LaunchProfile,
        home: Home | None = None,
        *,
        force: bool = False,
        gpu_source: Any = None,
        lock_timeout_s: float | None = LAUNCH_LOCK_TIMEOUT_S,
        cancelled: Callable[[], bool] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> ServerSession:
        """Validate ``profile``, start its server detached, and return the new session.

        In order, each refusal before anything starts: the profile already runs (`AlreadyRunning`, naming
        that session), the profile does not validate (`LaunchError` with every problem), the GPUs the
        launch would use hold other processes' memory (`GpuBusy`, unless ``force``).  All of it runs under
        a lock in the state dir, so two launches at the same moment start exactly one server.

        Write first, then start: the folder and a ``launching`` state.json exist before the server does,
        and the server carries the session id in its environment, so a launcher killed at any point
        leaves a server that `status` lists and `stop` stops.

        The lock wait is bounded (``lock_timeout_s``: `LaunchLockTimeout` naming the holder) and ends as
        soon as ``cancelled()`` is true (`LaunchCancelled`); ``progress(text)`` hears each step ("waiting
        for the launch lock held by ...", "checking GPUs"), for a progress line.
        """
        if profile.server.replicas > 1:
            raise LaunchError(f"profile '{profile.name}' has server.replicas = {profile.server.replicas}: "
                              "it launches as a group (ServerSession.launch_group)", code=2)
        return cls._launch_checked(profile, [profile], None, home=home, force=force, gpu_source=gpu_source,
                                   lock_timeout_s=lock_timeout_s, cancelled=cancelled, progress=progress)[0]

    @classmethod
    def launch_group(
        cls,
        profile: LaunchProfile,
        home: Home | None = None,
        *,
        force: bool = False,
        gpu_source: Any = None,
        lock_timeout_s: float | None = LAUNCH_LOCK_TIMEOUT_S,
        cancelled: Callable[[], bool] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> list[ServerSession]:
        """`launch` for a profile with ``server.replicas`` > 1: every member (`sessions.server.group`) is
        checked before any starts (the profile, each member's port, the GPUs of all members together), then
        all start; the members, in order.  A profile of one replica launches as `launch` does."""
        home = home or resolve_home()
        members = member_profiles(profile) if profile.server.replicas > 1 else [profile]
        group_id = new_group_id(profile.name) if len(members) > 1 else None
        return cls._launch_checked(profile, members, group_id, home=home, force=force, gpu_source=gpu_source,
                                   lock_timeout_s=lock_timeout_s, cancelled=cancelled, progress=progress)

    @classmethod
    def _launch_checked(
        cls,
        profile: LaunchProfile,
        members: list[LaunchProfile],
        group_id: str | None,
        *,
        home: Home | None,
        force: bool,
        gpu_source: Any,
        lock_timeout_s: float | None,
        cancelled: Callable[[], bool] | None,
        progress: Callable[[str], None] | None,
        running_ok: frozenset[str] = frozenset(),
        member_of: GroupInfo | None = None,
    ) -> list[ServerSession]:
        if profile.host is not None and profile.host != "local":
            # Its machine checks were skipped here (validate_profile leaves them to that host): starting it
            # on this machine would skip them for real.  `eagle3-tui launch` and the TUI send it over ssh.
            raise LaunchError(f"profile '{profile.name}' runs on host {profile.host} (host = \"{profile.host}\"): "
                              f"it launches there over ssh (eagle3-tui launch {profile.name}), never on this machine",
                              code=2)
        home = (home or resolve_home()).ensure()
        tell = progress or (lambda _text: None)
        lock_path = home.state_root / LAUNCH_LOCK_FILE

        def waiting(holder: str, waited_s: float) -> None:
            tell(f"waiting for another launch ({holder}) to release {lock_path.name}: {waited_s:.0f}s")

        tell("taking the launch lock")
        with launch_lock(lock_path, lock_timeout_s, cancelled=cancelled, on_wait=waiting):
            tell("checking the profile's running sessions")
            # running_ok: the other members of a group whose one member restarts.
            running = [s for s in running_sessions_of(profile.name, home) if s.session_id not in running_ok]
            if running:
                raise AlreadyRunning(_already_running_text(profile.name, running[0]), running[0].session_id)
            # validate_profile's port check names who holds the port (probes.describe_port_user).
            tell("validating the profile and its port")
            problems = validate_profile(members[0] if member_of is not None else profile, check_port=True)
            if len(members) > 1:
                problems += member_port_problems(members)
            errors = [p for p in problems if p.is_error]
            if errors:
                raise LaunchError(_problems_text(profile, errors), errors, code=2)
            commands = [build_command(member) for member in members]
            if not force:
                from sessions.gpus import busy_gpus_for_launch, format_busy, launch_gpu_ids

                tell("checking that its GPUs are free")
                # One reading over every member's GPUs: one busy GPU refuses the whole group.
                ids = sorted({g for member in members for g in launch_gpu_ids(member)})
                busy = busy_gpus_for_launch(members[0], home, source=gpu_source,
                                            describe_pid=_pid_describer(home), gpu_ids=ids)
                if busy:
                    raise GpuBusy(format_busy(profile.name, busy), busy)
            if cancelled is not None and cancelled():
                raise LaunchCancelled(f"launch of {profile.name} cancelled before the server started")
            tell("starting the server" if len(members) == 1 else f"starting {len(members)} replicas")
            started: list[ServerSession] = []
            try:
                for i, (member, command) in enumerate(zip(members, commands)):
                    group = None
                    if group_id is not None:
                        from sessions.gpus import launch_gpu_ids

                        index = i if member_of is None else member_of.index
                        size = len(members) if member_of is None else member_of.size
                        group = GroupInfo(group_id, index, size, tuple(launch_gpu_ids(member))).to_json()
                    started.append(cls._start(member, command, home, group=group))
            except BaseException:
                for session in started:  # all or none: a group half started is not what was asked for
                    with contextlib.suppress(Exception):
                        session.stop(grace_s=5.0)
                raise
            return started

    @classmethod
    def _start(cls, profile: LaunchProfile, command: Any, home: Home, group: dict | None = None) -> ServerSession:
        session_dir = _new_session_dir(home, profile.name)
        session_id = session_dir.name
        atomic_write_text(session_dir / PROFILE_FILE, profile.to_toml())
        added_env = {
            SESSION_ENV: session_id,
            SESSIONS_DIR_ENV: str(home.sessions_dir),
            "PYTHONUNBUFFERED": "1",
        }
        env_changes = dict(command.env_changes) | added_env
        # The exact secret values of this launch (0600, never shown): every later reader hides them by value.
        # The server also inherits what another host's hosts.toml env set in this CLI (`--env-stdin`).
        secret_list = collect_secrets(command.argv, host_env_of(os.environ) | env_changes)
        write_secrets_file(session_dir, secret_list)
        redactor = Redactor(secret_list)
        redacted_argv = [redactor.text(a) for a in redact_argv(command.argv)]
        atomic_write_json(
            session_dir / COMMAND_FILE,
            {
                "argv": redacted_argv,
                "env_changes": {k: redactor.text(v) for k, v in redact_env(env_changes).items()},
                "cwd": str(session_dir),
                "shell_text": redactor.text(command.shell_text(redacted=True)),
            },
        )
        # What this start runs with, for the diff against the last good start if it fails (redacted).
        start_facts.write(session_dir, start_facts.collect(profile, command.argv, command.env_changes))
        server = profile.server
        started_at = time.time()
        atomic_write_json(
            session_dir / STATE_FILE,
            {
                "version": STATE_VERSION,
                "session_id": session_id,
                "profile": profile.name,
                "profile_source": str(profile.path) if getattr(profile, "path", None) else None,
                "launcher": server.launcher,
                "launch_state": "launching",  # the server may be starting now; its pid follows
                "pid": None,
                "create_time": None,
                "pgid": None,
                "host": server.host,
                "port": server.port,
                "tp_size": server.tp_size,
                "stall_after_s": profile.watch.stall_after_s,
                "started_at": started_at,
                "argv_sha256": hashlib.sha256(json.dumps(redacted_argv).encode()).hexdigest(),
                "phase_entered_at": {StartupPhase.LAUNCHING.value: started_at},
                "descendants": [],
                "outcome": None,
            }
            | ({GROUP_KEY: group} if group else {}),
        )
        session = cls(session_dir, home)
        session._profile = profile
        log_fd = os.open(session_dir / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # cwd = the session dir: a user's own app/ or sessions/ folder never shadows ours under -m.
            popen = subprocess.Popen(
                command.argv,
                env=os.environ | env_changes,
                cwd=session_dir,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,  # own session + group: survives SIGHUP and the TUI's exit
                close_fds=True,
            )
        except OSError as exc:
            session._update_state(lambda rec: rec.update(launch_state="failed", outcome="failed"))
            raise LaunchError(f"could not start {command.argv[0]}: {exc.strerror or exc}") from exc
        finally:
            os.close(log_fd)
        session._popen = popen
        try:
            _record_pid(session, popen.pid)
        except BaseException:
            _kill_quietly(popen)
            raise
        return session

    def status(self, probe_http: bool = True, gpu_snapshot: Any = None) -> SessionStatus:
        """`SessionReader.status`, after reaping the server when this process launched it (a zombie
        is not a live server)."""
        self._reap()
        return super().status(probe_http, gpu_snapshot)

    def is_alive(self) -> bool:
        """The main process (pid, create_time) still runs."""
        self._reap()
        ident = self.main_identity()
        return ident is not None and probes.process_alive(*ident)

    # -- stop ------------------------------------------------------------------------------------------

    def stop(self, grace_s: float = 30.0) -> StopReport:
        """SIGTERM the main process, wait ``grace_s``, SIGKILL whatever remains, then verify.

        Only the main process gets SIGTERM: SGLang then drains, shuts its schedulers down and kills its
        own tree (tokenizer_manager.py:3508-3565).  A SIGTERM to every rank would send each scheduler's
        watchdog down its ~65 s crash-dump path (sglang-facts §6, §7).
        """
        t0 = time.monotonic()
        self._reap()
        ident = self.main_identity()
        pid, create_time = ident if ident else (None, 0.0)
        main = probes.get_process(pid, create_time) if pid else None
        was_alive = main is not None
        if was_alive:
            # The intent goes on record before any signal: a poll (the TUI's, another CLI's) that sees
            # the main process gone, or a rank's dying words, reads it and records a stop, not a crash.
            requested_at = time.time()
            self._update_state(lambda r: r.setdefault("stop_requested_at", requested_at), repair=True)
        rec = self.state_record
        # Every process of the session, captured before any signal: once the main dies, orphaned
        # descendants are no longer its children.
        members = self._members(rec) | _identities(self._strays(pid, create_time))
        signals: list[str] = []
        if main is not None:
            try:
                main.send_signal(signal.SIGTERM)
                signals.append(f"SIGTERM to {pid}")
            except psutil.NoSuchProcess:  # it ended on its own just now
                main = None
        _wait_gone(lambda: self._alive_members(members, pid, create_time), grace_s, self._reap)

        remaining = self._alive_members(members, pid, create_time)
        if remaining:
            pgid = rec.get("pgid")
            # start_new_session made the main the leader of its group (pgid == pid).  The number names
            # our group only while the leader lives or no process holds that pid (probes.group_is_ours).
            if pgid and pid is not None and pgid == pid and probes.group_is_ours(pid, create_time):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                    signals.append(f"SIGKILL to group {pgid}")
                except OSError:
                    pass
            for member_pid, member_ct in remaining:
                if probes.kill_identity(member_pid, member_ct, signal.SIGKILL):
                    signals.append(f"SIGKILL to {member_pid}")
            _wait_gone(lambda: self._alive_members(members, pid, create_time), KILL_WAIT_S, self._reap)

        # Last sweep: orphans still in the group (ranks whose parent died without PDEATHSIG) and strays
        # that left it but carry our session id in their environment (a daemonised grandchild).
        for proc in self._strays(pid, create_time):
            with contextlib.suppress(psutil.Error):  # NoSuchProcess: gone by itself
                members.add((proc.pid, proc.create_time()))
                proc.kill()
                signals.append(f"SIGKILL to {proc.pid} (left behind)")
        _wait_gone(lambda: self._alive_members(members, pid, create_time), KILL_WAIT_S, self._reap)

        survivors = tuple(sorted({p for p, _ in self._alive_members(members, pid, create_time)}))
        host, port = rec.get("host", "127.0.0.1"), rec.get("port")
        port_is_free = True
        if port:
            deadline = time.monotonic() + 2.0
            while not (port_is_free := probes.port_free(host, port)) and time.monotonic() < deadline:
                time.sleep(0.05)
        gpu_left = _gpu_pids_left({p for p, _ in members} | ({pid} if pid else set()))
        stopped = not survivors and not gpu_left
        waited_s = round(time.monotonic() - t0, 3)
        message = _stop_message(
            self.session_id, was_alive, stopped, survivors, port_is_free, gpu_left, port, host, signals, waited_s
        )
        report = StopReport(
            stopped=stopped,
            signals_sent=tuple(signals),
            waited_s=waited_s,
            survivors=survivors,
            port_free=port_is_free,
            gpu_pids_left=gpu_left,
            message=message,
        )

        def update(state_rec: dict) -> None:
            now = time.time()
            if was_alive or "stop" not in state_rec:  # a later clean-up keeps the report of the real stop
                state_rec["stop"] = report.to_json() | {"at": now}
            if was_alive and stopped:
                state_rec["stopped_at"] = now
                state_rec["outcome"] = "stopped"
                state_rec.setdefault("ended_at", now)
                if state_rec.get("start_outcome") is None:
                    ready = StartupPhase.READY.value in (state_rec.get("phase_entered_at") or {})
                    state_rec["start_outcome"] = "ready" if ready else "stopped"

        if not self.session_dir.is_dir():
            return report  # the folder is gone: nothing to record in
        rec = self._update_state(update, repair=True)
        self._record_history(rec, self._read_log())
        return report

    def _members(self, rec: dict) -> set[tuple[int, float]]:
        members: set[tuple[int, float]] = set()
        for d in rec.get("descendants", []):
            members.add((int(d[0]), float(d[1])))
        if rec.get("pid"):
            for info in probes.process_tree(rec["pid"], rec.get("create_time", 0.0))[1:]:
                members.add((info.pid, info.create_time))
        return members

    def _strays(self, pid: int | None, create_time: float) -> list:
        found = {p.pid: p for p in probes.processes_with_env(SESSION_ENV, self.session_id)}
        if pid:
            found.update({p.pid: p for p in probes.processes_in_group(pid, create_time)})
        return list(found.values())

    def _alive_members(self, members: set[tuple[int, float]], pid: int | None, create_time: float) -> list:
        alive = [(p, ct) for p, ct in members if probes.process_alive(p, ct)]
        if pid and probes.process_alive(pid, create_time):
            alive.append((pid, create_time))
        return alive

    def _reap(self) -> None:
        if self._popen is not None:
            self._popen.poll()

    # -- groups ----------------------------------------------------------------------------------------

    @property
    def group(self) -> GroupInfo | None:
        """This session's place in a group of replicas (`sessions.server.group`), None when alone."""
        return GroupInfo.from_record(self.state_record)

    # -- restart ---------------------------------------------------------------------------------------

    def restart(self, profile: LaunchProfile | None = None, grace_s: float = 30.0) -> ServerSession:
        """Stop this session and launch the current profile (or ``profile``); the new one keeps the diff.

        A member of a group restarts alone: as the same member (its GPUs, port and capture dir, taken from
        the profile as it is now), in the same group, while the other members go on."""
        info = self.group
        base = profile or self.current_profile()
        new_profile = member_profile(base, info.index) if info is not None else base
        diff = flag_diff(self.profile, new_profile)
        # Refuse a broken profile while the old server still runs (its port is checked after the stop).
        errors = [p for p in validate_profile(new_profile, check_port=False) if p.is_error]
        if errors:
            raise LaunchError(_problems_text(new_profile, errors), errors, code=2)
        report = self.stop(grace_s=grace_s)
        if not report.stopped:
            raise SessionError(f"restart of {self.session_id} aborted: {report.message}")
        if info is None:
            new = ServerSession.launch(new_profile, self.home)
        else:
            others = frozenset(s.session_id for s in group_members(info.group_id, self.home))
            new = ServerSession._launch_checked(
                base, [new_profile], info.group_id, home=self.home, force=False, gpu_source=None,
                lock_timeout_s=LAUNCH_LOCK_TIMEOUT_S, cancelled=None, progress=None, running_ok=others,
                member_of=info)[0]
        new.restart_diff = diff

        def note(state_rec: dict) -> None:
            state_rec["restarted_from"] = self.session_id
            state_rec["restart_diff"] = diff

        new._update_state(note)
        self._update_state(lambda rec: rec.__setitem__("restarted_as", new.session_id))
        return new

def group_members(group_id: str, home: Home | None = None) -> list[ServerSession]:
    """The sessions of group ``group_id``, by member index; of each index only the newest session (a
    member restarted alone leaves its ended predecessor behind)."""
    newest: dict[int, ServerSession] = {}
    for session in list_sessions(home):  # oldest first: a later session of an index replaces the earlier
        info = session.group
        if info is not None and info.group_id == group_id:
            newest[info.index] = session
    return [newest[i] for i in sorted(newest)]


def find_group(ref: str, home: Home | None = None) -> list[ServerSession] | None:
    """The members of the group whose id is ``ref`` or starts with it (the CLI's SESSION argument may
    name a group); None when ``ref`` names no group."""
    home = home or resolve_home()
    ids = {info.group_id for s in list_sessions(home) if (info := s.group) is not None}
    exact = [g for g in ids if g == ref]
    matches = exact or [g for g in ids if ref and g.startswith(ref)]
    if not matches:
        return None
    if len(matches) > 1:
        raise SessionNotFound(f"group '{ref}' is ambiguous: {len(matches)} match ({', '.join(sorted(matches)[:5])})")
    return group_members(matches[0], home)


def stop_group(members: list[ServerSession], grace_s: float = 30.0) -> list[StopReport]:
    """Stop every member at once (each its own SIGTERM, grace and SIGKILL), reports in member order."""
    from concurrent.futures import ThreadPoolExecutor

    if not members:
        return []
    with ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="stop-member") as pool:
        return list(pool.map(lambda m: m.stop(grace_s=grace_s), members))


def restart_group(
    members: list[ServerSession], profile: LaunchProfile | None = None, grace_s: float = 30.0
) -> list[ServerSession]:
    """Stop every member, then launch the group again from the profile as it is now (or ``profile``)."""
    if not members:
        raise SessionError("no members to restart")
    new_profile = profile or members[0].current_profile()
    info = members[0].group
    if info is not None and not new_profile.is_explicit("server.replicas"):
        # A group launched with --replicas N (the file says nothing): it restarts as N again.
        new_profile = with_replicas(new_profile, info.size)
    errors = [p for p in validate_profile(new_profile, check_port=False) if p.is_error]
    if errors:
        raise LaunchError(_problems_text(new_profile, errors), errors, code=2)
    reports = stop_group(members, grace_s)
    failed = [f"{m.session_id}: {r.message}" for m, r in zip(members, reports) if not r.stopped]
    if failed:
        raise SessionError("restart of the group aborted:\n  " + "\n  ".join(failed))
    new = ServerSession.launch_group(new_profile, members[0].home)
    for old, started in zip(members, new):
        started._update_state(partial(_note_restarted_from, old.session_id))
    return new


def _note_restarted_from(old_id: str, rec: dict) -> None:
    rec["restarted_from"] = old_id


def list_sessions(home: Home | None = None, include_ended: bool = True) -> list[ServerSession]:
    """Every session, oldest first; ``include_ended=False`` keeps the live ones.

    A session is a folder with a state.json, or one whose server runs (found by its session marker)
    although its state.json, or its whole folder, is damaged or gone: those are listed too, and their
    status says what is wrong.  Nothing here raises for a damaged file.
    """
    home = home or resolve_home()
    try:
        dirs = {
            d.name: d
            for d in home.sessions_dir.iterdir()
            if not d.is_symlink() and d.is_dir() and has_state_entry(d)
        }
    except FileNotFoundError:
        dirs = {}
    except NotADirectoryError:  # `<state>/sessions` is a file: say so, never a traceback
        raise SessionsFolderError(home.sessions_dir) from None
    marked = find_marked_servers(home)
    for session_id in marked:
        dirs.setdefault(session_id, home.sessions_dir / session_id)
    sessions = []
    for session_id, d in dirs.items():
        session = ServerSession(d, home)
        if session_id in marked:
            session._marked = marked[session_id]
        sessions.append(session)
    sessions.sort(key=_session_sort_key)
    if not include_ended:
        sessions = [s for s in sessions if s.is_alive()]
    return sessions


def _session_sort_key(session: ServerSession) -> tuple[float, str]:
    started = session.state_record.get("started_at")
    if not isinstance(started, (int, float)):
        try:
            started = session.session_dir.stat().st_mtime
        except OSError:
            started = time.time()
    return (float(started), session.session_id)


def running_sessions_of(profile_name: str, home: Home) -> list[ServerSession]:
    """The sessions of ``profile_name`` whose server runs now (the one-server-per-profile rule)."""
    return [s for s in list_sessions(home) if s.profile_name == profile_name and s.is_alive()]


def _already_running_text(profile_name: str, running: ServerSession) -> str:
    rec = running.state_record
    where = f"pid {running.pid}"
    if rec.get("port"):
        where += f", {rec.get('host', '127.0.0.1')}:{rec['port']}"
    return (
        f"profile '{profile_name}' is already running as {running.session_id} ({where}); "
        f"stop it first (eagle3-tui stop {running.session_id}) or restart it"
    )


def _pid_describer(home: Home) -> Callable[[int], str]:
    """pid -> "session <id>" for a process of one of ``home``'s running sessions, else its name."""
    owners: dict[int, str] | None = None

    def describe(pid: int) -> str:
        nonlocal owners
        if owners is None:
            owners = {}
            for session in list_sessions(home, include_ended=False):
                ident = session.main_identity()
                if ident:
                    for info in probes.process_tree(*ident):
                        owners[info.pid] = session.session_id
        if pid in owners:
            return f"session {owners[pid]}"
        from sessions.gpus import process_name

        return process_name(pid)

    return describe


def _record_pid(session: ServerSession, pid: int) -> None:
    """Write the new server's identity into its 'launching' record."""
    identity = {"pid": pid, "create_time": _create_time_of(pid), "pgid": _pgid_of(pid), "launch_state": "started"}
    session._update_state(lambda rec: rec.update(identity))


def find_session(ref: str, home: Home | None = None) -> ServerSession:
    """A session by its id or a unique prefix of it (the CLI's SESSION argument)."""
    home = home or resolve_home()
    if len(ref) > 255:
        raise SessionNotFound(f"no session '{ref[:40]}…' ({len(ref)} characters; a session id has at most 255)")
    if ref and _SAFE_SESSION_ID.fullmatch(ref) and has_state_entry(home.sessions_dir / ref):
        return ServerSession.load(ref, home)
    matches = [s for s in list_sessions(home) if s.session_id.startswith(ref)] if ref else []
    exact = [s for s in matches if s.session_id == ref]
    if exact:
        return exact[0]
    if not matches:
        raise SessionNotFound(f"no session '{ref}' in {home.sessions_dir}")
    if len(matches) > 1:
        names = ", ".join(s.session_id for s in matches[:5])
        raise SessionNotFound(f"session '{ref}' is ambiguous: {len(matches)} match ({names})")
    return matches[0]


def _problems_text(profile: LaunchProfile, problems: list[Problem]) -> str:
    lines = [f"profile '{profile.name}' cannot be launched:"]
    for p in problems:
        where = f" (line {p.line})" if p.line else ""
        lines.append(f"  {p.field}{where}: {p.message}")
    return "\n".join(lines)


def _new_session_dir(home: Home, profile_name: str) -> Path:
    base = _SAFE_ID_CHARS.sub("-", profile_name).strip("-.") or "session"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        session_dir = home.sessions_dir / f"{base}-{stamp}-{secrets.token_hex(2)}"
        try:
            session_dir.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return ensure_private_dir(session_dir)
    raise LaunchError(f"could not create a session folder in {home.sessions_dir}")


def _kill_quietly(popen: subprocess.Popen) -> None:
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


