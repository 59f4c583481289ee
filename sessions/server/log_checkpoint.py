"""Where a session's log was read to, saved in its folder, so that a status costs the same at any log size.

A week of serving makes a 2 GB log.  A status reads it once: the tracker's state (phase, ranks, errors,
line count) and the byte offset it reached are saved in ``log_checkpoint.json`` (0600, atomic, through
`sessions.home`'s writer), and the next status, in any process, resumes from that offset.  A read that
meets more than `SKIP_ABOVE_BYTES` of new log reads startup from the head (the first `HEAD_BYTES`) and the
serving view from the tail (the last `TAIL_BYTES`); the lines between are counted (C-speed
``bytes.count``), never parsed, so line numbers stay those of ``grep -n``.

A checkpoint is used only when it is this version's (this format, the same parser code), of this file (device and inode), not past its end, and the bytes just before its offset are still
the ones it saw (a log truncated and written again, or replaced, is read from the start).  A damaged file
is read through `sessions.safe_files` (a FIFO or a hard link in its place is refused) and ignored.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sessions.phases as phases_package
from sessions import safe_files
from sessions.home import atomic_write_json, read_json
from sessions.logs import LogFile
from sessions.logs import lines as lines_module
from sessions.phases import StartupTracker
from sessions.phases.checkpoint import CheckpointError, decode_tracker, encode_tracker

CHECKPOINT_FILE = "log_checkpoint.json"
FORMAT = 1
HEAD_BYTES = 8 << 20  # a start's lines, even a TP32 one's, fit in this
SKIP_ABOVE_BYTES = 2 << 20  # more new log than this in one read: head, count, tail
TAIL_BYTES = 64 << 10  # the serving view's lines: ~400, its history is 60 Decode lines
COUNT_BLOCK_BYTES = 16 << 20
FINGERPRINT_BYTES = 64
SAVE_EVERY_BYTES = 1 << 20  # a watcher saves again after this much more log, or after SAVE_EVERY_S
SAVE_EVERY_S = 30.0


@functools.cache
def version_key() -> str:
    """The format and a digest of the code that gives the saved state its meaning (the phase tracker,
    the line rules, this module): a checkpoint written by another eagle3-tui version, or by the same
    version number with another parser, is stale.  Read once per process (~1 ms; no package metadata)."""
    sources = sorted(Path(phases_package.__file__).parent.glob("*.py"))
    sources += [Path(lines_module.__file__), Path(__file__)]
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + safe_files.read_bytes(source, safe_files.SOURCE))
    return f"{FORMAT}/{digest.hexdigest()[:24]}"


@dataclass
class LogProgress:
    """How far a session's log was read, and the tracker's state there."""

    tracker: StartupTracker
    offset: int = 0
    identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
    fingerprint: bytes = b""  # the bytes before ``offset``
    activity_at: float | None = None
    tail: bytes = b""


def fingerprint_at(log: LogFile, offset: int) -> bytes:
    return log.read_range(max(0, offset - FINGERPRINT_BYTES), offset, "fingerprint")


def still_valid(progress: LogProgress, log: LogFile, size: int) -> bool:
    """The file is the one read, at least as long, and unchanged before the offset."""
    if progress.identity is not None and progress.identity != log.identity:
        return False
    if size < progress.offset:
        return False
    return fingerprint_at(log, progress.offset) == progress.fingerprint


def load(session_dir: Path, log: LogFile, size: int) -> LogProgress | None:
    """The saved progress of the log ``log`` reads, when it is valid for it (else None: read afresh)."""
    try:
        doc = read_json(session_dir / CHECKPOINT_FILE, kind=safe_files.SESSION_RECORD)
    except OSError:  # a FIFO or a hard link in its place: not read, the log is read from the start
        return None
    if not isinstance(doc, dict) or doc.get("version") != version_key():
        return None
    try:
        offset, dev, ino = int(doc["offset"]), int(doc["dev"]), int(doc["ino"])
        progress = LogProgress(
            tracker=decode_tracker(doc["tracker"]),
            offset=offset,
            identity=(dev, ino),
            fingerprint=str(doc["fingerprint"]).encode("latin-1"),
            activity_at=float(doc["activity_at"]) if doc.get("activity_at") is not None else None,
            tail=str(doc.get("tail", "")).encode("latin-1"),
        )
    except (CheckpointError, KeyError, TypeError, ValueError, UnicodeError):
        return None
    return progress if offset >= 0 and still_valid(progress, log, size) else None


def save(session_dir: Path, progress: LogProgress) -> bool:
    """Write the progress (atomic, 0600); False when it cannot be (a tracker value the codec does not
    know, a folder that is gone or not writable): the next status then reads the log again."""
    if progress.identity is None:
        return False
    try:
        doc: dict[str, Any] = {
            "version": version_key(),
            "offset": progress.offset,
            "dev": progress.identity[0],
            "ino": progress.identity[1],
            "fingerprint": progress.fingerprint.decode("latin-1"),
            "activity_at": progress.activity_at,
            "tail": progress.tail.decode("latin-1"),
            "saved_at": time.time(),
            "tracker": encode_tracker(progress.tracker),
        }
        atomic_write_json(session_dir / CHECKPOINT_FILE, doc)
    except (CheckpointError, OSError):
        return False
    return True


def advance(progress: LogProgress, log: LogFile, size: int) -> tuple[bytes, bool]:
    """Feed the tracker the log from ``progress.offset`` up to ``size``, read through the session's one
    reader ``log``; returns (the bytes read last, whether lines were skipped).  The bytes read last are the
    whole increment, or the tail after a skip.  ``progress.offset`` is not moved: the caller does."""
    start = progress.offset
    if size - start <= SKIP_ABOVE_BYTES:
        data = log.read_range(start, size, "catch-up")
        progress.tracker.feed_bytes(data)
        return data, False
    if start < HEAD_BYTES:  # startup lines come from the head
        head = log.read_range(start, HEAD_BYTES, "catch-up")
        progress.tracker.feed_bytes(head)
        start += len(head)
    tail_from = max(start, log.line_start_after(size - TAIL_BYTES, size))
    progress.tracker.skip_lines(log.count_newlines(start, tail_from, COUNT_BLOCK_BYTES))
    data = log.read_range(tail_from, size, "catch-up")
    progress.tracker.feed_bytes(data)
    return data, True


def serving_tail(log: LogFile, size: int) -> bytes:
    """The log's last `TAIL_BYTES` before ``size``, from a line start: what the serving view is read from
    afresh."""
    return log.read_range(log.line_start_after(max(0, size - TAIL_BYTES), size), size, "serving-tail")
