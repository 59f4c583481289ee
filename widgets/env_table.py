"""EnvTable: the `[server.env]` of a profile as an editable table; secret values are shown masked.

Enter edits the highlighted row, `a`/ctrl+n adds one, Delete/`x` removes one.  A value whose name looks
secret (`sessions.redaction.is_secret_name`) is never drawn: the editor dialog shows it masked too, and
leaving it unchanged keeps the stored value.
"""

from __future__ import annotations

import re
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, Static

from sessions.redaction import REDACTED, is_secret_name
from widgets.inputs import InOrderInput

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def shown_value(name: str, value: str) -> str:
    return REDACTED if is_secret_name(name) and value else value


class EnvRowModal(ModalScreen[tuple[str, str] | None]):
    """Add or edit one variable; returns (name, value) or None."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    EnvRowModal { align: center middle; }
    EnvRowModal > Vertical { width: 80%; max-width: 90; height: auto; border: thick $accent;
                             background: $surface; padding: 0 1; }
    EnvRowModal #env-error { color: $error; height: auto; }
    EnvRowModal #env-buttons { height: auto; align-horizontal: right; }
    EnvRowModal Button { margin-left: 2; }
    """

    def __init__(self, name: str = "", value: str = "", taken: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self._env_name = name  # (not _name: that is the widget name of Textual's DOMNode)
        self._value = value
        self._taken = taken
        self._secret = is_secret_name(name) and bool(value)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Name")
            yield InOrderInput(self._env_name, placeholder="NCCL_ALGO", id="env-name")
            yield Label("Value" + (" (secret: leave as *** to keep it)" if self._secret else ""))
            yield InOrderInput(
                shown_value(self._env_name, self._value), id="env-value", password=self._secret
            )
            yield Static("", id="env-error")
            with Horizontal(id="env-buttons"):
                yield Button("OK", id="env-ok", variant="primary")
                yield Button("Cancel", id="env-cancel")

    def on_mount(self) -> None:
        self.query_one("#env-name" if not self._env_name else "#env-value", Input).focus()

    def on_input_submitted(self) -> None:
        self._accept()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "env-ok":
            self._accept()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _accept(self) -> None:
        name = self.query_one("#env-name", Input).value.strip()
        value = self.query_one("#env-value", Input).value
        if not _ENV_NAME.match(name):
            self.query_one("#env-error", Static).update(
                f"env name {name!r}: use letters, digits and _, not starting with a digit"
            )
            return
        if name != self._env_name and name in self._taken:
            self.query_one("#env-error", Static).update(f"env name {name!r} is already in the table")
            return
        if self._secret and value == REDACTED:
            value = self._value
        self.dismiss((name, value))


class EnvTable(DataTable):
    """The env of a profile; `env` holds the real values, the table shows masked ones."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "edit_row", "Edit var", show=True),
        Binding("a,ctrl+n", "add_row", "Add var", show=True),
        Binding("delete,x", "delete_row", "Delete var", show=True),
    ]

    class Changed(Message):
        """The env was edited."""

        def __init__(self, env: dict[str, str]) -> None:
            super().__init__()
            self.env = env

    def __init__(self, env: dict[str, str] | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.env: dict[str, str] = dict(env or {})

    def on_mount(self) -> None:
        self.add_columns("name", "value")
        self._redraw()

    def _redraw(self, keep: str | None = None) -> None:
        self.clear()
        for name, value in self.env.items():
            self.add_row(name, shown_value(name, value), key=name)
        if not self.env:
            self.add_row("(none)", "press a to add a variable", key="")
        if keep and keep in self.env:
            self.move_cursor(row=list(self.env).index(keep))

    def _current_name(self) -> str | None:
        if not self.env or self.cursor_row is None:
            return None
        names = list(self.env)
        return names[self.cursor_row] if 0 <= self.cursor_row < len(names) else None

    def action_add_row(self) -> None:
        self.app.push_screen(EnvRowModal(taken=frozenset(self.env)), self._set_row)

    def action_edit_row(self) -> None:
        name = self._current_name()
        if name is None:
            self.action_add_row()
            return
        self.app.push_screen(
            EnvRowModal(name, self.env[name], frozenset(self.env)),
            lambda row: self._set_row(row, replacing=name),
        )

    def action_delete_row(self) -> None:
        name = self._current_name()
        if name is not None:
            del self.env[name]
            self._redraw()
            self.post_message(self.Changed(dict(self.env)))

    def _set_row(self, row: tuple[str, str] | None, replacing: str | None = None) -> None:
        if row is None:
            return
        name, value = row
        if replacing is not None and replacing != name:
            # Keep the order: the renamed variable takes the old one's place.
            self.env = {
                (name if k == replacing else k): (value if k == replacing else v) for k, v in self.env.items()
            }
        else:
            self.env[name] = value
        self._redraw(keep=name)
        self.post_message(self.Changed(dict(self.env)))
