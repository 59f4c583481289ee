"""What a server session is, in data: its files and states, its errors, and one status reading.

`SessionStatus` (with its `RankStatus` rows) is what `ServerSession.status()` returns and the screens
draw; `StopReport` is what ``stop()`` did.  `classify_state` turns the facts of one reading into
DESIGN §3's state.  Nothing here reads a process, a port or a file.
"""
from __future__ import annotations

import dataclasses
import errno
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions import probes
from sessions.phases import StartupSummary
from sessions.profiles import Problem
from sessions.stall import is_compiler_name

SESSION_ENV = "EAGLE3_TUI_SESSION"  # in the server's environment: finds strays that left the process group
# Also in the server's environment: the sessions folder it belongs to.  With SESSION_ENV it is the marker
# that finds a running server whose folder or state.json was damaged or deleted (`find_marked_servers`).
SESSIONS_DIR_ENV = "EAGLE3_TUI_SESSIONS_DIR"
LAUNCH_LOCK_FILE = "launch.lock"  # in the state dir: one launch at a time per home
# A 'launching' record older than this, with no server process found, is a launch that never completed.
LAUNCH_STALE_S = 30.0
_LAUNCH_STALE_S = LAUNCH_STALE_S
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


class SessionError(Exception):
    """A session action failed; ``code`` is the CLI exit code (1 failed, 2 bad input)."""

    code = 1


class SessionNotFound(SessionError):
    code = 2


class SessionsFolderError(SessionError, NotADirectoryError):
    """The sessions folder is not a folder (a file stands where it should be): no session can be listed.
    Also an OSError, so that a command without a SessionError handler still words it (app.cli)."""

    def __init__(self, folder: Path) -> None:
        message = f"{folder} is a file where the sessions folder is expected; move it away"
        NotADirectoryError.__init__(self, errno.ENOTDIR, message, str(folder))
        self.message = message

    def __str__(self) -> str:
        return self.message


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

    @property
    def holder_sessions(self) -> tuple[str, ...]:
        """The ids of this home's sessions among the holders (``who`` is "session <id>" for those)."""
        ids = [
            h.who.removeprefix("session ")
            for gpu in self.busy
            for h in getattr(gpu, "holders", ())
            if str(getattr(h, "who", "")).startswith("session ")
        ]
        return tuple(dict.fromkeys(ids))

    @property
    def only_sessions_hold(self) -> bool:
        """Every holder is one of this home's sessions: stopping them frees the GPUs."""
        holders = [h for gpu in self.busy for h in getattr(gpu, "holders", ())]
        return bool(holders) and all(str(getattr(h, "who", "")).startswith("session ") for h in holders)


@dataclass(frozen=True)
class RankStatus:
    """One SGLang child process: a scheduler (``rank`` = its TP rank, ``dp_rank`` its replica under a DP
    controller, from the title ``sglang::scheduler_DP1_TP0``), the detokenizer or DP controller."""

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
    dp_rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "title": self.title,
            "rank": self.rank,
            "dp_rank": self.dp_rank,
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
    # When an ended session ended (stopped_at for a stop, else ended_at of state.json), read with the
    # record in status(): widgets draw it and never open state.json themselves.
    ended_at: float | None = None
    launch_tp_size: int | None = None  # the TP size the session was launched with (its state.json)
    group: dict | None = None  # {"id", "index", "size", "gpus"} for a member of a group of replicas

    @property
    def rank_count(self) -> int | None:
        """How many TP ranks the start has: from its server_args line, else the highest rank seen + 1."""
        expected = self.summary.ranks_expected
        if expected:
            return int(expected)
        ranks = [r.rank for r in self.ranks if r.rank is not None]
        return max(ranks) + 1 if ranks else None

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
            "error_rank": s.error_rank,
            "error_cause": s.error_cause,
            "progress": progress,
            "ranks_expected": s.ranks_expected,
            "ranks_loaded": list(s.ranks_loaded),
            "line_count": s.line_count,
            "http_error": self.http_error,
            "session_dir": str(self.session_dir) if self.session_dir else None,
            "problem": self.problem,
            "serving": self.serving.to_json() if self.serving is not None else None,
            "ended_at": self.ended_at,
            "group": self.group,
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

