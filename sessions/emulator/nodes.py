"""One emulated server across nodes: ``--nnodes N --node-rank R --dist-init-addr HOST:PORT``.

What SGLang 0.5.23 does, and so what this module reproduces (docs/sglang-facts.md §10):

* Every node runs the same command but ``--node-rank``.  Node R holds TP ranks
  ``R*tp/N .. (R+1)*tp/N - 1`` (``_calculate_rank_ranges``, engine.py:2045-2076) and prints them with their
  global numbers (``TP2``, ``TP3`` on node 1 of a TP4 2-node start); its local GPU of TP rank t is
  ``base_gpu_id + (t % tp_per_node) * gpu_id_step`` (engine.py:931-940).
* The ranks meet in torch's TCP rendezvous on the dist-init address (bootstrap.py ``_resolve_dist_init_method``):
  here node 0's main process listens there and every other node's main process connects, retrying; a node
  that cannot connect prints c10d's ``The client socket has failed to connect to ...`` warning.  Every
  collective (the init rendezvous, the memory all-reduce, each forward) completes only when every node's
  ranks reached it, so a node that never joins leaves all ranks at ``Init parallel begin.``.
* Node 0 alone serves the API.  Other nodes run no tokenizer or detokenizer; once their schedulers are
  ready they serve a dummy health app whose ``/ping``, ``/health`` and ``/health_generate`` always answer
  200 (engine.py:1234-1284, utils/common.py:3624-3664), and a SIGTERM only logs ``SIGTERM received on
  node_rank R; waiting for the rank-0 ShutdownReq broadcast to stop the schedulers.``: they stop when node
  0's ShutdownReq reaches their schedulers.
* A peer that goes away (its process killed, its host down) breaks the connection: the ranks waiting in a
  collective then fail with NCCL's ``ncclRemoteError`` (``remote process exited or there was a network
  error``), as torch's ProcessGroupNCCL raises it, and take SGLang's scheduler-exception path.

The wire between the main processes is JSON lines (never pickle: the peer is another host).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from sessions.emulator.scheduler_client import Collectives, SchedulerClient

if TYPE_CHECKING:
    from sessions.emulator.console import Console

# The main process's Engine (sessions.emulator.startup), which imports this module: typed loosely here.
Engine = Any

# NCCL notices a closed peer socket on its next progress call; the emulator waits this long (scaled by the
# time scale, never less than PEER_LOSS_MIN_S of wall time) before the waiting ranks raise.
PEER_LOSS_S = 20.0
PEER_LOSS_MIN_S = 0.3
CONNECT_RETRY_S = 0.2
CONNECT_WARN_EVERY_S = 5.0
NCCL_VERSION = "2.27.7"
GATE_POLL_S = 1.0  # gated_launch.py POLL_INTERVAL_SECONDS
GATE_LOG_INTERVAL_S = 10.0  # gated_launch.py LOG_INTERVAL_SECONDS


@dataclass(frozen=True)
class NodeLayout:
    """Which TP ranks this node holds (pp = 1: the emulator runs no pipeline parallelism)."""

    nnodes: int
    node_rank: int
    tp_size: int

    @property
    def tp_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        per = self.tp_per_node
        return range(per * self.node_rank, per * (self.node_rank + 1))

    def node_of(self, tp_rank: int) -> int:
        return tp_rank // self.tp_per_node

    def ranks_of(self, node_rank: int) -> range:
        per = self.tp_per_node
        return range(per * node_rank, per * (node_rank + 1))

    @property
    def is_multi_node(self) -> bool:
        return self.nnodes > 1


def node_layout(args: Mapping[str, Any]) -> NodeLayout:
    return NodeLayout(int(args["nnodes"]), int(args["node_rank"]), int(args["tp_size"]))


def check_node_args(args: Mapping[str, Any]) -> None:
    """SGLang's checks of the node flags (validation_hook.py check_server_args), as ValueError."""
    nnodes, node_rank = args["nnodes"], args["node_rank"]
    if nnodes < 1:
        raise ValueError(f"--nnodes must be >= 1, not {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank} must be in 0..{nnodes - 1} (--nnodes {nnodes})")
    if (args["tp_size"] * args["pp_size"]) % nnodes:
        raise ValueError("tp_size must be divisible by number of nodes")
    if args["dp_size"] > 1 and nnodes != 1:
        raise ValueError(
            "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes"
        )
    if nnodes > 1:
        rendezvous_address(args)  # a malformed --dist-init-addr fails here, before anything starts


