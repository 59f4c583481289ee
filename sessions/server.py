"""Detached server sessions: launch, status, stop, restart and reattach (DESIGN §2, §3).

A session is a folder ``<home.sessions_dir>/<session-id>/`` holding ``profile.toml`` (the profile as
launched), ``command.json`` (argv and the env changes, secrets redacted), ``server.log`` (stdout and
stderr of the server) and ``state.json`` (identity, port, phase times, outcome).  Everything about a
session can be rebuilt from that folder, so any process may reattach to it: the TUI after a restart,
``eagle3-tui stop`` from another shell.

The server runs in its own session and process group (it outlives the TUI, SSH drops and SIGHUP) and is
identified by (pid, create_time).  The state of a session (``starting``, ``ready``, ``stalled``,
``crashed``, ``exited``, ``stopped``) is derived on every ``status()`` from the log, the process tree,
the port and ``/ready``; only facts (phase first seen, outcome, stop) are written back to ``state.json``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

from sessions import probes, start_facts
from sessions.history import last_good, record_start
from sessions.home import (
    Home,
    atomic_write_json,
    atomic_write_text,
    ensure_private_dir,
    read_json,
    resolve_home,
)
from sessions.logs import LogFileError, read_increment
from sessions.phases import StartupPhase, StartupSummary, StartupTracker
from sessions.profiles import LaunchProfile, Problem, build_command, load_profile, validate_profile
from sessions.redaction import Redactor, collect_secrets, redact_argv, redact_env, write_secrets_file
from sessions.serving import SessionServing
from sessions.stall import is_compiler_name, stall_limit_s
from sessions.state_file import StateRead, read_state

SESSION_ENV = "EAGLE3_TUI_SESSION"  # in the server's environment: finds strays that left the process group
# Also in the server's environment: the sessions folder it belongs to.  With SESSION_ENV it is the marker
# that finds a running server whose folder or state.json was damaged or deleted (`find_marked_servers`).
SESSIONS_DIR_ENV = "EAGLE3_TUI_SESSIONS_DIR"
LAUNCH_LOCK_FILE = "launch.lock"  # in the state dir: one launch at a time per home
# A 'launching' record older than this, with no server process found, is a launch that never completed.
_LAUNCH_STALE_S = 30.0
STATE_VERSION = 1
STATES = ("starting", "ready", "stalled", "crashed", "exited", "stopped")
FINAL_STATES = ("crashed", "exited", "stopped")

STATE_FILE = "state.json"
PROFILE_FILE = "profile.toml"
COMMAND_FILE = "command.json"
LOG_FILE = "server.log"
EMULATED_GPUS_FILE = "emulated_gpus.json"

HTTP_PROBE_TIMEOUT_S = 1.0
KILL_WAIT_S = 10.0  # after SIGKILL: a rank in uninterruptible sleep (GPU driver) may take a moment
_LOG_READ_LIMIT_BYTES = 64 << 20  # per status() call, so a huge log never blocks one refresh for long
_TAIL_KEEP_BYTES = 8192
_SAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_SAFE_SESSION_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_LINE_TIME = re.compile(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
# uvicorn's access line for one of our probes: `INFO:     127.0.0.1:5433 - "GET /ready HTTP/1.1" 503 ...`
_PROBE_ACCESS_LINE = re.compile(rb'"GET /(?:ready|model_info|get_model_info)(?:\?[^ "]*)? HTTP/1\.[01]" \d{3}')


class SessionError(Exception):
    """A session action failed; ``code`` is the CLI exit code (1 failed, 2 bad input)."""

    code = 1


class SessionNotFound(SessionError):
    code = 2


class LaunchError(SessionError):
    """Launch refused or failed.  ``problems`` are the validation problems (each names its field)."""

    def __init__(self, message: str, problems: list[Problem] | tuple[Problem, ...] = (), code: int = 1):
        super().__init__(message)
        self.problems = list(problems)
        self.code = code


class AlreadyRunning(LaunchError):
    """A launch of a profile that already has a running server; ``session_id`` names that session."""

    def __init__(self, message: str, session_id: str) -> None:
        super().__init__(message, code=1)
        self.session_id = session_id


class GpuBusy(LaunchError):
    """The GPUs a launch would use hold other processes' memory; ``busy`` names each GPU and holder.

    Exit code 2: the launch runs only when asked again with ``force`` (``--force``, or yes in the TUI).
    """

    def __init__(self, message: str, busy: list[Any]) -> None:
        super().__init__(message, code=2)
        self.busy = list(busy)


@dataclass(frozen=True)
class RankStatus:
    """One SGLang child process: a scheduler (``rank`` = its TP rank), the detokenizer or DP controller."""

    pid: int
    title: str
    rank: int | None
    status: str
    cpu_percent: float | None
    rss_bytes: int | None
    gpu_index: int | None
    role: str = "scheduler"
    create_time: float = 0.0
    num_threads: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "title": self.title,
            "rank": self.rank,
            "status": self.status,
            "role": self.role,
            "cpu_percent": self.cpu_percent,
            "rss_bytes": self.rss_bytes,
            "num_threads": self.num_threads,
            "gpu_index": self.gpu_index,
        }


@dataclass(frozen=True)
class SessionStatus:
    """One reading of a session (immutable); ``to_json`` gives the ``status --json`` object."""

    session_id: str
    profile: str
    pid: int | None
    create_time: float | None
    state: str
    phase: str
    port: int | None
    host: str
    ranks: tuple[RankStatus, ...]
    log_path: Path
    started_at: float | None
    port_listening: bool
    ready: bool | None  # /ready answered 200 (None: not asked, e.g. the port is closed)
    model_info: dict | None
    silent_for_s: float
    summary: StartupSummary
    phase_entered_at: dict[str, float]
    alive: bool = False
    outcome: str | None = None
    stall_limit_s: float | None = None  # math.inf: no limit now (a compiler child is alive, ...)
    processes: tuple[probes.ProcInfo, ...] = ()  # the whole tree, main first (diagnosis reads it)
    http_error: str | None = None
    session_dir: Path | None = None
    problem: str | None = None  # what is wrong with the session's record (damaged state.json, ...)
    taken_at: float = field(default_factory=time.time)
    serving: Any = None  # sessions.serving.ServingSnapshot once a stats line was logged

    @property
    def has_compile_child(self) -> bool:
        return any(is_compiler_name(p.name) for p in self.processes[1:])

    def to_json(self) -> dict[str, Any]:
        s = self.summary
        progress = None
        if s.progress is not None:
            progress = {"label": s.progress.label, "done": s.progress.done, "total": s.progress.total}
        return {
            # DESIGN §1b contract fields
            "session_id": self.session_id,
            "profile": self.profile,
            "pid": self.pid,
            "state": self.state,
            "phase": self.phase,
            "port": self.port,
            "ranks": [r.to_json() for r in self.ranks],
            "log_path": str(self.log_path),
            "started_at": self.started_at,
            # extras
            "host": self.host,
            "create_time": self.create_time,
            "alive": self.alive,
            "outcome": self.outcome,
            "port_listening": self.port_listening,
            "ready": self.ready,
            "model_info": self.model_info,
            "silent_for_s": round(self.silent_for_s, 3),
            "stall_limit_s": self.stall_limit_s if self.stall_limit_s not in (None, math.inf) else None,
            "phase_entered_at": dict(self.phase_entered_at),
            "error": s.error,
            "error_line": s.error_line,
            "progress": progress,
            "ranks_expected": s.ranks_expected,
            "ranks_loaded": list(s.ranks_loaded),
            "line_count": s.line_count,
            "http_error": self.http_error,
            "session_dir": str(self.session_dir) if self.session_dir else None,
            "problem": self.problem,
            "serving": self.serving.to_json() if self.serving is not None else None,
        }


@dataclass(frozen=True)
class StopReport:
    """What ``stop()`` did and what it verified afterwards."""

    stopped: bool  # nothing of the session remains
    signals_sent: tuple[str, ...]
    waited_s: float
    survivors: tuple[int, ...]
    port_free: bool
    gpu_pids_left: tuple[int, ...]
    message: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- the session --------------------------------------------------------------------------------------


class ServerSession:
    """A server launched by eagle3-tui, live or ended, rebuilt from its folder."""

    def __init__(self, session_dir: Path, home: Home) -> None:
        self.session_dir = Path(session_dir)
        self.session_id = self.session_dir.name
        self.home = home
        self.log_path = self.session_dir / LOG_FILE
        self._profile: LaunchProfile | None = None
        self._popen: subprocess.Popen | None = None  # set when this process launched it (to reap it)
        self._tracker = StartupTracker()
        self._serving = SessionServing()  # Decode/Prefill batch lines (+ /metrics) once it serves
        self._log_offset = 0
        self._log_tail = b""
        self._activity_at: float | None = None  # wall clock of the last log write that was not a probe
        self._model_info: dict | None = None
        self._tree_watch: probes.ProcessTreeWatch | None = None  # the main process's tree, between polls
        self._last_lines_cache: tuple[tuple[int, int], tuple[str, ...]] | None = None
        self._marked: tuple[int, float] | None = None  # the main found by its session marker
        self.restart_diff: list[str] = []
        self._has_metrics: bool | None = None

    def __repr__(self) -> str:
        return f"ServerSession({self.session_id!r})"

    # -- construction ----------------------------------------------------------------------------------

    @classmethod
    def load(cls, session_id: str, home: Home | None = None) -> ServerSession:
        """Reattach to a session by its exact id."""
        home = home or resolve_home()
        session_dir = home.sessions_dir / session_id
        if not session_id or "/" in session_id or not (session_dir / STATE_FILE).is_file():
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
    ) -> ServerSession:
        """Validate ``profile``, start its server detached, and return the new session.

        In order, each refusal before anything starts: the profile already runs (`AlreadyRunning`, naming
        that session), the profile does not validate (`LaunchError` with every problem), the GPUs the
        launch would use hold other processes' memory (`GpuBusy`, unless ``force``).  All of it runs under
        a lock in the state dir, so two launches at the same moment start exactly one server.

        Write first, then start: the folder and a ``launching`` state.json exist before the server does,
        and the server carries the session id in its environment, so a launcher killed at any point
        leaves a server that `status` lists and `stop` stops.
        """
        home = (home or resolve_home()).ensure()
        with _locked(home.state_root / LAUNCH_LOCK_FILE):
            running = running_sessions_of(profile.name, home)
            if running:
                raise AlreadyRunning(_already_running_text(profile.name, running[0]), running[0].session_id)
            # validate_profile's port check names who holds the port (probes.describe_port_user).
            problems = validate_profile(profile, check_port=True)
            errors = [p for p in problems if p.is_error]
            if errors:
                raise LaunchError(_problems_text(profile, errors), errors, code=2)
            command = build_command(profile)
            if not force:
                from sessions.gpus import busy_gpus_for_launch, format_busy

                busy = busy_gpus_for_launch(profile, home, source=gpu_source, describe_pid=_pid_describer(home))
                if busy:
                    raise GpuBusy(format_busy(profile.name, busy), busy)
            return cls._start(profile, command, home)

    @classmethod
    def _start(cls, profile: LaunchProfile, command: Any, home: Home) -> ServerSession:
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
        secret_list = collect_secrets(command.argv, env_changes)
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
            },
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
        name = self.state_record.get("profile")
        if name:
            return str(name)
        parts = self.session_id.rsplit("-", 3)
        return parts[0] if len(parts) == 4 else self.session_id

    def main_identity(self) -> tuple[int, float] | None:
        """(pid, create_time) of the main process: from state.json, else from the session marker in a
        running process's environment (the record is damaged, deleted, or the launcher died before it
        wrote the pid)."""
        rec = self.state_record
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

    def is_alive(self) -> bool:
        """The main process (pid, create_time) still runs."""
        self._reap()
        ident = self.main_identity()
        return ident is not None and probes.process_alive(*ident)

    def current_profile(self) -> LaunchProfile:
        """The profile a restart would launch: the source file as it is now, else the snapshot."""
        source = self.state_record.get("profile_source")
        if source and Path(source).is_file():
            profile = load_profile(Path(source))
            if profile.name != self.profile.name:
                profile = dataclasses.replace(profile, name=self.profile.name)
            return profile
        return self.profile

    # -- status ----------------------------------------------------------------------------------------

    def status(self, probe_http: bool = True, gpu_snapshot: Any = None) -> SessionStatus:
        """Read the log, the process tree, the port and (when it listens) ``/ready`` and ``/model_info``.

        A damaged or missing state.json does not raise: the status carries ``problem`` (what is wrong,
        naming the file and field), and the server is still found by its session marker.
        """
        self._reap()
        read = self.state_read
        rec = read.record
        problems = list(read.problems)
        ident = self.main_identity()
        pid, create_time = ident if ident else (None, None)
        if not self.session_dir.is_dir():
            problems = [f"the session folder {self.session_dir} is gone (found by its session marker)"]
        elif ident and not rec.get("pid"):
            rec = self._adopt_marked(read, ident, problems)
        elif (
            ident is None
            and rec.get("launch_state") == "launching"
            and time.time() - float(rec.get("started_at") or 0.0) > _LAUNCH_STALE_S
        ):
            problems.append("the launch never completed: no server process was recorded or found")
        host, port = rec.get("host", "127.0.0.1"), rec.get("port")
        summary = self._read_log()
        silent_for_s = self._silent_for_s(rec)
        log_ready = summary.phase == StartupPhase.READY or summary.outcome == "ready"
        if self._model_info is None and isinstance(rec.get("model_info"), dict):
            self._model_info = rec["model_info"]

        # Every request lands in the server's access log: ask /ready only until the start is over and
        # /model_info once (it is kept in state.json), so watching a server does not fill its log.
        known_ready = log_ready or rec.get("start_outcome") == "ready"
        # While it starts, the tree changes (ranks, compilers: the stall limit asks) and is walked every
        # time; once ready, the watch reads its known members and walks /proc only now and then.
        tree = self._process_tree(pid, create_time, full_scan=not known_ready) if pid else []
        alive = bool(tree) and tree[0].pid == pid
        listening = bool(alive and port and probes.port_listening(host, port))
        http_error = None
        port_owner: str | None = None
        if listening and port and not known_ready:
            # Whatever answers on the port counts only when it is our own process: another server on
            # the same port would answer /ready for us (a false good start in the history).
            owner = probes.listener_owner(port, host, [p.pid for p in tree])
            if owner.ours is False:
                listening = False
                port_owner = owner.text
                http_error = f"{owner.text}, not by this session"
        ready_http: bool | None = None
        if listening and probe_http:
            base = f"http://{_url_host(host)}:{port}"
            if known_ready:
                ready_http = True
            else:
                result = probes.http_get_json(f"{base}/ready", HTTP_PROBE_TIMEOUT_S)
                ready_http = result.status == 200 if result.status is not None else None
                http_error = result.error
            if self._model_info is None:
                info = probes.http_get_json(f"{base}/model_info", HTTP_PROBE_TIMEOUT_S)
                if info.status == 200 and isinstance(info.json, dict):
                    self._model_info = info.json

        # The log's ready line comes after warmup, as /ready's 200 does (http_server.py:2502); a 503 after
        # it means draining (SIGTERM), which is still a server that was ready, not a start.
        ready_now = alive and (ready_http is True or log_ready)
        phase = StartupPhase.READY.value if ready_now else str(summary.phase)
        fatal = summary.outcome == "crashed" or any(e.fatal for e in summary.errors)
        ever_ready = (
            log_ready
            or ready_now
            or rec.get("start_outcome") == "ready"
            or StartupPhase.READY.value in rec.get("phase_entered_at", {})
        )
        stall_limit = self._stall_limit_s(rec, summary, tree)
        stalled = alive and not ready_now and silent_for_s > stall_limit

        def classify(record: dict) -> str:
            # A stop the user asked for is a stop: what the signal causes (the main gone, ranks dying in
            # any order, their error lines) is not a crash once the intent is on record.
            stopping = record.get("stop_requested_at") is not None or bool(record.get("stopped_at"))
            return classify_state(
                alive=alive,
                stopped=stopping,
                fatal_error=fatal and not stopping,
                ready=ready_now,
                ever_ready=ever_ready,
                stalled=stalled,
            )

        state = classify(rec)
        if state in ("crashed", "exited") and rec.get("stop_requested_at") is None:
            # A stop may have recorded its intent after this call read the record: read it once more.
            fresh = self.state_record
            if fresh.get("stop_requested_at") is not None:
                rec = fresh
                state = classify(rec)
        if not read.damaged and self.session_dir.is_dir():
            rec = self._record_progress(rec, summary, state, tree, ready_now, alive, self._model_info)
            state = classify(rec)  # the record as written, under its lock, has the last word
        if port_owner:
            problems.append(f"{port_owner}: it is not this session's server")

        gpu_of = _gpu_index_by_pid(gpu_snapshot, self.session_dir)
        ranks = tuple(
            RankStatus(
                pid=p.pid,
                title=p.title,
                rank=p.rank,
                status=p.status,
                cpu_percent=p.cpu_percent,
                rss_bytes=p.rss_bytes,
                gpu_index=gpu_of.get(p.pid),
                role=p.role,
                create_time=p.create_time,
                num_threads=p.num_threads,
            )
            for p in tree
            if p.role in ("scheduler", "detokenizer", "dp_controller")
        )
        return SessionStatus(
            session_id=self.session_id,
            profile=self.profile_name,
            pid=pid,
            create_time=create_time,
            state=state,
            phase=phase,
            port=port,
            host=host,
            ranks=tuple(sorted(ranks, key=_rank_sort_key)),
            log_path=self.log_path,
            started_at=rec.get("started_at"),
            port_listening=listening,
            ready=ready_http,
            model_info=self._model_info,
            silent_for_s=silent_for_s,
            summary=summary,
            phase_entered_at=dict(rec.get("phase_entered_at", {})),
            alive=alive,
            outcome=rec.get("outcome"),
            stall_limit_s=stall_limit,
            processes=tuple(tree),
            http_error=http_error,
            session_dir=self.session_dir,
            problem="; ".join(problems) if problems else None,
            serving=self._serving_snapshot(host, port, listening and probe_http and ready_now),
        )

    def _serving_snapshot(self, host: str, port: int | None, live: bool) -> Any:
        """The serving figures (sessions.serving); ``/metrics`` too when the server exports it."""
        url = f"http://{_url_host(host)}:{port}" if live and port and self._metrics_enabled() else None
        return self._serving.snapshot(url)

    def _metrics_enabled(self) -> bool:
        if self._has_metrics is None:
            argv = (read_json(self.session_dir / COMMAND_FILE) or {}).get("argv") or []
            self._has_metrics = "--enable-metrics" in argv
        return self._has_metrics

    def _adopt_marked(self, read: StateRead, ident: tuple[int, float], problems: list[str]) -> dict:
        """A server found by its marker that state.json does not name: record it when the record is
        sound (the launcher died between starting it and writing its pid), else only say so."""
        pid, create_time = ident
        if read.damaged:
            problems.append(f"its server (pid {pid}) was found by its session marker")
            return read.record

        def adopt(state_rec: dict) -> None:
            if not state_rec.get("pid"):
                state_rec.update(pid=pid, create_time=create_time, pgid=_pgid_of(pid), launch_state="adopted")

        problems.append(f"the launcher did not record the server's pid; found pid {pid} by its session marker")
        return self._update_state(adopt)

    def _process_tree(self, pid: int, create_time: float | None, full_scan: bool) -> list[probes.ProcInfo]:
        watch = self._tree_watch
        if watch is None or (watch.pid, watch.create_time) != (pid, float(create_time or 0.0)):
            watch = self._tree_watch = probes.ProcessTreeWatch(pid, float(create_time or 0.0))
        return watch.read(full_scan=full_scan)

    def _read_log(self) -> StartupSummary:
        """Feed what the log gained since the last call into the tracker (a fresh object re-reads it)."""
        try:  # the log core opens it: a FIFO or a device in its place is refused, never waited on
            got = read_increment(self.log_path, self._log_offset, _LOG_READ_LIMIT_BYTES)
        except LogFileError:
            return self._tracker.summary()  # not a log file: nothing to learn from it (diagnose says why)
        if got is None:
            return self._tracker.summary()
        chunk, st = got
        if st.st_size < self._log_offset:  # truncated or replaced: start over
            self._tracker = StartupTracker()
            self._serving.reset()
            self._log_offset = 0
            self._log_tail = b""
            self._activity_at = None
            got = read_increment(self.log_path, 0, _LOG_READ_LIMIT_BYTES)
            chunk, st = got if got is not None else (b"", st)
        if chunk:
            first_read = self._log_offset == 0
            self._log_offset += len(chunk)
            self._tracker.feed_bytes(chunk)  # it keeps a partial last line until its newline comes
            self._serving.feed_bytes(chunk)
            self._log_tail = (self._log_tail + chunk[-_TAIL_KEEP_BYTES:])[-_TAIL_KEEP_BYTES:]
            activity_at = _last_activity_at(chunk, st.st_mtime, exact=not first_read)
            if activity_at is not None:
                self._activity_at = max(activity_at, self._activity_at or 0.0)
        return self._tracker.summary()

    def _last_lines(self, count: int = 5) -> tuple[str, ...]:
        """The latest non-empty log lines (tqdm renders split at ``\r``), for stall's DeepGEMM check."""
        key = (self._log_offset, count)
        if self._last_lines_cache is not None and self._last_lines_cache[0] == key:
            return self._last_lines_cache[1]  # the log did not grow since the last poll
        text = self._log_tail.decode("utf-8", errors="replace")
        lines = tuple([line for line in re.split(r"[\r\n]", text) if line.strip()][-count:])
        self._last_lines_cache = (key, lines)
        return lines

    def _silent_for_s(self, rec: dict) -> float:
        """Seconds since the server last wrote something other than the access lines of our probes."""
        last = self._activity_at if self._activity_at is not None else rec.get("started_at") or time.time()
        return max(0.0, time.time() - last)

    def _stall_limit_s(self, rec: dict, summary: StartupSummary, tree: list[probes.ProcInfo]) -> float:
        """Seconds of log silence before a start counts as stalled (wall clock, never time-scaled)."""
        try:
            profile: Any = self.profile
        except Exception:  # noqa: BLE001 - an unreadable snapshot must not break status; the recorded limit will do
            profile = SimpleNamespace(watch=SimpleNamespace(stall_after_s=rec.get("stall_after_s")))
        baseline = last_good(self.home, self.profile_name, exclude_session_id=self.session_id)
        has_compile_child = any(is_compiler_name(p.name) for p in tree[1:])
        return stall_limit_s(profile, summary, baseline, has_compile_child, last_lines=self._last_lines())

    def _record_progress(
        self,
        rec: dict,
        summary: StartupSummary,
        state: str,
        tree: list[probes.ProcInfo],
        ready_now: bool,
        alive: bool,
        model_info: dict | None,
    ) -> dict:
        """Write new facts to state.json, once each: phases first seen, the descendants, how it ended.

        ``start_outcome`` is how the start ended (``ready`` / ``crashed``; ``stop()`` adds ``stopped``),
        ``outcome`` how the session ended (``crashed`` / ``exited``; ``stop()`` adds ``stopped``).
        """
        now = time.time()
        started_at = rec.get("started_at") or now
        entered = dict(rec.get("phase_entered_at", {}))
        new_phases: dict[str, float] = {}
        for event in summary.events:
            name = str(event.phase)
            if name not in entered and name not in new_phases:
                new_phases[name] = _event_wall_time(event.log_time, started_at, now)
        if ready_now and StartupPhase.READY.value not in entered:
            new_phases.setdefault(StartupPhase.READY.value, now)
        known = {tuple(d) for d in rec.get("descendants", [])}
        new_descendants = [(p.pid, p.create_time) for p in tree[1:] if (p.pid, p.create_time) not in known]
        reached_ready = StartupPhase.READY.value in entered or StartupPhase.READY.value in new_phases

        def outcomes(record: dict) -> tuple[str | None, str | None]:
            """(start_outcome, outcome) to add to ``record``; a recorded stop intent turns what the stop
            causes into ``stopped``, never ``crashed``."""
            effective: str | None = state
            if record.get("stop_requested_at") is not None and state in ("crashed", "exited"):
                effective = "stopped" if not alive else None
            start = None
            if record.get("start_outcome") is None:
                if effective == "stopped" and reached_ready:
                    start = "ready"  # it was ready, then stopped
                elif effective in ("ready", "crashed", "stopped"):
                    start = effective
                elif effective == "exited":
                    start = "ready"  # it got ready between two looks, then ended
            end = None
            if effective in ("crashed", "exited", "stopped") and not alive and not record.get("outcome"):
                end = effective
            return start, end

        start_outcome, end_outcome = outcomes(rec)
        new_model_info = model_info if model_info is not None and "model_info" not in rec else None
        if (
            not new_phases
            and not new_descendants
            and start_outcome is None
            and end_outcome is None
            and new_model_info is None
        ):
            return rec

        def update(state_rec: dict) -> None:
            phases_now = state_rec.setdefault("phase_entered_at", {})
            for name, t in new_phases.items():
                phases_now.setdefault(name, t)
            kept = {tuple(d) for d in state_rec.get("descendants", [])}
            state_rec["descendants"] = sorted(list(d) for d in kept | set(new_descendants))
            start, end = outcomes(state_rec)  # the fresh record: a stop may have landed since
            if start is not None:
                state_rec["start_outcome"] = start
            if new_model_info is not None:
                state_rec.setdefault("model_info", new_model_info)
            if end is not None:
                state_rec["outcome"] = end
                state_rec.setdefault("ended_at", now)

        rec = self._update_state(update)
        self._record_history(rec, summary)
        return rec

    def _record_history(self, rec: dict, summary: StartupSummary) -> None:
        """Tell the history, once, how this start ended: the baseline the next start is compared with."""
        outcome = rec.get("start_outcome")
        if outcome is None or rec.get("history_recorded"):
            return
        claimed = {}

        def claim(state_rec: dict) -> None:
            claimed["ok"] = not state_rec.get("history_recorded")
            state_rec["history_recorded"] = True

        self._update_state(claim)
        if claimed.get("ok"):
            record_start(
                self.home,
                self.profile_name,
                self.session_id,
                summary,
                rec.get("phase_entered_at", {}),
                outcome,
                started_at=rec.get("started_at"),
                facts=start_facts.read(self.session_dir),
            )

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

    # -- restart ---------------------------------------------------------------------------------------

    def restart(self, profile: LaunchProfile | None = None, grace_s: float = 30.0) -> ServerSession:
        """Stop this session and launch the current profile (or ``profile``); the new one keeps the diff."""
        new_profile = profile or self.current_profile()
        diff = flag_diff(self.profile, new_profile)
        # Refuse a broken profile while the old server still runs (its port is checked after the stop).
        errors = [p for p in validate_profile(new_profile, check_port=False) if p.is_error]
        if errors:
            raise LaunchError(_problems_text(new_profile, errors), errors, code=2)
        report = self.stop(grace_s=grace_s)
        if not report.stopped:
            raise SessionError(f"restart of {self.session_id} aborted: {report.message}")
        new = ServerSession.launch(new_profile, self.home)
        new.restart_diff = diff

        def note(state_rec: dict) -> None:
            state_rec["restarted_from"] = self.session_id
            state_rec["restart_diff"] = diff

        new._update_state(note)
        self._update_state(lambda rec: rec.__setitem__("restarted_as", new.session_id))
        return new

    # -- state.json --------------------------------------------------------------------------------------

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


