"""One server across nodes as one session: each "node" is its own home on this machine at its own loopback
address (127.0.0.1, 127.0.0.2), reached through a local stand-in for the SSH link that runs our real CLI;
the servers are real emulator process trees with a real TCP rendezvous.  Everything started is killed by
pid at the end."""
from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest
from _extract_support import wait_for
from _nodes_support import free_port_on, kill_node_sessions, local_nodes, write_nodes_profile

from sessions.profiles import ProfileError, load_profile, validate_profile
from sessions.server.nodes import NodesError, launch_nodes, load_record
from sessions.server.nodes_report import diagnose_nodes, status_lines
from sessions.server.nodes_status import multi_node_status, stop_nodes

WAIT_S = 120.0  # hang guard only


@pytest.fixture
def cluster(tmp_path: Path, home, small_model_dir: Path):
    """``start(fault=..., envs=..., **server)`` -> (record, table, profile path); all killed at teardown."""
    launched: list[tuple[dict, object]] = []

    def start(fault: str = "none", envs=(), time_scale: float = 0.003, **server):
        port = free_port_on(("127.0.0.1", "127.0.0.2"))
        path = write_nodes_profile(tmp_path / "two-node.toml", small_model_dir, port, fault=fault,
                                   time_scale=time_scale, **server)
        table = local_nodes(tmp_path, 2, envs)
        record = launch_nodes(home, load_profile(path), table.__getitem__)
        launched.append((table, record))
        return record, table

    yield start
    for table, record in launched:
        kill_node_sessions(table, record)


def status_of(record, table):
    return multi_node_status(record, table.__getitem__)


def test_two_node_tp4_launch_shows_per_node_arrival_ready_and_stops_node0_first(cluster, home, tmp_path: Path) -> None:
    record, table = cluster()
    assert [n.host for n in record.nodes] == ["node0", "node1"] and all(n.session_id for n in record.nodes)
    assert record.dist_init_addr.startswith("127.0.0.1:")  # default: node 0's address and a free port
    assert load_record(home, record.node_id[:12]).nodes[1].session_id == record.nodes[1].session_id
    status = wait_for(lambda: (s := status_of(record, table)).state == "ready" and s, "ready across nodes", WAIT_S)
    node0, node1 = status.nodes
    assert node0.ranks == (0, 1) and node1.ranks == (2, 3)  # node 1 holds TP2-3 of the TP4
    assert node0.begun == node0.ended == (0, 1)
    assert node1.begun == node1.ended == (2, 3)
    assert node1.alive and node1.state == "serving"  # a worker is alive, never "ready" (its /health is a dummy)
    text = "\n".join(status_lines(status))
    assert "node 1 node1" in text and "TP2 begin+ends" in text and "TP3 begin+ends" in text
    # The emulator's GPU accounting on each node (emulated_gpus.json in its session folder): held now.
    boards = [tmp_path / f"home-node{n.rank}" / "state" / "sessions" / str(n.session_id) / "emulated_gpus.json"
              for n in record.nodes]
    for board in boards:
        gpus = wait_for(lambda b=board: b.is_file() and [g for g in json.loads(b.read_text())["gpus"] if g["processes"]],
                        f"{board} shows the node's ranks", WAIT_S)
        assert [g["index"] for g in gpus] == [0, 1]  # each node's two ranks on its own GPUs 0 and 1
    reports = stop_nodes(record, table.__getitem__, home, grace_s=30)
    assert not any(board.exists() for board in boards)  # GPUs freed on both nodes
    assert [r["node_rank"] for r in reports] == [0, 1]  # node 0 first
    assert all(r["stopped"] and not r["gpu_pids_left"] for r in reports)
    # Node 1's ranks ended on node 0's ShutdownReq (exit 0), not by their own node's SIGKILL.
    logs = table["node1"].call(["logs", record.nodes[1].session_id, "--grep", "terminated with"]).stdout
    assert logs.count("terminated with 0") == 2
    assert status_of(load_record(home, record.node_id), table).state == "stopped"


def test_a_node_that_never_joins_is_named_by_status_hints_and_diagnosis(cluster) -> None:
    record, table = cluster(fault="node-never-joins", stall_after_s=2)
    status = wait_for(lambda: (s := status_of(record, table)).nodes[1].rendezvous_warning and
                      len(s.nodes[0].begun) == 2 and len(s.nodes[1].begun) == 2 and s, "both nodes at the rendezvous",
                      WAIT_S)
    assert not any(v.ended for v in status.nodes)
    # Silent past the stall limit: the stall is the whole server's, and its verdict names the node.
    status = wait_for(lambda: (s := status_of(record, table)).state == "stalled" and s, "stalled", WAIT_S)
    assert "node 1 (node1) cannot reach the rendezvous" in status.verdict
    assert any(h.startswith("rendezvous: node 1 (node1) cannot reach node 0's --dist-init-addr") for h in status.hints)
    report = diagnose_nodes(record, table.__getitem__)
    assert [n["node_rank"] for n in report["nodes"]] == [0, 1]
    assert all("report" in n for n in report["nodes"]), report["nodes"]
    assert "node 1 (node1) cannot reach" in report["text"]
    assert "py-spy: " in report["text"] and "(TP2, TP3)" in report["text"]  # node 1's ranks, dumped there
    node1_hints = [h.get("id") for h in report["nodes"][1]["report"].get("hints", [])]
    assert "rendezvous-unreachable" in node1_hints  # the catalogue's cause, from node 1's own log


