"""What the dashboard's poll worker fetches, off the UI thread: profiles, sessions, GPUs and new log lines.

`DashboardFeed.poll()` runs in a thread worker and returns one immutable `DashboardSnapshot`; the UI
thread only draws it (dolphie's loop: fetch in a thread, render, re-arm a one-shot timer).  Nothing here
touches a widget.  `app.tui` imports this module only when the dashboard starts, so that `--help` and
the CLI commands stay cheap; an engine part that is missing is an ImportError here, not a quiet blank.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sessions.gpus import GpuSnapshot, GpuSource
from sessions.logs import LogFile, LogFilter, LogLine, shown
from sessions.profiles import ProfileError, list_profiles, load_profile
from sessions.profiles.capture_toggle import CaptureStatus, capture_status
from sessions.profiles.fields import dp_replicas_of
from sessions.redaction import Redactor
from sessions.remote.monitor import HostMonitor, HostView
from sessions.server import FINAL_STATES, ServerSession, SessionStatus, list_sessions
from sessions.server.nodes_monitor import NodesMonitor, NodesView
from sessions.snapshots import LogChunk, ProfileEntry, SessionEntry
from widgets.state_line import rank_label

if TYPE_CHECKING:
    from sessions.home import Home

# The poll hands at most this many new lines to the screen; a filter still sees every new line.
TAIL_LINES = 400
# A ready server's /ready is asked again after this long (every poll while it starts).
HTTP_RECHECK_S = 5.0
# The sessions folder is listed again when it changes, else this often: a listing reads every state.json
# and every process's environment (session markers), the largest part of a quiet watcher's CPU.
RELIST_S = 30.0
# How many ended sessions the list keeps (newest first).
MAX_ENDED_SESSIONS = 30


@dataclass(frozen=True)
class PollRequest:
    """What the UI wants this time: the selected session and the log filter in force."""

    selected_session: str | None
    log_filter: LogFilter | None
    read_log: bool = True
    selected_profile: str | None = None  # its capture status is read when capture is on


@dataclass(frozen=True)
class DashboardSnapshot:
    """One poll's result, drawn by the UI thread."""

    taken_at: float
    profiles: tuple[ProfileEntry, ...]
    sessions: tuple[SessionEntry, ...]
    selected: str | None  # the session the status/log belong to
    status: SessionStatus | None
    gpu: GpuSnapshot
    owners: dict[int, str] = field(default_factory=dict)  # pid -> "TP3" for the GPU panel
    log: LogChunk | None = None
    problems: tuple[str, ...] = ()  # engine parts that failed this poll, for a notification
    capture: CaptureStatus | None = None  # of the selected profile when its capture is on
    capture_profile: str | None = None
    group: tuple[SessionEntry, ...] = ()  # the selected session's group of replicas, one entry a member
    hosts: tuple[HostView, ...] = ()  # the other hosts of hosts.toml (their monitor's latest views)
    nodes: tuple[NodesView, ...] = ()  # the servers across nodes (their monitor's latest views)


def _entry(s: SessionStatus) -> SessionEntry:
    group = s.group or {}
    return SessionEntry(s.session_id, s.profile, s.state, s.phase, s.port, s.started_at, s.alive,
                        group.get("id"), group.get("index"), tuple(group.get("gpus") or ()))


def _list_order(statuses: dict[str, SessionStatus]):
    """Newest first, a group's members together under its newest member's start, in member order."""
    starts: dict[str, float] = {}
    for s in statuses.values():
        if s.group and s.group.get("id"):
            starts[s.group["id"]] = max(starts.get(s.group["id"], 0.0), s.started_at or 0.0)

    def key(s: SessionStatus) -> tuple[float, int]:
        if s.group and s.group.get("id") in starts:
            return (starts[s.group["id"]], -int(s.group.get("index") or 0))
        return (s.started_at or 0.0, 0)

    return key


def _group_of(status: SessionStatus | None, statuses: dict[str, SessionStatus]) -> tuple[SessionEntry, ...]:
    """The members of the selected session's group, by index (the newest session of each index)."""
    if status is None or not status.group or not status.group.get("id"):
        return ()
    newest: dict[int, SessionStatus] = {}
    for s in sorted(statuses.values(), key=lambda s: s.started_at or 0.0):
        if s.group and s.group.get("id") == status.group["id"] and isinstance(s.group.get("index"), int):
            newest[s.group["index"]] = s
    return tuple(_entry(newest[i]) for i in sorted(newest))