# --- module functions -----------------------------------------------------------------------------------


def classify_state(
    *, alive: bool, stopped: bool, fatal_error: bool, ready: bool, ever_ready: bool, stalled: bool
) -> str:
    """DESIGN §3's state of a session from the facts one status() gathers."""
    if stopped and not alive:
        return "stopped"
    if fatal_error:
        return "crashed"
    if alive:
        if ready:
            return "ready"
        return "stalled" if stalled else "starting"
    return "exited" if ever_ready else "crashed"


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
            if not d.is_symlink() and d.is_dir() and (d / STATE_FILE).is_file()
        }
    except FileNotFoundError:
        dirs = {}
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


def _marked_main(home: Home, session_id: str) -> tuple[int, float] | None:
    return find_marked_servers(home).get(session_id)


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


def _keep_damaged_copy(path: Path) -> None:
    """Keep a damaged state.json's bytes next to it (once) before it is rewritten: it is evidence."""
    target = path.with_name(path.name + ".damaged")
    if target.exists():
        return
    with contextlib.suppress(OSError):
        os.link(path, target)


def find_session(ref: str, home: Home | None = None) -> ServerSession:
    """A session by its id or a unique prefix of it (the CLI's SESSION argument)."""
    home = home or resolve_home()
    if ref and _SAFE_SESSION_ID.fullmatch(ref) and (home.sessions_dir / ref / STATE_FILE).is_file():
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


