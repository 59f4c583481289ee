"""One server across nodes (issue 26, item 2): ``[server] nnodes = N``, ``hosts = [...]`` (node 0 first),
``dist_init_addr``.

Each node runs our own headless CLI (``eagle3-tui launch PROFILE --node-rank R --dist-init-addr A``), so a
node's server is an ordinary session of that node's home; this module only coordinates them over a
`HostLink` per node and keeps a record here, ``<state>/nodes/<id>.json``, that names the per-node sessions.

* Before anything starts, every node answers ``eagle3-tui node-check ... --json`` (`node_check_report`): the
  profile loads there and validates (model path, GPUs, port), the SGLang/torch/NCCL versions, and node 0's
  rendezvous port (free on node 0, reachable from the others).  Versions and the node command must agree.
* Launch runs node 0 first (its rendezvous port listens first), then the others.
* Status asks every node for its session's status and its ``Init parallel`` lines: which ranks arrived
  (``begin``) and which got through the rendezvous (``ends``), so a hang names the node and its ranks; node
  0's endpoints give health, the other nodes only their process liveness (their ``/health`` is a dummy).
* Stop takes node 0 first (the workers wait for its ShutdownReq, docs/sglang-facts.md §10), then the
  workers, then checks that no node's GPUs still hold a process of the session.

The links come from a `NodeResolver`: `ssh_resolver` (a `sessions.remote.link.SshLink` per host of hosts.toml)
in the app, `LocalLink`s with their own homes in some tests.  Every node gets the
profile itself on stdin (``node-check -`` / ``launch - --name NAME``, as `sessions.remote.client` sends a
profile to its host): a node is another machine with its own home, where a profile name or a path of
this machine means nothing.
"""
from __future__ import annotations

import json
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessions.home import Home, atomic_write_json, read_json
from sessions.profiles import LaunchProfile
from sessions.remote.client import launch_argv, profile_text_for_host
from sessions.remote.link import HostLink

NODES_DIR = "nodes"
NODE_ID_PREFIX = "n-"
CALL_TIMEOUT_S = 60.0
INIT_LINE_RE = re.compile(r"\[[\d\- :.]+ (?:DP\d+ )?TP(?P<rank>\d+)(?: EP\d+)?\] Init parallel (?P<what>begin|ends)")


