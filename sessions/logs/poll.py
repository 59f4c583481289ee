"""What a `sessions.logs.file.LogFile` poll gives (`PollResult`), who else takes its bytes (`LogListener`:
the status tracker), and what the reader has read (`ReadStats`: a test or a bench asks how often each byte
was read without mocking the file system)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sessions.logs.lines import LogLine


@dataclass(frozen=True, slots=True)
class PollResult:
    """What ``poll()`` found since the last call."""

    lines: tuple[LogLine, ...] = ()  # new complete lines, in order
    truncated: bool = False  # the file shrank (or was rewritten) under us: reading restarted at 0
    rotated: bool = False  # another file now has the path: the old one was drained, the new one is read
    partial: str | None = None  # the unterminated last line as shown (a tqdm bar being drawn)
    more: bool = False  # more bytes are waiting beyond this poll's budget
    exists: bool = True  # False while the path does not exist (the server has not created it yet)
    gap: bool = False  # (``view_poll``) lines were dropped while the view did not take them: start over


@dataclass
class ReadStats:
    """What a `LogFile` has read, all of it through its own ``_pread``/``_fstat``: a test or a bench asks
    how often each byte was read without mocking the file system."""

    bytes_read: int = 0  # every byte read (by_purpose["probe"]: the byte before the offset, for truncation)
    reads: int = 0
    stats: int = 0  # stat/fstat calls
    polls: int = 0
    by_purpose: dict[str, int] = field(default_factory=dict)  # bytes per purpose ("poll", "index", ...)


class LogListener(Protocol):
    """A consumer of a log's raw bytes (the status tracker): called by ``poll()``, under the log's lock.
    ``log`` is the `sessions.logs.file.LogFile` that read them (typed Any here: that module imports this one)."""

    def log_data(self, log: Any, data: bytes, offset: int) -> None:
        """``data`` are the file's bytes at ``offset``: every byte ``poll()`` read, in order."""

    def log_reset(self, log: Any) -> None:
        """The file was truncated or another file took the path: what follows is read from offset 0."""
