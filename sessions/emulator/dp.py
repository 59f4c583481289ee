"""SGLang 0.5.23's data parallelism without DP attention (``--dp-size N``): a DP controller and N replicas.

What 0.5.23 does (``srt/entrypoints/engine.py:907-988``, ``srt/managers/data_parallel_controller.py``):
* the main process starts one ``sglang::data_parallel_controller`` process (besides the detokenizer), and
  the controller starts the schedulers: replica k's TP group begins at GPU ``k * tp_size * pp_size *
  gpu_id_step`` past ``--base-gpu-id``, and the controller logs ``Launch DP{k} starting at GPU #{offset}.``
  (its lines have no rank prefix);
* each scheduler is titled ``sglang::scheduler_DP{k}[_TP{m}]`` and prefixes its lines `` DP{k}[ TP{m}]``,
  ``m`` local to the replica (``scheduler.py:6257-6300``); its ``meta_info["dp_rank"]`` is ``k``;
* the main process's watchdog watches the controller as ``scheduler_0``; a scheduler that fails SIGQUITs
  its parent, the controller, which dies of it, and the main process tears the tree down;
* requests are dispatched by ``--load-balance-method`` (``auto`` is ``round_robin`` outside PD
  disaggregation): ``round_robin`` (one counter, the warmup request included), ``total_requests`` and
  ``total_tokens`` (the replica with the least requests / tokens in flight, first one on ties; SGLang reads
  scheduler load snapshots and adds +1 per dispatch, the emulator counts what it has in flight),
  ``follow_bootstrap_room`` (``bootstrap_room % dp_size``); ``routed_dp_rank`` (alias
  ``data_parallel_rank``) pins a request; health checks take their own round-robin counter.

The emulator's shortcut: the main process keeps one pipe to every scheduler (the controller hands each
scheduler its end at spawn), so it dispatches itself, with the controller's rules, instead of relaying
through the controller.  Each replica is its own TP group: its collectives complete among its own ranks.
Ranks are numbered globally ``dp_rank * tp_size + tp_rank`` on the GPU board and in ``/server_info``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

from sessions.emulator import pacing
from sessions.emulator.args import dp_replicas, gpu_id, log_level_number
from sessions.emulator.backend import RequestError
from sessions.emulator.console import Console
from sessions.emulator.faults import never_released_barriers
from sessions.emulator.gpu_memory import EmulatedGpuBoard
from sessions.emulator.ranks import RankSpec, kill_itself_when_parent_died, run_scheduler_process
from sessions.emulator.scheduler_client import Collectives, SchedulerClient, StreamCall
from sessions.emulator.startup import Engine

CONTROLLER_TITLE = "sglang::data_parallel_controller"
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK_"  # is_health_check_generate_req


# -- the controller process ---------------------------------------------------------------------------

def run_data_parallel_controller_process(
    parent_pid: int,
    conn: multiprocessing.connection.Connection,
    specs: list[RankSpec],
    rank_conns: list[multiprocessing.connection.Connection],
    log_level: str,
) -> None:
    """``sglang::data_parallel_controller``: start every replica's schedulers, report their pids, then wait
    for the shutdown (its schedulers die with it by PDEATHSIG)."""
    kill_itself_when_parent_died(parent_pid)
    import setproctitle

    setproctitle.setproctitle(CONTROLLER_TITLE)
    # Ctrl-C reaches the whole process group; the main process tears the tree down itself.  SIGQUIT keeps
    # its default action: a scheduler that fails SIGQUITs this process, which dies of it (as in SGLang).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    console = Console(level=log_level_number(log_level))
    ctx = multiprocessing.get_context("spawn")
    children: list[multiprocessing.process.BaseProcess] = []
    pids: list[tuple[int, int]] = []
    tp_size = specs[0].server_args["tp_size"]
    for spec, rank_conn in zip(specs, rank_conns, strict=True):
        assert spec.dp_rank is not None  # the main process builds one spec per (dp_rank, tp_rank)
        if spec.tp_rank == 0:
            offset = gpu_id(spec.server_args, 0, spec.dp_rank) - spec.server_args["base_gpu_id"]
            console.log(f"Launch DP{spec.dp_rank} starting at GPU #{offset}.")
        own = dataclasses.replace(spec, parent_pid=os.getpid())  # the schedulers are this process's children
        process = ctx.Process(
            target=run_scheduler_process, args=(own, rank_conn), name=f"scheduler_DP{spec.dp_rank}_TP{spec.tp_rank}"
        )
        process.start()
        rank_conn.close()
        children.append(process)
        assert process.pid is not None  # started just above
        pids.append((spec.dp_rank * tp_size + spec.tp_rank, process.pid))
    try:
        conn.send(("pids", pids))
        while True:
            message = conn.recv()
            if message and message[0] == "shutdown":
                break
    except (EOFError, OSError):
        pass
    for child in children:
        child.join(10)


# -- dispatch -----------------------------------------------------------------------------------------

class Dispatcher:
    """Which replica a request goes to, by ``--load-balance-method`` (data_parallel_controller.py:845-925)."""

    def __init__(self, method: str, dp_size: int) -> None:
        if method not in ("round_robin", "total_requests", "total_tokens", "follow_bootstrap_room"):
            raise ValueError(f"Invalid load balance method: {method.upper()}")
        self.method = method
        self.dp_size = dp_size
        self.round_robin_counter = 0
        self.health_round_robin_counter = 0
        self._lock = threading.Lock()

    def choose(self, request: dict[str, Any], loads: list[tuple[int, int]]) -> int:
        """The replica for ``request``; ``loads`` is (requests, tokens) in flight per replica.
        RequestError for a pin out of range or a bootstrap_room missing under follow_bootstrap_room."""
        with self._lock:
            is_health = str(request.get("rid", "")).startswith(HEALTH_CHECK_RID_PREFIX)
            if is_health and self.method != "follow_bootstrap_room":
                pinned = self._pinned(request)
                if pinned is not None:
                    return pinned
                slot = self.health_round_robin_counter % self.dp_size
                self.health_round_robin_counter = (self.health_round_robin_counter + 1) % self.dp_size
                return slot
            pinned = self._pinned(request)
            if pinned is not None:
                return pinned
            if self.method == "round_robin":
                slot = self.round_robin_counter % self.dp_size
                self.round_robin_counter = (self.round_robin_counter + 1) % self.dp_size
                return slot
            if self.method == "total_requests":
                requests = [r for r, _ in loads]
                return requests.index(min(requests))
            if self.method == "total_tokens":
                return min(range(self.dp_size), key=lambda i: (loads[i][1], loads[i][0]))
            room = request.get("bootstrap_room")
            if not isinstance(room, int):
                raise RequestError(
                    "req.bootstrap_room should not be None. Do not send requests directly to prefill or "
                    "decode instances; send to the router instead."
                )
            return room % self.dp_size

    def _pinned(self, request: dict[str, Any]) -> int | None:
        rank = request.get("routed_dp_rank")
        if rank is None:
            rank = request.get("data_parallel_rank")  # the deprecated alias (io_struct.py:418-429)
        if rank is None:
            return None
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.dp_size:
            # tokenizer_manager.py:915-924
            raise RequestError(f"routed_dp_rank={rank} out of range [0, {self.dp_size})")
        return rank


def estimated_tokens(request: dict[str, Any]) -> int:
    """``len(req.input_ids)`` as total_tokens counts it; the main process does not tokenize text, so a text
    prompt is estimated at 4 characters a token."""
    ids = request.get("input_ids")
    if isinstance(ids, list):
        return len(ids)
    text = request.get("text")
    return max(1, len(text) // 4) if isinstance(text, str) else 1


# -- the main process's side --------------------------------------------------------------------------

class ReplicaClient(SchedulerClient):
    """One replica's TP group: its pipes, its collectives, and what it has in flight (for the dispatch)."""

    def __init__(
        self,
        conns: dict[int, multiprocessing.connection.Connection],
        collectives: Collectives,
        on_report: Callable[[tuple[Any, ...]], None],
    ) -> None:
        super().__init__(conns, collectives, on_report)
        self.in_flight: dict[int, int] = {}  # msg_id -> estimated tokens
        self._flight_lock = threading.Lock()

    def load(self) -> tuple[int, int]:
        with self._flight_lock:
            return len(self.in_flight), sum(self.in_flight.values())

    def broadcast(self, *message: Any) -> None:
        # A generate request counts in flight from before it is sent (its reply may come at once) until its
        # final chunk or its refusal.
        if message[0] == "generate":
            with self._flight_lock:
                self.in_flight[message[1]] = estimated_tokens(message[2])
        super().broadcast(*message)

    def dispatch(self, message: tuple[Any, ...]) -> bool:
        if message[0] == "chunks":
            finished = [msg_id for msg_id, chunk in message[2] if isinstance(chunk, dict) and chunk.get("final")]
            if finished:
                with self._flight_lock:
                    for msg_id in finished:
                        self.in_flight.pop(msg_id, None)
        elif message[0] == "reply":
            with self._flight_lock:
                self.in_flight.pop(message[1], None)
        return super().dispatch(message)


