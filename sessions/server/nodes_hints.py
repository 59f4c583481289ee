"""Hints that only the view across nodes can give: which node never arrived at the rendezvous, which one
cannot reach it, which one is dead, plus the catalogue's causes (`sessions/data/known_causes_nodes.toml`)
matched on each node's first error."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sessions.hints import HintEvidence, match_hints

if TYPE_CHECKING:
    from sessions.server.nodes_status import NodeView


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
