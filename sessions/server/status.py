"""A session's status, read now: the log, the process tree, the port and ``/ready`` (DESIGN §3).

The state (``starting``, ``ready``, ``stalled``, ``crashed``, ``exited``, ``stopped``) is derived on
every `SessionReader.status` from what it reads; only facts (phase first seen, descendants, how the start
and the session ended, the model info) are written back to ``state.json``, once each, and the end of a
start goes to the history (the baseline of the next start).
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sessions import probes, safe_files, start_facts
from sessions.history import last_good, record_start
from sessions.home import Home, read_json
from sessions.logs import LogFile, LogFileError
from sessions.phases import StartupPhase, StartupSummary
from sessions.server.log_tracking import PROBE_ACCESS_LINE, LogTracking
from sessions.server.model import (
    _LAUNCH_STALE_S,
    COMMAND_FILE,
    EMULATED_GPUS_FILE,
    HTTP_PROBE_TIMEOUT_S,
    RankStatus,
    SessionStatus,
    classify_state,
)
from sessions.server.record import SessionRecord, _pgid_of
from sessions.serving import SessionServing, decode_log_interval_of
from sessions.stall import StallVerdict, is_compiler_name, stall_verdict
from sessions.state_file import StateRead

PORT_RECHECK_S = 5.0  # a ready server's port is connected to this often between HTTP probes
TREE_RESCAN_READY_S = 30.0  # all of /proc is walked this often for a ready server's tree
_POLLS_PER_STATUS = 4  # reader steps (`sessions.logs.file.POLL_MAX_BYTES` each) one status reads at most
_LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True)
class _PortReading:
    """What the port and the HTTP probes said in one status() call."""

    listening: bool
    ready_http: bool | None  # /ready answered 200 (None: not asked)
    http_error: str | None
    port_owner: str | None  # who holds the port when it is not this session's server


@dataclass(frozen=True)
class _Liveness:
    """The facts one status() call gathers, from which the state follows."""

    alive: bool
    ready_now: bool
    fatal: bool
    ever_ready: bool
    stalled: bool

    def state_of(self, record: dict) -> str:
        # A stop the user asked for is a stop: what the signal causes (the main gone, ranks dying in any
        # order, their error lines) is not a crash once the intent is on record.
        stopping = record.get("stop_requested_at") is not None or bool(record.get("stopped_at"))
        return classify_state(
            alive=self.alive,
            stopped=stopping,
            fatal_error=self.fatal and not stopping,
            ready=self.ready_now,
            ever_ready=self.ever_ready,
            stalled=self.stalled,
        )


class SessionReader(SessionRecord):
    """A session's record plus what its log, process tree and port say now; ``status()`` reads them all."""

    def __init__(self, session_dir: Path, home: Home) -> None:
        super().__init__(session_dir, home)
        self._serving = SessionServing()  # Decode/Prefill batch lines (+ /metrics) once it serves
        # the tracker, how far the log was read, the wall clock of its last write that was not a probe
        self._tracking = LogTracking(session_dir, self._serving)
        self._log: LogFile | None = None  # the session's one log reader, opened by the first status
        self._log_lock = threading.Lock()
        self._model_info: dict | None = None
        self._tree_watch: probes.ProcessTreeWatch | None = None  # the main process's tree, between polls
        self._last_lines_cache: tuple[tuple[int, int], tuple[str, ...]] | None = None
        self._has_metrics: bool | None = None
        self._over_verdict: tuple[tuple[str, str], StallVerdict] | None = None  # of a start that is over
        self._listening_seen: tuple[float, int, bool] | None = None  # (monotonic, port, listening)

    # -- status ----------------------------------------------------------------------------------------

    def status(self, probe_http: bool = True, gpu_snapshot: Any = None) -> SessionStatus:
        """Read the log, the process tree, the port and (when it listens) ``/ready`` and ``/model_info``.

        A damaged or missing state.json does not raise: the status carries ``problem`` (what is wrong,
        naming the file and field), and the server is still found by its session marker.
        """
        read = self.state_read  # state.json, read once for this status
        ident = self.main_identity(read.record)
        pid, create_time = ident if ident else (None, None)
        rec, problems = self._checked_record(read, ident)
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
        net = self._read_port(host, port, tree, alive, known_ready, probe_http)
        # The log's ready line comes after warmup, as /ready's 200 does (http_server.py:2502); a 503 after
        # it means draining (SIGTERM), which is still a server that was ready, not a start.
        ready_now = alive and (net.ready_http is True or log_ready)
        verdict = self._stall_verdict(rec, summary, tree, silent_for_s, ready_now)
        live = _Liveness(
            alive=alive,
            ready_now=ready_now,
            fatal=summary.outcome == "crashed" or any(e.fatal for e in summary.errors),
            ever_ready=_ever_ready(rec, log_ready or ready_now),
            stalled=alive and verdict.stalled,
        )
        rec, state = self._settle_state(read, rec, summary, tree, live)
        if net.port_owner:
            problems.append(f"{net.port_owner}: it is not this session's server")
        log = self._log
        if not alive and log is not None and not log.has_view:
            self.close_log()  # an ended session's log: no file kept open for it (a later status reopens)
        return SessionStatus(
            session_id=self.session_id,
            profile=self.profile_name_in(rec),
            pid=pid,
            create_time=create_time,
            state=state,
            phase=StartupPhase.READY.value if ready_now else str(summary.phase),
            port=port,
            host=host,
            ranks=_rank_rows(tree, _gpu_index_by_pid(gpu_snapshot, self.session_dir)),
            log_path=self.log_path,
            started_at=rec.get("started_at"),
            port_listening=net.listening,
            ready=net.ready_http,
            model_info=self._model_info,
            silent_for_s=silent_for_s,
            summary=summary,
            phase_entered_at=dict(rec.get("phase_entered_at", {})),
            alive=alive,
            outcome=rec.get("outcome"),
            stall_limit_s=verdict.limit_s,
            processes=tuple(tree),
            http_error=net.http_error,
            session_dir=self.session_dir,
            problem="; ".join(problems) if problems else None,
            serving=self._serving_snapshot(host, port, net.listening and probe_http and ready_now),
            ended_at=ended_at_of(rec, state),
            launch_tp_size=rec["tp_size"] if isinstance(rec.get("tp_size"), int) and rec["tp_size"] > 0 else None,
            group=rec["group"] if isinstance(rec.get("group"), dict) else None,
        )

    def _checked_record(self, read: StateRead, ident: tuple[int, float] | None) -> tuple[dict, list[str]]:
        """The record to read this status from, and what is wrong with the session's files."""
        rec = read.record
        problems = list(read.problems)
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
        return rec, problems

    def _read_port(
        self,
        host: str,
        port: int | None,
        tree: list[probes.ProcInfo],
        alive: bool,
        known_ready: bool,
        probe_http: bool,
    ) -> _PortReading:
        """Whether the port listens for this session's server, and (when asked) what ``/ready`` says."""
        listening = bool(alive and port and self._port_listening(host, port, known_ready and not probe_http))
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
            self._ask_model_info(base)
        return _PortReading(listening, ready_http, http_error, port_owner)

    def _port_listening(self, host: str, port: int, may_reuse: bool) -> bool:
        """Whether the port takes connections.  For a server known ready, between two HTTP probes, the
        answer of the last few seconds stands: a connection every second is most of a watcher's poll, and
        a server that went away shows first as its process gone (the tree is read every time)."""
        seen = self._listening_seen
        now = time.monotonic()
        if may_reuse and seen is not None and seen[1] == port and now - seen[0] < PORT_RECHECK_S:
            return seen[2]
        listening = probes.port_listening(host, port)
        self._listening_seen = (now, port, listening)
        return listening

    def _ask_model_info(self, base: str) -> None:
        if self._model_info is None:
            from sessions.server_answers import get_json

            # Typed and bounded: only an object (finite numbers, bounded depth) is kept in state.json.
            info = get_json(f"{base}/model_info", deadline_s=HTTP_PROBE_TIMEOUT_S, expect=dict)
            if info.status == 200 and isinstance(info.json, dict):
                self._model_info = info.json

    def _settle_state(
        self,
        read: StateRead,
        rec: dict,
        summary: StartupSummary,
        tree: list[probes.ProcInfo],
        live: _Liveness,
    ) -> tuple[dict, str]:
        """The state, once the facts it implies are on record (the record, under its lock, has the last
        word)."""
        state = live.state_of(rec)
        if state in ("crashed", "exited") and rec.get("stop_requested_at") is None:
            # A stop may have recorded its intent after this call read the record: read it once more.
            fresh = self.state_record
            if fresh.get("stop_requested_at") is not None:
                rec = fresh
                state = live.state_of(rec)
        if not read.damaged and self.session_dir.is_dir():
            rec = self._record_progress(
                rec, summary, state, tree, live.ready_now, live.alive, self._model_info
            )
            state = live.state_of(rec)
        return rec, state

    def _serving_snapshot(self, host: str, port: int | None, live: bool) -> Any:
        """The serving figures (sessions.serving); ``/metrics`` too when the server exports it."""
        metrics = self._metrics_enabled()  # reads the command once (also the decode log interval)
        url = f"http://{_url_host(host)}:{port}" if live and port and metrics else None
        return self._serving.snapshot(url)

    def _metrics_enabled(self) -> bool:
        if self._has_metrics is None:
            try:  # a command.json that is a FIFO or a hard link is refused: no metrics, not a failed status
                command = read_json(self.session_dir / COMMAND_FILE, kind=safe_files.SESSION_RECORD)
            except OSError:
                command = None
            argv = command.get("argv") if isinstance(command, dict) else None
            argv = [str(a) for a in argv] if isinstance(argv, list) else []
            self._has_metrics = "--enable-metrics" in argv
            # How often it logs a Decode line: how long a silence means idle (sessions.serving.idle_after_s).
            self._serving.decode_log_interval = decode_log_interval_of(argv)
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
        # A ready server's tree is settled: its members are read every time (a rank that ends is seen at
        # once), all of /proc only now and then, for a newcomer.
        watch.rescan_after_s = probes.TREE_RESCAN_S if full_scan else TREE_RESCAN_READY_S
        return watch.read(full_scan=full_scan)

    def session_log(self) -> LogFile | None:
        """This session's one log reader in this process (`sessions.logs.LogFile`): the status tracker
        listens to it (`sessions.server.log_tracking`) and the log view reads its lines from it, so each
        new byte is read once per poll and a line has one number everywhere.  None while the log cannot be
        opened (a FIFO or a device in its place is refused, never waited on)."""
        with self._log_lock:
            if self._log is None:
                try:
                    log = LogFile(self.log_path, follow_from="end", lines=False)
                except LogFileError:
                    return None  # not a log file: nothing to learn (diagnose says why)
                log.add_listener(self._tracking)
                self._tracking.opened()
                self._log = log
            return self._log

    def close_log(self) -> None:
        """Let go of the log's file (an ended session nobody views); a later status opens it again and
        goes on from where the tracker is."""
        with self._log_lock:
            log, self._log = self._log, None
        if log is not None:
            log.close()

    def _read_log(self) -> StartupSummary:
        """Poll the session's reader: the tracker gets what the log gained since the last call; the first
        call in a process resumes from the session's checkpoint (`sessions.server.log_checkpoint`), so its
        cost does not grow with the log."""
        log = self.session_log()
        tracking = self._tracking
        if log is None:
            return tracking.progress.tracker.summary()
        try:
            for _ in range(_POLLS_PER_STATUS):  # a backlog is read in the reader's steps, bounded
                if not log.poll().more:
                    break
        except LogFileError:
            return tracking.progress.tracker.summary()
        tracking.sync(log)
        tracking.save_if_due()
        return tracking.progress.tracker.summary()

    def _last_lines(self, count: int = 5) -> tuple[str, ...]:
        """The latest non-empty log lines (tqdm renders split at ``\r``), for stall's DeepGEMM check."""
        key = (self._tracking.progress.offset, count)
        if self._last_lines_cache is not None and self._last_lines_cache[0] == key:
            return self._last_lines_cache[1]  # the log did not grow since the last poll
        text = self._tracking.progress.tail.decode("utf-8", errors="replace")
        lines = tuple([line for line in re.split(r"[\r\n]", text) if line.strip()][-count:])
        self._last_lines_cache = (key, lines)
        return lines

    def _silent_for_s(self, rec: dict) -> float:
        """Seconds since the server last wrote something other than the access lines of our probes."""
        activity_at = self._tracking.progress.activity_at
        last = activity_at if activity_at is not None else rec.get("started_at") or time.time()
        return max(0.0, time.time() - last)

    def _stall_verdict(
        self,
        rec: dict,
        summary: StartupSummary,
        tree: list[probes.ProcInfo],
        silent_for_s: float,
        ready: bool,
    ) -> StallVerdict:
        """Whether the start is stalled, and its limit: seconds of log silence (wall clock, never
        time-scaled) before a start that is not over counts as stalled."""
        over = ready or summary.phase == StartupPhase.READY or summary.outcome in ("ready", "crashed")
        key = (str(summary.phase), summary.outcome)
        kept = self._over_verdict
        if over and kept is not None and kept[0] == key:
            # The start is over and its phase is what it was: the limit shown is the one computed then
            # (the profile, state.json and the history are not read again every second).
            return StallVerdict(False, kept[1].limit_s, silent_for_s, kept[1].reason)
        verdict = self._fresh_stall_verdict(rec, summary, tree, silent_for_s, ready)
        self._over_verdict = (key, verdict) if over and not verdict.stalled else None
        return verdict

    def _fresh_stall_verdict(
        self,
        rec: dict,
        summary: StartupSummary,
        tree: list[probes.ProcInfo],
        silent_for_s: float,
        ready: bool,
    ) -> StallVerdict:
        try:
            profile: Any = self.profile
        except Exception:  # noqa: BLE001 - an unreadable snapshot must not break status; the recorded limit will do
            profile = SimpleNamespace(watch=SimpleNamespace(stall_after_s=rec.get("stall_after_s")))
        baseline = last_good(self.home, self.profile_name_in(rec), exclude_session_id=self.session_id)
        has_compile_child = any(is_compiler_name(p.name) for p in tree[1:])
        return stall_verdict(
            profile, summary, silent_for_s, ready, baseline, has_compile_child, last_lines=self._last_lines()
        )

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
            try:
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
            except OSError:  # the history folder or file is not writable (a file, a folder in its place):
                # this status stands, and a later one tries again
                self._update_state(lambda state_rec: state_rec.__setitem__("history_recorded", False))