@dataclass(frozen=True)
class NodeEndpoint:
    """A host as a node: its hosts.toml name, the address the other nodes reach it at, and the link."""

    name: str
    address: str
    link: HostLink

    def call(self, args: Sequence[str], timeout_s: float = CALL_TIMEOUT_S,
             input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Our CLI's ``args`` there (the link puts that host's eagle3-tui in front); ``input`` is its stdin."""
        return self.link.run(list(args), timeout_s, input=input)


NodeResolver = Callable[[str], NodeEndpoint]


def ssh_resolver(home: Home) -> NodeResolver:
    """The hosts of hosts.toml as nodes, each over its `SshLink` (made once per host and resolver).  A
    node's address (for the default --dist-init-addr and a worker's bind) is the host name ssh itself
    connects to (`SshLink.address`: an ~/.ssh/config alias's ``HostName``), since the other nodes must reach
    it there.  `sessions.remote.hosts.HostsError` for a bad hosts.toml; KeyError for an unknown host."""
    from sessions.remote.hosts import load_hosts
    from sessions.remote.link import SshLink

    hosts = load_hosts(home)
    resolved: dict[str, NodeEndpoint] = {}

    def resolve(name: str) -> NodeEndpoint:
        if name not in resolved:
            if name not in hosts:
                raise KeyError(f"no host {name!r} in hosts.toml (known: {', '.join(sorted(hosts)) or 'none'})")
            link = SshLink(hosts[name], home)
            resolved[name] = NodeEndpoint(name, link.address(), link)
        return resolved[name]

    return resolve


class NodesError(Exception):
    """A multi-node launch, status or stop that cannot go on; the message names the node and the cause."""


def ranks_of_node(tp_size: int, nnodes: int, node_rank: int) -> range:
    """SGLang's ``_calculate_rank_ranges`` for pp = 1: node R holds ``R*tp/N .. (R+1)*tp/N - 1``."""
    per = tp_size // nnodes
    return range(per * node_rank, per * (node_rank + 1))


def node_profile(profile: LaunchProfile, node_rank: int, dist_init_addr: str, node_address: str) -> LaunchProfile:
    """What node ``node_rank`` runs: the profile with SGLang's node flags, one node (nnodes = 1 here, the
    flags carry the rest).  Node 0 binds ``server.host``; the others bind their dummy health app on their own
    address (same port), since their API is not served."""
    s = profile.server
    extra = (*s.extra_args, "--nnodes", str(s.nnodes), "--node-rank", str(node_rank),
             "--dist-init-addr", dist_init_addr)
    changes: dict[str, Any] = {"nnodes": 1, "hosts": (), "dist_init_addr": None, "extra_args": extra}
    if node_rank > 0:
        changes["host"] = node_address
    return profile.with_changes(server=changes)


def default_dist_init_addr(profile: LaunchProfile, node0: NodeEndpoint) -> str:
    """``server.dist_init_addr``, else node 0's address and a port node 0 says is free."""
    if profile.server.dist_init_addr:
        return str(profile.server.dist_init_addr)
    result = node0.call(["node-check", "--free-port", node0.address])
    port = result.stdout.strip()
    if result.returncode != 0 or not port.isdigit():
        raise NodesError(f"node 0 ({node0.name}): cannot pick a free rendezvous port: "
                         f"{(result.stderr or result.stdout).strip()[:300]}")
    return f"{_url_host(node0.address)}:{port}"


def gated_profile(profile: LaunchProfile, node0: NodeEndpoint) -> tuple[LaunchProfile, dict[str, Any]]:
    """``server.gated_launch``: the profile every node gets, with ``--gated-launch-port P`` (a port node 0 says is
    free on its ``--host``, where SGLang's world rank 0 serves the gate: gated_launch.py:31-33,
    bootstrap.py:200-202), and the record's gate entry."""
    host = str(profile.server.host or "127.0.0.1")
    result = node0.call(["node-check", "--free-port", host])
    port = result.stdout.strip()
    if result.returncode != 0 or not port.isdigit():
        raise NodesError(f"node 0 ({node0.name}): cannot pick a free gated-launch port on {host}: "
                         f"{(result.stderr or result.stdout).strip()[:300]}")
    extra = (*profile.server.extra_args, "--gated-launch-port", port)
    sent = profile.with_changes(server={"gated_launch": False, "extra_args": extra})
    return sent, {"host": host, "port": int(port), "state": "closed"}


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# -- node-check (runs on each node) -----------------------------------------------------------------------


def free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def rendezvous_state(node_rank: int, dist_init_addr: str, timeout_s: float = 3.0) -> str:
    """Node 0: "free" when its rendezvous port can be bound, else "taken".  Another node: "reachable" when
    node 0 answers (a refused connection is an answer: the host is there, nothing listens yet), "taken" when
    something already listens there, else "unreachable: <why>"."""
    host, _, port_text = dist_init_addr.rpartition(":")
    host, port = host.strip("[]"), int(port_text)
    if node_rank == 0:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as probe:
            try:
                probe.bind((host, port))
            except OSError as exc:
                return f"taken: {exc.strerror or exc}"
        return "free"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return "taken: something already listens there"
    except ConnectionRefusedError:
        return "reachable"
    except OSError as exc:
        return f"unreachable: {exc.strerror or exc}"


def versions_of(profile: LaunchProfile) -> dict[str, str | None]:
    """SGLang, torch and NCCL as the profile's Python has them (package metadata: nothing is imported)."""
    if profile.server.launcher == "emulator":
        from sessions.emulator.args import SGLANG_VERSION
        from sessions.emulator.nodes import NCCL_VERSION

        return {"sglang": f"{SGLANG_VERSION} (emulator)", "torch": _metadata(profile, "torch"), "nccl": NCCL_VERSION}
    return {"sglang": _metadata(profile, "sglang"), "torch": _metadata(profile, "torch"),
            "nccl": _metadata(profile, "nvidia-nccl-cu12") or _metadata(profile, "nvidia-nccl-cu13")}


def _metadata(profile: LaunchProfile, package: str) -> str | None:
    code = ("import importlib.metadata as m, sys\n"
            "try: print(m.version(sys.argv[1]))\n"
            "except m.PackageNotFoundError: print('')\n")
    try:
        result = subprocess.run([profile.server.python, "-c", code, package], capture_output=True, text=True,
                                timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def node_check_report(profile: LaunchProfile, node_rank: int, dist_init_addr: str, node_address: str) -> dict:
    """What ``node-check --json`` prints: this node's view before a multi-node launch."""
    from sessions.profiles import validate_profile
    from sessions.profiles.command import build_command

    mine = node_profile(profile, node_rank, dist_init_addr, node_address)
    problems = [str(p) for p in validate_profile(mine) if p.is_error]
    rendezvous = rendezvous_state(node_rank, dist_init_addr)
    if rendezvous not in ("free", "reachable"):
        problems.append(f"rendezvous {dist_init_addr}: {rendezvous}")
    command = build_command(mine).argv
    return {"node_rank": node_rank, "problems": problems, "versions": versions_of(profile),
            "command": command[1:], "rendezvous": rendezvous}


def comparable_command(argv: Sequence[str]) -> list[str]:
    """A node's command with what may differ between nodes blanked: ``--node-rank``'s and ``--host``'s
    values (and the interpreter, which may live elsewhere on each host)."""
    out = list(argv)
    for i, token in enumerate(out[:-1]):
        if token in ("--node-rank", "--host"):
            out[i + 1] = "*"
    return out


# -- the record -------------------------------------------------------------------------------------------


@dataclass
class NodeEntry:
    rank: int
    host: str
    address: str
    session_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "address": self.address, "session_id": self.session_id}


@dataclass
class MultiNodeRecord:
    """``<state>/nodes/<id>.json``: one server across nodes, naming each node's own session."""

    node_id: str
    profile: str
    tp_size: int
    dist_init_addr: str
    nodes: list[NodeEntry]
    started_at: float = field(default_factory=time.time)
    stopped_at: float | None = None
    # server.gated_launch: where world rank 0's gate listens on node 0 (its --host, a free port), and whether
    # this launch sent POST /gate/activate yet ("closed" / "open"); None without a gate.
    gate: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.node_id, "profile": self.profile, "tp_size": self.tp_size, "nnodes": len(self.nodes),
                "dist_init_addr": self.dist_init_addr, "nodes": [n.to_json() for n in self.nodes],
                "started_at": self.started_at, "stopped_at": self.stopped_at, "gate": self.gate}

    @classmethod
    def from_json(cls, data: dict) -> MultiNodeRecord:
        nodes = [NodeEntry(int(n["rank"]), str(n["host"]), str(n["address"]), n.get("session_id"))
                 for n in data["nodes"]]
        gate = data.get("gate") if isinstance(data.get("gate"), dict) else None
        return cls(str(data["id"]), str(data["profile"]), int(data["tp_size"]), str(data["dist_init_addr"]),
                   nodes, float(data.get("started_at") or 0.0), data.get("stopped_at"), gate)

    def save(self, home: Home) -> None:
        directory = home.state_root / NODES_DIR
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_json(directory / f"{self.node_id}.json", self.to_json())


