"""SGLang's gated launch across nodes (``[server] gated_launch = true``; `sessions.server.nodes.gated_profile`).

What SGLang 0.5.23 does with ``--gated-launch-port P`` (distributed/gated_launch.py, bootstrap.py:200-202): right
after ``Init parallel ends`` and before the memory baseline, world rank 0 starts a control server on its
``--host``:P (``GET /health``, ``POST /gate/activate``), every rank logs ``Gated launch waiting for activation.
rank=N`` and waits, polling rank 0's flag over the CPU group each second, until the POST; then each logs ``Gated
launch activated. elapsed=… s`` and the memory-hungry part of the start (weights, KV cache, graphs) begins.

A rank reaches the gate only through the rendezvous, which needs every node, so the gate itself never waits
for a node: what it gives the launch is a hold before any sizable GPU allocation, and a point where every
rank of every node is known to be up.  `open_gate` waits until each node's log shows all of its ranks at the
gate, then sends the POST on node 0 (over its link: the gate may listen on node 0's 127.0.0.1).  A node that
never joins leaves its peers at ``Init parallel begin.``: the gate stays closed and the answer names that node
and its ranks (`sessions.server.nodes_status.summarize`'s rendezvous verdict).
"""
from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from sessions.home import Home
from sessions.server.nodes import MultiNodeRecord, NodeResolver, NodesError, ranks_of_node

GATE_WAIT_RE = re.compile(r"\[[\d\- :.]+ (?:DP\d+ )?TP(?P<rank>\d+)(?: EP\d+)?\] Gated launch waiting for activation")
POLL_S = 1.0


@dataclass(frozen=True)
class GateResult:
    opened: bool
    message: str  # "gate opened: ..." or why it is still closed, naming the node and its ranks


def ranks_at_gate(record: MultiNodeRecord, resolver: NodeResolver) -> dict[int, tuple[int, ...]]:
    """Node rank -> the TP ranks whose ``Gated launch waiting for activation`` line its log holds."""
    found: dict[int, tuple[int, ...]] = {}
    for entry in record.nodes:
        if entry.session_id is None:
            found[entry.rank] = ()
            continue
        try:
            result = resolver(entry.host).call(["logs", entry.session_id, "--grep", "Gated launch waiting"])
        except Exception:  # noqa: BLE001 - an unreachable node has no rank at the gate as far as we know
            found[entry.rank] = ()
            continue
        found[entry.rank] = tuple(sorted({int(m["rank"]) for m in GATE_WAIT_RE.finditer(result.stdout)}))
    return found


def not_at_gate(record: MultiNodeRecord, arrived: dict[int, tuple[int, ...]]) -> list[str]:
    """One phrase per node that still misses ranks at the gate: ``node 1 (h3): TP2–3``."""
    out = []
    for entry in record.nodes:
        ranks = tuple(ranks_of_node(record.tp_size, len(record.nodes), entry.rank))
        missing = [r for r in ranks if r not in arrived.get(entry.rank, ())]
        if missing:
            label = (f"TP{missing[0]}–{missing[-1]}" if len(missing) > 1 and missing == list(range(missing[0], missing[-1] + 1))
                     else ", ".join(f"TP{r}" for r in missing))
            out.append(f"node {entry.rank} ({entry.host}): {label}")
    return out


def activate(record: MultiNodeRecord, resolver: NodeResolver, home: Home) -> None:
    """``POST /gate/activate`` on node 0's host (``node-check --gate-activate HOST:PORT`` there)."""
    assert record.gate is not None
    node0 = record.nodes[0]
    target = f"{record.gate['host']}:{record.gate['port']}"
    result = resolver(node0.host).call(["node-check", "--gate-activate", target])
    if result.returncode != 0:
        raise NodesError(f"node 0 ({node0.host}): POST /gate/activate to {target} failed (exit {result.returncode}): "
                         f"{(result.stderr or result.stdout).strip()[:300]}")
    record.gate["state"] = "open"
    record.gate["opened_at"] = time.time()
    record.save(home)


def open_gate(record: MultiNodeRecord, resolver: NodeResolver, home: Home, timeout_s: float,
              poll_s: float = POLL_S) -> GateResult:
    """Wait (at most ``timeout_s``) until every rank of every node is at the gate, then open it.  A node found
    dead ends the wait at once; the result names what holds the gate closed."""
    from sessions.server.nodes_status import multi_node_status

    if record.gate is None:
        raise NodesError(f"{record.node_id} was launched without server.gated_launch: it has no gate")
    if record.gate.get("state") == "open":
        return GateResult(True, f"gate already open on {record.gate['host']}:{record.gate['port']}")
    deadline = time.monotonic() + timeout_s
    while True:
        arrived = ranks_at_gate(record, resolver)
        missing = not_at_gate(record, arrived)
        if not missing:
            activate(record, resolver, home)
            total = sum(len(r) for r in arrived.values())
            return GateResult(True, f"gate opened: all {total} ranks of {len(record.nodes)} nodes were at the gate; "
                                    f"POST /gate/activate sent to {record.gate['host']}:{record.gate['port']} on node 0")
        status = multi_node_status(record, resolver)
        if status.state == "crashed" or time.monotonic() >= deadline:
            why = status.verdict if status.verdict else status.state
            return GateResult(False, f"gate closed: not at the gate: {'; '.join(missing)} ({why})")
        time.sleep(poll_s)


def post_activate(target: str, timeout_s: float = 10.0) -> str:
    """``POST http://HOST:PORT/gate/activate`` from this host (node 0); the answer's body, or `NodesError`."""
    host, _, port = target.rpartition(":")
    url = f"http://{host}:{port}/gate/activate" if ":" not in host.strip("[]") else f"http://[{host.strip('[]')}]:{port}/gate/activate"
    request = urllib.request.Request(url, data=b"", method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(request, timeout=timeout_s) as answer:
            return answer.read(1024).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        raise NodesError(f"POST {url}: {exc}") from None
