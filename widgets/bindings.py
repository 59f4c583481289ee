"""Key specs for the widgets' own bindings (the log view, the confirm modal), and `KeySpec` itself.

Widgets sit below `app/`, so the bindings they declare live here; `app.keymap` builds the whole keymap
(and its `[keys]` remap) from these and the app's own specs.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class KeySpec:
    """One remappable key: its id (used in `[keys]`), default keys, action and help text."""

    id: str
    keys: str
    action: str
    description: str
    show: bool = True
    priority: bool = False
    key_display: str | None = None
    help: str = ""  # a longer line for the help screen

    def binding(self) -> Binding:
        return Binding(
            self.keys,
            self.action,
            self.description,
            show=self.show,
            priority=self.priority,
            key_display=self.key_display,
            tooltip=self.help,
            id=self.id,
        )


LOG_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "log.follow",
        "end,G",
        "follow",
        "Follow",
        show=False,
        help="Jump to the end of the log and follow it again.",
    ),
    KeySpec("log.top", "home,g", "top", "Top", show=False, help="Jump to the first line."),
    KeySpec(
        "log.clear_filter", "escape", "clear_filter", "Clear filter", show=False, help="Clear the log filter."
    ),
)

CONFIRM_KEYS: tuple[KeySpec, ...] = (
    KeySpec("confirm.yes", "y", "answer(True)", "Yes"),
    KeySpec("confirm.no", "n,escape", "answer(False)", "No"),
)

# A question with two answers besides No (ChoiceModal): the GPU-busy launch ("launch anyway" or "stop the
# holder and launch").
CHOICE_KEYS: tuple[KeySpec, ...] = (
    KeySpec("choice.first", "y", "choose(0)", "Yes"),
    KeySpec("choice.second", "s", "choose(1)", "Second answer"),
    KeySpec("choice.no", "n,escape", "choose(-1)", "No"),
)


def bindings(specs: tuple[KeySpec, ...]) -> list[BindingType]:
    return [spec.binding() for spec in specs]