def flag_diff(old: LaunchProfile, new: LaunchProfile) -> list[str]:
    """The command-line flags and env changes that differ, secrets redacted.

    Lines read ``+ --flag value`` (added), ``- --flag value`` (removed), ``~ --flag old -> new`` (changed),
    and the same with ``env NAME=value``.
    """
    old_cmd, new_cmd = build_command(old), build_command(new)
    lines: list[str] = []
    old_head, old_flags = _parse_argv(old_cmd.argv)
    new_head, new_flags = _parse_argv(new_cmd.argv)
    if old_head != new_head:
        lines.append(f"~ command {' '.join(redact_argv(old_head))} -> {' '.join(redact_argv(new_head))}")
    lines += _diff_maps(old_flags, new_flags, prefix="")
    old_env = {k: v for k, v in old_cmd.env_changes.items()}
    new_env = {k: v for k, v in new_cmd.env_changes.items()}
    lines += _diff_maps(
        {k: (v, redact_env({k: v})[k]) for k, v in old_env.items()},
        {k: (v, redact_env({k: v})[k]) for k, v in new_env.items()},
        prefix="env ",
        joiner="=",
    )
    return lines


def _parse_argv(argv: list[str]) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """Split argv into its head (interpreter, -m module) and flag -> (raw value, redacted value)."""
    redacted = redact_argv(argv)
    head_len = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
    flags: dict[str, tuple[list[str], list[str]]] = {}
    current: str | None = None
    for raw, shown in zip(argv[head_len:], redacted[head_len:]):
        if raw.startswith("--"):
            name, eq, value = raw.partition("=")
            _, _, shown_value = shown.partition("=")
            current = name
            entry = flags.setdefault(name, ([], []))
            if eq:
                entry[0].append(value)
                entry[1].append(shown_value)
        elif current is not None:
            flags[current][0].append(raw)
            flags[current][1].append(shown)
    return argv[:head_len], {k: (" ".join(v[0]), " ".join(v[1])) for k, v in flags.items()}


