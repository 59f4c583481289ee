"""Every rank of an emulated server across nodes sees the requests in one order (the 2-node extraction hang).

SGLang's TP0 broadcasts each request to every rank of the world group, and each forward is a collective of all
ranks: ranks that saw two requests in different orders wait in different collectives for ever.  In the emulator
node 0's main process sends each request to its own ranks' pipes and mirrors it to the other nodes over the
rendezvous link.  Here two real links (node 0 listening on loopback, node 1 connected, as `sessions.emulator.nodes`
sets them up) and real pipes stand where the rank processes' ends would be; request A's mirror is held until
request B could have been sent and mirrored from another thread, as two HTTP threads of the emulator do under
load.  The old code mirrored after the broadcast lock: node 1's ranks got B before A while node 0's got A then B.
"""
from __future__ import annotations

import multiprocessing
import threading
import types
from multiprocessing.connection import Connection

import pytest

from sessions.emulator.console import Console
from sessions.emulator.nodes import NodeCollectives, NodeLayout, NodeLink, NodeSchedulerClient, wire_link
from tests._extract_support import wait_for
from tests._nodes_support import free_port_on


def node(layout: NodeLayout, port: int) -> tuple[NodeLink, NodeSchedulerClient, dict[int, Connection]]:
    """One node's link and main-process client, with the far ends of its ranks' pipes for the test."""
    console = Console()
    link = NodeLink(layout, ("127.0.0.1", port), console, frozenset())
    ours, theirs = {}, {}
    for rank in layout.local_ranks:
        ours[rank], theirs[rank] = multiprocessing.Pipe(duplex=True)
    client = NodeSchedulerClient(ours, NodeCollectives(layout.local_ranks, frozenset(), link), lambda _m: None)
    wire_link(types.SimpleNamespace(console=console), client, link)
    return link, client, theirs


def received(conn: Connection, count: int) -> list[int]:
    """The msg ids of the first ``count`` generate requests a rank's pipe delivers."""
    ids: list[int] = []
    while len(ids) < count:
        assert conn.poll(30), f"the rank got {ids} of {count} requests"
        message = conn.recv()
        if message[0] == "generate":
            ids.append(message[1])
    return ids


@pytest.fixture
def two_nodes():
    port = free_port_on(("127.0.0.1",))
    link0, client0, ranks0 = node(NodeLayout(2, 0, 4), port)
    link0.listen()
    link1, _client1, ranks1 = node(NodeLayout(2, 1, 4), port)
    link1.start_client()
    try:
        wait_for(lambda: link0.joined() == [0, 1], "node 1 connected to node 0's rendezvous", 30)
        yield client0, link0, ranks0, ranks1
    finally:
        link1.close()
        link0.close()


def test_two_requests_from_two_threads_reach_every_node_in_one_order(two_nodes) -> None:
    client0, link0, ranks0, ranks1 = two_nodes
    mirror = link0.mirror
    a_mirroring, b_mirrored = threading.Event(), threading.Event()

    def held_mirror(message: tuple) -> None:
        if message[1] == 1:  # request A: held while B may overtake it (it must not be able to)
            a_mirroring.set()
            b_mirrored.wait(2.0)  # only the old code lets B get here first; the fixed code holds B back
        mirror(message)
        if message[1] == 2:
            b_mirrored.set()

    link0.mirror = held_mirror  # type: ignore[method-assign]
    send_a = threading.Thread(target=client0.broadcast, args=("generate", 1, {"rid": "a"}, False))
    send_b = threading.Thread(target=client0.broadcast, args=("generate", 2, {"rid": "b"}, False))
    send_a.start()
    assert a_mirroring.wait(30)
    send_b.start()
    send_a.join(30)
    send_b.join(30)
    orders = {rank: received(conn, 2) for rank, conn in (ranks0 | ranks1).items()}
    assert orders == {0: [1, 2], 1: [1, 2], 2: [1, 2], 3: [1, 2]}, orders
