"""`LogFilter`: which lines to show, by text, ``/regex/`` (or ``re:regex``) and rank; the TUI and the CLI share it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sessions.logs.lines import LogLine

MAIN_RANK = -1  # the rank filter value for lines without a rank (main process, uvicorn, library output)


@dataclass(frozen=True)
class LogFilter:
    """Show only lines matching ``text`` and ``rank``.

    ``text`` is a case-insensitive substring, or a regular expression when written ``/regex/`` or
    ``re:regex`` (then case-insensitive too unless it sets its own flags).  ``rank`` is a TP rank,
    `MAIN_RANK` for lines without one, or None for all.  Matching looks at what the line shows (its
    cleaned text) and at the rank the log core attributed to it.
    """

    text: str = ""
    rank: int | None = None
    _pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    _literal: str | None = field(default=None, compare=False, repr=False)  # a plain substring filter's text

    @classmethod
    def parse(cls, text: str, rank: int | None = None) -> LogFilter:
        """Build a filter from what the user typed; raises ValueError naming the bad regex."""
        text = text.strip()
        source: str | None = None
        if len(text) >= 2 and text.startswith("/") and text.endswith("/"):
            source = text[1:-1]
        elif text.startswith("re:"):
            source = text[3:]
        if source is not None:
            try:
                pattern = re.compile(source, re.IGNORECASE) if source else None
            except re.error as exc:
                raise ValueError(f"filter {text!r}: bad regular expression: {exc}") from None
        else:
            pattern = re.compile(re.escape(text), re.IGNORECASE) if text else None
        if rank is not None and rank < MAIN_RANK:
            raise ValueError(f"filter rank {rank}: a rank is 0 or more (or main)")
        return cls(text, rank, pattern, text if source is None and text else None)

    @property
    def active(self) -> bool:
        return self._pattern is not None or self.rank is not None

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """The compiled text pattern (for highlighting matches), None when only the rank filters."""
        return self._pattern

    @property
    def literal(self) -> str | None:
        """The text of a plain substring filter (a scan may look for it in the bytes first), else None."""
        return self._literal

    def matches(self, line: LogLine) -> bool:
        if self.rank is not None and (MAIN_RANK if line.rank is None else line.rank) != self.rank:
            return False
        return self._pattern is None or self._pattern.search(line.text) is not None

    def describe(self) -> str:
        parts = []
        if self.text:
            parts.append(self.text)
        if self.rank is not None:
            parts.append("main" if self.rank == MAIN_RANK else f"TP{self.rank}")
        return " · ".join(parts)
