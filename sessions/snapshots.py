"""Snapshot types the engine hands to the screens: small, immutable, defined below the widgets that draw them.

The dashboard's poll (`app.feed`) builds these in a worker thread; widgets only read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions.logs.filter import LogFilter


@dataclass(frozen=True)
class ProfileEntry:
    """One profile as the list shows it; ``error`` when it does not load."""

    name: str
    title: str = ""
    launcher: str = ""
    tp_size: int | None = None
    port: int | None = None
    capture: bool = False
    error: str | None = None
    live_session: str | None = None  # a live session runs this profile
    live_state: str | None = None
    dp_size: int = 1  # SGLang's --dp-size replicas behind the one URL (1: none)


@dataclass(frozen=True)
class SessionEntry:
    """One session as the list shows it."""

    session_id: str
    profile: str
    state: str
    phase: str
    port: int | None
    started_at: float | None
    alive: bool = False  # its main process runs (what `s` can stop)
    # A member of a group of replicas (sessions.server.group): its group id, index and GPUs.
    group: str | None = None
    group_index: int | None = None
    gpus: tuple[int, ...] = ()

    def names(self) -> str:
        """How a question names this session: "profile tiny-llama, port 30000"."""
        return f"profile {self.profile}" + (f", port {self.port}" if self.port else "")


@dataclass(frozen=True)
class LogChunk:
    """What one poll read from the log: the new tail lines, and the new matches of the active filter.

    While the log's lines are still being counted (a big file opened tail first), ``counting`` is True and
    line numbers are provisional: 0 is the first line the feed showed.  The first chunk after the count
    carries ``shift``, the true number of that line: the view adds it to every number it holds.
    """

    path: str
    file_id: int  # changes when the file was rotated or truncated: the view then starts over
    total_lines: int
    lines: tuple[tuple[int, str], ...]  # (0-based line number, shown text), the last ones read
    filter: LogFilter | None  # the filter `matches` were computed for
    matches: tuple[int, ...] = ()
    counting: bool = False
    shift: int = 0
