"""`TextLines`: a widget drawn as a list of Rich lines that repaints only when those lines change.

The dashboard polls every second; most polls change nothing on screen, and a repaint (or a reflow) per
poll was a measurable share of the TUI's CPU (DESIGN §8: < 3 % of a core).
"""
from __future__ import annotations

from collections.abc import Hashable

from rich.text import Text
from textual.widget import Widget


class TextLines(Widget):
    """Subclasses implement `_lines(width)`; call `_refresh_for_content()` after changing their state."""

    def _lines(self, width: int) -> list[Text]:
        raise NotImplementedError

    def _content_key(self, width: int) -> Hashable | None:
        """What the lines are drawn from, when cheaper to compare than the lines; None: build and compare."""
        return None

    def _refresh_for_content(self) -> None:
        """Repaint only when what is drawn changed, and re-run the layout only when the number of lines
        changed: a poll every second must not repaint (or reflow) a screen that looks the same."""
        width = self.size.width
        if not width:
            self.refresh(layout=True)
            return
        key = self._content_key(width)
        if key is not None and key == getattr(self, "_drawn_key", None):
            return
        self._drawn_key = key
        drawn = self._lines(width)
        if drawn == getattr(self, "_drawn", None):
            return
        self._drawn = drawn
        self.refresh(layout=len(drawn) != self.size.height)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._lines(max(1, width)))

    def render(self) -> Text:
        return Text("\n").join(self._lines(max(1, self.size.width)))
