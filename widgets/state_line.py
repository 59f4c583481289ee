"""StateLine: the selected session in three lines: state and phase, ranks, identity.

It answers the questions the seed accounts asked with ps, ss and curl: is it alive, which phase, for how
long, is the port open (and is a refused port normal right now), does /ready answer, is every rank there.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text

from sessions.phases import StartupPhase, error_headline
from sessions.server import FINAL_STATES
from widgets import units
from widgets.text_lines import TextLines

if TYPE_CHECKING:
    from sessions.server import SessionStatus

STATE_GLYPHS = {
    "starting": ("◐", "state--starting"),
    "ready": ("●", "state--ready"),
    "stalled": ("⚠", "state--stalled"),
    "crashed": ("✖", "state--crashed"),
    "exited": ("○", "state--ended"),
    "stopped": ("■", "state--ended"),
}
# psutil status -> the letter ps shows
_STATUS_LETTERS = {
    "running": "R",
    "sleeping": "S",
    "disk-sleep": "D",
    "stopped": "T",
    "tracing-stop": "t",
    "zombie": "Z",
    "dead": "X",
    "idle": "I",
    "waking": "W",
    "parked": "P",
    "locked": "L",
}
# The HTTP port opens only after every scheduler finished weights, KV cache and CUDA graphs
# (sglang-facts §1.6, `sglang/srt/entrypoints/engine.py:1347-1352`): refused before that is normal.
_PORT_OPENS_AT = StartupPhase.WARMUP


def flow(segments: list[Text], width: int, separator: str = "  · ") -> list[Text]:
    """Join segments with ``separator``, starting a new line where the next one would not fit."""
    lines: list[Text] = []
    current = Text()
    for segment in segments:
        if current.plain and current.cell_len + len(separator) + segment.cell_len > width:
            lines.append(current)
            current = Text()
        if current.plain:
            current.append(separator)
        current.append_text(segment)
    if current.plain or not lines:
        lines.append(current)
    return lines


def state_glyph(state: str) -> tuple[str, str]:
    return STATE_GLYPHS.get(state, ("?", "state--ended"))


def rank_label(rank: Any) -> str:
    """ "TP3" for a scheduler ("DP1 TP0" under a DP controller), "detok" for the detokenizer, "dp" for the
    DP controller."""
    if getattr(rank, "rank", None) is not None:
        dp = getattr(rank, "dp_rank", None)
        return f"TP{rank.rank}" if dp is None else f"DP{dp} TP{rank.rank}"
    role = getattr(rank, "role", "")
    title = getattr(rank, "title", "") or ""
    if role == "detokenizer" or "detokenizer" in title:
        return "detok"
    if role == "dp_controller" or "data_parallel" in title:
        return "dp"
    return "proc"


def _phase_of(value: str) -> StartupPhase | None:
    try:
        return StartupPhase(value)
    except ValueError:
        return None


class StateLine(TextLines):
    """Draws a `SessionStatus` (or a hint when no session is selected)."""

    DEFAULT_CSS = """
    StateLine { height: auto; }
    StateLine > .state--starting { color: $warning; text-style: bold; }
    StateLine > .state--ready { color: $success; text-style: bold; }
    StateLine > .state--stalled { color: $error; text-style: bold reverse; }
    StateLine > .state--crashed { color: $error; text-style: bold; }
    StateLine > .state--ended { color: $text-muted; text-style: bold; }
    StateLine > .state--dim { color: $text-muted; }
    StateLine > .state--bad { color: $error; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "state--starting",
        "state--ready",
        "state--stalled",
        "state--crashed",
        "state--ended",
        "state--dim",
        "state--bad",
    }

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.status: SessionStatus | None = None
        self.hint = "No session. Select a profile and press l to launch it."
        self.now: float | None = None  # tests freeze the clock
        self._updates = 0  # how many times update_status was called (the content key's part for it)

    def on_mount(self) -> None:
        # The clock on the card ("for 0:41") moves every second by itself: a poll that takes long (a GPU
        # check under load, a slow disk) must not make the card look frozen.  Nothing is read here.
        self.set_interval(1.0, self._refresh_for_content, name="state-clock")

    def update_status(self, status: SessionStatus | None, hint: str | None = None) -> None:
        self._updates += 1
        self.status = status
        if hint is not None:
            self.hint = hint
        self._refresh_for_content()

    def _content_key(self, width: int) -> Hashable | None:
        # The clock's tick between polls rebuilt every line each second; the status only changes with
        # `update_status`, so (which update, the width, what the clock shows) is what the lines are drawn from.
        status = self.status
        if status is None:
            return (width, self._updates, None)
        entered = status.phase_entered_at.get(status.phase)
        if status.state in FINAL_STATES or not entered:
            shown: object = None  # no clock, or one that stopped at the end
        else:
            now = self.now if self.now is not None else time.time()
            shown = int((now - entered) // 60) if status.state == "ready" else int(now)
        return (width, self._updates, shown)

    def _lines(self, width: int) -> list[Text]:
        status = self.status
        dim = self.get_component_rich_style("state--dim")
        bad = self.get_component_rich_style("state--bad")
        if status is None:
            return [Text(self.hint, style=dim)]
        now = self.now if self.now is not None else time.time()
        glyph, klass = state_glyph(status.state)
        entered = status.phase_entered_at.get(status.phase)
        ended_at = self._ended_at(status) if status.state in FINAL_STATES else None
        if status.state in FINAL_STATES:
            # How it ended and when: "after 0:11 ready · stopped 06:10:22" (not "ready for", which reads
            # as if it still were); the time in the last phase counts up to the end, not to now.
            lasted = f" {units.duration(ended_at - entered)}" if entered and ended_at else ""
            in_phase = f"after{lasted} {status.phase}" if lasted else f"in {status.phase}"
            if ended_at:
                in_phase += f" · {status.state} {time.strftime('%H:%M:%S', time.localtime(ended_at))}"
            in_phase = f"  {in_phase}"
        elif not entered:
            in_phase = ""
        elif status.state == "ready":  # nothing moves once ready: a coarse clock, so the line stays still
            in_phase = f" for {units.minutes(now - entered)}"
        else:
            in_phase = f" for {units.duration(now - entered)}"
        segments = [
            Text.assemble(
                (f"{glyph} {status.state.upper()}", self.get_component_rich_style(klass)),
                in_phase if status.state in FINAL_STATES else f"  {status.phase}{in_phase}",
            ),
        ]
        if status.alive and status.state != "ready" and status.silent_for_s >= 10:
            limit = getattr(status, "stall_limit_s", None)
            silent = f"log silent {units.duration(status.silent_for_s)}"
            if limit and status.state != "ready":
                silent += f" (stall at {units.duration(limit)})"
            segments.append(Text(silent, style=bad if status.state == "stalled" else dim))
        segments += self._port_segments(status)
        lines = flow(segments, width)
        lines.append(self._ranks_text(status, width))
        error = error_headline(status.summary) if getattr(status.summary, "error", None) else None
        if error and status.state in ("crashed", "exited", "stalled"):
            line = getattr(status.summary, "error_line", None)
            lines.append(Text(f"✖ line {line}: {error}" if line else f"✖ {error}", style=bad))
        if width >= 100:  # narrow terminals: the session id is in the pane title already
            identity = [Text(f"pid {status.pid or units.NA}"), Text(status.session_id)]
            if status.started_at:
                started = time.strftime("%H:%M:%S", time.localtime(status.started_at))
                identity.append(Text(f"started {started}"))
            for line in flow(identity, width):
                line.stylize(dim)
                lines.append(line)
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        return lines

    def _ended_at(self, status: SessionStatus) -> float | None:
        """When an ended session ended: the status carries it (read with the record in the poll)."""
        return getattr(status, "ended_at", None)

    def _port_segments(self, status: SessionStatus) -> list[Text]:
        dim = self.get_component_rich_style("state--dim")
        port = status.port if status.port is not None else units.NA
        if status.port_listening:
            port_text = Text(f"port {port} open")
        elif not status.alive:
            port_text = Text(f"port {port} closed", style=dim)
        else:
            port_text = Text(f"port {port} refused")
            phase = _phase_of(status.phase)
            if phase is not None and phase.order < _PORT_OPENS_AT.order:
                port_text.append(" (normal until CUDA graphs are done)", style=dim)
        ready = status.ready
        answer = "200" if ready is True else "503" if ready is False else "–"
        return [port_text, Text(f"/ready {answer}")]

    def _ranks_text(self, status: SessionStatus, width: int) -> Text:
        text = Text()
        schedulers = [r for r in status.ranks if r.rank is not None]
        # How many there should be: the start's server_args line, else the TP size it was launched with.
        # Unknown (a record without either), the count stands alone: never "ranks 0/n/a".
        expected = (getattr(status.summary, "ranks_expected", None) or status.launch_tp_size
                    or len(schedulers))
        alive = [r for r in schedulers if r.status not in ("zombie", "dead")]
        bad = self.get_component_rich_style("state--bad")
        text.append(
            f"ranks {len(alive)}/{expected}" if expected else f"ranks {len(alive)}",
            style=bad if expected and len(alive) < expected and status.alive else "",
        )
        if not status.ranks:
            text.append(
                "  (no processes)" if not status.alive else "  (none yet)",
                style=self.get_component_rich_style("state--dim"),
            )
            return text
        with_cpu = any(r.cpu_percent is not None for r in status.ranks)
        verbose = with_cpu and width >= 12 * len(status.ranks) + 14
        for rank in status.ranks:
            letter = _STATUS_LETTERS.get(rank.status, "?")
            text.append("  ")
            label = rank_label(rank)
            style = bad if letter in ("Z", "X", "D", "T") else ""
            if verbose:
                cpu = units.percent(rank.cpu_percent)
                text.append(f"{label} {letter} {cpu:>4}", style=style)
            else:
                text.append(
                    f"{label} {letter}" if width >= 7 * len(status.ranks) + 14 else f"{label}:{letter}",
                    style=style,
                )
        return text
