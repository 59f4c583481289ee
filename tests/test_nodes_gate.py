"""SGLang's gated launch across nodes (``[server] gated_launch = true``; sessions/server/nodes_gate.py): a 2-node
TP4 emulator server, each node its own home at its own loopback address (tests/test_nodes_sessions.py's set-up),
real processes and a real TCP rendezvous.  The emulator does what SGLang 0.5.23's gated_launch.py does: after
``Init parallel ends`` every rank waits, world rank 0 serves ``/health`` and ``/gate/activate`` on node 0's
``--host``; the launch opens the gate only once every rank of every node is there.  A node that never joins keeps
the gate closed (its peers never get through the rendezvous), and the answer names it.
"""
from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _extract_support import wait_for
from _nodes_support import free_port_on, kill_node_sessions, local_nodes, write_nodes_profile

from sessions.profiles import load_profile, validate_profile
from sessions.server.nodes import launch_nodes, load_record
from sessions.server.nodes_gate import open_gate, ranks_at_gate
from sessions.server.nodes_status import multi_node_status

pytestmark = pytest.mark.slow
WAIT_S = 240.0  # hang guard only


@pytest.fixture
def gated(tmp_path: Path, home, small_model_dir: Path):
    """``start(fault=..., **server)`` -> (profile, table); every node's session is killed at teardown."""
    started: list[tuple[dict, str]] = []

    def start(fault: str = "none", **server):
        port = free_port_on(("127.0.0.1", "127.0.0.2"))
        path = write_nodes_profile(tmp_path / "gated.toml", small_model_dir, port, fault=fault, gated_launch=True,
                                   **server)
        table = local_nodes(tmp_path, 2)
        started.append((table, ""))
        return load_profile(path), table, started

    yield start
    for table, node_id in started:
        if node_id:
            kill_node_sessions(table, load_record(home, node_id))


def log_of(table, record, rank: int) -> str:
    return table[f"node{rank}"].call(["logs", record.nodes[rank].session_id]).stdout


def http_status(url: str, method: str = "GET") -> int | None:
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def test_gated_launch_holds_every_rank_until_both_nodes_are_at_the_gate_then_activates(gated, home) -> None:
    profile, table, started = gated()
    record = launch_nodes(home, profile, table.__getitem__)
    started[-1] = (table, record.node_id)
    assert record.gate is not None and record.gate["state"] == "closed" and record.gate["host"] == "127.0.0.1"
    port = record.gate["port"]
    # Every node runs the flag (SGLang gates every rank); only world rank 0 (TP0, node 0) serves the gate.
    wait_for(lambda: ranks_at_gate(record, table.__getitem__) == {0: (0, 1), 1: (2, 3)}, "every rank at the gate",
             WAIT_S)
    assert http_status(f"http://127.0.0.1:{port}/health") == 200
    for rank in (0, 1):  # held: no rank took its memory baseline (before any sizable GPU allocation)
        assert "Memory baseline taken" not in log_of(table, record, rank)
    control = re.findall(r"TP(\d+)\] Gated launch control server started on (\S+)", log_of(table, record, 0))
    assert control == [("0", f"127.0.0.1:{port}")]
    assert "Gated launch control server" not in log_of(table, record, 1)
    result = open_gate(record, table.__getitem__, home, WAIT_S)
    assert result.opened, result.message
    assert "all 4 ranks of 2 nodes were at the gate" in result.message
    assert load_record(home, record.node_id).gate["state"] == "open"
    wait_for(lambda: multi_node_status(record, table.__getitem__).state == "ready", "ready across nodes", WAIT_S)
    for rank, tps in ((0, (0, 1)), (1, (2, 3))):
        log = log_of(table, record, rank)
        for tp in tps:  # each rank: through the rendezvous, waited, activated, then its memory baseline
            lines = [m for m in re.findall(rf"TP{tp}\] ([^\r\n]*)", log)]
            order = [next(i for i, line in enumerate(lines) if line.startswith(text)) for text in (
                "Init parallel ends", f"Gated launch waiting for activation. rank={tp}", "Gated launch activated. elapsed=",
                "Memory baseline taken")]
            assert order == sorted(order), (rank, tp, lines[:12])


def test_a_node_that_never_joins_leaves_the_gate_closed_and_is_named(gated, home, capsys) -> None:
    from app.cli_nodes import EXIT_GATE_CLOSED, launch_across_nodes

    profile, table, started = gated(fault="node-never-joins", stall_after_s=30)
    assert not [p for p in validate_profile(profile) if p.is_error]
    code = launch_across_nodes(profile, home, table.__getitem__)  # the CLI's launch: waits stall_after_s
    out = capsys.readouterr()
    node_id = out.out.split()[0]
    started[-1] = (table, node_id)
    record = load_record(home, node_id)
    assert code == EXIT_GATE_CLOSED, out.err
    assert "gate closed: not at the gate: node 0 (node0): TP0–1; node 1 (node1): TP2–3" in out.err
    assert "node 1 (node1) cannot reach the rendezvous" in out.err, out.err
    assert f"nodes gate {node_id}" in out.err
    assert record.gate is not None and record.gate["state"] == "closed"
    # SGLang's gate comes after the rendezvous: no rank got there, so the control server never started.
    for rank in (0, 1):
        assert "Gated launch" not in log_of(table, record, rank)
        assert "Init parallel begin." in log_of(table, record, rank)
    assert http_status(f"http://127.0.0.1:{record.gate['port']}/health") is None