def ended_at_of(rec: dict, state: str) -> float | None:
    """When the session ended, from its record: a stop's time for ``stopped``, else ``ended_at``."""
    if state not in ("crashed", "exited", "stopped"):
        return None
    value = rec.get("stopped_at") if state == "stopped" else None
    value = value or rec.get("ended_at")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _gpu_index_by_pid(gpu_snapshot: Any, session_dir: Path) -> dict[int, int]:
    """pid -> GPU index from a GpuSnapshot, else from the emulator's ``emulated_gpus.json``."""
    mapping: dict[int, int] = {}
    if gpu_snapshot is not None:
        for sample in getattr(gpu_snapshot, "samples", ()):
            for proc in sample.processes:
                mapping.setdefault(proc.pid, sample.index)
        return mapping
    try:
        data = read_json(session_dir / EMULATED_GPUS_FILE, kind=safe_files.SESSION_RECORD)
    except OSError:  # refused (a FIFO, a hard link): no GPU column, not a failed status
        data = None
    if isinstance(data, dict):
        for gpu in data.get("gpus", []) or []:
            try:
                for proc in gpu.get("processes", []) or []:
                    mapping.setdefault(int(proc["pid"]), int(gpu["index"]))
            except (KeyError, TypeError, ValueError):
                continue
    return mapping