def _diff_maps(
    old: dict[str, tuple[str, str]], new: dict[str, tuple[str, str]], prefix: str, joiner: str = " "
) -> list[str]:
    def show(name: str, value: str) -> str:
        return f"{prefix}{name}{joiner}{value}" if value else f"{prefix}{name}"

    lines = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"- {show(name, old[name][1])}")
        elif name not in old:
            lines.append(f"+ {show(name, new[name][1])}")
        elif old[name][0] != new[name][0]:
            before, after = old[name][1], new[name][1]
            suffix = " (secret changed)" if before == after else ""
            lines.append(f"~ {show(name, before)} -> {after or '(no value)'}{suffix}")
    return lines


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


def _create_time_of(pid: int) -> float:
    return psutil.Process(pid).create_time()


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _kill_quietly(popen: subprocess.Popen) -> None:
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _identities(procs: list) -> set[tuple[int, float]]:
    found = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # NoSuchProcess: already gone
            found.add((proc.pid, proc.create_time()))
    return found


def _wait_gone(alive: Callable[[], list], timeout_s: float, reap: Callable[[], None]) -> None:
    deadline = time.monotonic() + max(0.0, timeout_s)
    delay = 0.02
    while True:
        reap()
        if not alive() or time.monotonic() >= deadline:
            return
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _gpu_pids_left(pids: set[int]) -> tuple[int, ...]:
    """Session pids that NVML still lists as holding GPU memory (empty without NVML)."""
    from sessions.gpus import NvmlSource

    source = NvmlSource(wait_s=3.0)
    try:
        deadline = time.monotonic() + 5.0  # the driver may release a dead process's memory a moment later
        while True:
            snapshot = source.snapshot()
            if not snapshot.available:
                return ()
            held = {p.pid for s in snapshot.samples for p in s.processes} & pids
            if not held or time.monotonic() >= deadline:
                return tuple(sorted(held))
            time.sleep(0.25)
    finally:
        source.close()