class DataParallelClient(SchedulerClient):
    """The replicas behind one tokenizer manager: requests go to one replica, control calls to all."""

    def __init__(self, replicas: list[ReplicaClient], tp_size: int, method: str) -> None:
        conns = {
            dp * tp_size + rank: conn
            for dp, replica in enumerate(replicas)
            for rank, conn in replica.conns.items()
        }
        super().__init__(conns, Collectives(()), lambda _message: None)
        self.replicas = replicas
        self.tp_size = tp_size
        self.leader_ranks = tuple(dp * tp_size for dp in range(len(replicas)))
        self.dispatcher = Dispatcher(method, len(replicas))
        for replica in replicas:
            replica.on_metrics = self._forward_metrics

    def _forward_metrics(self, rank: int, values: dict[str, Any]) -> None:
        if self.on_metrics is not None:
            self.on_metrics(rank, values)

    def start_readers(self) -> None:
        for replica in self.replicas:
            replica.start_readers()

    def stream(self, kind: str, *payload: Any) -> StreamCall:
        if kind != "generate":
            raise ValueError(f"only generate requests stream, not {kind!r}")
        request, is_warmup = payload
        dp = self.dispatcher.choose(request, [replica.load() for replica in self.replicas])
        return self.replicas[dp].stream("generate", request, is_warmup)

    def call(
        self,
        kind: str,
        *payload: Any,
        reply_from: Iterable[int] | None = None,
        timeout_s: float | None = None,
    ) -> dict[int, Any] | None:
        """A control call to every replica (SGLang's controller sends them to all workers); ``reply_from``
        names ranks inside a replica.  Replies are keyed by global rank; None when one replica timed out."""
        wanted = None if reply_from is None else tuple(reply_from)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results: dict[int, Any] = {}
        for dp, replica in enumerate(self.replicas):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            replies = replica.call(kind, *payload, reply_from=wanted, timeout_s=left)
            if replies is None:
                return None
            results.update({dp * self.tp_size + rank: value for rank, value in replies.items()})
        return results


