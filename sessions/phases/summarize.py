"""One-shot summaries of a whole static log (text, bytes or a file): a `StartupTracker` fed to the end."""

from __future__ import annotations

from pathlib import Path

from sessions.logs.source import iter_blocks
from sessions.phases.model import StartupSummary
from sessions.phases.tracker import StartupTracker


def summarize_text(text: str) -> StartupSummary:
    """The summary of a whole static log given as text."""
    tracker = StartupTracker()
    tracker.feed_text(text)
    tracker.flush()
    return tracker.summary()


def summarize_bytes(data: bytes) -> StartupSummary:
    """The summary of a whole static log given as bytes (decoded as UTF-8 with replacement)."""
    tracker = StartupTracker()
    tracker.feed_bytes(data)
    tracker.flush()
    return tracker.summary()


def summarize_file(path: str | Path, max_bytes: int | None = None) -> StartupSummary:
    """The summary of a static log file, read in 8 MiB blocks by the log core (memory stays bounded for any
    size; a FIFO or a device is a `sessions.logs.LogFileError` at once)."""
    tracker = StartupTracker()
    for block in iter_blocks(path, max_bytes):
        tracker.feed_bytes(block)
    tracker.flush()
    return tracker.summary()