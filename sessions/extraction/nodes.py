"""Extraction against a server across nodes (issue 26 item 3): where its captures land, and what is refused.

With TP only (pp = 1, which capture needs) every TP rank holds the same batch and the same aux rows, and the
capture plugin writes from ``attn_tp_rank == 0`` of the last PP rank only (``eagle3_capture/hook.py``
`_writer_rank`): global TP0, which SGLang's ``_calculate_rank_ranges`` puts on node 0 (docs/sglang-facts.md
§10).  So every dump of a multi-node server lands on node 0's host, in node 0's capture dir, and one job on
node 0's host against node 0's session collects them all (with today's guarantees: no duplicates, kill-safe,
``extract verify`` clean); no collector per host and no merge are needed.

Two jobs cannot work and are refused before they start, naming the host to use instead:

* a job against a worker node's session (node R > 0): its ranks write no dumps, so it would wait forever;
* a job here naming the multi-node session id: the dumps are on node 0's host, not in this home.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessions.home import Home


def writer_node_rank(tp_size: int, nnodes: int) -> int:
    """The node whose ranks include global TP0, the one rank that writes captures (pp = 1)."""
    from sessions.server.nodes import ranks_of_node

    return next(r for r in range(nnodes) if 0 in ranks_of_node(tp_size, nnodes, r))


def node_flags(extra_args: Sequence[str]) -> dict[str, str]:
    """``--nnodes``, ``--node-rank`` and ``--dist-init-addr`` of a node's command (what `node_profile` adds)."""
    flags: dict[str, str] = {}
    words = list(extra_args)
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in ("--nnodes", "--node-rank", "--dist-init-addr"):
            if eq:
                flags[name] = value
            elif i + 1 < len(words):
                flags[name] = words[i + 1]
    return flags


def worker_node_refusal(session_id: str, tp_size: int, extra_args: Sequence[str]) -> str | None:
    """Why a job against this session collects nothing: it is a node of a multi-node server that holds no
    writing rank.  None for a single-node session or for the writer's node."""
    from sessions.server.nodes import ranks_of_node

    flags = node_flags(extra_args)
    try:
        nnodes, node_rank = int(flags.get("--nnodes", "1")), int(flags.get("--node-rank", "0"))
    except ValueError:
        return None  # SGLang refuses such a command itself; not this check's business
    if nnodes <= 1:
        return None
    writer = writer_node_rank(tp_size, nnodes)
    if node_rank == writer:
        return None
    ranks = ranks_of_node(tp_size, nnodes, node_rank)
    node0_host = flags.get("--dist-init-addr", "").rpartition(":")[0] or "node 0's host"
    return (f"session {session_id} is node {node_rank} (TP{ranks[0]}–{ranks[-1]}) of a server across {nnodes} "
            f"nodes: its ranks write no captures (only TP0 writes, on node {writer}, the host of "
            f"--dist-init-addr {node0_host}); run the job on node {writer}'s host against node {writer}'s "
            f"session (eagle3-tui extract run SPEC --host NODE0)")


def multi_node_refusal(ref: str, home: Home) -> str | None:
    """Why a job here cannot name multi-node session ``ref``: its captures land on node 0's host, in node
    0's session, which this home does not hold.  None when ``ref`` is no multi-node record of this home."""
    from sessions.server.nodes import NodesError, load_record

    try:
        record = load_record(home, ref)
    except (NodesError, OSError, ValueError, KeyError):
        return None
    writer = record.nodes[writer_node_rank(record.tp_size, len(record.nodes))]
    session = writer.session_id or "(none: its launch did not get that far)"
    return (f"{ref} is a server across {len(record.nodes)} nodes; every capture is written by TP0 on node "
            f"{writer.rank}, host {writer.host!r} ({writer.address}), into node {writer.rank}'s session "
            f"{session}: run the job there with session = \"{session}\" in the spec "
            f"(eagle3-tui extract run SPEC --host {writer.host})")
