"""ProfileList and SessionList: the two pick lists of the dashboard (panes 1 and 2).

Each takes a tuple of small immutable entries and redraws only when the entries changed, keeping the
highlighted item by id (a poll every second must not move the cursor under the user's finger).
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import OptionList, Select
from textual.widgets._select import SelectCurrent, SelectOverlay
from textual.widgets.option_list import Option

from sessions.server import FINAL_STATES
from sessions.snapshots import ProfileEntry, SessionEntry
from widgets.state_line import state_glyph

__all__ = ["ProfileEntry", "ProfileList", "SessionEntry", "SessionList"]


def can_page(option_list: OptionList) -> bool:
    """Whether ``option_list`` can move its highlight by a page now.

    Textual's `OptionList._move_page` reads its line index, which is only built once the list has a
    non-empty content region; a list that is hidden, squeezed to height 0 or refilled before its next
    layout raises KeyError/IndexError there (seen with the command palette's list while it refills).
    With no visible rows there is no page to move by.
    """
    return bool(
        option_list.options
        and option_list.scrollable_content_region.height > 0
        and option_list._lines  # builds the line index when the list has a size
        and (option_list.highlighted or 0) in option_list._index_to_line
    )


class PageSafeOptionList(OptionList):
    """An OptionList whose PageUp/PageDown keep the highlight while it has no rows to page through."""

    def _move_page(self, direction: Any) -> None:
        if can_page(self):
            super()._move_page(direction)


class _KeyedList(PageSafeOptionList):
    """An OptionList whose options carry ids and survive refreshes with the highlight in place."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, compact=True)
        self._entries: tuple | None = None

    @property
    def needed_width(self) -> int:
        """Cells the longest entry needs to be shown whole (the dashboard sizes its left column by it)."""
        return max((o.prompt.cell_len if isinstance(o.prompt, Text) else len(str(o.prompt))
                    for o in self.options), default=0)

    @property
    def highlighted_id(self) -> str | None:
        option = self.highlighted_option
        return option.id if option is not None else None

    def select_id(self, option_id: str | None) -> bool:
        """Highlight ``option_id`` from code.  No `OptionHighlighted` is posted: only the user's own moves
        are choices, and an echo handled later would undo a newer selection (the restart race)."""
        if option_id is None:
            return False
        try:
            index = self.get_option_index(option_id)
        except Exception:  # noqa: BLE001 - OptionDoesNotExist
            return False
        with self.prevent(OptionList.OptionHighlighted):
            self.highlighted = index
        return True

    def _replace(self, entries: tuple, options: list[Option], prefer: str | None = None) -> bool:
        if entries == self._entries:
            if prefer is not None and prefer != self.highlighted_id:
                self.select_id(prefer)
            return False
        keep = prefer or self.highlighted_id
        self._entries = entries
        with self.prevent(OptionList.OptionHighlighted):  # a refill is not the user's choice either
            self.set_options(options)
            if not self.select_id(keep) and options and not options[0].disabled:
                self.highlighted = 0
        return True


class ProfileList(_KeyedList):
    """Profiles from `<config>/profiles`; a dot marks one with a live session."""

    def update_entries(self, entries: tuple[ProfileEntry, ...], prefer: str | None = None) -> bool:
        if entries == self._entries:  # the same profiles: no options to build (a poll every second)
            return self._replace(entries, [], prefer)
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
            details.append(f"TP{entry.tp_size}" + (f" DP{entry.dp_size}" if entry.dp_size > 1 else ""))
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
    """Sessions, newest first: live ones with their state, ended ones dimmed.

    ``full_ids``: show each session's whole id (wide terminals, where the id is what `eagle3-tui stop`,
    `logs` and `diagnose` take); otherwise its profile and the id's last part, to fit a narrow column."""

    full_ids = False

    def update_entries(self, entries: tuple[SessionEntry, ...], prefer: str | None = None) -> bool:
        full = self.full_ids
        if (full, entries) == self._entries:  # the same sessions: no options to build (a poll every second)
            return self._replace((full, entries), [], prefer)
        options = [Option(self._full_prompt(e) if full else self._prompt(e), id=e.session_id) for e in entries]
        if not options:
            options = [Option(Text("none yet (l launches)", style="dim"), disabled=True)]
        return self._replace((full, entries), options, prefer)

    @staticmethod
    def _head(entry: SessionEntry) -> Text:
        """Both prompts' start: the state (an ended one dimmed, a crash not) and the member's index."""
        glyph, _ = state_glyph(entry.state)
        ended = entry.state in FINAL_STATES
        text = Text(
            no_wrap=True, overflow="ellipsis", style="dim" if ended and entry.state != "crashed" else ""
        )
        text.append(f"{glyph} {entry.state:<8}", style="bold")
        if entry.group_index is not None:  # a member of a group of replicas: listed with its group
            text.append(f" [{entry.group_index}]", style="bold")
        return text

    @classmethod
    def _full_prompt(cls, entry: SessionEntry) -> Text:
        text = cls._head(entry)
        text.append(f" {entry.session_id}")
        if not entry.session_id.startswith(entry.profile):  # the id carries a sanitized profile name
            text.append(f" ({entry.profile})")
        if entry.port:
            text.append(f" :{entry.port}", style="dim")
        return text

    @classmethod
    def _prompt(cls, entry: SessionEntry) -> Text:
        text = cls._head(entry)
        text.append(f" {entry.profile}")
        if entry.port:
            text.append(f" :{entry.port}", style="dim")
        if entry.started_at:
            text.append(f" {time.strftime('%H:%M', time.localtime(entry.started_at))}", style="dim")
        text.append(f"  {entry.session_id.rsplit('-', 1)[-1]}", style="dim")
        return text


class PageSafeSelectOverlay(SelectOverlay):
    """A Select's drop-down list with the `can_page` guard (PageUp while it opens or closes)."""

    def _move_page(self, direction: Any) -> None:
        if can_page(self):
            super()._move_page(direction)


class PageSafeSelect(Select):
    """A Select whose drop-down pages safely; otherwise Textual's own."""

    def compose(self) -> ComposeResult:
        yield SelectCurrent(self.prompt)
        yield PageSafeSelectOverlay(type_to_search=self._type_to_search).data_bind(compact=Select.compact)
