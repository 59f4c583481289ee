"""The command palette, with the two guarantees the rest of the app has: every key of a burst lands in
order in its input, and PageUp/PageDown while its list refills (height 0) do nothing instead of raising.

`Eagle3App.action_command_palette` opens `SafeCommandPalette`.  The layout is Textual's own; only the
input and the list are the burst-safe and page-safe subclasses (`widgets.inputs`, `widgets.lists`).
"""

from __future__ import annotations

from typing import Any

from textual import events, work
from textual.app import ComposeResult
from textual.command import CommandInput, CommandList, CommandPalette, SearchIcon
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import Button, LoadingIndicator

from widgets.inputs import run_own_binding
from widgets.lists import can_page


class InOrderCommandInput(CommandInput):
    """The palette's search field; editing keys take effect in the order typed (see `widgets.inputs`)."""

    async def _on_key(self, event: events.Key) -> None:
        if await run_own_binding(self, event):
            return
        await super()._on_key(event)


class PageSafeCommandList(CommandList, can_focus=False):
    """The palette's result list; paging while it has no rows on screen is a no-op (`can_page`)."""

    def _move_page(self, direction: Any) -> None:
        if can_page(self):
            super()._move_page(direction)


class SafeCommandPalette(CommandPalette):
    """Textual's command palette with `InOrderCommandInput` and `PageSafeCommandList`, whose search worker
    survives the palette closing under it."""

    @work(exclusive=True, group=CommandPalette._GATHER_COMMANDS_GROUP)
    async def _gather_commands(self, search_value: str) -> None:
        # A search that starts while the palette is being dismissed (a key typed into it, then Esc, in one
        # burst) finds its list already removed; Textual's worker then raises NoMatches and the app exits.
        gather = CommandPalette._gather_commands.__wrapped__  # type: ignore[attr-defined]  # Textual's own search
        try:
            await gather(self, search_value)
        except NoMatches:
            if self.is_attached and self.query(CommandList):
                raise  # a missing widget of a palette still open is a real error

    def compose(self) -> ComposeResult:
        with Vertical(id="--container"):
            with Horizontal(id="--input"):
                yield SearchIcon()
                yield InOrderCommandInput(placeholder=self._placeholder, select_on_focus=False)
                if not self.run_on_select:
                    yield Button("\u25b6")
            with Vertical(id="--results"):
                yield PageSafeCommandList()
                yield LoadingIndicator()
