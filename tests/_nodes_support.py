"""Multi-node tests on one machine: each "node" is its own loopback address (127.0.0.1, .2, .3), its own
working directory and its own processes.

* `EmulatorNode` runs ``python -m sessions.emulator ... --nnodes N --node-rank R`` as a real process in its
  own session and directory, stderr to a file, and kills what it started by pid.
* `free_port_on` finds a port free on every address given (node 0's and the workers' HTTP ports are the
  same number on different addresses, as on real hosts).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from _extract_support import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent
NODE_HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
WAIT_S = 90.0  # a hang guard for slow machines, not a speed assertion
# Anywhere in a line: a tqdm bar (no newline) may run into the next log line of another rank.
RANK_LINE_RE = re.compile(r"\[\d{4}-\d\d-\d\d [\d:.]+ TP(?P<rank>\d+)\] (?P<msg>[^\r\n]*)")


def free_port_on(hosts: Sequence[str] = NODE_HOSTS[:2]) -> int:
    """A port that was free on every one of ``hosts`` a moment ago."""
    while True:
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        ok = True
        for host in hosts[1:]:
            with socket.socket() as other:
                try:
                    other.bind((host, port))
                except OSError:
                    ok = False
        if ok:
            return port


class EmulatorNode:
    """One node of an emulated multi-node server."""

    def __init__(self, directory: Path, model_dir: Path, node_rank: int, nnodes: int, tp: int,
                 dist_init_addr: str, port: int, extra: Sequence[str] = (), env: dict[str, str] | None = None,
                 time_scale: str = "0.003") -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.node_rank = node_rank
        self.host = NODE_HOSTS[node_rank]
        self.port = port
        self.argv = [
            sys.executable, "-m", "sessions.emulator", "--model-path", str(model_dir), "--tp-size", str(tp),
            "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--dist-init-addr", dist_init_addr,
            "--host", self.host, "--port", str(port), "--time-scale", time_scale, *extra,
        ]
        self.env = dict(os.environ) | {"PYTHONPATH": str(REPO_ROOT)} | (env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self._seen: set[tuple[int, float]] = set()

    def start(self) -> EmulatorNode:
        self.stderr_path = self.directory / "stderr.log"
        with open(self.stderr_path, "wb") as err, open(self.directory / "stdout.log", "wb") as out:
            self.proc = subprocess.Popen(self.argv, cwd=self.directory, stdout=out, stderr=err, env=self.env,
                                         start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def rank_lines(self) -> list[tuple[int, str]]:
        return [(int(m["rank"]), m["msg"]) for m in RANK_LINE_RE.finditer(self.log())]

    def wait_log(self, text: str, count: int = 1, limit_s: float = WAIT_S) -> str:
        def seen() -> str | None:
            log = self.log()
            return log if log.count(text) >= count else None
        return wait_for(seen, f"node {self.node_rank} logs {text!r} x{count}:\n{self.log()[-3000:]}", limit_s)

    def gpu_board(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.directory / "emulated_gpus.json").read_text())
        except (OSError, ValueError):
            return None

    def remember_tree(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            for proc in [root, *root.children(recursive=True)]:
                self._seen.add((proc.pid, proc.create_time()))

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the node's processes by pid (the ones seen, if they are still the same processes)."""
        self.remember_tree()
        for pid, created in self._seen:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.create_time() == created:
                    proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)


def two_node_tp4(tmp_path: Path, model_dir: Path, extra: Sequence[str] = (),
                 envs: Sequence[dict[str, str] | None] = (None, None), nnodes: int = 2,
                 time_scale: str = "0.003") -> list[EmulatorNode]:
    """The nodes (not started) of a TP4 server over ``nnodes`` nodes on 127.0.0.1, 127.0.0.2, ..."""
    hosts = NODE_HOSTS[:nnodes]
    rendezvous = free_port_on(hosts[:1])
    port = free_port_on(hosts)
    return [EmulatorNode(tmp_path / f"node{r}", model_dir, r, nnodes, 4, f"127.0.0.1:{rendezvous}", port, extra,
                         envs[r] if r < len(envs) else None, time_scale) for r in range(nnodes)]


# -- nodes as separate homes on this machine (the SSH layer's stand-in) ----------------------------------


def LocalLink(home_dir: Path, env: dict[str, str] | None = None) -> Any:
    """`sessions.remote.link.LocalLink` to a "host" that is this machine with its own ``EAGLE3_TUI_HOME`` (and
    any env the host gets, like a hosts.toml ``env``): runs our CLI as real subprocesses."""
    from sessions.remote.link import LocalLink as Link

    return Link(env={"EAGLE3_TUI_HOME": str(home_dir), "PYTHONPATH": str(REPO_ROOT), "EAGLE3_TUI_DEMO": ""}
                | (env or {}))


def local_nodes(tmp_path: Path, count: int = 2, envs: Sequence[dict[str, str] | None] = ()) -> dict[str, Any]:
    """Hosts ``node0``, ``node1``, ... at 127.0.0.1, 127.0.0.2, ..., each with its own home; returns the
    resolver's table (name -> NodeEndpoint)."""
    from sessions.server.nodes import NodeEndpoint

    table = {}
    for rank in range(count):
        env = envs[rank] if rank < len(envs) else None
        link = LocalLink(tmp_path / f"home-node{rank}", env)
        table[f"node{rank}"] = NodeEndpoint(f"node{rank}", NODE_HOSTS[rank], link)
    return table


def write_nodes_profile(path: Path, model_dir: Path, port: int, *, fault: str = "none", time_scale: float = 0.003,
                        stall_after_s: float = 300.0, **server: Any) -> Path:
    import tomli_w

    doc = {
        "server": {"launcher": "emulator", "python": sys.executable, "model_path": str(model_dir), "tp_size": 4,
                   "host": "127.0.0.1", "port": port, "nnodes": 2, "hosts": ["node0", "node1"]} | server,
        "watch": {"stall_after_s": stall_after_s},
        "emulator": {"time_scale": time_scale, "fault": fault},
    }
    path.write_text(tomli_w.dumps(doc))
    return path


def kill_node_sessions(table: dict[str, Any], record: Any) -> None:
    """Teardown: SIGKILL every process of every node's session, by the pids its status names."""
    for entry in record.nodes:
        if entry.session_id is None:
            continue
        node = table[entry.host]
        result = node.call(["status", entry.session_id, "--json", "--no-http"])
        try:
            data = json.loads(result.stdout)
        except ValueError:
            continue
        status = data[0] if isinstance(data, list) else data
        pids = [status.get("pid")] + [r.get("pid") for r in status.get("ranks") or []]
        for pid in pids:
            if isinstance(pid, int):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
