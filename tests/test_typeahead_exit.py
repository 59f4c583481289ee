"""Keys held by the type-ahead never wait for good: when an action ends the app (the palette's Quit, a binding
that calls `exit()`, an exception Textual ends the app on) with keys typed after it still held, the App's
loop ends and nothing would ever dispatch them; they are dropped there (`TypeAheadApp._process_messages_loop`).

Before, `typeahead.busy` stayed true for good after such a quit: the fuzz test (seed 1, "ctrl+p space enter"
ran the palette's first command, Quit) then waited 120 s on a burst that no loop would ever finish."""

from __future__ import annotations

from typing import ClassVar

import pytest
from textual.app import ComposeResult
from textual.widgets import Input

from app.typeahead import TypeAheadApp
from tests._tui_support import key_event, run, wait_until
from widgets.inputs import InOrderInput


class _Ending(TypeAheadApp[None]):
    """``f5`` ends the app from an action that is not the quit binding (as the palette's Quit command is run),
    so the type-ahead's own quit-key check (`_quits`) does not see it coming; ``f6`` raises in an action."""

    BINDINGS: ClassVar = [("f5", "leave", "Leave"), ("f6", "fail", "Fail")]

    def compose(self) -> ComposeResult:
        yield InOrderInput(id="field")

    def action_leave(self) -> None:
        self.exit()

    def action_fail(self) -> None:
        raise RuntimeError("an action that fails ends the app (Textual's rule)")


@pytest.mark.parametrize("ending", ["f5", "f6"])
def test_keys_typed_after_an_action_that_ends_the_app_are_dropped_not_held_for_ever(ending):
    async def scenario() -> None:
        app = _Ending()
        with pytest.raises(RuntimeError) if ending == "f6" else _nothing():
            async with app.run_test() as pilot:
                # The field does not take f5 or f6: they bubble to the App, whose binding ends it; the keys after
                # them are typed ahead, in the same burst, before the App has read the first.
                for key in ("a", ending, "b", "c", "d", "e"):
                    event = key_event(key)
                    event.set_sender(app)
                    app._driver.send_message(event)
                await wait_until(pilot, lambda: not app.is_running, "the app ended")
                await wait_until(pilot, lambda: not app.typeahead.busy, "no key held once the app ended",
                                 limit_s=10)
                assert app.query_one("#field", Input).value == "a"  # typed before the end; nothing after it

    run(scenario)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False
