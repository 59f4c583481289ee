"""LogView: the server log, drawn from a window of lines; never the whole file.

The widget holds no file handle: the dashboard's poll worker reads new lines (`LogChunk`) and the lines
the view asks for (`LogView.NeedLines`) in a thread, and hands them over, cleaned, ranked and redacted by
the log core (`sessions.logs`); the view only draws.  A big log arrives tail first: while its lines are
being counted the numbers are provisional, and the chunk after the count shifts them into place.  The view keeps an LRU of
line texts, so its memory and its render cost depend on the window, not on the log (toolong's idea;
SGLang at --log-level debug across 8 ranks writes gigabytes).

Follow mode sticks to the end; scrolling up pauses it and counts the lines that arrive meanwhile
(toolong, k9s); scrolling back to the end, or `end`, follows again.  A filter (text, /regex/, rank) turns
the view into the list of matching line numbers, built by a scan worker and extended by each poll.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, ClassVar, Self

from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from sessions.logs import MAIN_RANK, PREFIX_RE, LogFilter
from sessions.snapshots import LogChunk
from widgets.bindings import LOG_KEYS, bindings

__all__ = ["MAIN_RANK", "LogChunk", "LogFilter", "LogView", "is_error_line"]

_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b\w*(?:Error|Exception)\b|out of memory|Scheduler hit an exception"
    r"|scheduler died|Capture cuda graph failed|Initialization failed|address already in use|\bFATAL\b"
    r"|\bCRITICAL\b|watchdog timeout|Received sigquit",
    re.IGNORECASE,
)
_WARNING = re.compile(r"\bWARNING\b|\bwarn(?:ing)?:|deprecated", re.IGNORECASE)
# The multi-node view's merged log: each line starts with its node ("n1 [2026-... TP2] ...").
_NODE_PREFIX = re.compile(r"n\d+ ")
def is_error_line(line: str) -> bool:
    return bool(_ERROR.search(line))


class LogView(Widget, can_focus=True):
    """A window onto a log file: follow, scroll, filter, wrap, timestamps, error highlighting."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "scroll_lines(-1)", "Up", show=False),
        Binding("down,j", "scroll_lines(1)", "Down", show=False),
        Binding("pageup,ctrl+b", "scroll_page(-1)", "Page up", show=False),
        Binding("pagedown,ctrl+f,space", "scroll_page(1)", "Page down", show=False),
        Binding("left,h", "scroll_columns(-8)", "Left", show=False),
        Binding("right", "scroll_columns(8)", "Right", show=False),
        *bindings(LOG_KEYS),
    ]
    DEFAULT_CSS = """
    LogView { height: 1fr; min-height: 3; }
    LogView > .log--error { color: $error; text-style: bold; }
    LogView > .log--warning { color: $warning; }
    LogView > .log--dim { color: $text-muted; }
    LogView > .log--match { text-style: reverse; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"log--error", "log--warning", "log--dim", "log--match"}

    wrap: reactive[bool] = reactive(False)
    show_timestamps: reactive[bool] = reactive(True)
    follow: reactive[bool] = reactive(True)

    CACHE_LINES = 4000  # enough for a few screens of a 250x70 terminal, wrapped or not

    class NeedLines(Message):
        """The view needs these line numbers of ``path`` (not in its cache)."""

        def __init__(self, path: str, line_numbers: tuple[int, ...]) -> None:
            super().__init__()
            self.path = path
            self.line_numbers = line_numbers

    class StateChanged(Message):
        """Follow/pending/filter changed: the pane title should be redrawn."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.path: str | None = None
        self._file_id = 0
        self._total = 0
        self._cache: OrderedDict[int, str] = OrderedDict()
        self._filter: LogFilter | None = None
        self._matches: list[int] | None = None
        self.filter_scanning = False
        self._top = 0  # first visible index in view space (used when not following)
        self.pending = 0
        self._x = 0
        self._requested: set[int] = set()
        self._strip_cache: OrderedDict[tuple, list[Strip]] = OrderedDict()
        self.needs_scan = False
        self.counting = False  # the feed is still counting the log's lines: numbers are provisional
        self.placeholder = "No session selected: launch a profile with l."
        self.node_prefixed = False  # lines start with "nR " (the merged log of a multi-node server)

    # -- data in ----------------------------------------------------------------------------------------

    @property
    def log_filter(self) -> LogFilter | None:
        return self._filter

    @property
    def total_lines(self) -> int:
        return self._total

    @property
    def view_count(self) -> int:
        return len(self._matches) if self._matches is not None else self._total

    def show_file(self, path: str | None, placeholder: str | None = None) -> None:
        """Switch to another log (or none); the filter stays."""
        if placeholder is not None:
            self.placeholder = placeholder
        if path == self.path:
            return
        self.path = path
        self._reset()
        self.refresh()
        self.post_message(self.StateChanged())

    def _reset(self) -> None:
        self._file_id = 0
        self._total = 0
        self._cache.clear()
        self._strip_cache.clear()
        self._requested.clear()
        self._matches = [] if self._filter is not None and self._filter.active else None
        self.filter_scanning = self._matches is not None
        self.needs_scan = self._matches is not None  # the owner runs a filter scan of the new file
        self._top = 0
        self.pending = 0
        self.follow = True
        self.counting = False

    def _shift(self, by: int) -> None:
        """The lines held are really ``by`` further down the file (the feed finished counting)."""
        self._cache = OrderedDict((number + by, text) for number, text in self._cache.items())
        self._strip_cache.clear()
        self._requested.clear()
        if self._matches is not None:
            self._matches = [number + by for number in self._matches]
        elif not self.follow:
            self._top += by

    def apply_chunk(self, chunk: LogChunk) -> None:
        """Take what a poll read; ignored when it is for another file."""
        if chunk.path != self.path:
            return
        restarted = bool(self._file_id and chunk.file_id != self._file_id)
        if restarted:  # rotated or truncated: start over
            self._reset()
        self._file_id = chunk.file_id
        if chunk.shift:
            self._shift(chunk.shift)
            restarted = True  # everything drawn moved: repaint
        if self.counting and not chunk.counting and self._matches is not None:
            self.needs_scan = True  # a scan made while counting had provisional numbers: scan again
        self.counting = chunk.counting
        before = self.view_count
        top_before = self._current_top()
        self._total = chunk.total_lines
        for number, text in chunk.lines:
            self._remember(number, text)
        if self._matches is not None and chunk.filter == self._filter:
            known = self._matches[-1] if self._matches else -1
            self._matches.extend(n for n in chunk.matches if n > known)
        added = self.view_count - before
        if not self.follow and added > 0:
            self.pending += added
        # Repaint only when the window shows something new: following, or paused with room left in it.
        # New lines that no filter matches, or that arrive below a paused window, change nothing drawn.
        if restarted or (added and (self.follow or before < top_before + self._page_rows())):
            self.refresh()
        if added:
            self.post_message(self.StateChanged())

    def add_lines(self, path: str, lines: dict[int, str]) -> None:
        """Lines fetched for a `NeedLines` request."""
        if path != self.path:
            return
        for number, text in lines.items():
            self._requested.discard(number)
            self._remember(number, text)
        self.refresh()

    def set_filter(self, log_filter: LogFilter | None) -> None:
        """Apply a filter; the dashboard then runs a scan and calls `set_filter_matches`."""
        if log_filter is not None and not log_filter.active:
            log_filter = None
        self._filter = log_filter
        self._matches = [] if log_filter is not None else None
        self.filter_scanning = log_filter is not None
        self._top = 0
        self.pending = 0
        self.follow = True
        self.refresh()
        self.post_message(self.StateChanged())

    def set_filter_matches(
        self, path: str, log_filter: LogFilter, matches: list[int], scanned: int, done: bool = True
    ) -> None:
        """Results of a filter scan over lines [0, scanned); polls report the lines after those."""
        if path != self.path or log_filter != self._filter or self._matches is None:
            return
        if self.counting:  # the scan's numbers are exact, the view's not yet: rescanned after the count
            self.needs_scan = True
            return
        later = [n for n in self._matches if n >= scanned]
        self._matches = list(matches) + later
        self.filter_scanning = not done
        self.refresh()
        self.post_message(self.StateChanged())

    def _remember(self, number: int, text: str) -> None:
        cache = self._cache
        cache[number] = text
        cache.move_to_end(number)
        while len(cache) > self.CACHE_LINES:
            cache.popitem(last=False)

    # -- moving around ----------------------------------------------------------------------------------

    def _page_rows(self) -> int:
        return max(1, self.size.height)

    def _max_top(self) -> int:
        return max(0, self.view_count - self._page_rows())

    def _scroll_to_line(self, top: int) -> None:
        max_top = self._max_top()
        if top >= max_top:  # reaching the end follows again (toolong's tail)
            self.action_follow()
            return
        if self.follow:
            self.follow = False
            self.pending = 0
        self._top = max(0, top)
        self.refresh()
        self.post_message(self.StateChanged())

    def _current_top(self) -> int:
        return self._max_top() if self.follow else min(self._top, self._max_top())

    def action_scroll_lines(self, delta: int) -> None:
        self._scroll_to_line(self._current_top() + delta)

    def action_scroll_page(self, pages: int) -> None:
        self._scroll_to_line(self._current_top() + pages * max(1, self._page_rows() - 1))

    def action_scroll_columns(self, delta: int) -> None:
        if self.wrap:
            return
        self._x = max(0, self._x + delta)
        self.refresh()

    def action_follow(self) -> None:
        self.follow = True
        self.pending = 0
        self._x = 0
        self.refresh()
        self.post_message(self.StateChanged())

    def action_top(self) -> None:
        if self.view_count > self._page_rows():
            self.follow = False
            self.pending = 0
            self._top = 0
            self.refresh()
            self.post_message(self.StateChanged())

    def action_clear_filter(self) -> None:
        if self._filter is not None:
            self.set_filter(None)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.action_scroll_lines(-3)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.action_scroll_lines(3)

    def watch_wrap(self) -> None:
        self._x = 0
        self.refresh()

    def watch_show_timestamps(self) -> None:
        self.refresh()

    # -- drawing ----------------------------------------------------------------------------------------

    def title_text(self) -> str:
        """The log pane's title: follow or paused (with pending lines), the filter, wrap and timestamps."""
        parts = ["4 Log"]
        if self.follow:
            parts.append("following")
        else:
            pending = f" · {self.pending:,} new (End follows)" if self.pending else " (End follows)"
            parts.append("paused" + pending)
        if self.log_filter is not None:
            scanning = " scanning…" if self.filter_scanning else ""
            parts.append(f"filter {self.log_filter.describe()}{scanning}")
        parts.extend(name for name, on_ in (("wrap", self.wrap), ("no time", not self.show_timestamps)) if on_)
        return " · ".join(parts)

    def position_text(self) -> str:
        """ "lines 1,200-1,224 of 52,311 · following" for the pane title."""
        count = self.view_count
        if count == 0:
            return "empty" if self.path else ""
        top = self._current_top()
        last = min(count, top + self._page_rows())
        what = "matches" if self._matches is not None else "lines"
        text = f"{what} {top + 1:,}-{last:,} of {count:,}"
        if self._matches is not None:
            text += f" (of {self._total:,} lines)"
        if self.counting:
            text += " · counting lines…"
        return text

    def render_line(self, y: int) -> Strip:
        rows = self._rows()
        style = self.rich_style
        if y >= len(rows):
            return Strip.blank(self.size.width, style)
        return rows[y]

    def visible_text(self) -> str:
        """What the view shows now, as plain text (one row per line)."""
        return "\n".join(strip.text.rstrip() for strip in self._rows())

    def notify_style_update(self) -> None:
        self._strip_cache.clear()  # a theme change: the cached colours are stale
        super().notify_style_update()

    def refresh(self, *args: Any, **kwargs: Any) -> Self:
        self._rows_cache: tuple[tuple[int, int], list[Strip]] | None = None
        return super().refresh(*args, **kwargs)

    def _rows(self) -> list[Strip]:
        """The visible rows as strips, built once per change (render_line is called per row)."""
        width = max(1, self.size.width)
        key = (width, self.size.height)
        cached = getattr(self, "_rows_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        strips = self._row_strips(width, self.size.height)
        self._rows_cache = (key, strips)
        return strips

    def _to_strip(self, row: Text, width: int) -> Strip:
        style = self.rich_style
        segments = list(row.render(self.app.console, end=""))
        return Strip(segments).crop_extend(0, width, style).apply_style(style).simplify()

    def _row_strips(self, width: int, height: int) -> list[Strip]:
        if self.path is None or (self.view_count == 0 and not self.filter_scanning):
            message = (
                self.placeholder
                if self.path is None
                else ("no lines match the filter" if self._matches is not None else "the log is empty so far")
            )
            return [self._to_strip(Text(message, style=self.get_component_rich_style("log--dim")), width)]
        count = self.view_count
        rows: list[Strip] = []
        missing: list[int] = []
        if self.follow:
            index = count - 1
            while index >= 0 and len(rows) < height:
                rows[0:0] = self._line_strips(index, width, missing)
                index -= 1
            rows = rows[-height:] if height else []
        else:
            index = min(self._top, self._max_top())
            while index < count and len(rows) < height:
                rows.extend(self._line_strips(index, width, missing))
                index += 1
            rows = rows[:height]
        if missing and self.path is not None:
            wanted = tuple(n for n in missing if n not in self._requested)
            if wanted:
                self._requested.update(wanted)
                self.post_message(self.NeedLines(self.path, wanted))
        return rows

    def _line_strips(self, index: int, width: int, missing: list[int]) -> list[Strip]:
        """One log line's rows, rendered once per look (following a chatty log re-renders only new lines)."""
        number = self._line_number(index)
        if number not in self._cache:
            missing.append(number)
            return [self._to_strip(Text("…", style=self.get_component_rich_style("log--dim")), width)]
        pattern = self._filter.pattern.pattern if self._filter is not None and self._filter.pattern else None
        key = (number, width, self.wrap, self.show_timestamps, self._x, pattern)
        strips = self._strip_cache.get(key)
        if strips is None:
            strips = [self._to_strip(row, width) for row in self._line_rows(index, width, missing)]
            self._strip_cache[key] = strips
            while len(self._strip_cache) > self.CACHE_LINES:
                self._strip_cache.popitem(last=False)
        return strips

    def _line_number(self, index: int) -> int:
        return self._matches[index] if self._matches is not None else index

    def _line_rows(self, index: int, width: int, missing: list[int]) -> list[Text]:
        number = self._line_number(index)
        raw = self._cache.get(number)
        if raw is None:
            missing.append(number)
            return [Text("…", style=self.get_component_rich_style("log--dim"))]
        line = self._styled(raw)
        error = is_error_line(raw)
        gutter = Text(
            "! " if error else "  ", style=self.get_component_rich_style("log--error") if error else ""
        )
        if self.wrap:
            wrapped = line.wrap(self.app.console, max(1, width - 2), overflow="fold", no_wrap=False)
            rows = list(wrapped) or [Text("")]
            return [Text.assemble(gutter if i == 0 else Text("  "), row) for i, row in enumerate(rows)]
        if self._x:
            line = line[self._x :]
        return [Text.assemble(gutter, line)]

    def _styled(self, raw: str) -> Text:
        """One log line as styled text: dim timestamp, the rank tag, error/warning colours."""
        text = Text()
        node = _NODE_PREFIX.match(raw) if self.node_prefixed else None
        if node is not None:
            text.append(node.group(0), style="bold")
            raw = raw[node.end() :]
        match = PREFIX_RE.match(raw)
        body = raw
        if match is not None:
            ranks = match.group("ranks").strip()
            if self.show_timestamps:
                text.append(f"[{match.group('ts')}", style=self.get_component_rich_style("log--dim"))
                text.append(f" {ranks}]" if ranks else "]", style="bold" if ranks else "")
                text.append(" ")
            elif ranks:
                text.append(f"[{ranks}] ", style="bold")
            body = raw[match.end() :]
        if is_error_line(raw):
            text.append(body, style=self.get_component_rich_style("log--error"))
        elif _WARNING.search(body):
            text.append(body, style=self.get_component_rich_style("log--warning"))
        else:
            text.append(body)
        if self._filter is not None and self._filter.pattern is not None:
            text.highlight_regex(self._filter.pattern, style=self.get_component_rich_style("log--match"))
        return text


class LogPane(Vertical):
    """The dashboard's pane 4, holding the log view; `f` maximizes it (Esc or f restores)."""

    ALLOW_MAXIMIZE = True