class DataParallelEngine(Engine):
    """The main process of a ``--dp-size N`` server: the controller and detokenizer as its children, the
    schedulers as the controller's."""

    def __init__(self, ns: Any, options: Any, argv: list[str]) -> None:
        super().__init__(ns, options, argv)
        self.controller_conn: multiprocessing.connection.Connection | None = None
        self.scheduler_pids: dict[int, int] = {}  # global rank -> pid, as the controller reports them
        self._conn_rank: dict[multiprocessing.connection.Connection, tuple[int, int]] = {}
        self._gpu_modes: dict[int, str] = {}

    def _start_children(self, args: dict[str, Any]) -> dict[int, multiprocessing.connection.Connection]:
        ctx = multiprocessing.get_context("spawn")
        tp_size, dp_size = args["tp_size"], args["dp_size"]
        self.board = EmulatedGpuBoard(Path.cwd(), self.pid, self.options.gpus)
        never = never_released_barriers(self.options.fault)
        specs: list[RankSpec] = []
        child_ends: list[multiprocessing.connection.Connection] = []
        replicas: list[ReplicaClient] = []
        conns: dict[int, multiprocessing.connection.Connection] = {}
        for dp in range(dp_size):
            replica_conns: dict[int, multiprocessing.connection.Connection] = {}
            for rank in range(tp_size):
                parent_end, child_end = ctx.Pipe(duplex=True)
                specs.append(RankSpec(args, rank, gpu_id(args, rank, dp), self.pid, self.options, dp_rank=dp))
                child_ends.append(child_end)
                replica_conns[rank] = parent_end
                conns[dp * tp_size + rank] = parent_end
                self._conn_rank[parent_end] = (dp, rank)
                self.board.set_rank(dp * tp_size + rank, None, gpu_id(args, rank, dp))
            replicas.append(ReplicaClient(replica_conns, Collectives(replica_conns, never), self._report_from(dp)))
        parent_end, child_end = ctx.Pipe(duplex=True)
        controller = ctx.Process(
            target=run_data_parallel_controller_process,
            args=(self.pid, child_end, specs, child_ends, args["log_level"]),
            name="data_parallel_controller",
        )
        controller.start()
        child_end.close()
        for end in child_ends:
            end.close()
        self.controller_conn = parent_end
        self.aux_conns.append(parent_end)
        # SGLang's watchdog knows the controller as scheduler_0 (engine.py:1313-1315); it is the one child
        # the main process waits on while the replicas load.
        self.processes["scheduler_0"] = controller
        detok_end, detok_child = ctx.Pipe(duplex=True)
        from sessions.emulator.ranks import run_detokenizer_process

        detokenizer = ctx.Process(
            target=run_detokenizer_process,
            name="detokenizer",
            args=(self.pid, detok_child, "sglang::detokenizer", args["log_level"],
                  bool(args["soft_watchdog_timeout"])),
        )
        detokenizer.start()
        detok_child.close()
        self.aux_conns.append(detok_end)
        self.processes["detokenizer"] = detokenizer
        self.board.start()
        self.client = DataParallelClient(replicas, tp_size, args["load_balance_method"])
        return conns

    def _report_from(self, dp: int) -> Callable[[tuple[Any, ...]], None]:
        def report(message: tuple[Any, ...]) -> None:
            # ("mem"|"gpu", local_rank, ...) -> the global rank
            self._on_rank_report((message[0], dp * self.args["tp_size"] + message[1], *message[2:]))

        return report

    def _on_rank_report(self, message: tuple[Any, ...]) -> None:
        assert self.board is not None
        if message[0] == "mem":
            self.board.update(message[1], message[2], message[3])
        elif message[0] == "gpu":
            self._gpu_modes[message[1]] = message[2]
            expected = self.args["tp_size"] * self.args["dp_size"]
            if len(self._gpu_modes) == expected and all(m == "real" for m in self._gpu_modes.values()):
                self.board.disable()

    def _wait_for_ready(
        self, conns: dict[int, multiprocessing.connection.Connection]
    ) -> dict[int, dict[str, Any]]:
        """Read every scheduler (and the controller's pid report) until all are ready; RuntimeError when the
        controller died (engine.py:2013-2042 waits on the controller's pipe only)."""
        client = cast(DataParallelClient, self.client)
        assert self.controller_conn is not None and self.board is not None
        ready: dict[int, dict[str, Any]] = {}
        open_conns: list[multiprocessing.connection.Connection] = [*conns.values(), self.controller_conn]
        controller = self.processes["scheduler_0"]
        poll_s = self.pacing.poll_interval(pacing.INIT_DEATH_POLL_S, floor_s=0.05)
        next_check = time.monotonic() + poll_s
        tp_size = self.args["tp_size"]
        while len(ready) < len(conns):
            timeout = max(0.0, next_check - time.monotonic())
            for ready_object in multiprocessing.connection.wait(open_conns, timeout):
                conn = cast(multiprocessing.connection.Connection, ready_object)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    open_conns.remove(conn)
                    continue
                if conn is self.controller_conn:
                    if message[0] == "pids":
                        for rank, pid in message[1]:
                            self.scheduler_pids[rank] = pid
                            dp, local = divmod(rank, tp_size)
                            self.board.set_rank(rank, pid, gpu_id(self.args, local, dp))
                    continue
                dp, _local = self._conn_rank[conn]
                if message[0] == "ready":
                    ready[dp * tp_size + message[1]] = message[2]
                else:
                    client.replicas[dp].dispatch(message)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + poll_s
                if controller.exitcode is not None:
                    raise RuntimeError(
                        f"Rank 0 scheduler died during initialization (exit code: {controller.exitcode}). "
                        "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
                        "Run `dmesg -T | grep -i oom` to check."
                    )
        return ready

    def live_scheduler_pids(self) -> list[int]:
        import psutil

        alive = []
        for pid in self.scheduler_pids.values():
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                continue
        return alive



def engine_for(ns: Any) -> type[Engine]:
    """The main process for these flags: the DP controller's for ``--dp-size N`` (no attention DP)."""
    return DataParallelEngine if dp_replicas(ns) > 1 else Engine
