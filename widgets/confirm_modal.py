"""ConfirmModal: a y/N question in front of every destructive action (stop, restart, discard edits).

The default is No: Enter on the focused "No" button, Esc and n all answer No; only y or the "Yes"
button answer Yes (k9s#302: users could not confirm when focus was not on OK, so both keys always work).
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from widgets.bindings import CHOICE_KEYS, CONFIRM_KEYS, bindings


class DismissOnce:
    """Mixin for a Screen: only its first `dismiss` counts.

    Two answers in one burst (Enter, Enter; y, y: a paste, or type-ahead over SSH) both reach the screen
    before it is popped.  Textual's `Screen.dismiss` would then run the result callback twice (its future
    raises InvalidStateError, which ends the app) and pop a second screen, the one below.
    """

    _dismissed = False

    def dismiss(self, result: Any = None) -> AwaitComplete:
        if self._dismissed:
            return AwaitComplete()
        self._dismissed = True
        return super().dismiss(result)  # type: ignore[misc]


def question_layout(question: str, detail: str, answers: list[Button]) -> ComposeResult:
    """The body of every question modal here: the question, ``detail`` scrollable below it (when there is
    one), then the answer buttons, right-aligned (the CSS of `ConfirmModal` styles these ids)."""
    with Vertical():
        yield Static(question, id="question", markup=False)
        if detail:
            with VerticalScroll(id="detail-scroll"):
                yield Static(detail, id="detail", markup=False)
        with Horizontal(id="buttons"):
            yield from answers


class ConfirmModal(DismissOnce, ModalScreen[bool]):
    """Ask ``question``; ``detail`` (e.g. a flag diff) is shown below it, scrollable."""

    BINDINGS = bindings(CONFIRM_KEYS)
    DEFAULT_CSS = """
    ConfirmModal { align: center middle; }
    ConfirmModal > Vertical {
        width: 90%; max-width: 100; height: auto; max-height: 90%;
        border: thick $warning; background: $surface; padding: 0 1;
    }
    ConfirmModal #question { text-style: bold; margin-bottom: 1; }
    ConfirmModal #detail-scroll { height: auto; max-height: 20; }
    ConfirmModal #buttons { height: auto; align-horizontal: right; margin-top: 1; }
    ConfirmModal Button { margin-left: 2; min-width: 10; }
    """

    def __init__(
        self, question: str, detail: str = "", yes_label: str = "Yes (y)", no_label: str = "No (N)"
    ) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self._yes_label = yes_label
        self._no_label = no_label

    def compose(self) -> ComposeResult:
        yield from question_layout(self.question, self.detail, [
            Button(self._yes_label, id="yes", variant="warning"),
            Button(self._no_label, id="no", variant="primary"),
        ])

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ChoiceModal(DismissOnce, ModalScreen[str]):
    """A question with up to two answers besides No: ``choices`` are (value, label) pairs; y picks the
    first, s the second, n / Esc / Enter on the focused No button answer ``"no"``."""

    BINDINGS = bindings(CHOICE_KEYS)
    DEFAULT_CSS = ConfirmModal.DEFAULT_CSS.replace("ConfirmModal", "ChoiceModal")

    def __init__(self, question: str, detail: str, choices: list[tuple[str, str]], no_label: str = "No (N)") -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.choices = list(choices)[:2]
        self._no_label = no_label

    def compose(self) -> ComposeResult:
        yield from question_layout(self.question, self.detail, [
            *(Button(label, id=f"choice-{i}", variant="warning") for i, (_value, label) in enumerate(self.choices)),
            Button(self._no_label, id="no", variant="primary"),
        ])

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()
        self._fit_detail()

    def on_resize(self) -> None:
        self._fit_detail()

    def _fit_detail(self) -> None:
        # The answers must stay on screen at 80x24: the detail scrolls in what the question and buttons leave.
        scrolls = self.query("#detail-scroll")
        if scrolls:
            scrolls.first().styles.max_height = max(3, min(20, self.size.height - 12))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        button_id = event.button.id or "no"
        self.action_choose(int(button_id.removeprefix("choice-")) if button_id.startswith("choice-") else -1)

    def action_choose(self, index: int) -> None:
        if 0 <= index < len(self.choices):
            self.dismiss(self.choices[index][0])
        elif index < 0:
            self.dismiss("no")