def load_record(home: Home, ref: str) -> MultiNodeRecord:
    """The record of id ``ref`` or of a unique id prefix; NodesError naming what was looked for."""
    directory = home.state_root / NODES_DIR
    found = sorted(p for p in directory.glob(f"{NODE_ID_PREFIX}*.json") if p.stem.startswith(ref)) \
        if directory.is_dir() else []
    exact = [p for p in found if p.stem == ref]
    if exact:
        found = exact
    if len(found) != 1:
        raise NodesError(f"multi-node session {ref!r}: " + ("not found" if not found else
                         f"ambiguous ({', '.join(p.stem for p in found[:5])})") + f" in {directory}")
    data = read_json(found[0])
    try:
        return MultiNodeRecord.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise NodesError(f"{found[0]}: not a multi-node record ({exc})") from None


# -- launch -----------------------------------------------------------------------------------------------


def resolve_nodes(profile: LaunchProfile, resolver: NodeResolver) -> list[NodeEndpoint]:
    endpoints = []
    for rank, name in enumerate(profile.server.hosts):
        try:
            endpoints.append(resolver(name))
        except Exception as exc:  # noqa: BLE001 - any failure to reach a host is that node's problem
            raise NodesError(f"node {rank} ({name}): {exc}") from None
    return endpoints


