"""Helpers for the TUI tests: wait on app state (never on the clock), read the screen as text, snapshots.

`wait_until` polls a condition between Pilot pauses; its limit only stops a test that would otherwise
hang, and the failure names what never happened.  Text snapshots live in ``tests/snapshots/*.txt``;
``EAGLE3_UPDATE_SNAPSHOTS=1`` rewrites them (review the diff before committing).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console

SNAPSHOT_DIR = Path(__file__).resolve().parent / "snapshots"
UPDATE_ENV = "EAGLE3_UPDATE_SNAPSHOTS"


# Each app run by `App.run_test` gets an event that its message hook sets whenever any of its message pumps
# dispatches a message (a poll's result, a worker's state change, a timer, a key): `wait_until` sleeps on it,
# so a test wakes when the app did something, as harlequin's tests wait on messages, not on a clock.  The
# event lives on the app (this module is imported under two names, `_tui_support` and `tests._tui_support`).
_ACTIVITY_ATTR = "_eagle3_test_activity"


def install_message_waits() -> None:
    """Wrap `App.run_test` so every test app reports its messages to `wait_until` (conftest calls this);
    a test's own ``message_hook`` still gets every message.

    Textual hands the hook to its pumps through a context variable (`textual._context.message_hook`, private:
    used here only) that `run_test` sets in the app's own task.  A pump inherits the context of the task
    that starts it, so a screen the test body pushes itself (``await app.push_screen(BenchScreen(home))``)
    and every widget on it dispatched their messages unseen: `wait_until` woke only on other pumps' messages
    (the dashboard's 1 s timers), and slept through a whole compare once those timers rested while hidden.
    The wrapper sets the same hook in the test body's context too, so every pump reports, whoever started it."""
    from textual._context import message_hook as message_hook_context_var
    from textual.app import App

    if getattr(App.run_test, "_eagle3_waits", False):
        return
    original = App.run_test

    @contextlib.asynccontextmanager
    async def run_test(self: Any, *args: Any, message_hook: Callable[[Any], None] | None = None,
                       **kwargs: Any) -> Any:
        activity = asyncio.Event()
        setattr(self, _ACTIVITY_ATTR, activity)

        def hook(message: Any) -> None:
            activity.set()
            if message_hook is not None:
                message_hook(message)

        async with original(self, *args, message_hook=hook, **kwargs) as pilot:
            token = message_hook_context_var.set(hook)  # the test body's context: see the docstring
            try:
                yield pilot
            finally:
                message_hook_context_var.reset(token)

    run_test._eagle3_waits = True  # type: ignore[attr-defined]
    App.run_test = run_test  # type: ignore[method-assign]


# A condition can also turn true with no message dispatched: a loop timer (the type-ahead's flight and settle
# limits run on the event loop, not as messages), a subprocess ending, a file written by a server.  Waking only
# on messages then sleeps until the limit (the fuzz test's seed-1 burst: its last key's flight ended by the
# loop timer, and nothing dispatched after it).  So the wait also re-checks at this interval; a condition that
# never holds still fails at the limit.
RECHECK_S = 0.25


async def wait_until(pilot: Any, condition: Callable[[], Any], what: str, limit_s: float = 120.0) -> Any:
    """Wait until ``condition()`` is truthy, re-checking each time the app dispatches a message (its workers'
    results and polls arrive as messages); returns its value.

    The limit only stops a stuck test; it is generous because CI runs two workers on two busy cores."""
    deadline = time.monotonic() + limit_s
    activity: asyncio.Event | None = getattr(pilot.app, _ACTIVITY_ATTR, None)
    while True:
        value = condition()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            with contextlib.suppress(Exception):  # where the app was stuck (stderr may be captured)
                faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
            raise AssertionError(f"never happened within {limit_s:.0f} s: {what}")
        if activity is None:  # install_message_waits not called (a script, not pytest): pause a little
            await pilot.pause(0.05)
            continue
        activity.clear()
        with contextlib.suppress(TimeoutError):  # also re-check now and then: see RECHECK_S
            await asyncio.wait_for(activity.wait(), timeout=min(left, RECHECK_S))
        await pilot.pause()  # let what that message started (a render) finish before checking


def screen_text(app: Any) -> str:
    """The current screen as plain text, one line per terminal row (what a user reads).

    This is the render call of Textual's own `App.export_screenshot` (private `_compositor`, kept in this
    one place), printed as text instead of SVG.  pytest-textual-snapshot 1.1.0 was considered instead: it
    pins syrupy==4.8.0, which needs pytest<9 (this project runs pytest 9), and it compares SVGs, whose diffs
    a reviewer cannot read the way these text snapshots read."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system=None,
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens, simplify=True)
    )
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def assert_snapshot(name: str, text: str) -> None:
    """Compare ``text`` with ``tests/snapshots/<name>.txt`` (rewrite it with EAGLE3_UPDATE_SNAPSHOTS=1)."""
    path = SNAPSHOT_DIR / f"{name}.txt"
    if os.environ.get(UPDATE_ENV) == "1":
        SNAPSHOT_DIR.mkdir(exist_ok=True)
        path.write_text(text + "\n")
        return
    assert path.exists(), f"no snapshot {path}: run with {UPDATE_ENV}=1 once and review it"
    expected = path.read_text().removesuffix("\n")  # exactly the newline written above
    if text != expected:
        actual = path.with_suffix(".actual.txt")
        actual.write_text(text + "\n")
        raise AssertionError(f"screen differs from {path} (actual written to {actual}):\n{text}")


def screen_host(make_screen: Callable[[], Any]) -> Any:
    """A bare Textual app that opens on ``make_screen()``: one screen tested without the dashboard."""
    from textual.app import App

    class ScreenHost(App):
        def on_mount(self) -> None:
            self.push_screen(make_screen())

    return ScreenHost()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


async def first_poll(pilot: Any, app: Any, polls: int = 1) -> None:
    await wait_until(
        pilot,
        lambda: app.dashboard is not None and app.dashboard.poll_count >= polls,
        f"{polls} dashboard poll(s)",
    )
    await pilot.pause()


def key_event(key: str) -> Any:
    """The `Key` event a terminal key press becomes (as `Pilot.press` builds it)."""
    import unicodedata

    from textual import events
    from textual.keys import REPLACED_KEYS, _character_to_key, _get_unicode_name_from_key

    if len(key) == 1 and not key.isalnum():
        key = _character_to_key(key)
    try:
        char: str | None = unicodedata.lookup(_get_unicode_name_from_key(REPLACED_KEYS.get(key, key)))
    except KeyError:
        char = key if len(key) == 1 else None
    return events.Key(key, char)


async def burst(pilot: Any, *keys: str) -> None:
    """Send ``keys`` the way a paste or type-ahead over SSH arrives: all queued at once, with no pause
    between them (`Pilot.press` waits for the app to go idle after each key, which hides lost keys), then
    wait until the app has handled them: Eagle3App hands out a burst one key at a time (app.typeahead), so
    after the App has read them all, wait until none is left waiting or in hand."""
    app = pilot.app
    driver = app._driver
    for key in keys:
        event = key_event(key)
        event.set_sender(app)
        driver.send_message(event)
    await pilot.pause()
    await wait_until(pilot, lambda: not getattr(getattr(app, "typeahead", None), "busy", False),
                     f"the app handled the burst {' '.join(keys)[:80]!r}")
    await pilot.pause()
