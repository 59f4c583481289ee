"""Status, stop and diagnosis of one server across nodes (`sessions.server.nodes` launches it).

Every answer comes from the nodes' own CLIs over their links: ``status SID --json`` (state, liveness, GPUs),
``logs SID --grep "Init parallel"`` (each rank's arrival at the rendezvous and its way through it),
``stop SID --json`` and ``diagnose SID --json``.  A node whose server process is gone is shown as dead at
the next poll, whatever its peers' logs say: NCCL's watchdog may take minutes, or never fire (sglang #3099).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessions.hints import HintEvidence, match_hints
from sessions.remote.client import SSH_FAILED, ssh_reason
from sessions.server.nodes import (
    INIT_LINE_RE,
    MultiNodeRecord,
    NodeEndpoint,
    NodeResolver,
    NodesError,
    ranks_of_node,
)


@dataclass(frozen=True)
class NodeView:
    """One node at one poll."""

    rank: int
    host: str
    session_id: str | None
    ranks: tuple[int, ...]  # the TP ranks this node holds
    begun: tuple[int, ...] = ()  # logged "Init parallel begin."
    ended: tuple[int, ...] = ()  # logged "Init parallel ends"
    alive: bool = False
    state: str = "unknown"
    phase: str = ""
    error: str | None = None  # the node's first fatal error, or why it could not be asked
    reachable: bool = True
    gpu_pids: tuple[int, ...] = ()
    rendezvous_warning: str | None = None  # c10d "failed to connect" on this node

    @property
    def waiting(self) -> tuple[int, ...]:
        """Ranks that arrived but did not get through the rendezvous."""
        return tuple(r for r in self.begun if r not in self.ended)

    @property
    def missing(self) -> tuple[int, ...]:
        """Ranks of this node that never arrived."""
        return tuple(r for r in self.ranks if r not in self.begun)

    def to_json(self) -> dict[str, Any]:
        return {"node_rank": self.rank, "host": self.host, "session_id": self.session_id,
                "tp_ranks": list(self.ranks), "init_begun": list(self.begun), "init_ended": list(self.ended),
                "alive": self.alive, "state": self.state, "phase": self.phase, "error": self.error,
                "reachable": self.reachable, "rendezvous_warning": self.rendezvous_warning}


@dataclass(frozen=True)
class MultiNodeStatus:
    record: MultiNodeRecord
    nodes: tuple[NodeView, ...]
    state: str = "starting"
    verdict: str = ""  # one line: what holds the start, naming the node and ranks
    hints: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"id": self.record.node_id, "profile": self.record.profile, "state": self.state,
                "verdict": self.verdict, "hints": list(self.hints), "dist_init_addr": self.record.dist_init_addr,
                "gate": self.record.gate,
                "nodes": [n.to_json() for n in self.nodes]}


def _tp_label(ranks: tuple[int, ...] | range) -> str:
    ranks = tuple(ranks)
    if not ranks:
        return "none"
    if len(ranks) > 1 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"TP{ranks[0]}–{ranks[-1]}"
    return ", ".join(f"TP{r}" for r in ranks)


def _ask(node: NodeEndpoint, args: list[str]) -> tuple[Any, str | None]:
    """The node's answer, or why it gave none.  ssh's own exit status (255: it could not connect, or lost
    the connection) is no answer of our CLI there: the node is unreachable, never "dead" (its server may be
    serving on)."""
    try:
        result = node.call(args)
    except Exception as exc:  # noqa: BLE001 - an unreachable host is a state of that node
        return None, f"unreachable: {exc}"
    if result.returncode == SSH_FAILED:
        return None, f"unreachable: {ssh_reason(result.stderr)}"
    return result, None


def node_view(record: MultiNodeRecord, rank: int, node: NodeEndpoint) -> NodeView:
    entry = record.nodes[rank]
    ranks = tuple(ranks_of_node(record.tp_size, len(record.nodes), rank))
    base = NodeView(rank, entry.host, entry.session_id, ranks)
    if entry.session_id is None:
        return NodeView(rank, entry.host, None, ranks, state="not started", error="never launched")
    result, why = _ask(node, ["status", entry.session_id, "--json", "--no-http"])
    if why is not None or result is None:
        return NodeView(rank, entry.host, entry.session_id, ranks, reachable=False, state="unreachable", error=why)
    try:
        data = json.loads(result.stdout)
        status = data[0] if isinstance(data, list) else data
    except (ValueError, IndexError):
        return NodeView(rank, entry.host, entry.session_id, ranks, state="unknown",
                        error=f"status failed (exit {result.returncode}): {(result.stderr or '').strip()[:200]}")
    logs, _ = _ask(node, ["logs", entry.session_id, "--grep", "/Init parallel|c10d/"])
    begun: set[int] = set()
    ended: set[int] = set()
    warning = None
    for line in (logs.stdout if logs is not None else "").splitlines():
        for match in INIT_LINE_RE.finditer(line):
            (begun if match["what"] == "begin" else ended).add(int(match["rank"]))
        if "[c10d]" in line and "failed to connect" in line:
            warning = line.strip()[-300:]
    gpu_pids = tuple(int(r["pid"]) for r in status.get("ranks") or [] if r.get("gpu_index") is not None)
    return NodeView(rank, base.host, base.session_id, ranks, tuple(sorted(begun)), tuple(sorted(ended)),
                    bool(status.get("alive")), str(status.get("state") or "unknown"), str(status.get("phase") or ""),
                    status.get("error"), True, gpu_pids, warning)


def multi_node_status(record: MultiNodeRecord, resolver: NodeResolver) -> MultiNodeStatus:
    views = tuple(node_view(record, entry.rank, resolver(entry.host)) for entry in record.nodes)
    return summarize(record, views)


def summarize(record: MultiNodeRecord, views: tuple[NodeView, ...]) -> MultiNodeStatus:
    """The whole server's state, from node 0's state and every other node's liveness."""
    node0 = views[0]
    dead = [v for v in views if v.session_id is not None and v.reachable and not v.alive]
    unreachable = [v for v in views if not v.reachable]
    hints = tuple(node_hints(views))
    if record.stopped_at is not None and not any(v.alive for v in views):
        return MultiNodeStatus(record, views, "stopped", "stopped", hints)
    if dead:
        # The first failure first: a node that failed on a lost peer (ncclRemoteError) is a consequence.
        dead.sort(key=lambda v: (_lost_a_peer(v.error), v.rank))
        names = "; ".join(f"node {v.rank} ({v.host}, {_tp_label(v.ranks)}) is {v.state}"
                          + (f": {v.error}" if v.error else "") for v in dead)
        return MultiNodeStatus(record, views, "crashed", f"dead node: {names}", hints)
    if unreachable:
        names = ", ".join(f"node {v.rank} ({v.host})" for v in unreachable)
        return MultiNodeStatus(record, views, node0.state, f"cannot reach {names}", hints)
    if node0.state == "ready":
        # A worker's log goes quiet once its ranks are ready (it serves no API): its own session reads that
        # as a stall, but with node 0 ready it is serving.
        views = (node0, *(dataclasses.replace(v, state="serving") if v.alive else v for v in views[1:]))
        return MultiNodeStatus(record, views, "ready", f"ready: node 0 serves, {len(views) - 1} worker node(s) alive",
                               hints)
    stuck = [v for v in views if v.waiting or v.missing]
    arrived = [r for v in views for r in v.begun]
    if stuck and arrived and not any(v.ended for v in views):
        missing = [v for v in views if v.missing]
        if missing:
            verdict = "rendezvous: " + "; ".join(f"node {v.rank} ({v.host}) has not arrived: "
                                                 f"{_tp_label(v.missing)} missing" for v in missing)
        else:
            unreached = [v for v in views if v.rendezvous_warning]
            who = (f"node {unreached[0].rank} ({unreached[0].host}) cannot reach the rendezvous at "
                   f"{record.dist_init_addr}") if unreached else "no node got through"
            verdict = f"rendezvous: every rank began Init parallel ({len(arrived)}), none ended: {who}"
        return MultiNodeStatus(record, views, node0.state, verdict, hints)
    return MultiNodeStatus(record, views, node0.state, f"{node0.state}: {node0.phase}", hints)