class DashboardFeed:
    """Holds the engine objects between polls (a `ServerSession` reads its log incrementally)."""

    def __init__(self, home: Home, gpu_source: GpuSource, hosts: HostMonitor | None = None,
                 nodes: NodesMonitor | None = None) -> None:
        self.home = home
        self.gpu_source = gpu_source
        self.hosts = hosts  # never waited on: its threads talk to the hosts, `views()` returns at once
        self.nodes = nodes  # likewise: a thread per node of each multi-node session
        self._sessions: dict[str, ServerSession] = {}
        self._final: dict[str, tuple[int, SessionStatus]] = {}  # id -> (state.json mtime, status) of ended
        self._profiles: dict[str, tuple[int, ProfileEntry]] = {}
        self._feeds: dict[str, LogFeed] = {}
        self._http: dict[str, tuple[float, bool | None]] = {}  # session id -> (when, /ready was 200)
        self._listed_stamp: int | None = None
        self._listed_at = 0.0
        self._lock = threading.Lock()

    # -- the poll ---------------------------------------------------------------------------------------

    def poll(self, request: PollRequest) -> DashboardSnapshot:
        problems: list[str] = []
        gpu = self.gpu_source.snapshot()
        statuses = self._statuses(gpu, problems)
        selected = request.selected_session
        if selected not in statuses:
            selected = _default_selection(statuses)
        status = statuses.get(selected) if selected is not None else None
        profiles = self._profile_entries(statuses, problems)
        owners = {r.pid: rank_label(r) for r in status.ranks} if status is not None else {}
        if status is not None and status.pid:
            owners.setdefault(status.pid, "main")
        group = _group_of(status, statuses)
        if group:  # the GPU panel names each member's GPUs: "r2 TP1" is replica 2's TP rank 1
            owners = {}
            for member in group:
                member_status = statuses[member.session_id]
                owners.update({r.pid: f"r{member.group_index} {rank_label(r)}" for r in member_status.ranks})
                if member_status.pid:
                    owners.setdefault(member_status.pid, f"r{member.group_index} main")
        log = None
        self._park_other_feeds(str(status.log_path) if status is not None and request.read_log else None)
        if status is not None and request.read_log:
            feed = self.log_feed(str(status.log_path), status)
            try:
                log = feed.poll(request.log_filter)
            except OSError as exc:
                problems.append(f"log {status.log_path}: {exc.strerror or exc}")
        entries = tuple(_entry(s) for s in sorted(statuses.values(), key=_list_order(statuses), reverse=True))
        capture = self._capture_status(request.selected_profile, profiles, problems)
        return DashboardSnapshot(
            time.time(),
            profiles,
            entries,
            selected,
            status,
            gpu,
            owners,
            log,
            tuple(problems),
            capture,
            request.selected_profile if capture else None,
            group,
            self.hosts.views() if self.hosts is not None else (),
            self.nodes.views() if self.nodes is not None else (),
        )

    def _capture_status(
        self, name: str | None, profiles: tuple[ProfileEntry, ...], problems: list[str]
    ) -> CaptureStatus | None:
        entry = next((p for p in profiles if p.name == name), None)
        if name is None or entry is None or not entry.capture:
            return None
        try:
            return capture_status(load_profile(name, self.home))
        except Exception as exc:  # noqa: BLE001 - the panel shows nothing; the toast says why
            problems.append(f"capture status of {name}: {exc}")
            return None

    def _park_other_feeds(self, shown_path: str | None) -> None:
        """A session's reader builds lines only for a view that is on screen: the feeds of the other logs
        let go of their session's reader (back on screen, a feed starts again from the log's tail)."""
        with self._lock:
            others = [feed for path, feed in self._feeds.items() if path != shown_path]
        for feed in others:
            feed.park()

    def log_feed(self, path: str, status: SessionStatus | None = None) -> LogFeed:
        with self._lock:
            feed = self._feeds.get(path)
            if feed is None:
                session = self._sessions.get(status.session_id) if status is not None else None
                # By value: the launch's secrets file and the profile's secrets (an unreadable one adds none).
                secrets = Redactor.for_session(session).known if session is not None else ()
                # The session's own reader, which its status tracker reads too: one read of each new byte.
                shared = session.session_log if session is not None and Path(path) == session.log_path else None
                feed = LogFeed(Path(path), secrets, shared)
                self._feeds[path] = feed
            return feed

    def session(self, session_id: str) -> ServerSession:
        """The `ServerSession` object for an id (the same one the poll uses)."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            session = ServerSession.load(session_id, self.home)
            with self._lock:
                self._sessions[session_id] = session
        return session

    def adopt(self, session: ServerSession) -> None:
        """A session this process just launched: keep its object (it holds the Popen to reap)."""
        with self._lock:
            self._sessions[session.session_id] = session
            self._final.pop(session.session_id, None)

    def forget_final(self, session_id: str) -> None:
        with self._lock:
            self._final.pop(session_id, None)

    def _statuses(self, gpu: GpuSnapshot, problems: list[str]) -> dict[str, SessionStatus]:
        if self._listing_due():
            try:
                found = list_sessions(self.home)
            except Exception as exc:  # noqa: BLE001 - show it, keep polling
                problems.append(f"listing sessions failed: {exc}")
                return {}
            with self._lock:
                for session in found:
                    self._sessions.setdefault(session.session_id, session)
                live_ids = {s.session_id for s in found}
                for gone in set(self._sessions) - live_ids:  # folder deleted
                    self._sessions.pop(gone).close_log()
                    self._final.pop(gone, None)
        with self._lock:
            sessions = list(self._sessions.values())
        statuses: dict[str, SessionStatus] = {}
        for session in sessions:
            stamp = _state_stamp(session)
            final = self._final.get(session.session_id)
            if final is not None and final[0] == stamp:
                statuses[session.session_id] = final[1]
                continue
            probe = self._http_due(session.session_id)
            try:
                status = session.status(probe_http=probe, gpu_snapshot=gpu if gpu.available else None)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"status of {session.session_id} failed: {exc}")
                continue
            status = self._with_http(status, probed=probe)
            statuses[session.session_id] = status
            if status.state in FINAL_STATES and not status.alive and stamp is not None:
                # An ended session changes only through its state.json (a stop records itself there,
                # also one that lands while this poll ran): keyed by that file's mtime, never stale.
                with self._lock:
                    self._final[session.session_id] = (stamp, status)
        ended = [s for s in statuses.values() if s.state in FINAL_STATES]
        ended.sort(key=lambda s: s.started_at or 0.0, reverse=True)
        for old in ended[MAX_ENDED_SESSIONS:]:
            statuses.pop(old.session_id, None)
        return statuses

    def _listing_due(self) -> bool:
        """Re-list the sessions folder when it changed (a session was added or removed), else every
        `RELIST_S`: with hundreds of ended sessions, listing reads every state.json."""
        try:
            stamp = self.home.sessions_dir.stat().st_mtime_ns
        except OSError:
            stamp = None
        now = time.monotonic()
        if stamp != self._listed_stamp or now - self._listed_at >= RELIST_S:
            self._listed_stamp, self._listed_at = stamp, now
            return True
        return False

    def _http_due(self, session_id: str) -> bool:
        """Ask /ready every poll while a server starts; once it answers 200, every few seconds is enough
        (each probe is a connection and an HTTP round trip, the largest part of a poll's CPU)."""
        last = self._http.get(session_id)
        return last is None or last[1] is not True or time.monotonic() - last[0] >= HTTP_RECHECK_S

    def _with_http(self, status: SessionStatus, probed: bool) -> SessionStatus:
        if probed:
            if status.port_listening:
                self._http[status.session_id] = (time.monotonic(), status.ready)
            else:
                self._http.pop(status.session_id, None)
            return status
        last = self._http.get(status.session_id)
        if last is None or not status.port_listening:
            self._http.pop(status.session_id, None)
            return status
        return dataclasses.replace(status, ready=last[1])

    def _profile_entries(
        self, statuses: dict[str, SessionStatus], problems: list[str]
    ) -> tuple[ProfileEntry, ...]:
        live: dict[str, SessionStatus] = {}
        for status in sorted(statuses.values(), key=lambda s: s.started_at or 0.0):
            if status.alive:
                live[status.profile] = status
        entries = []
        try:
            names = list_profiles(self.home)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"listing profiles failed: {exc}")
            return ()
        for name in _demo_first(names, self.home):
            path = self.home.profiles_dir / f"{name}.toml"
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                mtime = -1
            cached = self._profiles.get(name)
            if cached is not None and cached[0] == mtime and mtime != -1:
                entry = cached[1]
            else:
                entry = _profile_entry(name, self.home)
                self._profiles[name] = (mtime, entry)
            live_status = live.get(name)
            entries.append(
                ProfileEntry(
                    entry.name,
                    entry.title,
                    entry.launcher,
                    entry.tp_size,
                    entry.port,
                    entry.capture,
                    entry.error,
                    live_session=live_status.session_id if live_status else None,
                    live_state=live_status.state if live_status else None,
                    dp_size=entry.dp_size,
                )
            )
        return tuple(entries)


