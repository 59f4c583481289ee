"""A multi-node session as text (per-node rank arrival, the verdict, the hints) and its diagnosis: every
node's own ``diagnose --json`` (py-spy of the ranks on that node) gathered into one report."""
from __future__ import annotations

import json
from typing import Any

from sessions.server.nodes import MultiNodeRecord, NodeResolver
from sessions.server.nodes_status import MultiNodeStatus, NodeView, multi_node_status

DIAGNOSE_TIMEOUT_S = 180.0


def _rank_cell(view: NodeView, rank: int) -> str:
    if rank in view.ended:
        return f"TP{rank} begin+ends"
    if rank in view.begun:
        return f"TP{rank} begin (waiting)"
    return f"TP{rank} missing"


def node_line(view: NodeView) -> str:
    life = "alive" if view.alive else ("unreachable" if not view.reachable else "DEAD")
    cells = ", ".join(_rank_cell(view, r) for r in view.ranks)
    line = f"node {view.rank} {view.host:<12} {life:<11} {view.state:<9} {view.phase:<16} {cells}"
    if view.error:
        line += f"  error: {view.error.splitlines()[-1][:120]}"
    return line


def status_lines(status: MultiNodeStatus) -> list[str]:
    record = status.record
    head = (f"{record.node_id}  {record.profile}  {status.state}  TP{record.tp_size} over {len(record.nodes)} "
            f"nodes, rendezvous {record.dist_init_addr}")
    lines = [head, f"  {status.verdict}"]
    lines += [f"  {node_line(v)}" for v in status.nodes]
    lines += [f"  hint: {h}" for h in status.hints]
    return lines


def diagnose_nodes(record: MultiNodeRecord, resolver: NodeResolver) -> dict[str, Any]:
    """The status across nodes plus each node's ``diagnose --json`` (its stacks, phase, hints)."""
    status = multi_node_status(record, resolver)
    per_node: list[dict[str, Any]] = []
    for entry in record.nodes:
        if entry.session_id is None:
            per_node.append({"node_rank": entry.rank, "host": entry.host, "error": "never launched"})
            continue
        try:
            result = resolver(entry.host).call(["diagnose", entry.session_id, "--json"], DIAGNOSE_TIMEOUT_S)
            report = json.loads(result.stdout)
        except Exception as exc:  # noqa: BLE001 - one node's failure is part of the report
            per_node.append({"node_rank": entry.rank, "host": entry.host, "error": f"diagnose failed: {exc}"})
            continue
        per_node.append({"node_rank": entry.rank, "host": entry.host, "report": report})
    text = status_lines(status)
    for item in per_node:
        text.append(f"--- node {item['node_rank']} ({item['host']})")
        if "error" in item:
            text.append(f"  {item['error']}")
            continue
        report = item["report"]
        for hint in report.get("hints") or []:
            title = hint.get("title") if isinstance(hint, dict) else str(hint)
            text.append(f"  hint: {title}")
        dumped = [p for p in report.get("processes") or [] if isinstance(p, dict) and p.get("stack")]
        ranks = [f"TP{p['rank']}" for p in dumped if p.get("role") == "scheduler" and p.get("rank") is not None]
        text.append(f"  py-spy: {len(dumped)} process(es) of this node dumped"
                    + (f" ({', '.join(ranks)})" if ranks else ""))
    return {"status": status.to_json(), "nodes": per_node, "text": "\n".join(text)}
