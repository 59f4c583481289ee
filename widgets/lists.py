"""ProfileList and SessionList: the two pick lists of the dashboard (panes 1 and 2).

Each takes a tuple of small immutable entries and redraws only when the entries changed, keeping the
highlighted item by id (a poll every second must not move the cursor under the user's finger).
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from sessions.snapshots import ProfileEntry, SessionEntry
from widgets.state_line import state_glyph

__all__ = ["ProfileEntry", "ProfileList", "SessionEntry", "SessionList"]


class _KeyedList(OptionList):
    """An OptionList whose options carry ids and survive refreshes with the highlight in place."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, compact=True)
        self._entries: tuple | None = None

    @property
    def highlighted_id(self) -> str | None:
        option = self.highlighted_option
        return option.id if option is not None else None

    def select_id(self, option_id: str | None) -> bool:
        if option_id is None:
            return False
        try:
            self.highlighted = self.get_option_index(option_id)
        except Exception:  # noqa: BLE001 - OptionDoesNotExist
            return False
        return True

    def _replace(self, entries: tuple, options: list[Option], prefer: str | None = None) -> bool:
        if entries == self._entries:
            return False
        keep = prefer or self.highlighted_id
        self._entries = entries
        self.set_options(options)
        if not self.select_id(keep) and options and not options[0].disabled:
            self.highlighted = 0
        return True


class ProfileList(_KeyedList):
    """Profiles from `<config>/profiles`; a dot marks one with a live session."""

    def update_entries(self, entries: tuple[ProfileEntry, ...], prefer: str | None = None) -> bool:
        return self._replace(entries, [Option(self._prompt(e), id=e.name) for e in entries], prefer)

    @staticmethod
    def _prompt(entry: ProfileEntry) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        if entry.live_state:
            glyph, _ = state_glyph(entry.live_state)
            text.append(f"{glyph} ", style="bold")
        else:
            text.append("  ")
        text.append(entry.name, style="bold")
        if entry.error:
            text.append("  ✖ invalid", style="red")
            return text
        details = []
        if entry.tp_size:
            details.append(f"TP{entry.tp_size}")
        if entry.launcher == "emulator":
            details.append("emu")
        if entry.port:
            details.append(f":{entry.port}")
        if entry.capture:
            details.append("capture")
        if details:
            text.append("  " + " ".join(details), style="dim")
        return text


class SessionList(_KeyedList):
    """Sessions, newest first: live ones with their state, ended ones dimmed."""

    def update_entries(self, entries: tuple[SessionEntry, ...], prefer: str | None = None) -> bool:
        options = [Option(self._prompt(e), id=e.session_id) for e in entries]
        if not options:
            options = [Option(Text("none yet (l launches)", style="dim"), disabled=True)]
        return self._replace(entries, options, prefer)

    @staticmethod
    def _prompt(entry: SessionEntry) -> Text:
        glyph, _ = state_glyph(entry.state)
        ended = entry.state in ("exited", "stopped", "crashed")
        text = Text(
            no_wrap=True, overflow="ellipsis", style="dim" if ended and entry.state != "crashed" else ""
        )
        text.append(f"{glyph} {entry.state:<8}", style="bold")
        text.append(f" {entry.profile}")
        if entry.port:
            text.append(f" :{entry.port}", style="dim")
        if entry.started_at:
            text.append(f" {time.strftime('%H:%M', time.localtime(entry.started_at))}", style="dim")
        text.append(f"  {entry.session_id.rsplit('-', 1)[-1]}", style="dim")
        return text