def _state_stamp(session: ServerSession) -> int | None:
    try:
        return (session.session_dir / "state.json").stat().st_mtime_ns
    except OSError:
        return None


def _profile_entry(name: str, home: Home) -> ProfileEntry:
    try:
        profile = load_profile(name, home)
    except ProfileError as exc:  # the list says "invalid" and why
        message = "; ".join(f"{p.field}: {p.message}" for p in exc.problems) if exc.problems else str(exc)
        return ProfileEntry(name, error=message)
    except Exception as exc:  # noqa: BLE001 - a loader bug on a strange file: listed, polls go on
        return ProfileEntry(name, error=str(exc))
    server = profile.server
    return ProfileEntry(name, "", server.launcher, server.tp_size, server.port, profile.capture.enabled,
                        dp_size=dp_replicas_of(server))


def _demo_first(names: list[str], home: Home) -> list[str]:
    """In the demo home the healthy profile comes first (DESIGN §1b: it is selected first)."""
    if not home.demo:
        return list(names)
    from sessions.demo import DEMO_PROFILES

    ordered = [n for n in DEMO_PROFILES if n in names]
    return ordered + [n for n in names if n not in ordered]


def _default_selection(statuses: dict[str, SessionStatus]) -> str | None:
    """The newest live session, else the newest session."""
    if not statuses:
        return None
    by_age = sorted(statuses.values(), key=lambda s: s.started_at or 0.0, reverse=True)
    live = [s for s in by_age if s.alive]
    return (live or by_age)[0].session_id