def preflight(profile: LaunchProfile, endpoints: list[NodeEndpoint],
              dist_init_addr: str) -> list[dict]:
    """Every node's node-check report; NodesError listing every node's problem and every mismatch."""
    reports, problems = [], []
    text = profile_text_for_host(profile)
    for rank, node in enumerate(endpoints):
        result = node.call(["node-check", "-", "--name", profile.name, "--node-rank", str(rank), "--dist-init-addr",
                            dist_init_addr, "--node-address", node.address, "--json"], input=text)
        try:
            report = json.loads(result.stdout)
        except ValueError:
            problems.append(f"node {rank} ({node.name}): node-check failed (exit {result.returncode}): "
                            f"{(result.stderr or result.stdout).strip()[:400]}")
            continue
        reports.append(report | {"host": node.name})
        problems += [f"node {rank} ({node.name}): {p}" for p in report.get("problems", [])]
    if len(reports) == len(endpoints) and reports:
        base = reports[0]
        for rank, report in enumerate(reports[1:], start=1):
            for package in ("sglang", "torch", "nccl"):
                ours, theirs = base["versions"].get(package), report["versions"].get(package)
                if ours != theirs:
                    problems.append(f"node {rank} ({report['host']}): {package} {theirs} but node 0 "
                                    f"({base['host']}) has {ours}: every node must run the same versions")
            if comparable_command(report["command"]) != comparable_command(base["command"]):
                problems.append(f"node {rank} ({report['host']}): its command differs from node 0's beyond "
                                f"--node-rank: {' '.join(report['command'])}")
    if problems:
        raise NodesError("multi-node launch refused before anything started:\n  " + "\n  ".join(problems))
    return reports


def launch_nodes(home: Home, profile: LaunchProfile, resolver: NodeResolver,
                 progress: Callable[[str], None] = lambda _text: None) -> MultiNodeRecord:
    """Preflight, then ``launch`` on node 0 and on each other node; the record is saved before the first
    node starts (a failure part way leaves a record that `stop_nodes` can clean up)."""
    endpoints = resolve_nodes(profile, resolver)
    dist_init_addr = default_dist_init_addr(profile, endpoints[0])
    gate = None
    if profile.server.gated_launch:
        profile, gate = gated_profile(profile, endpoints[0])
    preflight(profile, endpoints, dist_init_addr)
    node_id = f"{NODE_ID_PREFIX}{profile.name[:60]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    record = MultiNodeRecord(node_id, profile.name, int(profile.server.tp_size), dist_init_addr,
                             [NodeEntry(r, e.name, e.address) for r, e in enumerate(endpoints)], gate=gate)
    record.save(home)
    text = profile_text_for_host(profile)
    for rank, node in enumerate(endpoints):
        result = node.call([*launch_argv(profile.name), "--node-rank", str(rank), "--dist-init-addr",
                            dist_init_addr, "--node-address", node.address], input=text)
        session_id = result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""
        if result.returncode != 0 or not session_id:
            record.save(home)
            raise NodesError(f"node {rank} ({node.name}): launch failed (exit {result.returncode}): "
                             f"{(result.stderr or result.stdout).strip()[:400]}; stop what started with "
                             f"'eagle3-tui nodes stop {node_id}'")
        record.nodes[rank].session_id = session_id
        record.save(home)
        progress(f"node {rank} ({node.name}): session {session_id}")
    return record
