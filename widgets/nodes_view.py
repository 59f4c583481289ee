"""The multi-node view's own drawings: each node's arrival timeline, and the titles of its GPU and log panes.

Drawn from immutable state only: the `NodesView` of `sessions.server.nodes_monitor` (where each node is)
and the `NodeLog`s of `sessions.server.nodes_detail` (when each rank logged ``Init parallel begin.`` and
``Init parallel ends``, read from that node's mirrored log).  A rank's cell reads ``TP2 05:20:01→05:20:03``
(begin, then ends: through the rendezvous), ``TP2 05:20:01→…`` (arrived, waiting for the others) or
``TP2 ·`` (never arrived): a rendezvous or NCCL-init hang names the node and its missing ranks.
"""
from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from sessions.server.nodes_detail import MERGED, NodeGpus, NodeLog
from sessions.server.nodes_monitor import NodesView
from widgets import units
from widgets.nodes_card import stage, tp_range


def _clock(key: str | None) -> str:
    """ "2026-12-02 05:20:01.123" -> "05:20:01" (the date and the fraction do not fit a cell)."""
    if not key:
        return "?"
    return key.rpartition(" ")[2].split(".")[0]


def arrival_text(view: NodesView, logs: tuple[NodeLog, ...]) -> Text:
    """A line per node: its host, TP ranks, where it is, and each rank's begin→ends times."""
    text = Text(overflow="fold")
    stopped = view.status.state == "stopped"
    width = max((len(v.host) for v in view.nodes), default=4)
    by_rank = {log.rank: log for log in logs}
    for i, node in enumerate(view.nodes):
        if i:
            text.append("\n")
        where = stage(node, stopped)
        text.append(f"n{node.rank} ", style="bold")
        text.append(f"{node.host:<{width}} {tp_range(node.ranks):<7} ")
        style = "bold red" if where in ("dead", "unreachable") else "green" if where in (
            "ready", "serving", "joined") else "dim" if where in ("stopped", "asking") else "yellow"
        text.append(f"{where:<11}", style=style)
        log = by_rank.get(node.rank)
        times = {r: (b, e) for r, b, e in log.arrivals} if log is not None else {}
        for r in node.ranks:
            text.append(" ")
            begun, ended = times.get(r, (None, None))
            if begun is None and r in node.begun:  # the monitor saw it; the mirror has not got there yet
                begun = ""
            if begun is None:
                text.append(f"TP{r} ·", style="yellow" if not stopped else "dim")
            elif ended is None and r not in node.ended:
                text.append(f"TP{r} {_clock(begun)}→…", style="yellow")
            else:
                text.append(f"TP{r} {_clock(begun)}→{_clock(ended)}", style="green")
        if where == "unreachable":
            text.append(f"  {(node.error or '').removeprefix('unreachable: ')}", style="red")
        elif where == "dead" and node.error:
            text.append(f"  {node.error.splitlines()[-1][:160]}", style="red")
    return text


def gpu_title(gpus: NodeGpus, wall: float | None = None) -> str:
    """ "n1 h3 · TP2–3 · 2 GPUs · emulated", or why the reading is missing or old."""
    wall = time.time() if wall is None else wall
    head = f"n{gpus.rank} {gpus.host} · {tp_range(gpus.tp_ranks)}"
    snap = gpus.gpus
    if gpus.error is not None:
        age = f", last reading {units.duration(wall - gpus.answered_at)} ago" if gpus.answered_at else ""
        return f"{head} · {gpus.error.removeprefix('unreachable: ')[:80]}{age}"
    if snap is None:
        return f"{head} · asking…"
    source = "emulated" if snap.source == "emulated" else "NVML" if snap.available else "no NVML"
    return f"{head} · {len(snap.samples)} GPUs · {source}"


def log_title(shown: int, logs: tuple[NodeLog, ...], hosts: dict[int, str]) -> str:
    """ "Log n1 h3 · 412 lines" / "Log merged (n0 n1)", and a node whose stream is down says why."""
    if shown == MERGED:
        down = [f"n{log.rank} {log.error}" for log in logs if log.error]
        return "Log merged (" + " ".join(f"n{log.rank}" for log in logs) + ")" + (
            f" · {down[0][:60]}" if down else "")
    log = next((x for x in logs if x.rank == shown), None)
    head = f"Log n{shown} {hosts.get(shown, '?')}"
    if log is None:
        return head
    return head + (f" · {log.error[:70]}" if log.error else "")


class NodeArrivals(Static):
    DEFAULT_CSS = "NodeArrivals { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.shown = Text()  # what it draws now (tests read it)

    def update_arrivals(self, view: NodesView, logs: tuple[NodeLog, ...]) -> None:
        shown = arrival_text(view, logs)
        if shown.plain != self.shown.plain:
            self.shown = shown
            self.update(shown)
