"""The group card: one line per member of the selected session's group of replicas (issue 24, item 1).

Drawn from immutable `SessionEntry` values (the feed gathers them); hidden for a session of no group.
A crashed member stands out in red between the live ones, which go on.
"""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from sessions.snapshots import SessionEntry
from widgets.state_line import state_glyph

_STATE_STYLE = {"ready": "green", "starting": "yellow", "stalled": "bold yellow", "crashed": "bold red",
                "exited": "dim", "stopped": "dim"}


def group_text(members: tuple[SessionEntry, ...]) -> Text:
    """"group g-… · 4 replicas: 3 ready, 1 crashed", then "[i] state :port GPU a,b id" a member."""
    text = Text(no_wrap=True, overflow="ellipsis")
    if not members:
        return text
    states = [m.state for m in members]
    summary = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
    text.append("group ", style="bold")
    text.append(members[0].group or "?")
    text.append(f" · {len(members)} replicas: {summary}", style="dim")
    for m in members:
        glyph, _ = state_glyph(m.state)
        text.append(f"\n [{m.group_index}] ")
        text.append(f"{glyph} {m.state:<8}", style=_STATE_STYLE.get(m.state, "bold"))
        text.append(f" :{m.port}" if m.port else " :-", style="dim")
        gpus = ",".join(str(g) for g in m.gpus) or "?"
        text.append(f"  GPU {gpus}")
        text.append(f"  {m.session_id}", style="dim")
    return text


class GroupCard(Static):
    DEFAULT_CSS = "GroupCard { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._members: tuple[SessionEntry, ...] | None = None
        self.shown = Text()  # what the card draws now (tests read it)
        self.display = False  # no room taken until a group member is shown

    def update_group(self, members: tuple[SessionEntry, ...]) -> None:
        if members == self._members:
            return
        self._members = members
        self.display = bool(members)
        self.shown = group_text(members)
        self.update(self.shown)
