"""ServingLine: once a session is ready, how fast it serves: gen throughput with a short sparkline,
running and queued requests, KV token usage, and the accept length when speculative decoding logs one.

It draws a `sessions.serving.ServingSnapshot` (the session status's ``serving``); before the first stats line
of a ready server it says so, and it takes no room for a server that is not ready.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.timer import Timer

from widgets import units
from widgets.state_line import flow
from widgets.text_lines import TextLines

if TYPE_CHECKING:
    from sessions.server import SessionStatus
    from sessions.serving import ServingSnapshot

SPARK_WIDTH = 16


def serving_segments(serving: ServingSnapshot | None, now: float | None = None) -> list[Text]:
    """The parts of the line (also used by tests and the bench screen)."""
    if serving is None:
        return [Text("serving: no Decode/Prefill batch line yet (send a request, or press b to bench)",
                     style="dim")]
    now = now or time.time()
    if serving.idle:
        # The present: nothing runs.  The last busy figures would read as if a bench were still going.
        parts = [Text.assemble(("idle", "bold"), ("  running 0  queued 0", "dim"))]
        if serving.token_usage is not None:
            parts.append(Text.assemble(("KV ", "dim"), f"{serving.token_usage * 100:.0f}%"))
        if serving.last_batch_at is not None:
            since = units.duration(max(0.0, now - serving.last_batch_at))
            parts.append(Text(f"last batch {since} ago · {serving.source}", style="dim"))
        return parts
    history = list(serving.history)[-SPARK_WIDTH:]
    peak = max(history) if history else 0.0
    gen = serving.gen_throughput
    parts = [Text.assemble(("gen ", "dim"), (f"{gen:.1f}" if gen is not None else units.NA, "bold"),
                           (" tok/s", "dim"))]
    if history and peak > 0:
        parts[0].append(" " + units.sparkline(history, len(history), maximum=peak), style="green")
    parts.append(Text.assemble(("running ", "dim"), str(_or_na(serving.running_reqs)), ("  queued ", "dim"),
                               str(_or_na(serving.queue_reqs))))
    usage = serving.token_usage
    parts.append(Text.assemble(("KV ", "dim"), f"{usage * 100:.0f}%" if usage is not None else units.NA))
    if serving.accept_length is not None:
        rate = f" ({serving.accept_rate:.2f})" if serving.accept_rate is not None else ""
        parts.append(Text.assemble(("accept len ", "dim"), f"{serving.accept_length:.2f}{rate}"))
    if serving.updated_at is not None:
        age = max(0.0, now - serving.updated_at)
        parts.append(Text(f"{units.duration(age)} ago · {serving.source}", style="dim"))
    return parts


def _or_na(value: Any) -> Any:
    return units.NA if value is None else value


class ServingLine(TextLines):
    """One line (two on a narrow pane) under the session's state; hidden unless the session is ready."""

    DEFAULT_CSS = "ServingLine { height: auto; display: none; }"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._serving: ServingSnapshot | None = None
        self._ready = False
        self._age_timer: Timer | None = None

    def on_mount(self) -> None:
        # "12s ago" keeps counting while ready; hidden (not ready), the line draws nothing and its timer rests
        self._age_timer = self.set_interval(1.0, self._refresh_for_content, name="serving-age", pause=not self._ready)

    def update_status(self, status: SessionStatus | None) -> None:
        self._ready = status is not None and status.state == "ready"
        self._serving = status.serving if status is not None else None
        self.display = self._ready
        timer = self._age_timer
        if timer is not None and self._ready:
            timer.resume()
        elif timer is not None:
            timer.pause()
        self._refresh_for_content()

    def _content_key(self, width: int) -> Hashable | None:
        s = self._serving
        if s is None:
            return (width, self._ready, None)
        # the age text changes once a second: part of the key
        return (width, self._ready, s.idle, s.gen_throughput, s.running_reqs, s.queue_reqs, s.token_usage,
                s.accept_length, s.updated_at, s.last_batch_at, tuple(s.history), int(time.time()))

    def _lines(self, width: int) -> list[Text]:
        if not self._ready:
            return []
        head = Text("serving  ", style="bold")
        segments = serving_segments(self._serving)
        segments[0] = head + segments[0]
        return flow(segments, width)