def _lost_a_peer(error: str | None) -> bool:
    return bool(error) and ("ncclRemoteError" in str(error) or "remote process exited" in str(error))


def stop_nodes(record: MultiNodeRecord, resolver: NodeResolver, home: Any, grace_s: float = 30.0,
               progress: Callable[[str], None] = lambda _text: None) -> list[dict]:
    """Node 0 first, then the workers (they stop on node 0's ShutdownReq; their own stop is the backstop),
    then every node's GPUs checked free of the session's processes.  NodesError when anything remains."""
    import time

    reports: list[dict] = []
    left: list[str] = []
    for entry in record.nodes:  # node 0 is first in the record
        if entry.session_id is None:
            continue
        node = resolver(entry.host)
        result, why = _ask(node, ["stop", entry.session_id, "--json", "--grace", f"{grace_s:g}"])
        if why is not None or result is None:
            left.append(f"node {entry.rank} ({entry.host}): {why}")
            continue
        try:
            report = json.loads(result.stdout)
        except ValueError:
            report = {"stopped": False, "message": (result.stderr or result.stdout).strip()[:300]}
        report |= {"node_rank": entry.rank, "host": entry.host}
        reports.append(report)
        progress(f"node {entry.rank} ({entry.host}): {report.get('message', '')}")
        if not report.get("stopped") or report.get("gpu_pids_left"):
            left.append(f"node {entry.rank} ({entry.host}): {report.get('message', 'not stopped')}"
                        + (f"; GPU pids left {report['gpu_pids_left']}" if report.get("gpu_pids_left") else ""))
    record.stopped_at = time.time()
    record.save(home)
    if left:
        raise NodesError("multi-node stop incomplete:\n  " + "\n  ".join(left))
    return reports


