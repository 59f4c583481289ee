"""One server across two hosts reached over REAL OpenSSH (issue 26 items 1+2 joined): hosts h2 (127.0.0.2) and
h3 (127.0.0.3) are sshd servers this test starts (tests/_ssh_support.py), each with its own EAGLE3_TUI_HOME
given by hosts.toml's ``env``; the profile lives only in this test's home and reaches each node on stdin.
Everything started is killed by pid at the end (the hosts' sessions, then the sshd servers)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import tomli_w

from tests._extract_support import wait_for
from tests._nodes_support import free_port_on
from tests.test_hosts import cli

WAIT_S = 180.0  # hang guard only: every node answers over ssh


def two_node_profile(path: Path, model_dir: Path, port: int, fault: str = "none") -> None:
    path.write_text(tomli_w.dumps({
        "server": {"launcher": "emulator", "python": sys.executable, "model_path": str(model_dir), "tp_size": 4,
                   "host": "127.0.0.2", "port": port, "nnodes": 2, "hosts": ["h2", "h3"]},
        "watch": {"stall_after_s": 300},
        "emulator": {"time_scale": 0.003, "fault": fault},
    }))


def test_two_node_tp4_over_ssh_launches_arrives_per_node_and_stops_node0_first(
        ssh_hosts, home, cli_env, small_model_dir: Path) -> None:
    from tests.conftest import LaunchedSessions

    port = free_port_on(("127.0.0.2", "127.0.0.3"))
    two_node_profile(home.profiles_dir / "two-node.toml", small_model_dir, port)
    remotes = {name: LaunchedSessions(ssh_hosts.homes[name]) for name in ("h2", "h3")}
    try:
        launched = cli(["launch", "two-node"], cli_env)
        assert launched.returncode == 0, launched.stderr
        node_id = launched.stdout.split()[0]
        record = json.loads((home.state_root / "nodes" / f"{node_id}.json").read_text())
        sessions = {n["host"]: n["session_id"] for n in record["nodes"]}
        for name, session_id in sessions.items():
            remotes[name].track(session_id)
        # Each node's session lives in its own host's home; the rendezvous is h2's address from ssh_config's
        # HostName (the alias "h2" names no machine the other node could reach).
        assert [n["host"] for n in record["nodes"]] == ["h2", "h3"]
        assert [n["address"] for n in record["nodes"]] == ["127.0.0.2", "127.0.0.3"]
        assert record["dist_init_addr"].startswith("127.0.0.2:")
        for name, session_id in sessions.items():
            assert (ssh_hosts.homes[name].sessions_dir / session_id).is_dir()
            assert (ssh_hosts.homes[name].state_root / "received-profiles" / "two-node.toml").is_file()
        assert not (home.sessions_dir).exists() or not any(home.sessions_dir.iterdir())

        def status() -> dict:
            shown = cli(["nodes", "status", node_id, "--json"], cli_env)
            assert shown.returncode == 0, shown.stderr
            return json.loads(shown.stdout)

        ready = wait_for(lambda: (s := status())["state"] == "ready" and s, "ready across h2 and h3", WAIT_S)
        node0, node1 = ready["nodes"]
        assert (node0["host"], node0["tp_ranks"], node0["init_begun"], node0["init_ended"]) == ("h2", [0, 1], [0, 1], [0, 1])
        assert (node1["host"], node1["tp_ranks"], node1["init_begun"], node1["init_ended"]) == ("h3", [2, 3], [2, 3], [2, 3])
        assert node1["alive"] and node1["state"] == "serving"
        text = cli(["nodes", "status", node_id], cli_env).stdout
        assert "node 1 h3" in text and "TP2 begin+ends" in text and "TP3 begin+ends" in text, text

        boards = {name: ssh_hosts.homes[name].state_root / "sessions" / sid / "emulated_gpus.json"
                  for name, sid in sessions.items()}
        for name, board in boards.items():
            held = wait_for(lambda b=board: b.is_file() and [g["index"] for g in json.loads(b.read_text())["gpus"]
                                                               if g["processes"]], f"{name}'s GPUs held", WAIT_S)
            assert held == [0, 1]

        stopped = cli(["nodes", "stop", node_id, "--json"], cli_env)
        assert stopped.returncode == 0, stopped.stderr
        reports = json.loads(stopped.stdout)
        assert [(r["node_rank"], r["host"]) for r in reports] == [(0, "h2"), (1, "h3")]  # node 0 first
        assert all(r["stopped"] and not r["gpu_pids_left"] for r in reports), reports
        assert not any(b.exists() for b in boards.values())  # GPUs freed on both hosts
        # h3's ranks ended on node 0's ShutdownReq (exit 0), not by their own node's SIGKILL.
        logs = cli(["logs", sessions["h3"], "--host", "h3", "--grep", "terminated with"], cli_env)
        assert logs.stdout.count("terminated with 0") == 2, logs.stdout + logs.stderr
        assert status()["state"] == "stopped"
    finally:
        for remote in remotes.values():
            remote.cleanup()