def _gpu_index_by_pid(gpu_snapshot: Any, session_dir: Path) -> dict[int, int]:
    """pid -> GPU index from a GpuSnapshot, else from the emulator's ``emulated_gpus.json``."""
    mapping: dict[int, int] = {}
    if gpu_snapshot is not None:
        for sample in getattr(gpu_snapshot, "samples", ()):
            for proc in sample.processes:
                mapping.setdefault(proc.pid, sample.index)
        return mapping
    data = read_json(session_dir / EMULATED_GPUS_FILE)
    if isinstance(data, dict):
        for gpu in data.get("gpus", []) or []:
            try:
                for proc in gpu.get("processes", []) or []:
                    mapping.setdefault(int(proc["pid"]), int(gpu["index"]))
            except (KeyError, TypeError, ValueError):
                continue
    return mapping


def _stop_message(
    session_id: str,
    was_alive: bool,
    stopped: bool,
    survivors: tuple[int, ...],
    port_is_free: bool,
    gpu_left: tuple[int, ...],
    port: int | None,
    host: str,
    signals: list[str],
    waited_s: float,
) -> str:
    if stopped and was_alive:
        how = "SIGTERM" if not any("SIGKILL" in s for s in signals) else "SIGTERM, then SIGKILL"
        text = f"stopped {session_id} in {waited_s:.1f}s ({how})"
        if port and port_is_free:
            text += f"; port {port} is free"
    elif stopped:
        text = f"{session_id} was not running; nothing of it remains"
    else:
        parts = []
        if survivors:
            parts.append(f"still running: pid {', '.join(map(str, survivors))}")
        if gpu_left:
            parts.append(f"still holding GPU memory: pid {', '.join(map(str, gpu_left))}")
        text = f"could not stop {session_id}: " + "; ".join(parts)
    if port and not port_is_free:
        text += f"; {probes.describe_port_user(host, port)}"
    return text