# -- hints only the view across nodes can give ------------------------------------------------------------
# Which node never arrived at the rendezvous, which cannot reach it, which is dead; plus the catalogue's
# causes (`sessions/data/known_causes_nodes.toml`) matched on each node's first error.


def _tp(ranks: Sequence[int]) -> str:
    return ", ".join(f"TP{r}" for r in ranks)


def node_hints(views: Sequence[NodeView]) -> list[str]:
    """One line each, most specific first: a dead node, a node that never arrived, a node that cannot reach
    the rendezvous, then the known causes of each node's error."""
    out: list[str] = []
    for v in views:
        if v.session_id is not None and v.reachable and not v.alive:
            out.append(f"node {v.rank} ({v.host}) is dead ({v.state}): its ranks {_tp(v.ranks)} are gone; "
                       "the other nodes wait in their next collective until NCCL notices or its watchdog fires")
    arrived_anywhere = any(v.begun for v in views)
    for v in views:
        if v.alive and v.missing and arrived_anywhere and not any(x.ended for x in views):
            out.append(f"rendezvous: node {v.rank} ({v.host}) never arrived: {_tp(v.missing)} did not log "
                       "'Init parallel begin.' (still booting, or stuck before distributed init)")
        elif v.session_id is None:
            out.append(f"rendezvous: node {v.rank} ({v.host}) was never launched: {_tp(v.ranks)} can never join")
    for v in views:
        if v.rendezvous_warning:
            out.append(f"rendezvous: node {v.rank} ({v.host}) cannot reach node 0's --dist-init-addr: "
                       f"{v.rendezvous_warning}")
    for v in views:
        if v.error:
            for hint in match_hints(HintEvidence(log_lines=v.error.splitlines())):
                out.append(f"node {v.rank} ({v.host}): {hint.title}. {hint.detail}")
    return out


__all__ = ["MultiNodeStatus", "NodeView", "NodesError", "multi_node_status", "stop_nodes", "summarize"]
