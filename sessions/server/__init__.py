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

* `sessions.server.model`: the files, states and errors, and `SessionStatus` / `StopReport` (data only);
* `sessions.server.record`: `SessionRecord`, the folder and ``state.json`` (locked writes, the marker);
* `sessions.server.status`: `SessionReader`, one status reading (log, tree, port, ``/ready``, stall);
* `sessions.server.session`: `ServerSession`, the lifecycle (launch, stop, restart) and finding sessions;
* `sessions.server.stopping` and `sessions.server.diff`: the helpers of a stop, a restart's flag diff.

The names below are the package's public ones; ``from sessions.server import ...`` is the way in.
"""

from sessions.server.diff import flag_diff
from sessions.server.group import GroupInfo
from sessions.server.model import (
    COMMAND_FILE,
    EMULATED_GPUS_FILE,
    FINAL_STATES,
    HTTP_PROBE_TIMEOUT_S,
    KILL_WAIT_S,
    LAUNCH_LOCK_FILE,
    LOG_FILE,
    PROFILE_FILE,
    SESSION_ENV,
    SESSIONS_DIR_ENV,
    STATE_FILE,
    STATE_VERSION,
    STATES,
    AlreadyRunning,
    GpuBusy,
    LaunchError,
    RankStatus,
    SessionError,
    SessionNotFound,
    SessionStatus,
    StopReport,
    classify_state,
)
from sessions.server.record import SessionRecord, find_marked_servers
from sessions.server.session import (
    ServerSession,
    find_group,
    find_session,
    group_members,
    list_sessions,
    restart_group,
    running_sessions_of,
    stop_group,
)
from sessions.server.status import SessionReader

__all__ = [
    "COMMAND_FILE",
    "EMULATED_GPUS_FILE",
    "FINAL_STATES",
    "HTTP_PROBE_TIMEOUT_S",
    "KILL_WAIT_S",
    "LAUNCH_LOCK_FILE",
    "LOG_FILE",
    "PROFILE_FILE",
    "SESSIONS_DIR_ENV",
    "SESSION_ENV",
    "STATES",
    "STATE_FILE",
    "STATE_VERSION",
    "AlreadyRunning",
    "GpuBusy",
    "GroupInfo",
    "LaunchError",
    "RankStatus",
    "ServerSession",
    "SessionError",
    "SessionNotFound",
    "SessionReader",
    "SessionRecord",
    "SessionStatus",
    "StopReport",
    "classify_state",
    "find_group",
    "find_marked_servers",
    "find_session",
    "flag_diff",
    "group_members",
    "list_sessions",
    "restart_group",
    "running_sessions_of",
    "stop_group",
]
