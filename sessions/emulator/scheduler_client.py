"""The main process's side of the rank pipes: collectives, rank reports, and request round trips.

While the ranks start, the main thread reads their pipes itself (`SchedulerClient.dispatch`); once every
rank is ready, one reader thread per rank takes over (`start_readers`) so that HTTP threads can make
round trips (`call`) and follow a request's streamed chunks (`stream`).  Calls have no timeout unless one is given: SGLang's ``/server_info`` waits on every
scheduler without one (sglang-facts §2), and a request whose forward lost a rank hangs, as in SGLang.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any


class Collectives:
    """Barrier bookkeeping: a collective completes when every rank arrived, unless the fault forbids it."""

    def __init__(self, ranks: Iterable[int], never_released: frozenset[str] = frozenset()) -> None:
        self.ranks = frozenset(ranks)
        self.never_released = never_released
        self._arrived: dict[str, set[int]] = {}
        self._lock = threading.Lock()

    def arrive(self, rank: int, name: str) -> bool:
        """Record an arrival; True when the collective is now complete and must be released."""
        with self._lock:
            arrived = self._arrived.setdefault(name, set())
            arrived.add(rank)
            if arrived >= self.ranks and name not in self.never_released:
                del self._arrived[name]
                return True
            return False

    def waiting(self) -> dict[str, tuple[int, ...]]:
        with self._lock:
            return {name: tuple(sorted(ranks)) for name, ranks in self._arrived.items()}


@dataclass
class _Call:
    expected: frozenset[int]
    results: dict[int, Any] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    events: queue.SimpleQueue | None = None  # a streaming call: ("chunk", chunk) and ("reply", payload)


class StreamCall:
    """A request whose output comes as chunks: ``get()`` returns ``("chunk", chunk)`` or
    ``("reply", payload)`` (a refusal) in arrival order; ``close()`` forgets the call."""

    def __init__(self, client: SchedulerClient, msg_id: int, call: _Call) -> None:
        self._client = client
        self.msg_id = msg_id
        assert call.events is not None  # a StreamCall is made for a streaming call only
        self._events: queue.SimpleQueue = call.events

    def get(self, timeout_s: float | None = None) -> tuple[str, Any] | None:
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def get_nowait(self) -> tuple[str, Any] | None:
        try:
            return self._events.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        with self._client._calls_lock:
            self._client._calls.pop(self.msg_id, None)


class SchedulerClient:
    """Pipes to the ranks, plus what to do with their reports (memory, GPU mode)."""

    # The ranks whose internal state /server_info lists: TP0 of each DP rank (one here; dp.py has more).
    leader_ranks: tuple[int, ...] = (0,)

    def __init__(
        self,
        conns: dict[int, Connection],
        collectives: Collectives,
        on_report: Callable[[tuple[Any, ...]], None],
    ) -> None:
        self.conns = conns
        self.collectives = collectives
        self.on_report = on_report
        self._send_locks = {rank: threading.Lock() for rank in conns}
        self._broadcast_lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._readers: list[threading.Thread] = []
        # TP0's gauges, sent with every stats line (the main process serves them on /metrics)
        self.on_metrics: Callable[[int, dict[str, Any]], None] | None = None

    def send(self, rank: int, *message: Any) -> bool:
        """Send to one rank; False when its pipe is gone (the rank died)."""
        try:
            with self._send_locks[rank]:
                self.conns[rank].send(message)
            return True
        except (OSError, ValueError):
            return False

    def broadcast(self, *message: Any) -> None:
        # One lock around the whole broadcast: every rank must see the requests in the same order, or
        # two concurrent forwards would each wait in a collective the other rank entered second.  That holds
        # for ranks on other nodes too (`relay`): their copy goes out under the same lock.
        with self._broadcast_lock:
            self.send_to_local_ranks(message)
            self.relay(message)

    def send_to_local_ranks(self, message: tuple[Any, ...]) -> None:
        """Every rank's pipe of this process, in rank order (the caller holds the broadcast lock)."""
        for rank in self.conns:
            self.send(rank, *message)

    def relay(self, message: tuple[Any, ...]) -> None:
        """Ranks beyond this process's pipes that must see the broadcasts in the same order: none here (the
        nodes of a server across nodes, `sessions.emulator.nodes.NodeSchedulerClient`)."""

    def dispatch(self, message: tuple[Any, ...]) -> bool:
        """Handle a collective, a report or a reply; False for anything else (e.g. "ready")."""
        kind = message[0]
        if kind == "barrier":
            if self.collectives.arrive(message[1], message[2]):
                self.broadcast("barrier_release", message[2])
            return True
        if kind in ("mem", "gpu"):
            self.on_report(message)
            return True
        if kind == "reply":
            _, msg_id, rank, payload = message
            with self._calls_lock:
                call = self._calls.get(msg_id)
            if call is not None:
                if call.events is not None:
                    call.events.put(("reply", payload))
                call.results[rank] = payload
                if call.expected <= call.results.keys():
                    call.done.set()
            return True
        if kind == "chunks":
            _, rank, items = message
            with self._calls_lock:
                calls = [(self._calls.get(msg_id), chunk) for msg_id, chunk in items]
            for call, chunk in calls:
                if call is not None and call.events is not None:
                    call.events.put(("chunk", chunk))
            return True
        if kind == "metrics":
            if self.on_metrics is not None:
                self.on_metrics(message[1], message[2])
            return True
        return False

    def start_readers(self) -> None:
        for rank, conn in self.conns.items():
            thread = threading.Thread(
                target=self._read, args=(conn,), name=f"rank-{rank}-reader", daemon=True
            )
            thread.start()
            self._readers.append(thread)

    def _read(self, conn: Connection) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return  # the rank is gone; the main process's watchdog deals with that
            self.dispatch(message)

    def stream(self, kind: str, *payload: Any) -> StreamCall:
        """Send ``(kind, msg_id, *payload)`` to every rank; TP0's chunks and replies come through the
        returned call."""
        msg_id = next(self._ids)
        call = _Call(frozenset({0}), events=queue.SimpleQueue())
        with self._calls_lock:
            self._calls[msg_id] = call
        self.broadcast(kind, msg_id, *payload)
        return StreamCall(self, msg_id, call)

    def call(
        self,
        kind: str,
        *payload: Any,
        reply_from: Iterable[int] | None = None,
        timeout_s: float | None = None,
    ) -> dict[int, Any] | None:
        """Send ``(kind, msg_id, *payload)`` to every rank and wait for the replies of ``reply_from``
        (all ranks by default); None on timeout."""
        msg_id = next(self._ids)
        call = _Call(frozenset(self.conns if reply_from is None else reply_from))
        with self._calls_lock:
            self._calls[msg_id] = call
        try:
            self.broadcast(kind, msg_id, *payload)
            if not call.done.wait(timeout_s):
                return None
            return dict(call.results)
        finally:
            with self._calls_lock:
                self._calls.pop(msg_id, None)