def _last_activity_at(chunk: bytes, mtime: float, exact: bool) -> float | None:
    """When the server last wrote something in ``chunk`` other than the access lines of /ready and
    /model_info probes (uvicorn logs each request): those would keep a hung warmup looking busy.

    ``exact``: the chunk is what the log gained since the previous look, so its non-probe text was
    written by ``mtime``.  A first read of a whole log dates its last non-probe line by its own
    timestamp when probe lines follow it.  None: nothing but probe lines.
    """
    segments = [s for s in re.split(rb"[\r\n]", chunk) if s.strip()]
    for i in range(len(segments) - 1, -1, -1):
        if _PROBE_ACCESS_LINE.search(segments[i]):
            continue
        if exact or i == len(segments) - 1:
            return mtime
        match = _LINE_TIME.match(segments[i])
        if match:
            try:
                stamp = time.mktime(time.strptime(match.group(1).decode(), _LOG_TIME_FORMAT))
            except ValueError:
                return mtime
            return min(stamp, mtime)
        return mtime
    return None


def _event_wall_time(log_time: str | None, started_at: float, now: float) -> float:
    """When a phase began: the log line's own timestamp when plausible, else now (when we saw it)."""
    if log_time:
        try:
            t = time.mktime(time.strptime(log_time.strip()[:19], _LOG_TIME_FORMAT))
        except ValueError:
            t = None
        if t is not None and started_at - 1.0 <= t <= now + 1.0:
            return min(max(t, started_at), now)
    return now


def _rank_sort_key(rank: RankStatus) -> tuple:
    order = {"dp_controller": 0, "scheduler": 1, "detokenizer": 2}
    return (order.get(rank.role, 3), rank.rank if rank.rank is not None else -1, rank.pid)


def _url_host(host: str) -> str:
    target = probes.connect_host(host)
    return f"[{target}]" if ":" in target else target


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
