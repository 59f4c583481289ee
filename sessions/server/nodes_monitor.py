"""Every multi-node session of this home watched in threads: the TUI reads the latest `NodesView`s and never
waits on SSH (the `sessions.remote.monitor.HostMonitor` pattern, for the records of `sessions.server.nodes`).

One thread lists ``<state>/nodes/`` every ``interval_s``; each node of each live record gets its own thread
that asks that node (`nodes_status.node_view`: its session's status and its ``Init parallel`` lines), so a
node whose host hangs or is gone holds only its own line: the others go on, and the whole record is
summarized (`nodes_status.summarize`) from every node's latest answer.  A node that has not answered yet
shows as ``asking``; one that stopped answering keeps its last view, marked unreachable with the reason.
A stopped record is polled until no node is alive, then kept as it was last seen.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sessions.home import Home, read_json
from sessions.server.nodes import NODE_ID_PREFIX, NODES_DIR, MultiNodeRecord, NodeResolver, ranks_of_node
from sessions.server.nodes_status import MultiNodeStatus, NodeView, node_view, summarize

POLL_INTERVAL_S = 2.0
MAX_SHOWN = 4  # records: the live ones, then the newest stopped ones
ASKING = "asking"


@dataclass(frozen=True)
class NodesView:
    """One multi-node session as the dashboard draws it (immutable)."""

    node_id: str
    profile: str
    tp_size: int
    dist_init_addr: str
    status: MultiNodeStatus
    answered: tuple[bool, ...]  # per node: answered at least once
    asked_at: tuple[float | None, ...]  # per node: time.time() of its last answer

    @property
    def nodes(self) -> tuple[NodeView, ...]:
        return self.status.nodes


def _asking(record: MultiNodeRecord, rank: int) -> NodeView:
    entry = record.nodes[rank]
    return NodeView(rank, entry.host, entry.session_id, tuple(ranks_of_node(record.tp_size, len(record.nodes), rank)),
                    state=ASKING, reachable=True, alive=True)


class _RecordWatch:
    """The threads of one record: one per node."""

    def __init__(self, record: MultiNodeRecord, resolver: NodeResolver, interval_s: float,
                 stop: threading.Event) -> None:
        self.record = record
        self.resolver = resolver
        self.interval_s = interval_s
        self.stop = stop
        self.lock = threading.Lock()
        self.views = [_asking(record, n.rank) for n in record.nodes]
        self.answered = [False] * len(record.nodes)
        self.asked_at: list[float | None] = [None] * len(record.nodes)
        self.done = threading.Event()  # the record is stopped and no node is alive: nothing more to ask
        self.threads = [threading.Thread(target=self._run, args=(n.rank,), daemon=True,
                                         name=f"nodes-{record.node_id[-4:]}-{n.rank}") for n in record.nodes]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _run(self, rank: int) -> None:
        while not self.stop.is_set() and not self.done.is_set():
            try:
                view = node_view(self.record, rank, self.resolver(self.record.nodes[rank].host))
            except Exception as exc:  # noqa: BLE001 - a host that cannot even be resolved is that node's state
                view = dataclasses.replace(self.views[rank], reachable=False, state="unreachable", error=str(exc))
            with self.lock:
                if view.reachable:
                    self.views[rank] = view
                    self.answered[rank] = True
                    self.asked_at[rank] = time.time()
                else:  # keep what it said last (its ranks' arrival), marked unreachable with the reason
                    self.views[rank] = dataclasses.replace(self.views[rank], reachable=False, state="unreachable",
                                                           error=view.error)
                if self.record.stopped_at is not None and all(self.answered) and \
                        not any(v.alive for v in self.views):
                    self.done.set()
            self.stop.wait(self.interval_s)

    def view(self) -> NodesView:
        with self.lock:
            views, answered, asked_at = tuple(self.views), tuple(self.answered), tuple(self.asked_at)
        status = summarize(self.record, views)
        waiting = [v for v, a in zip(views, answered, strict=True) if not a and v.reachable]
        if waiting and status.state not in ("crashed", "stopped"):
            status = dataclasses.replace(status, verdict="asking " + ", ".join(f"node {v.rank} ({v.host})"
                                                                            for v in waiting) + " …")
        r = self.record
        return NodesView(r.node_id, r.profile, r.tp_size, r.dist_init_addr, status, answered, asked_at)


class NodesMonitor:
    """`views()`: the latest view of each multi-node session of ``home``, instantly."""

    def __init__(self, home: Home, resolver_factory: Callable[[], NodeResolver],
                 interval_s: float = POLL_INTERVAL_S) -> None:
        self.home = home
        self.resolver_factory = resolver_factory  # called in the lister's thread (ssh -G runs there)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watches: dict[str, _RecordWatch] = {}
        self._stamps: dict[str, int] = {}
        self._resolver: NodeResolver | None = None
        self.problem: str | None = None  # why the records cannot be watched (a bad hosts.toml)
        self._thread = threading.Thread(target=self._list_loop, name="nodes-list", daemon=True)

    def start(self) -> NodesMonitor:
        self._thread.start()
        return self

    def views(self) -> tuple[NodesView, ...]:
        with self._lock:
            watches = list(self._watches.values())
        views = [w.view() for w in watches]
        views.sort(key=lambda v: (v.status.state == "stopped", -self._started(v.node_id)))
        return tuple(views[:MAX_SHOWN])

    def _started(self, node_id: str) -> float:
        watch = self._watches.get(node_id)
        return watch.record.started_at if watch is not None else 0.0

    def close(self) -> None:
        self._stop.set()

    def _list_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._list_once()
            except Exception as exc:  # noqa: BLE001 - shown by the dashboard; the lister goes on
                self.problem = str(exc)
            self._stop.wait(self.interval_s)

    def _list_once(self) -> None:
        directory = self.home.state_root / NODES_DIR
        if not directory.is_dir():
            return
        paths = sorted(directory.glob(f"{NODE_ID_PREFIX}*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for path in paths[:MAX_SHOWN]:  # the newest changed: live ones change as their nodes launch or stop
            stamp = path.stat().st_mtime_ns
            if self._stamps.get(path.stem) == stamp:
                continue
            self._stamps[path.stem] = stamp
            try:
                record = MultiNodeRecord.from_json(read_json(path))
            except (OSError, KeyError, TypeError, ValueError) as exc:
                self.problem = f"{path}: not a multi-node record ({exc})"
                continue
            if self._resolver is None:
                self._resolver = self.resolver_factory()
            old = self._watches.get(record.node_id)
            if old is not None:  # the record changed (a node launched, or it was stopped): watch it anew
                old.done.set()
            watch = _RecordWatch(record, self._resolver, self.interval_s, self._stop)
            if old is not None:
                watch.views, watch.answered, watch.asked_at = list(old.views), list(old.answered), list(old.asked_at)
            with self._lock:
                self._watches[record.node_id] = watch
            watch.start()