def test_a_node_killed_mid_load_is_shown_dead_at_the_next_poll(cluster) -> None:
    record, table = cluster(time_scale=0.05)
    wait_for(lambda: table["node1"].call(["logs", record.nodes[1].session_id, "--grep", "Load weight begin"]).stdout,
             "node 1 loading weights", WAIT_S)
    data = json.loads(table["node1"].call(["status", record.nodes[1].session_id, "--json", "--no-http"]).stdout)
    pid = (data[0] if isinstance(data, list) else data)["pid"]
    os.kill(pid, signal.SIGKILL)  # the node's server goes down; its ranks follow by PDEATHSIG
    status = wait_for(lambda: (s := status_of(record, table)).nodes[1].state not in ("starting", "stalled") and s,
                      "node 1 seen dead", WAIT_S)
    assert status.state == "crashed"
    assert status.verdict.startswith("dead node: node 1 (node1, TP2–3)")
    assert any("node 1 (node1) is dead" in h for h in status.hints)
    # Node 0's ranks fail their next collective with NCCL's remote error, as SGLang prints it.
    err = wait_for(lambda: status_of(record, table).nodes[0].error, "node 0's error", WAIT_S)
    assert "ncclRemoteError" in err or "remote process exited" in err


def test_gloo_socket_ifname_naming_a_missing_interface_is_hinted(cluster) -> None:
    record, table = cluster(envs=(None, {"GLOO_SOCKET_IFNAME": "eth-missing9"}))
    status = wait_for(lambda: (s := status_of(record, table)).nodes[1].error and s, "node 1's error", WAIT_S)
    assert "Unable to find address for: eth-missing9" in status.nodes[1].error
    assert any("GLOO_SOCKET_IFNAME names an interface this host does not have" in h for h in status.hints)


def test_preflight_refuses_before_anything_starts(tmp_path: Path, home, small_model_dir: Path) -> None:
    port = free_port_on(("127.0.0.1", "127.0.0.2"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        rendezvous = taken.getsockname()[1]
        path = write_nodes_profile(tmp_path / "p.toml", small_model_dir, port,
                                   dist_init_addr=f"127.0.0.1:{rendezvous}")
        table = local_nodes(tmp_path, 2)
        with pytest.raises(NodesError) as caught:
            launch_nodes(home, load_profile(path), table.__getitem__)
    message = str(caught.value)
    assert "refused before anything started" in message
    assert f"node 0 (node0): rendezvous 127.0.0.1:{rendezvous}: taken" in message
    assert "node 1 (node1): rendezvous" in message and "something already listens" in message
    for rank in (0, 1):  # no node launched anything
        sessions = tmp_path / f"home-node{rank}" / "state" / "sessions"
        assert not sessions.exists() or not any(sessions.iterdir())


@pytest.mark.parametrize(("server", "field", "text"), [
    ({"tp_size": 3}, "server.nnodes", "must be divisible by the 2 nodes"),
    ({"extra_args": ["--dp-size", "2"]}, "server.extra_args", "SGLang refuses multi-node data-parallel replicas"),
    ({"hosts": ["node0"]}, "server.hosts", "must name 2 hosts (node 0 first)"),
    ({"hosts": ["node0", "node0"]}, "server.hosts", "names a host twice"),
    ({"extra_args": ["--node-rank", "1"]}, "server.extra_args", "--node-rank is set per node"),
    ({"dist_init_addr": "nohost"}, "server.dist_init_addr", "must be HOST:PORT"),
    ({"extra_args": ["--pp-size", "2"], "capture": True}, "capture.enabled", "capture needs pp_size = 1"),
])
def test_multi_node_profile_validation(tmp_path: Path, small_model_dir: Path, server: dict, field: str,
                                       text: str) -> None:
    capture = server.pop("capture", False)
    path = write_nodes_profile(tmp_path / "p.toml", small_model_dir, 30000, **server)
    if capture:
        path.write_text(path.read_text() + "\n[capture]\nenabled = true\n")
    try:  # field problems stop the load itself; the rest are validation's
        problems = [p for p in validate_profile(load_profile(path), check_port=False) if p.is_error]
    except ProfileError as exc:
        problems = exc.problems
    assert any(p.field == field and text in p.message for p in problems), problems


def test_a_node_needs_and_checks_only_its_share_of_the_gpus(tmp_path: Path, small_model_dir: Path) -> None:
    from sessions.gpus import launch_gpu_ids
    from sessions.server.nodes import node_profile

    path = write_nodes_profile(tmp_path / "p.toml", small_model_dir, 30000, tp_size=16, launcher="sglang")
    profile = load_profile(path)
    for rank in (0, 1):
        node = node_profile(profile, rank, "10.0.0.1:25000", f"10.0.0.{rank + 1}")
        assert launch_gpu_ids(node) == list(range(8))  # TP8-15 run on GPUs 0-7 of node 1 (engine.py:931-940)
        assert gpu_problems(node, 8) == []
        assert ["TP 16 over 2 nodes needs 8 GPUs but only 4 are visible (NVML sees 4)"] == gpu_problems(node, 4)


def gpu_problems(profile, gpus: int) -> list[str]:
    return [p.message for p in validate_profile(profile, check_port=False, nvml_gpu_count=gpus)
            if p.field == "server.tp_size" and "GPU" in p.message]


def test_launch_of_a_node_rank_outside_the_profile_is_refused(tmp_path: Path, small_model_dir: Path) -> None:
    from _nodes_support import LocalLink

    path = write_nodes_profile(tmp_path / "p.toml", small_model_dir, 30000)
    result = LocalLink(tmp_path / "home").run(["launch", str(path), "--node-rank", "3", "--dist-init-addr",
                                               "127.0.0.1:29500"], 120)
    assert result.returncode == 2
    assert "--node-rank 3: profile" in result.stderr and "server.nnodes = 2 (node ranks 0..1)" in result.stderr