OUTPUT_SCAN_BYTES = 4 << 20  # probe access lines are ~100 bytes: 4 MiB of them is hours of polling


def last_output_offset(log_path: Path, max_bytes: int = OUTPUT_SCAN_BYTES) -> int | None:
    """The byte offset in the log right after the server's last output that is not one of our probes'
    access lines: where the log went quiet.  Every reader of the same log gets the same number (the
    watchers' own probe lines after it do not move it), so it names one stall for all of them.  None when
    the log cannot be read; 0 when it holds nothing but probe lines within ``max_bytes`` of its end."""
    from sessions.safe_files import Kind, read_file_tail

    try:
        data, start = read_file_tail(log_path, Kind("log", None, private=True), max_bytes)
    except OSError:  # (SpecialFileError is one): not a log to read
        return None
    for match in reversed(list(re.finditer(rb"[^\r\n]+", data))):
        segment = match.group(0)
        if segment.strip() and not PROBE_ACCESS_LINE.search(segment):
            return start + match.end()
    return start


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
    dp = rank.dp_rank if rank.dp_rank is not None else -1
    return (order.get(rank.role, 3), dp, rank.rank if rank.rank is not None else -1, rank.pid)


def _url_host(host: str) -> str:
    target = probes.connect_host(host)
    return f"[{target}]" if ":" in target else target


def _ever_ready(rec: dict, seen_ready: bool) -> bool:
    """The server was ready at some point: seen now, or on record."""
    return (
        seen_ready
        or rec.get("start_outcome") == "ready"
        or StartupPhase.READY.value in rec.get("phase_entered_at", {})
    )


def _rank_rows(tree: list[probes.ProcInfo], gpu_of: dict[int, int]) -> tuple[RankStatus, ...]:
    """The SGLang children of the tree (schedulers, detokenizer, DP controller) as status rows, in order."""
    ranks = (
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
            dp_rank=p.dp_rank,
        )
        for p in tree
        if p.role in ("scheduler", "detokenizer", "dp_controller")
    )
    return tuple(sorted(ranks, key=_rank_sort_key))
