"""ActionLine: one line with a spinner that says what a running action is doing now and for how long.

A launch may wait for the home's launch lock or for the GPU check (NVML, or every process's memory under
load) for many seconds; without a line that moves, the TUI looked frozen (issue 21 item 10).  The action's
worker thread calls `step` and `finish`, which only set fields under a lock; the widget's own timer, on the
UI thread, draws them.  Nothing here waits on or reads anything.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.text import Text
from textual.timer import Timer

from widgets.text_lines import TextLines

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
TICK_S = 0.2


class ActionLine(TextLines):
    """Hidden unless an action runs; ``start`` (UI thread), ``step`` / ``finish`` (any thread)."""

    DEFAULT_CSS = "ActionLine { height: auto; display: none; color: $warning; }"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._title: str | None = None
        self._step = ""
        self._started = 0.0
        self._frame = 0
        self._timer: Timer | None = None

    def on_mount(self) -> None:
        # The spinner's timer runs only while an action runs: idle, a 5 Hz timer woke the event loop five
        # times a second for nothing, most of the idle TUI's wake-ups (issue 23).
        self._timer = self.set_interval(TICK_S, self._tick, name="action-line", pause=self._title is None)

    def start(self, title: str) -> None:
        with self._lock:
            self._title, self._step, self._started = title, "", time.monotonic()
        self.display = True
        if self._timer is not None:
            self._timer.resume()
        self._refresh_for_content()

    def step(self, text: str) -> None:
        with self._lock:
            self._step = text

    def finish(self) -> None:
        with self._lock:
            self._title = None

    @property
    def text(self) -> str:
        """What the line says now ("" when no action runs)."""
        return self._lines(200)[0].plain if self._title is not None else ""

    def _tick(self) -> None:
        with self._lock:
            running = self._title is not None
        if not running:
            if self.display:
                self.display = False
            if self._timer is not None:
                self._timer.pause()
            return
        self._frame += 1
        self.display = True
        self._refresh_for_content()

    def _lines(self, width: int) -> list[Text]:
        with self._lock:
            title, step, started = self._title, self._step, self._started
        if title is None:
            return []
        spin = SPINNER[self._frame % len(SPINNER)]
        waited = time.monotonic() - started
        text = Text(f"{spin} {title}: {step or 'starting'} · {waited:.0f}s")
        text.truncate(width, overflow="ellipsis")
        return [text]