def rendezvous_address(args: Mapping[str, Any]) -> tuple[str, int]:
    """Where torch's TCP rendezvous listens: ``--dist-init-addr``, else ``--host:--nccl-port``
    (bootstrap.py ``_resolve_dist_init_method``)."""
    given = args.get("dist_init_addr")
    if not given:
        host = args.get("host") or "127.0.0.1"
        return host, int(args["nccl_port"])
    text = str(given)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dist-init-addr {text!r} is not HOST:PORT (e.g. 192.168.0.2:25000)")
    return host.strip("[]"), int(port)


# -- socket interface variables -------------------------------------------------------------------------


def _interface_names() -> list[str]:
    return [name for _index, name in socket.if_nameindex()]


def missing_interface(environ: Mapping[str, str], names: list[str] | None = None) -> tuple[str, str] | None:
    """``(variable, value)`` when ``NCCL_SOCKET_IFNAME`` or ``GLOO_SOCKET_IFNAME`` selects no interface of
    this host (``socket.if_nameindex()``), else None.

    NCCL reads a comma list of prefixes, ``=name`` for exact names and a leading ``^`` to exclude (NCCL
    User Guide, env.rst); Gloo takes exact interface names, comma separated (torch ProcessGroupGloo)."""
    present = _interface_names() if names is None else names
    gloo = environ.get("GLOO_SOCKET_IFNAME", "").strip()
    if gloo and not any(part.strip() in present for part in gloo.split(",") if part.strip()):
        return "GLOO_SOCKET_IFNAME", gloo
    nccl = environ.get("NCCL_SOCKET_IFNAME", "").strip()
    if nccl and not _nccl_selects_any(nccl, present):
        return "NCCL_SOCKET_IFNAME", nccl
    return None


def _nccl_selects_any(spec: str, present: list[str]) -> bool:
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    body = body[1:] if exact else body
    patterns = [p.strip() for p in body.split(",") if p.strip()]

    def matches(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)

    if exclude:
        return any(not matches(name) for name in present)
    return any(matches(name) for name in present)


class DistBackendError(RuntimeError):
    """Stands in for ``torch.distributed.DistBackendError`` (same printed name)."""


DistBackendError.__module__ = "torch.distributed"


def interface_error(variable: str, value: str) -> Exception:
    """What the rank raises at ``Init parallel`` when its interface variable names no interface."""
    if variable == "GLOO_SOCKET_IFNAME":
        first = value.split(",")[0].strip()
        return RuntimeError(
            "[enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] ifa != nullptr. "
            f"Unable to find address for: {first}"
        )
    return DistBackendError(
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, internal error - "
        f"please report this issue to the NCCL developers, NCCL version {NCCL_VERSION}\n"
        "ncclInternalError: Internal check failed.\n"
        "Last error:\n"
        f"Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME={value})"
    )


def peer_lost_error(peer: str) -> Exception:
    """What a rank waiting in a collective raises once a peer node went away (ProcessGroupNCCL)."""
    return DistBackendError(
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process exited or there "
        f"was a network error, NCCL version {NCCL_VERSION}\n"
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
        "Last error:\n"
        f"socketProgress: Connection closed by remote peer {peer}"
    )


def check_interfaces(environ: Mapping[str, str]) -> None:
    """A rank at ``Init parallel``: raise as Gloo / NCCL do when the interface variable names none here."""
    missing = missing_interface(environ)
    if missing is not None:
        raise interface_error(*missing)


def fail_for_lost_peer(peer: str, time_scale: float) -> NoReturn:
    """A rank in a collective whose peer node went away: NCCL notices the closed socket on its next
    progress, then the collective raises."""
    time.sleep(max(PEER_LOSS_MIN_S, PEER_LOSS_S * time_scale))
    raise peer_lost_error(peer)


def c10d_connect_warning(host: str, port: int, error: OSError) -> str:
    """torch's c10d warning for a rendezvous client that cannot connect (socket.cpp), glog format."""
    now = datetime.now()
    errno_text = f"errno: {error.errno} - {os.strerror(error.errno)}" if error.errno else str(error)
    return (
        f"[W{now:%m%d %H:%M:%S}.{now.microsecond:06d}000 socket.cpp:767] [c10d] The client socket has failed "
        f"to connect to [{host}]:{port} ({errno_text}).\n"
    )


# -- the link between the nodes' main processes -------------------------------------------------------------


