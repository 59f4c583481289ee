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


async def wait_until(pilot: Any, condition: Callable[[], Any], what: str, limit_s: float = 120.0) -> Any:
    """Pause the pilot until ``condition()`` is truthy; returns its value.

    The limit only stops a stuck test; it is generous because CI runs two workers on two busy cores."""
    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            with contextlib.suppress(Exception):  # where the app was stuck (stderr may be captured)
                faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
            raise AssertionError(f"never happened within {limit_s:.0f} s: {what}")
        await pilot.pause(0.05)


def screen_text(app: Any) -> str:
    """The current screen as plain text, one line per terminal row (what a user reads)."""
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
    wait until the app has handled them."""
    app = pilot.app
    driver = app._driver
    for key in keys:
        event = key_event(key)
        event.set_sender(app)
        driver.send_message(event)
    await pilot.pause()
    await pilot.pause()
