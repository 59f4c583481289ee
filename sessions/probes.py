"""Probes of a running server from the outside: its TCP port, its HTTP endpoints and its process tree.

Every probe is bounded and never raises for the thing it probes (a refused port, a dead pid, a timeout);
it returns a value that says so, as nvitop does for NVML.  Three rules come from SGLang 0.5.23:

* Poll ``/ready`` and ``/model_info`` only.  Every ``/health`` call injects a 1-token generation
  (``sglang/srt/entrypoints/http_server.py:721-799``), and ``/server_info`` round-trips to every scheduler
  with no server-side timeout (``http_server.py:853-895``), so it hangs exactly when a rank is stuck.
* The port is not bound until every scheduler has loaded (``engine.py:1347-1352``): a refused connection
  during loading is normal.
* A process is identified by (pid, create_time), never by pid alone or by name.  Ranks are recognised by
  the titles SGLang sets with ``setproctitle`` (``managers/scheduler.py:6257-6300``).
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import os
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import psutil

# psutil derives create_time from jiffies since boot, so two readings of one process agree to the tick;
# a pid reused by another process within one tick is not a case worth a wider window.
CREATE_TIME_TOLERANCE_S = 0.05

# `sglang::scheduler` + `_DP{d}` `_PP{p}` `_ATTN_CP{c}` `_MOE_DP{m}` `_TP{t}` `_EP{e}`, each optional, in this
# order (sglang/srt/managers/scheduler.py:6257-6300).  No `_TP` suffix means tp_size 1, i.e. TP rank 0.
_SCHEDULER_TITLE = re.compile(
    r"^sglang::scheduler"
    r"(?:_DP(?P<dp>\d+))?(?:_PP(?P<pp>\d+))?(?:_ATTN_CP(?P<cp>\d+))?(?:_MOE_DP(?P<moe_dp>\d+))?"
    r"(?:_TP(?P<tp>\d+))?(?:_EP(?P<ep>\d+))?(?=$|\s)"
)
_FIXED_ROLES = {
    "sglang::detokenizer": "detokenizer",
    "sglang::detokenizer_router": "detokenizer",
    "sglang::data_parallel_controller": "dp_controller",
}


@dataclass(frozen=True)
class RankTitle:
    """What a process title says about its role: ``role`` is main/scheduler/detokenizer/dp_controller/other."""

    role: str
    tp_rank: int | None = None
    dp_rank: int | None = None
    pp_rank: int | None = None
    ep_rank: int | None = None


@dataclass(frozen=True)
class ProcInfo:
    """One process of a server tree, read once.  Fields psutil could not read are None."""

    pid: int
    ppid: int | None
    create_time: float
    title: str
    name: str
    status: str
    cpu_percent: float | None  # None on the first sight of a process (psutil needs two readings)
    rss_bytes: int | None
    num_threads: int | None
    children: tuple[str, ...]  # names of direct children, e.g. ("ninja",) while DeepGEMM compiles
    role: str
    rank: int | None  # TP rank for schedulers; None otherwise
    dp_rank: int | None = None
    pp_rank: int | None = None
    ep_rank: int | None = None

    @property
    def identity(self) -> tuple[int, float]:
        return (self.pid, self.create_time)


class HttpResult(NamedTuple):
    """The outcome of one bounded GET: ``status`` None means no HTTP answer (refused, timeout, ...)."""

    status: int | None
    json: Any
    error: str | None


# --- ports -----------------------------------------------------------------------------------------------


def connect_host(host: str) -> str:
    """Where to connect to reach a server bound to ``host`` (a wildcard bind is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host.strip("[]")


def port_listening(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when a TCP connect to (host, port) succeeds within ``timeout_s``."""
    try:
        with socket.create_connection((connect_host(host), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def port_free(host: str, port: int) -> bool:
    """True when (host, port) can be bound now.

    SO_REUSEADDR is set, as uvicorn and asyncio servers set it: a port whose only sockets are in
    TIME_WAIT (after a server died with open connections) is free for the next server, so it is free here.
    """
    bind_host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_host, int(port)))
        return True
    except OSError as exc:
        # EADDRNOTAVAIL (host not on this machine) and the like are not "in use": the server will say it.
        return exc.errno not in (errno.EADDRINUSE, errno.EACCES)
    finally:
        sock.close()


def pid_listening_on(port: int, host: str | None = None) -> int | None:
    """The pid holding a listening TCP socket on ``port`` (and ``host``, when given), or None.

    None also when the owner cannot be seen: psutil raises AccessDenied on some systems (macOS, hardened
    /proc) or reports pid None for other users' sockets.
    """
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError, OSError):
        return None
    wanted_hosts = None
    if host is not None and host not in ("", "0.0.0.0", "::"):
        wanted_hosts = {host.strip("[]"), "0.0.0.0", "::"}
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != int(port):
            continue
        if wanted_hosts is not None and conn.laddr.ip not in wanted_hosts:
            continue
        if conn.pid:
            return conn.pid
    return None


class PortOwner(NamedTuple):
    """Who holds the listening socket of a port: ``ours`` is True (a process of the given tree), False
    (another process: ``pid``/``text`` say which, when visible) or None (cannot tell on this system)."""

    ours: bool | None
    pid: int | None
    text: str


def _listening_inodes(port: int) -> set[int] | None:
    """Inodes of the LISTEN sockets on ``port`` from /proc/net/tcp and tcp6; None without /proc."""
    found: set[int] = set()
    seen_table = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as fh:
                next(fh, None)
                seen_table = True
                for line in fh:
                    fields = line.split()
                    # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                    if len(fields) < 10 or fields[3] != "0A":  # 0A: TCP_LISTEN
                        continue
                    if int(fields[1].rsplit(":", 1)[1], 16) == int(port):
                        found.add(int(fields[9]))
        except (OSError, ValueError):
            continue
    return found if seen_table else None


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def listener_owner(port: int, host: str | None, tree_pids: Iterable[int]) -> PortOwner:
    """Whether the process listening on ``port`` is one of ``tree_pids`` (a server's own process tree).

    On Linux this matches the listening socket's inode (/proc/net/tcp) against the sockets the tree's
    processes hold open (/proc/PID/fd: readable for our own processes, whatever the owner of the port),
    so it needs no scan of every process.  Elsewhere it asks psutil for the listener's pid.
    """
    pids = [int(p) for p in tree_pids]
    inodes = _listening_inodes(port)
    if inodes is not None:
        if not inodes:
            return PortOwner(None, None, f"port {port}: no listening socket")
        for pid in pids:
            if _socket_inodes(pid) & inodes:
                return PortOwner(True, pid, f"port {port} is held by pid {pid} of this session")
        return PortOwner(False, pid_listening_on(port, host), describe_port_user(host or "127.0.0.1", port))
    owner = pid_listening_on(port, host)
    if owner is None:
        return PortOwner(None, None, f"port {port}: its owner cannot be seen here")
    if owner in pids:
        return PortOwner(True, owner, f"port {port} is held by pid {owner} of this session")
    return PortOwner(False, owner, describe_port_user(host or "127.0.0.1", port))


def describe_port_user(host: str, port: int) -> str:
    """``"port 30000 on 127.0.0.1 is in use by pid 1234 (python)"``, or without the pid when unknown."""
    text = f"port {port} on {host} is in use"
    pid = pid_listening_on(port, host)
    if pid is not None:
        try:
            name = psutil.Process(pid).name()
        except (psutil.Error, OSError):
            name = "?"
        text += f" by pid {pid} ({name})"
    return text


# --- HTTP ------------------------------------------------------------------------------------------------


def http_get_json(url: str, timeout_s: float = 1.0) -> HttpResult:
    """GET ``url`` within ``timeout_s`` in all (connect, headers and body) and `JSON_MAX_BYTES`; never raises.

    Read by `sessions.server_answers` (the one bounded reader for server answers): no proxy from the
    environment (an ``http_proxy`` meant for the internet must not intercept a probe of a local server: the
    hang catalogue's proxy-intercepts-warmup case), no redirect.  ``json`` is the decoded body when it is
    JSON within the reader's rules (finite numbers, bounded depth), else None; ``error`` is None whenever
    a whole answer came, whatever its body.  Use `server_answers.get_json` for a typed answer.
    """
    from sessions import server_answers

    answer = server_answers.fetch(url, deadline_s=timeout_s, max_bytes=server_answers.JSON_MAX_BYTES)
    if answer.error is not None:
        return HttpResult(answer.status, None, answer.error)
    body, _ = server_answers.parse_json(answer.body, expect=None) if answer.body.strip() else (None, None)
    return HttpResult(answer.status, body, None)


# --- processes -------------------------------------------------------------------------------------------


def parse_title(title: str) -> RankTitle:
    """Recognise SGLang's process titles; anything else is ``other``."""
    head = title.strip()
    match = _SCHEDULER_TITLE.match(head)
    if match:
        def num(key: str) -> int | None:
            value = match.group(key)
            return int(value) if value is not None else None

        tp = num("tp")
        return RankTitle(
            role="scheduler",
            tp_rank=tp if tp is not None else 0,
            dp_rank=num("dp"),
            pp_rank=num("pp"),
            ep_rank=num("ep"),
        )
    first = head.split(" ", 1)[0]
    if first in _FIXED_ROLES:
        return RankTitle(role=_FIXED_ROLES[first])
    return RankTitle(role="other")


def process_title(proc: psutil.Process) -> str:
    """The title as ``ps -o args`` shows it: setproctitle rewrites argv, so cmdline carries the title."""
    try:
        cmdline = proc.cmdline()
    except (psutil.Error, OSError):
        cmdline = []
    title = " ".join(part for part in cmdline if part).strip()
    if title:
        return title
    try:
        return proc.name()
    except (psutil.Error, OSError):
        return "?"


def same_process(proc: psutil.Process, create_time: float) -> bool:
    try:
        return abs(proc.create_time() - float(create_time)) <= CREATE_TIME_TOLERANCE_S
    except (psutil.Error, OSError):
        return False


def get_process(pid: int, create_time: float) -> psutil.Process | None:
    """The live process with this identity, or None (gone, a zombie, or the pid now belongs to another)."""
    try:
        proc = psutil.Process(int(pid))
    except (psutil.Error, OSError, ValueError):
        return None
    if not same_process(proc, create_time):
        return None
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap_if_child(proc.pid)
            return None
    except (psutil.Error, OSError):
        return None
    return proc


def process_alive(pid: int, create_time: float) -> bool:
    return get_process(pid, create_time) is not None


def _reap_if_child(pid: int) -> None:
    """Collect our own dead child so it stops showing up as a zombie (we launched it with Popen)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


# Process objects kept between calls so that cpu_percent() measures the time since the previous call.
_CPU_TRACKERS: dict[tuple[int, float], psutil.Process] = {}


def _tracked(proc: psutil.Process, create_time: float) -> tuple[psutil.Process, bool]:
    key = (proc.pid, round(create_time, 2))
    known = _CPU_TRACKERS.get(key)
    if known is not None:
        return known, True
    _CPU_TRACKERS[key] = proc
    return proc, False


def _forget_dead_trackers(alive: set[tuple[int, float]]) -> None:
    if len(_CPU_TRACKERS) < 256:
        return
    for key in [k for k in _CPU_TRACKERS if k not in alive]:
        _CPU_TRACKERS.pop(key, None)


def read_proc(
    proc: psutil.Process,
    main_pid: int | None = None,
    children: tuple[str, ...] | None = None,
    title: str | None = None,
    name: str | None = None,
) -> ProcInfo | None:
    """One reading of ``proc``; None when it vanished while being read.

    ``children``: the names of its direct children when the caller already knows them (`process_tree`
    does: asking psutil per process would scan all of /proc once per process).  ``title`` and ``name``:
    when the caller already read them (`ProcessTreeWatch` keeps a rank's title, which no longer changes
    once SGLang set it, instead of reading its cmdline every second).
    """
    try:
        with proc.oneshot():
            create_time = proc.create_time()
            status = proc.status()
            ppid = proc.ppid()
            title = title if title is not None else process_title(proc)
            name = name if name is not None else proc.name()
            rss = _maybe(lambda: proc.memory_info().rss)
            threads = _maybe(proc.num_threads)
            tracker, seen_before = _tracked(proc, create_time)
            # Inside oneshot: when the tracker is ``proc`` itself (a kept object), cpu_times() reuses the
            # /proc/PID/stat just read instead of reading it again.
            cpu = _maybe(lambda: tracker.cpu_percent(interval=None))
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except (psutil.AccessDenied, OSError):
        return None
    if not seen_before:
        cpu = None  # psutil's first reading is always 0.0, which would read as "this rank is idle"
    if children is None:
        try:
            children = tuple(sorted(c.name() for c in proc.children(recursive=False)))
        except (psutil.Error, OSError):
            children = ()
    parsed = parse_title(title)
    role = "main" if proc.pid == main_pid else parsed.role
    return ProcInfo(
        pid=proc.pid,
        ppid=ppid,
        create_time=create_time,
        title=title,
        name=name,
        status=status,
        cpu_percent=cpu,
        rss_bytes=rss,
        num_threads=threads,
        children=children,
        role=role,
        rank=parsed.tp_rank,
        dp_rank=parsed.dp_rank,
        pp_rank=parsed.pp_rank,
        ep_rank=parsed.ep_rank,
    )


def _maybe(read):
    try:
        return read()
    except (psutil.Error, OSError):
        return None


def _parent_map() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, name) of every process, read from /proc in one pass (psutil where there is none)."""
    found: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = None
    if entries is None:
        for pid in psutil.pids():  # not process_iter: see processes_with_env
            try:
                proc = psutil.Process(pid)
                found[pid] = (proc.ppid(), proc.name())
            except (psutil.Error, OSError):
                continue
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")".
        open_at, close_at = stat.find(b"("), stat.rfind(b")")
        fields = stat[close_at + 2:].split()
        if open_at < 0 or close_at < 0 or len(fields) < 2:
            continue
        found[int(entry)] = (int(fields[1]), stat[open_at + 1:close_at].decode("utf-8", "replace"))
    return found


def _children_names(children_of: dict[int, list[tuple[int, str]]], pid: int) -> tuple[str, ...]:
    return tuple(sorted(name for _, name in children_of.get(pid, [])))


def _walk_tree(
    root: psutil.Process, known: dict[int, psutil.Process] | None = None
) -> tuple[list[psutil.Process], dict[int, tuple[str, ...]]]:
    """The root and all its descendants (breadth first) and each one's children's names, from one pass
    over /proc (psutil's children() rescans every process per call).  A pid in ``known`` whose process is
    still the same one (pid, create_time) keeps its object (and with it its CPU% baseline)."""
    children_of: dict[int, list[tuple[int, str]]] = {}
    for child_pid, (ppid, name) in _parent_map().items():
        children_of.setdefault(ppid, []).append((child_pid, name))
    procs = [root]
    names: dict[int, tuple[str, ...]] = {}
    for proc in procs:  # breadth first; grows while it walks
        names[proc.pid] = _children_names(children_of, proc.pid)
        for child_pid, _ in children_of.get(proc.pid, []):
            try:
                child = psutil.Process(child_pid)
            except (psutil.Error, OSError):
                continue
            kept = (known or {}).get(child_pid)
            if kept is not None and same_process(child, kept.create_time()):
                child = kept
            procs.append(child)
    return procs, names


def _read_tree(
    procs: list[psutil.Process],
    names: dict[int, tuple[str, ...]],
    root_pid: int,
    titles: dict[int, tuple[str, str]] | None = None,
) -> list[ProcInfo]:
    infos = []
    for proc in procs:
        title, name = (titles or {}).get(proc.pid, (None, None))
        info = read_proc(proc, main_pid=root_pid, children=names.get(proc.pid, ()), title=title, name=name)
        if info is not None and (info.status != psutil.STATUS_ZOMBIE or info.pid == root_pid):
            infos.append(info)
    _forget_dead_trackers({(i.pid, round(i.create_time, 2)) for i in infos})
    return infos


def process_tree(pid: int, create_time: float, cpu_interval_s: float | None = None) -> list[ProcInfo]:
    """The process (pid, create_time) and all its descendants, the root first; [] when it is gone.

    CPU% compares with the previous call in this process; pass ``cpu_interval_s`` to measure over a
    short interval now instead (diagnosis wants "this rank is at 0% while the others spin").
    Always walks all of /proc; a caller that reads the same tree every second uses `ProcessTreeWatch`.
    """
    root = get_process(pid, create_time)
    if root is None:
        return []
    procs, names = _walk_tree(root)
    if cpu_interval_s:
        for proc in procs:
            try:
                _tracked(proc, proc.create_time())[0].cpu_percent(interval=None)
            except (psutil.Error, OSError):
                pass
        time.sleep(cpu_interval_s)
    return _read_tree(procs, names, root.pid)


# A watched tree is walked again (all of /proc) at least this often, to find new descendants such as a
# compiler that a rank started; between walks only the known members are read.
TREE_RESCAN_S = 5.0


class ProcessTreeWatch:
    """One server's process tree, read again and again (the TUI reads it every second).

    `process_tree` walks all of /proc and builds a psutil object per process on every call: with a TP8
    server that was most of a poll's CPU.  This keeps the members' psutil objects between reads and reads
    only them; it walks /proc for new descendants on the first read, when a member ended or its pid now
    belongs to another process (identity is (pid, create_time)), when asked (``full_scan``), and at least
    every ``rescan_after_s``.  A rank's title is kept once SGLang has set it (it never changes after).
    """

    def __init__(self, pid: int, create_time: float, rescan_after_s: float = TREE_RESCAN_S) -> None:
        self.pid = int(pid)
        self.create_time = float(create_time)
        self.rescan_after_s = rescan_after_s
        self._members: list[psutil.Process] | None = None
        self._names: dict[int, tuple[str, ...]] = {}
        self._titles: dict[int, tuple[str, str]] = {}  # pid -> (title, name) of recognised SGLang roles
        self._walked_at = 0.0
        self.walks = 0  # how many times all of /proc was walked (tests and benches read it)
        # Between walks of a settled tree (``full_scan`` off: a ready server's) each member is read from
        # its /proc/PID/stat alone, one file instead of psutil's five: the last readings, and per pid
        # (start ticks, CPU seconds, when) of its stat line.
        self._last: list[ProcInfo] = []
        self._ticks: dict[int, tuple[int, float, float]] = {}

    def read(self, full_scan: bool = False) -> list[ProcInfo]:
        """The tree as `process_tree` returns it: the root first, then its descendants; [] when gone."""
        members = self._members
        if full_scan or members is None or time.monotonic() - self._walked_at >= self.rescan_after_s:
            return self._walk()
        if self._last and len(self._last) == len(members):
            fast = self._read_stats()
            if fast is not None:
                return fast
        # read_proc gives None for a member that ended or whose pid is another process now: psutil's
        # ppid() compares the create_time it read first with the one it reads now (is_running()).
        infos = _read_tree(members, self._names, self.pid, self._titles)
        if len(infos) != len(members) or (infos and infos[0].status == psutil.STATUS_ZOMBIE):
            return self._walk()  # the tree changed: find out what it is now
        self._remember_titles(infos)
        return infos

    def _walk(self) -> list[ProcInfo]:
        self.walks += 1
        self._walked_at = time.monotonic()
        root = get_process(self.pid, self.create_time)
        if root is None:
            self._members = None
            return []
        if self._members and self._members[0].pid == root.pid:
            root = self._members[0]  # the same process (get_process checked it): keep its CPU baseline
        known = {p.pid: p for p in self._members or ()}
        procs, names = _walk_tree(root, known)
        # A title is kept only for the very process it was read from (a reused pid is another process).
        still = {p.pid for p in procs if known.get(p.pid) is p}
        self._titles = {pid: kept for pid, kept in self._titles.items() if pid in still}
        infos = _read_tree(procs, names, root.pid, self._titles)
        read_pids = {i.pid for i in infos}
        self._members = [p for p in procs if p.pid in read_pids]
        self._names = names
        self._remember_titles(infos)
        self._last = infos
        # the stat line's baseline, so that the next read's CPU% is the time since this walk
        now = time.monotonic()
        self._ticks = {i.pid: (f[5], f[2], now) for i in infos if (f := _stat_fields(i.pid)) is not None}
        return infos

    def _remember_titles(self, infos: list[ProcInfo]) -> None:
        for info in infos:
            if info.pid not in self._titles and parse_title(info.title).role != "other":
                self._titles[info.pid] = (info.title, info.name)

    def _read_stats(self) -> list[ProcInfo] | None:
        """The members again from their stat lines (state, ppid, CPU time, threads, RSS); None when one
        ended, its pid is another process now (other start ticks), or the root is a zombie: walk then.
        The title, name and children are the last walk's (a ready server's do not change; the walk every
        ``rescan_after_s`` reads them again)."""
        now = time.monotonic()
        out: list[ProcInfo] = []
        ticks: dict[int, tuple[int, float, float]] = {}
        for info in self._last:
            stat = _stat_fields(info.pid)
            if stat is None:
                return None
            state, ppid, cpu_s, threads, rss, start = stat
            kept = self._ticks.get(info.pid)
            if kept[0] != start if kept is not None else abs(start / _CLOCK_TICKS + _boot_time() - info.create_time) > 1:
                return None  # the pid belongs to another process now
            status = _STATES.get(state, state)
            if status == psutil.STATUS_ZOMBIE and (info.pid == self.pid or not out):
                return None
            cpu = info.cpu_percent
            if kept is not None and now > kept[2]:
                cpu = max(0.0, (cpu_s - kept[1]) / (now - kept[2]) * 100.0)
            ticks[info.pid] = (start, cpu_s, now)
            if status == psutil.STATUS_ZOMBIE:
                continue  # (as `_read_tree`: a zombie child is not a member)
            out.append(dataclasses.replace(info, status=status, ppid=ppid, cpu_percent=cpu, num_threads=threads,
                                           rss_bytes=rss))
        if len(out) != len(self._last):
            return None  # a member became a zombie: the tree changed
        self._ticks = ticks
        self._last = out
        return out


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# /proc/PID/stat's state letter as psutil names it
_STATES = {
    "R": psutil.STATUS_RUNNING, "S": psutil.STATUS_SLEEPING, "D": psutil.STATUS_DISK_SLEEP,
    "T": psutil.STATUS_STOPPED, "t": psutil.STATUS_TRACING_STOP, "Z": psutil.STATUS_ZOMBIE,
    "X": psutil.STATUS_DEAD, "x": psutil.STATUS_DEAD, "K": "wake-kill",
    "W": psutil.STATUS_WAKING, "I": psutil.STATUS_IDLE, "P": psutil.STATUS_PARKED,
}


@functools.cache
def _boot_time() -> float:
    return psutil.boot_time()  # what psutil adds to a process's start ticks for its create_time


def _stat_fields(pid: int) -> tuple[str, int, float, int, int, int] | None:
    """(state, ppid, CPU seconds (user + system), threads, RSS bytes, start ticks) of ``pid`` from
    /proc/PID/stat (man 5 proc); None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    close_at = raw.rfind(b")")  # comm may hold spaces and parentheses
    fields = raw[close_at + 2:].split()
    if close_at < 0 or len(fields) < 22:
        return None
    try:
        return (fields[0].decode(), int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS,
                int(fields[17]), int(fields[21]) * _PAGE_SIZE, int(fields[19]))
    except ValueError:
        return None


def processes_with_env(name: str, value: str, exclude_pids: Iterable[int] = ()) -> list[psutil.Process]:
    """Live processes whose environment has ``name=value``.

    This finds what left the process group and lost its parent (a daemonised grandchild, a compiler):
    environments are inherited, as SGLang's own ``SGLANG_RUN_ID`` shows (engine.py:1878-1942).  It cannot
    find SGLang's ranks: ``setproctitle`` reuses the environ area for the title, so their
    ``/proc/PID/environ`` reads back empty; `processes_in_group` finds those.  Processes whose environment
    we may not read are skipped.
    """
    skip = set(exclude_pids) | {os.getpid()}
    found: list[psutil.Process] = []
    # Fresh Process objects, not psutil.process_iter(): its cache skips, for one pass, a pid that was
    # reused since the previous pass, which is exactly the new process a long-lived caller looks for.
    for pid in psutil.pids():
        if pid in skip:
            continue
        try:
            proc = psutil.Process(pid)
            if proc.environ().get(name) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def group_is_ours(leader_pid: int, leader_create_time: float) -> bool:
    """True when process group / session ``leader_pid`` can only be the one our leader created.

    Either the leader (pid, create_time) still lives, or no process has that pid: Linux does not hand a
    pid number out again while a process still uses it as its group or session id, so a pid that no
    process holds means any member of that group is a leftover of ours.
    """
    if process_alive(leader_pid, leader_create_time):
        return True
    try:
        proc = psutil.Process(int(leader_pid))
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):
        return False
    try:
        return proc.status() == psutil.STATUS_ZOMBIE and same_process(proc, leader_create_time)
    except (psutil.Error, OSError):
        return False


def processes_in_group(leader_pid: int, leader_create_time: float) -> list[psutil.Process]:
    """Live processes whose process group or session is the one (leader_pid, create_time) started.

    A launch with ``start_new_session=True`` makes the server the leader of both; SGLang's ranks stay in
    its group (sglang-facts §1.2) and keep it after the main process dies.  [] when the group id may
    belong to someone else now (see `group_is_ours`).
    """
    if not group_is_ours(leader_pid, leader_create_time):
        return []
    me = os.getpid()
    found = []
    for pid in psutil.pids():
        if pid in (me, leader_pid):
            continue
        try:
            if leader_pid in (os.getpgid(pid), os.getsid(pid)):
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() >= leader_create_time - 1:
                    found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def kill_identity(pid: int, create_time: float, sig: int) -> bool:
    """Send ``sig`` to (pid, create_time) if that exact process still lives; True when sent."""
    proc = get_process(pid, create_time)
    if proc is None:
        return False
    try:
        proc.send_signal(sig)
        return True
    except (psutil.Error, OSError):
        return False