# --- the log ---------------------------------------------------------------------------------------------

# A log up to this size is counted in the poll that opens it (a few ms); a bigger one in the background.
SYNC_INDEX_BYTES = 16 << 20


class LogFeed:
    """One server log for the LogView, read through the log core (`sessions.logs.LogFile`): new lines per
    poll, windows on demand, filter scans, all in worker threads, never on the UI thread.

    Tail first: the first poll reads only the file's end (toolong's way), so a 2 GB log shows its last
    screen as fast as a small one.  Counting its lines runs in the core's background thread; until it is
    done, line numbers are provisional (0 is the first line shown) and chunks say ``counting``.  The first
    poll after the count sends ``shift`` (the true number of that line) and numbers are exact from then on.
    This adapter numbers lines from 0 (the view's convention), turns rotation and truncation into a new
    ``file_id``, and shows each line through the core's display path (cleaned, secrets redacted).
    """

    def __init__(self, path: Path, known_secrets: list[str] | tuple[str, ...] = (),
                 shared: Callable[[], LogFile | None] | None = None) -> None:
        self.path = Path(path)
        self._secrets = tuple(known_secrets)
        self._lock = threading.Lock()
        self._log: LogFile | None = None  # opened on the first poll
        # the session's one reader (`SessionReader.session_log`), which its status tracker polls too; a
        # log of no session gets a reader of its own
        self._shared = shared
        self._file_id = 0
        self._total = 0  # complete lines delivered so far, in the view's numbering
        self._base: int | None = 0  # true 0-based number of provisional line 0; None while counting
        self._first_offset = 0  # byte offset of provisional line 0
        self._shift_due = 0  # a shift the next chunk must carry
        self._filter: LogFilter | None = None
        self._filtered_upto = 0  # lines already checked against _filter by polls

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                if self._shared is not None:
                    self._log.detach_view()  # the session's reader: its status goes on reading it
                else:
                    self._log.close()
                self._log = None

    def park(self) -> None:
        """Off screen: a session's shared reader stops building lines for this feed (its own reader, a
        plain file's, stays open and unread until the next poll)."""
        with self._lock:
            if self._log is not None and self._shared is not None:
                self._log.detach_view()
                self._log = None

    def _show(self, line: LogLine) -> str:
        return shown(line, self._secrets)

    def _settle(self) -> None:
        """Once the core has counted the file: the true number of provisional line 0 (lock held)."""
        if self._base is not None or self._log is None:
            return
        before = self._log.line_number_at(self._first_offset)
        if before is None:
            return
        self._base = before
        self._total += before
        self._filtered_upto += before
        self._shift_due += before

    # -- what the poll and the view ask for -----------------------------------------------------------------

    def poll(self, log_filter: LogFilter | None, tail: int = TAIL_LINES) -> LogChunk:
        with self._lock:
            fresh = self._log is None
            if fresh:
                self._log = self._open()
            log = self._log
            assert log is not None
            # The lines of the polls since the last one (the status's poll read them), or a poll now.
            result = log.view_poll()
            if fresh or result.truncated or result.rotated or result.gap:
                return self._restart(log, log_filter, tail)
            self._settle()
            new = list(result.lines)
            first_new = self._total
            numbered = [(first_new + i, line) for i, line in enumerate(new)]
            self._total += len(new)
            lines = tuple((number, self._show(line)) for number, line in numbered[-tail:])
            matches: tuple[int, ...] = ()
            if log_filter is not None and log_filter.active:
                if log_filter != self._filter:
                    # A new filter: the view's scan covers the old lines; only lines from here on count.
                    self._filter = log_filter
                    self._filtered_upto = first_new
                matches = tuple(
                    number for number, line in numbered
                    if number >= self._filtered_upto and log_filter.matches(line)
                )
                self._filtered_upto = self._total
            shift, self._shift_due = self._shift_due, 0
            return LogChunk(
                str(self.path), self._file_id, self._total, lines, log_filter, matches,
                counting=self._base is None, shift=shift,
            )

    def _open(self) -> LogFile:
        shared = self._shared() if self._shared is not None else None
        if shared is None:
            self._shared = None
            return LogFile(self.path, follow_from="end")
        shared.attach_view()
        return shared

    def _restart(self, log: LogFile, log_filter: LogFilter | None, tail: int) -> LogChunk:
        """(Re)start on a file: show its tail at once; count its lines now when small, else in the
        background (lock held)."""
        self._file_id += 1
        self._shift_due = 0
        if not log.index_step(SYNC_INDEX_BYTES):
            log.build_index(background=True)
        shown_lines = log.tail_lines(tail)
        self._first_offset = shown_lines[0].offset if shown_lines else log.delivered_offset
        self._base = None
        self._total = len(shown_lines)
        self._filtered_upto = self._total  # the view scans the restarted file itself
        self._settle()
        self._shift_due = 0  # nothing was shown with provisional numbers yet
        first = self._total - len(shown_lines)
        lines = tuple((first + i, self._show(line)) for i, line in enumerate(shown_lines))
        return LogChunk(str(self.path), self._file_id, self._total, lines, log_filter, counting=self._base is None)

    def read(self, numbers: tuple[int, ...] | list[int]) -> dict[int, str]:
        """Lines by 0-based number (the view's window when it scrolled off the cached tail); nothing while
        the lines are being counted (the view holds every line it was given then)."""
        with self._lock:
            log, counted = self._log, self._base is not None
        if log is None or not numbers or not counted:
            return {}
        wanted = sorted(set(numbers))
        out: dict[int, str] = {}
        first = wanted[0]
        for line in log.lines(first + 1, wanted[-1] - first + 1):
            if line.number is not None and line.number - 1 in numbers:
                out[line.number - 1] = self._show(line)
        return out

    def scan(self, log_filter: LogFilter, cancelled: Callable[[], bool]) -> tuple[list[int], int]:
        """Every matching line number among the lines delivered so far; (matches, lines scanned).  Waits
        for the line count first (this runs in a worker thread)."""
        with self._lock:
            log = self._log
        if log is None:
            return [], 0
        log.build_index(background=False)
        with self._lock:
            self._settle()
            scanned = self._total
            self._filter = log_filter
            self._filtered_upto = scanned  # later polls report matches from here on
        matches: list[int] = []
        if scanned == 0:
            return matches, scanned
        for count, line in enumerate(log.iter_filtered(log_filter), start=1):
            if line.number is None or line.number > scanned:
                break
            matches.append(line.number - 1)
            if count % 4096 == 0 and cancelled():
                break
        return matches, scanned
