"""HelpScreen: every key with its binding id (as remapped), and the few facts a first-time user needs.

It scrolls (arrows, PgUp/PgDn, Home/End), because a help screen cut off in an 80x24 SSH terminal is
useless (dolphie#1).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from app.keymap import (
    APP_KEYS,
    DASHBOARD_KEYS,
    EDITOR_KEYS,
    LOG_KEYS,
    NODES_KEYS,
    KeySpec,
    effective_keys,
    key_label,
)

_NOTES = """\
Servers run detached: quitting the TUI (q) or losing the SSH connection never stops them; the next
eagle3-tui reattaches.  During startup the HTTP port stays closed until every rank has loaded its
weights, allocated the KV cache and captured CUDA graphs, so "port refused" then is normal.
The log pane follows the end; scroll up to pause it (new lines are counted), End to follow again.
Filter: text, or /regex/, plus a rank; Esc in the log clears it."""


class HelpScreen(ModalScreen[None]):
    """All keys, grouped by where they work."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close", key_display="Esc"),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown,space", "page(1)", show=False),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 100%; max-width: 110; height: 100%; max-height: 46;
        border: thick $accent; background: $surface;
    }
    HelpScreen #help-body { height: 1fr; padding: 0 1; }
    HelpScreen #help-footer { height: 1; color: $text-muted; padding: 0 1; }
    """

    def __init__(self, keymap: dict[str, str], config_file: Path | None = None) -> None:
        super().__init__()
        self.keymap = keymap
        self.config_file = config_file

    def compose(self) -> ComposeResult:
        with Vertical():
            with VerticalScroll(id="help-body"):
                yield Static(self._body(), id="help-text")
            yield Static("↑/↓ PgUp/PgDn scroll · Esc or ? closes", id="help-footer")

    def on_mount(self) -> None:
        self.query_one(Vertical).border_title = "Help · eagle3-tui"
        self.query_one("#help-body").focus()

    def _body(self) -> Table:
        keys = effective_keys(self.keymap)
        show_ids = self.app.size.width >= 100
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(ratio=1)
        if show_ids:
            grid.add_column(no_wrap=True, style="dim")

        def row(key: str, text: str | Text, binding_id: str = "") -> None:
            if show_ids:
                grid.add_row(key, text, binding_id)
            elif binding_id:  # narrow: the id goes under the text, so remapping stays possible
                grid.add_row(key, Text.assemble(text, "\n", (binding_id, "dim")))
            else:
                grid.add_row(key, text)

        def title(text: str) -> None:
            row("", Text(text, style="bold underline"))

        sections: list[tuple[str, tuple[KeySpec, ...]]] = [
            ("Everywhere", APP_KEYS),
            ("Dashboard", DASHBOARD_KEYS),
            ("Log pane (pane 4)", LOG_KEYS),
            ("Profile editor", EDITOR_KEYS),
            ("Multi-node view (Enter on a Multi-node card)", NODES_KEYS),
        ]
        for heading, specs in sections:
            title(heading)
            for spec in specs:
                row(key_label(keys[spec.id]), spec.help or spec.description, spec.id)
            row("", "")
        title("Log scrolling")
        row("↑ ↓ j k", "one line (scrolling up pauses following)")
        row("PgUp PgDn", "one page")
        row("← →", "scroll sideways when wrap is off")
        row("", "")
        where = str(self.config_file) if self.config_file else "<config>/config.toml"
        title("Remapping keys")
        row(
            "",
            f'In {where}, section [keys]: "binding.id" = "key" (several keys: "a,ctrl+a"). '
            "Each key's binding id is shown with it above.",
        )
        row("", "")
        title("Good to know")
        row("", _NOTES)
        return grid

    def action_page(self, pages: int) -> None:
        body = self.query_one("#help-body", VerticalScroll)
        if pages < 0:
            body.scroll_page_up()
        else:
            body.scroll_page_down()