class NodeLink:
    """Node 0 listens on the rendezvous address, the others connect; barriers, mirrored requests and
    peer loss travel over it.  Callbacks run on the link's threads."""

    def __init__(
        self,
        layout: NodeLayout,
        address: tuple[str, int],
        console: Console,
        never_released: frozenset[str],
        connect: bool = True,
        source_host: str = "",
    ) -> None:
        self.layout = layout
        self.address = address
        self.console = console
        self.never_released = never_released
        self.connect_enabled = connect  # False: node-never-joins (its packets never reach node 0)
        self.source_host = source_host
        self.on_release: Callable[[str], None] = lambda _name: None
        self.on_mirror: Callable[[tuple[Any, ...]], None] = lambda _message: None
        self.on_peer_lost: Callable[[int, str], None] = lambda _node, _peer: None
        self._lock = threading.Lock()
        self._peers: dict[int, socket.socket] = {}  # node 0: the workers; a worker: {0: node 0}
        self._arrivals: dict[str, set[int]] = {}
        self._listener: socket.socket | None = None
        # One writer at a time on the peer sockets: releases (rank reader threads) and mirrored requests (HTTP
        # threads) would otherwise interleave the bytes of two JSON lines on one connection.
        self._wire_lock = threading.Lock()
        self.closing = False
        self._closed = threading.Event()

    # node 0 ---------------------------------------------------------------------------------------------

    def listen(self) -> None:
        """Bind the rendezvous port (node 0); OSError as torch's TCPStore raises it when taken."""
        host, port = self.address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
        except OSError as exc:
            listener.close()
            raise OSError(
                exc.errno,
                f"The server socket has failed to listen on any local network address. port: {port}, "
                f"useIpv6: {family == socket.AF_INET6}, code: -{exc.errno}, name: "
                f"{_errno_name(exc.errno)}, message: {exc.strerror}",
            ) from exc
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept_loop, name="rendezvous-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                conn, _peer = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_worker, args=(conn,), name="rendezvous-peer", daemon=True).start()

    def _serve_worker(self, conn: socket.socket) -> None:
        reader = conn.makefile("r", encoding="utf-8")
        node: int | None = None
        peer = _peer_text(conn)
        try:
            for line in reader:
                message = json.loads(line)
                if message.get("hello") is not None:
                    node = int(message["hello"])
                    with self._lock:
                        self._peers[node] = conn
                elif message.get("arrive") is not None and node is not None:
                    self._arrive(node, str(message["arrive"]))
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                if node is not None and self._peers.get(node) is conn:
                    del self._peers[node]
            with contextlib.suppress(OSError):
                conn.close()
            if node is not None and not self.closing:
                self.on_peer_lost(node, peer)

    def _arrive(self, node: int, name: str) -> None:
        with self._lock:
            arrived = self._arrivals.setdefault(name, set())
            arrived.add(node)
            if len(arrived) < self.layout.nnodes or name in self.never_released:
                return
            del self._arrivals[name]
            peers = list(self._peers.values())
        for conn in peers:
            self._send(conn, {"release": name})
        self.on_release(name)

    def mirror(self, message: tuple[Any, ...]) -> None:
        """Node 0: send a request broadcast to the other nodes' ranks (SGLang broadcasts every request from
        TP0 to all ranks of the world group)."""
        with self._lock:
            peers = list(self._peers.values())
        for conn in peers:
            self._send(conn, {"mirror": list(message)})

    def joined(self) -> list[int]:
        with self._lock:
            return sorted({0, *self._peers})

    # the other nodes ------------------------------------------------------------------------------------

    def start_client(self) -> None:
        threading.Thread(target=self._client_loop, name="rendezvous-client", daemon=True).start()

    def _client_loop(self) -> None:
        host, port = self.address
        warned_at = 0.0
        while not self._closed.is_set():
            if not self.connect_enabled:
                error: OSError = TimeoutError(110, os.strerror(110))
            else:
                try:
                    conn = socket.create_connection((host, port), timeout=5, source_address=self._source())
                    break
                except OSError as exc:
                    error = exc
            if time.monotonic() - warned_at >= CONNECT_WARN_EVERY_S:
                warned_at = time.monotonic()
                self.console.raw(c10d_connect_warning(host, port, error))
            self._closed.wait(CONNECT_RETRY_S)
        else:
            return
        conn.settimeout(None)
        with self._lock:
            self._peers[0] = conn
            pending = list(self._arrivals)
            self._arrivals.clear()
        self._send(conn, {"hello": self.layout.node_rank})
        for name in pending:  # barriers the local ranks reached before the connection
            self._send(conn, {"arrive": name})
        peer = _peer_text(conn)
        reader = conn.makefile("r", encoding="utf-8")
        try:
            for line in reader:
                message = json.loads(line)
                if "release" in message:
                    self.on_release(str(message["release"]))
                elif "mirror" in message:
                    self.on_mirror(tuple(message["mirror"]))
        except (OSError, ValueError):
            pass
        with self._lock:
            self._peers.pop(0, None)
        if not self.closing:
            self.on_peer_lost(0, peer)

    def _source(self) -> tuple[str, int] | None:
        """Connect from this node's own address (``--host``), so node 0 sees which host a peer is."""
        if not self.source_host or self.source_host in ("0.0.0.0", "::"):
            return None
        try:
            with socket.socket(socket.AF_INET6 if ":" in self.source_host else socket.AF_INET) as probe:
                probe.bind((self.source_host, 0))
        except OSError:
            return None  # not an address of this host (a name, or a NAT): let the kernel choose
        return self.source_host, 0

    def local_complete(self, name: str) -> None:
        """Every local rank reached collective ``name``."""
        if self.layout.node_rank == 0:
            self._arrive(0, name)
            return
        with self._lock:
            conn = self._peers.get(0)
            if conn is None:
                self._arrivals[name] = {self.layout.node_rank}  # sent once connected
                return
        self._send(conn, {"arrive": name})

    def _send(self, conn: socket.socket, message: dict[str, Any]) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._wire_lock, contextlib.suppress(OSError):
            conn.sendall(data)

    def close(self) -> None:
        self.closing = True
        self._closed.set()
        with self._lock:
            conns = list(self._peers.values())
            self._peers.clear()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()




