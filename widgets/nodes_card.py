"""The multi-node card: each server across nodes as one card, a line per node (issue 26 item 2).

Drawn from the immutable `NodesView`s of `sessions.server.nodes_monitor` (its threads ask the nodes; the
dashboard's poll only reads them), in the group card's shape: a head line (id, profile, TP over N nodes,
the verdict that names what holds the start), then per node its host, its TP ranks, where it is
(not arrived, arrived = waiting at the rendezvous, ready/serving, dead, unreachable) and each rank's
"Init parallel" arrival: ``✓`` begin and ends, ``…`` begin only (waiting in the rendezvous), ``·`` missing.
"""
from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Static

from sessions.server.nodes_monitor import ASKING, NodesView
from sessions.server.nodes_status import NodeView
from widgets import units

_STAGE_STYLE = {"ready": "green", "serving": "green", "joined": "green", "arrived": "yellow", "arriving": "yellow",
                "not arrived": "yellow", ASKING: "dim", "stopped": "dim", "dead": "bold red",
                "unreachable": "bold red", "not launched": "yellow"}  # "not launched": also while the launch goes on
QUIET_AFTER_S = 8.0  # a node unanswered this long (several polls) is said to be so
_STATE_STYLE = {"ready": "green", "starting": "yellow", "stalled": "bold yellow", "crashed": "bold red",
                "stopped": "dim"}


def tp_range(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "-"
    return f"TP{ranks[0]}" if len(ranks) == 1 else f"TP{ranks[0]}–{ranks[-1]}"


def stage(view: NodeView, stopped: bool) -> str:
    """Where one node is: what the line says after its ranks."""
    if view.state == ASKING:
        return ASKING
    if view.session_id is None:
        return "not launched"
    if not view.reachable:
        return "unreachable"
    if not view.alive:
        return "stopped" if stopped else "dead"
    if view.ranks and all(r in view.ended for r in view.ranks):
        return view.state if view.state in ("ready", "serving") else "joined"
    if view.ranks and all(r in view.begun for r in view.ranks):
        return "arrived"
    return "arriving" if view.begun else "not arrived"


def rank_cells(view: NodeView) -> str:
    return " ".join(f"TP{r}{'✓' if r in view.ended else '…' if r in view.begun else '·'}" for r in view.ranks)


def nodes_text(views: tuple[NodesView, ...], wall: float | None = None, cursor: int | None = None,
               node_lines: bool = True) -> Text:
    """The cards; ``cursor``: the card the pane's cursor is on (its head reversed: Enter opens it);
    ``node_lines`` False: the head and the hint only (the multi-node view draws its own node lines)."""
    wall = time.time() if wall is None else wall
    # The view (node_lines False) wraps its head: at 80 columns the verdict names the node that holds the start.
    text = Text(no_wrap=True, overflow="ellipsis") if node_lines else Text(overflow="fold")
    for i, nv in enumerate(views):
        status = nv.status
        if i:
            text.append("\n")
        if node_lines:  # the multi-node view names the server in its title: its head starts at the profile
            text.append(nv.node_id, style="bold reverse" if i == cursor else "bold")
            text.append(" ")
        text.append(f"{nv.profile} · TP{nv.tp_size} over {len(nv.nodes)} nodes · ", style="dim")
        text.append(status.state, style=_STATE_STYLE.get(status.state, "bold"))
        verdict = status.verdict.removeprefix(f"{status.state}: ")  # "ready: node 0 serves": said once
        if verdict and verdict != status.state:
            text.append(f" · {verdict}")
        width = max((len(v.host) for v in nv.nodes), default=4)
        for v, asked in zip(nv.nodes, nv.asked_at, strict=True) if node_lines else ():
            where = stage(v, status.state == "stopped")
            arrived = sum(1 for r in v.ranks if r in v.begun)
            through = sum(1 for r in v.ranks if r in v.ended)
            text.append(f"\n node {v.rank} ")
            text.append(f"{v.host:<{width}}", style="bold")
            text.append(f"  {tp_range(v.ranks):<7} ")
            text.append(f"{where:<11}", style=_STAGE_STYLE.get(where, "bold"))
            text.append(f" begin {arrived}/{len(v.ranks)} ends {through}/{len(v.ranks)}  ", style="dim")
            text.append(rank_cells(v))
            if where == "unreachable":
                text.append(f"  {(v.error or '').removeprefix('unreachable: ')}", style="red")
                if asked is not None:
                    text.append(f" (last answer {units.duration(wall - asked)} ago)", style="dim")
            elif where == "dead" and v.error:
                text.append(f"  {v.error.splitlines()[-1][:160]}", style="red")
            elif status.state != "stopped" and asked is not None and wall - asked > QUIET_AFTER_S:
                # a hung host: its call is still out (ssh gives up after its keep-alives); say how old this is
                text.append(f"  (no answer for {units.duration(wall - asked)})", style="yellow")
        if status.state not in ("ready", "stopped") and status.hints:
            text.append(f"\n hint: {status.hints[0]}", style="yellow")
    return text


class NodesCard(Static, can_focus=True):
    """The cards; focused (key 5 on the dashboard), up/down move a cursor between them and Enter posts
    `Opened` for the one under it (the dashboard opens its multi-node view)."""

    DEFAULT_CSS = "NodesCard { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("enter", "open", "Open", show=False),
    ]

    class Opened(Message):
        """Enter on a card: the multi-node server ``node_id``."""

        def __init__(self, node_id: str) -> None:
            super().__init__()
            self.node_id = node_id

    def __init__(self, *, id: str | None = None, node_lines: bool = True) -> None:
        super().__init__(id=id)
        self.node_lines = node_lines
        self.views: tuple[NodesView, ...] = ()
        self.cursor = 0
        self.shown = Text()  # what the card draws now (tests read it)

    @property
    def selected_id(self) -> str | None:
        """The server under the cursor."""
        return self.views[self.cursor].node_id if 0 <= self.cursor < len(self.views) else None

    def update_nodes(self, views: tuple[NodesView, ...]) -> None:
        # While focused the cursor stays on its server; otherwise it is on the first card (the newest live one),
        # so 5 then d or Enter acts on the server shown on top, not on one picked long ago.
        chosen = self.selected_id if self.has_focus else None
        self.views = views
        ids = [v.node_id for v in views]
        self.cursor = ids.index(chosen) if chosen in ids else 0
        self._draw()

    def _draw(self) -> None:
        shown = nodes_text(self.views, cursor=self.cursor if self.has_focus else None, node_lines=self.node_lines)
        if shown.plain != self.shown.plain or shown.spans != self.shown.spans:
            self.shown = shown
            self.update(shown)

    def on_focus(self) -> None:
        self._draw()

    def on_blur(self) -> None:
        self._draw()

    def action_move(self, step: int) -> None:
        if self.views:
            self.cursor = (self.cursor + step) % len(self.views)
            self._draw()

    def action_open(self) -> None:
        if self.selected_id is not None:
            self.post_message(self.Opened(self.selected_id))
