"""The emulator across nodes, as SGLang 0.5.23 behaves (docs/sglang-facts.md §10): a real TCP rendezvous on the
dist-init address between real processes on 127.0.0.1 and 127.0.0.2, global rank numbers per node, the
worker's dummy health, a worker's SIGTERM that waits for node 0, and the node faults.  Every process is
killed by pid at the end."""
from __future__ import annotations

import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _extract_support import wait_for
from _hang_support import wait_until_parked
from _nodes_support import WAIT_S, EmulatorNode, two_node_tp4

from sessions.emulator.nodes import missing_interface


@pytest.fixture
def nodes_to_kill():
    started: list[EmulatorNode] = []
    yield started
    for node in started:
        node.kill()


def http_status(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def started(nodes: list[EmulatorNode], into: list[EmulatorNode]) -> list[EmulatorNode]:
    for node in nodes:
        into.append(node.start())
    return nodes


def test_two_node_tp4_places_global_ranks_serves_from_node0_and_stops_on_node0s_shutdown(
        tmp_path: Path, small_model_dir: Path, nodes_to_kill) -> None:
    node0, node1 = started(two_node_tp4(tmp_path, small_model_dir), nodes_to_kill)
    node0.wait_log("The server is fired up and ready to roll!")
    node1.wait_log("Capture target decode CUDA graph end", count=2)
    # Global rank numbers: node 0 holds TP0-1, node 1 holds TP2-3, each logging the whole start.
    assert {rank for rank, _ in node0.rank_lines()} == {0, 1}
    assert {rank for rank, _ in node1.rank_lines()} == {2, 3}
    for node, ranks in ((node0, (0, 1)), (node1, (2, 3))):
        for rank in ranks:
            messages = [m for r, m in node.rank_lines() if r == rank]
            assert "Init parallel begin." in messages
            assert any(m.startswith("Init parallel ends. elapsed=") for m in messages)
    # Only node 0 serves the API and prints the ready line; node 1's health is SGLang's dummy app.
    assert "fired up" not in node1.log() and "Uvicorn running" not in node1.log()
    assert http_status(f"http://127.0.0.1:{node0.port}/health") == 200
    wait_for(lambda: http_status_or_none(f"http://127.0.0.2:{node1.port}/health") == 200, "node 1 dummy health")
    assert http_status(f"http://127.0.0.2:{node1.port}/health_generate") == 200
    assert http_status(f"http://127.0.0.2:{node1.port}/model_info") == 404
    # A request crosses both nodes (every rank takes part in every forward).
    assert http_status(f"http://127.0.0.1:{node0.port}/health_generate") == 200
    # Node 1's ranks are on its own GPUs 0 and 1 (engine.py:931-940), in its emulated GPU accounting.
    def held_gpus() -> set[int] | None:
        board = node1.gpu_board()  # rewritten about once a second
        held = {gpu["index"] for gpu in board["gpus"] if gpu["processes"]} if board else set()
        return held or None

    assert wait_for(held_gpus, "node 1's ranks in its emulated_gpus.json") == {0, 1}
    node0.remember_tree()
    node1.remember_tree()
    # A worker's SIGTERM only waits for node 0's ShutdownReq.
    node1.signal(signal.SIGTERM)
    node1.wait_log("SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast")
    assert node1.proc is not None and node1.proc.poll() is None
    node0.signal(signal.SIGTERM)
    assert node0.proc is not None
    assert node0.proc.wait(WAIT_S) == 0
    assert node1.proc.wait(WAIT_S) == 0
    assert "terminated with 0" in node1.log()
    # GPUs freed on both nodes: the emulated accounting is gone with the ranks.
    assert node0.gpu_board() is None and node1.gpu_board() is None


def http_status_or_none(url: str) -> int | None:
    try:
        return http_status(url)
    except OSError:
        return None


def test_a_node_that_never_starts_leaves_node0_at_init_parallel_begin(
        tmp_path: Path, small_model_dir: Path, nodes_to_kill) -> None:
    node0, _node1 = two_node_tp4(tmp_path, small_model_dir)
    nodes_to_kill.append(node0.start())
    assert node0.proc is not None
    # Proof of the hang from the stacks: both ranks block in the rendezvous collective of init_torch_distributed.
    dumps = wait_until_parked(node0.proc, {0: "_wait_for_peers", 1: "_wait_for_peers"})
    for dump in dumps.values():
        assert any(frame.name == "init_torch_distributed" for frame in dump.main_thread.frames)
    messages = [m for _r, m in node0.rank_lines()]
    assert messages.count("Init parallel begin.") == 2
    assert not any(m.startswith("Init parallel ends") for m in messages)


def test_node_never_joins_fault_warns_on_the_lost_node_and_hangs_everyone(
        tmp_path: Path, small_model_dir: Path, nodes_to_kill) -> None:
    node0, node1 = started(two_node_tp4(tmp_path, small_model_dir, ["--emulate-fault", "node-never-joins"]),
                           nodes_to_kill)
    node1.wait_log("[c10d] The client socket has failed to connect to [127.0.0.1]:")
    assert "Connection timed out" in node1.log()
    assert node0.proc is not None and node1.proc is not None
    wait_until_parked(node0.proc, {0: "_wait_for_peers", 1: "_wait_for_peers"})
    assert not any(m.startswith("Init parallel ends") for _r, m in node0.rank_lines() + node1.rank_lines())
    assert "c10d" not in node0.log()  # only the node that cannot reach the rendezvous says so


def test_a_node_that_dies_while_loading_fails_the_others_with_ncclremoteerror(
        tmp_path: Path, small_model_dir: Path, nodes_to_kill) -> None:
    node0, node1 = started(two_node_tp4(tmp_path, small_model_dir, ["--emulate-fault", "node-dies-loading"]),
                           nodes_to_kill)
    assert node0.proc is not None and node1.proc is not None
    assert node1.proc.wait(WAIT_S) == -signal.SIGKILL  # the whole node went down mid-weights
    log1 = node1.log()
    assert "Load weight begin." in log1 and "Load weight end." not in log1
    node0.wait_log("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting")
    node0.wait_log("Scheduler hit an exception")
    assert "torch.distributed.DistBackendError: NCCL error in:" in node0.log()
    assert "socketProgress: Connection closed by remote peer 127.0.0.2<" in node0.log()
    node0.proc.wait(WAIT_S)  # SGLang's scheduler-exception path takes node 0's tree down


def test_a_worker_killed_by_pid_mid_load_is_seen_by_node0(tmp_path: Path, small_model_dir: Path,
                                                          nodes_to_kill) -> None:
    node0, node1 = started(two_node_tp4(tmp_path, small_model_dir, time_scale="0.05"), nodes_to_kill)
    node1.wait_log("Load weight begin.")
    node1.kill()
    node0.wait_log("ncclRemoteError")


@pytest.mark.parametrize("variable", ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"])
def test_an_interface_variable_naming_a_missing_interface_fails_that_node_at_init(
        tmp_path: Path, small_model_dir: Path, nodes_to_kill, variable: str) -> None:
    bad = "eth-missing9"
    assert missing_interface({variable: bad}) == (variable, bad)  # really absent on this host
    node0, node1 = started(two_node_tp4(tmp_path, small_model_dir, envs=(None, {variable: bad})), nodes_to_kill)
    node1.wait_log("Scheduler hit an exception")
    expected = ("Unable to find address for: eth-missing9" if variable == "GLOO_SOCKET_IFNAME"
                else "Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=eth-missing9)")
    assert expected in node1.log()
    assert expected not in node0.log()
    node0.wait_log("ncclRemoteError")  # node 0 loses its peer


def test_interface_matching_follows_nccl_and_gloo_rules() -> None:
    present = ["lo", "eth0", "docker0"]
    assert missing_interface({"NCCL_SOCKET_IFNAME": "eth"}, present) is None  # a prefix
    assert missing_interface({"NCCL_SOCKET_IFNAME": "=eth"}, present) == ("NCCL_SOCKET_IFNAME", "=eth")
    assert missing_interface({"NCCL_SOCKET_IFNAME": "^docker0,lo"}, present) is None  # eth0 is left
    assert missing_interface({"NCCL_SOCKET_IFNAME": "^docker,lo,eth"}, present) is not None
    assert missing_interface({"GLOO_SOCKET_IFNAME": "eth"}, present) == ("GLOO_SOCKET_IFNAME", "eth")  # exact
    assert missing_interface({"GLOO_SOCKET_IFNAME": "eth0"}, present) is None


@pytest.mark.parametrize(("flags", "message"), [
    (["--tp-size", "3", "--nnodes", "2"], "tp_size must be divisible by number of nodes"),
    (["--tp-size", "4", "--nnodes", "2", "--dp-size", "2"], "multi-node data-parallel replicas are not supported"),
    (["--tp-size", "4", "--nnodes", "2", "--node-rank", "2"], "--node-rank 2 must be in 0..1"),
    (["--tp-size", "4", "--nnodes", "2", "--dist-init-addr", "nohost"], "--dist-init-addr 'nohost' is not HOST:PORT"),
])
def test_node_flags_are_checked_as_sglang_does(small_model_dir: Path, flags: list[str], message: str) -> None:
    from sessions.emulator.args import parse_args, resolve_server_args
    from sessions.emulator.model_config import load_model_config

    ns, _options = parse_args(["--model-path", str(small_model_dir), *flags])
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_server_args(ns, load_model_config(str(small_model_dir)))


def test_gated_launch_holds_every_node_after_init_parallel_until_activated(
        tmp_path: Path, small_model_dir: Path, nodes_to_kill) -> None:
    from _nodes_support import free_port_on

    gate = free_port_on(("127.0.0.1",))
    node0, node1 = started(two_node_tp4(tmp_path, small_model_dir, ["--gated-launch-port", str(gate)]),
                           nodes_to_kill)
    node0.wait_log(f"Gated launch control server started on 127.0.0.1:{gate}")
    assert node1.proc is not None
    # Node 1's ranks are past the rendezvous and parked in the gate's collective, before their memory baseline.
    wait_until_parked(node1.proc, {2: "_wait_for_peers", 3: "_wait_for_peers"})
    for node in (node0, node1):
        assert node.log().count("Gated launch waiting for activation. rank=") == 2
        assert "Memory baseline taken" not in node.log()
    assert http_status(f"http://127.0.0.1:{gate}/health") == 200
    request = urllib.request.Request(f"http://127.0.0.1:{gate}/gate/activate", data=b"", method="POST")
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as answer:
        assert answer.status == 200
    node0.wait_log("The server is fired up and ready to roll!")
    for node in (node0, node1):
        assert node.log().count("Gated launch activated. elapsed=") == 2