def _peer_text(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return "<unknown>"
    return f"{host}<{port}>"


def _errno_name(number: int | None) -> str:
    import errno

    return errno.errorcode.get(number or 0, "UNKNOWN")


# -- the main process's pieces ----------------------------------------------------------------------------


class NodeCollectives(Collectives):
    """A collective completes when every node's ranks arrived: local arrivals go to the link, the release
    comes back from node 0."""

    def __init__(self, ranks: range, never_released: frozenset[str], link: NodeLink) -> None:
        super().__init__(ranks, never_released)
        self.link = link

    def arrive(self, rank: int, name: str) -> bool:
        if super().arrive(rank, name):
            self.link.local_complete(name)
        return False  # released by the link's on_release


class NodeSchedulerClient(SchedulerClient):
    """Node 0's client: every request broadcast also goes to the other nodes' ranks.

    The copy for the other nodes is sent under the same lock as the local ranks' (`SchedulerClient.broadcast`
    calls `relay` inside it), so every rank of every node sees the requests in one order.  Mirrored after the
    lock, two HTTP threads' requests A and B could reach node 0's ranks as A, B and node 1's as B, A: node 0's
    ranks then wait in ``forward:A`` and node 1's in ``forward:B``, each collective for ever one node short (the
    2-node extraction test's hang after a resume: two samples in flight, no answer, no error)."""

    link: NodeLink | None = None

    def relay(self, message: tuple[Any, ...]) -> None:
        if self.link is not None and message[0] != "barrier_release" and self.link.layout.node_rank == 0:
            if message[0] == "shutdown":
                self.link.closing = True  # the workers leave after this: not a lost peer
            self.link.mirror(message)

    def local_broadcast(self, *message: Any) -> None:
        """This node's ranks only: a release, or what node 0 mirrored here (read in order by one thread)."""
        with self._broadcast_lock:
            self.send_to_local_ranks(message)


def wire_link(engine: Engine, client: NodeSchedulerClient, link: NodeLink) -> None:
    """Connect the link's callbacks to this node's ranks."""
    client.link = link
    link.on_release = lambda name: client.local_broadcast("barrier_release", name)

    def mirrored(message: tuple[Any, ...]) -> None:
        if message[0] == "shutdown":
            link.closing = True  # node 0 closes the connection after its ShutdownReq
        client.local_broadcast(*message)

    link.on_mirror = mirrored

    def peer_lost(node: int, peer: str) -> None:
        engine.console.log(
            f"[emulator] lost the connection to node {node} ({peer}); ranks waiting in a collective will "
            "fail with ncclRemoteError",
            logging.WARNING,
        )
        for rank in client.conns:
            client.send(rank, "peer_lost", node, peer)

    link.on_peer_lost = peer_lost


# -- a worker node after its schedulers are ready ---------------------------------------------------------


class _DummyHealthHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.split("?")[0] in ("/ping", "/health", "/health_generate"):
            self._answer(200, b"")
        else:
            self._answer(404, b'{"detail":"Not Found"}')

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        if body:
            self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # uvicorn runs it at log_level="warning": no access lines


class DummyHealthServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _DummyHealthHandler)


