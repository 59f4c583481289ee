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
            self._drawn = None
            self.refresh(layout=True)
            return
        key = self._content_key(width)
        if key is not None and key == getattr(self, "_drawn_key", None):
            return
        self._drawn_key = key
        drawn = self._lines(width)
        if drawn == getattr(self, "_drawn", None) and width == getattr(self, "_drawn_width", None):
            return
        self._drawn, self._drawn_width = drawn, width
        self.refresh(layout=len(drawn) != self.size.height)

    def _lines_at(self, width: int) -> list[Text]:
        """The lines at ``width``: those `_refresh_for_content` just built when the width is theirs.  The
        repaint it asks for (and the layout's height query) used to build every line again (issue 23)."""
        drawn = getattr(self, "_drawn", None)
        if drawn is not None and width == getattr(self, "_drawn_width", None):
            return drawn
        drawn = self._lines(width)
        self._drawn, self._drawn_width, self._drawn_key = drawn, width, None
        return drawn

    def notify_style_update(self) -> None:
        # The lines carry component styles (colours of the theme): a new theme or class draws them anew.
        self._drawn = self._drawn_key = None
        super().notify_style_update()

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._lines_at(max(1, width)))

    def render(self) -> Text:
        return Text("\n").join(self._lines_at(max(1, self.size.width)))