def serve_worker_node(engine: Engine) -> int:
    """engine.py:1234-1284 for node_rank >= 1: the SIGTERM note, the dummy health app, then block until the
    schedulers exit (node 0's ShutdownReq, or a failure)."""
    node_rank = engine.args["node_rank"]

    def sigterm_handler(signum: int, frame: Any) -> None:
        engine.console.log(
            f"SIGTERM received on node_rank {node_rank}; waiting for the rank-0 ShutdownReq broadcast to stop "
            "the schedulers.",
            logging.WARNING,
        )

    signal.signal(signal.SIGTERM, sigterm_handler)
    assert engine.client is not None
    engine.client.start_readers()  # the ranks' collectives in every forward go through this process
    server: DummyHealthServer | None = None
    try:
        server = DummyHealthServer(engine.args["host"], engine.args["port"])
    except OSError as exc:
        engine.console.uvicorn(
            f"[Errno {exc.errno}] error while attempting to bind on address "
            f"({engine.args['host']!r}, {engine.args['port']}): {exc.strerror}",
            logging.ERROR,
        )
    if server is not None:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        for process in engine.rank_processes.values():
            while process.exitcode is None:
                process.join(0.5)  # short joins: the SIGTERM handler must get to run
            engine.console.log(
                f"Scheduler or DataParallelController {process.pid} terminated with {process.exitcode}",
                logging.ERROR,
            )
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    return 0


# -- --gated-launch-port (distributed/gated_launch.py) ------------------------------------------------------


class _GateHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: GateServer

    def do_GET(self) -> None:
        self._answer(200 if self.path.split("?")[0] == "/health" else 404)

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/gate/activate":
            self._answer(404)
            return
        self.server.activated.set()
        self._answer(200)

    def _answer(self, status: int) -> None:
        body = b"OK" if status == 200 else b'{"detail":"Not Found"}'
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        # PlainTextResponse("OK"), or FastAPI's JSON 404
        self.send_header("content-type", "text/plain; charset=utf-8" if status == 200 else "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # uvicorn at log_level="warning"


class GateServer(http.server.ThreadingHTTPServer):
    """The first rank's gate control server: ``GET /health`` -> OK, ``POST /gate/activate`` opens the gate."""

    daemon_threads = True

    def __init__(self, host: str, port: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.activated = threading.Event()
        super().__init__((host, port), _GateHandler)


def wait_for_gated_launch(console: Console, args: Mapping[str, Any], tp_rank: int,
                          all_reduce: Callable[[str], None]) -> None:
    """``maybe_wait_for_gated_launch`` (distributed/gated_launch.py:23-66 in 0.5.23): after ``Init parallel
    ends`` and before the memory baseline (bootstrap.py:200-202), world rank 0 starts the control server on
    ``--host`` and ``--gated-launch-port``, then every rank logs ``Gated launch waiting for activation.
    rank=N`` and waits until ``POST /gate/activate`` reached it: SGLang broadcasts rank 0's flag over the CPU
    group every second, so no rank leaves before rank 0 saw the POST (here: one collective after it).  Every
    rank logs ``Gated launch still waiting for activation. rank=N elapsed=S s`` every 10 s meanwhile.  A port
    that cannot be bound is uvicorn's error in its server thread, and the gate then never opens."""
    port = args.get("gated_launch_port")
    if port is None:
        return
    server: GateServer | None = None
    if tp_rank == 0:
        host = args.get("host") or "127.0.0.1"
        try:
            server = GateServer(host, int(port))
        except OSError as exc:  # uvicorn.Server.run in its thread: logs, ends the thread, the ranks wait on
            console.log(f"Gated launch control server started on {host}:{port}")  # logged as the thread starts
            console.uvicorn(f"[Errno {exc.errno}] error while attempting to bind on address ({host!r}, {port}): "
                            f"{(exc.strerror or str(exc)).lower()}", logging.ERROR)
        else:
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            console.log(f"Gated launch control server started on {host}:{port}")
    console.log(f"Gated launch waiting for activation. rank={tp_rank}")
    tic = time.monotonic()
    released = threading.Event()

    def still_waiting() -> None:
        while not released.wait(GATE_LOG_INTERVAL_S):
            console.log(f"Gated launch still waiting for activation. rank={tp_rank} "
                        f"elapsed={time.monotonic() - tic:.0f} s")

    threading.Thread(target=still_waiting, name="gated-launch-log", daemon=True).start()
    try:
        if tp_rank == 0:
            while server is None or not server.activated.wait(GATE_POLL_S):
                if server is None:
                    time.sleep(GATE_POLL_S)  # no server: nothing can open the gate
        all_reduce("gated_launch")
    finally:
        released.set()
    console.log(f"Gated launch activated. elapsed={time.monotonic() - tic:.2f} s")
