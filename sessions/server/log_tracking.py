"""The status tracker's side of a session's one log reader (issue 23).

A session's log is read by one `sessions.logs.LogFile` per process (`SessionReader.session_log`), which
the log view shares.  `LogTracking` listens to it: every byte its ``poll()`` reads comes here once, with
its offset, and feeds the startup tracker (phase, ranks, errors, the 1-based line count), the serving
view and the activity clock.  Before the first bytes of a file it syncs: the checkpoint of
`sessions.server.log_checkpoint` is loaded and checked against the open file, then the tracker is caught
up from the checkpoint's offset to where the reader starts (startup from the head, the serving view from
the tail, the middle counted, never parsed), all through the same reader.  A truncation or a rotation
the reader notices starts the tracker over on the new bytes.  So line ``N`` of the tracker is line ``N``
of the reader's view, after appends, truncation and rotation alike.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from sessions.logs import LogFile
from sessions.phases import StartupTracker
from sessions.server import log_checkpoint
from sessions.serving import SessionServing

TAIL_KEEP_BYTES = 8192  # the log's last bytes kept for stall's last lines (DeepGEMM, tqdm renders)
_LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_LINE_TIME = re.compile(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
# uvicorn's access line for one of our probes: `INFO:     127.0.0.1:5433 - "GET /ready HTTP/1.1" 503 ...`
PROBE_ACCESS_LINE = re.compile(rb'"GET /(?:ready|model_info|get_model_info)(?:\?[^ "]*)? HTTP/1\.[01]" \d{3}')


class LogTracking:
    """The tracker, the serving view and the checkpoint of one session's log, fed by its reader."""

    def __init__(self, session_dir: Path, serving: SessionServing) -> None:
        self.session_dir = session_dir
        self.serving = serving
        self.progress = log_checkpoint.LogProgress(StartupTracker())
        self._checkpoint_read = False  # the saved checkpoint is considered once per process
        self._synced = False  # the progress is checked against the file open now, and caught up to it
        self._save_now = True  # a first read (or one after a reset) saves at once
        self._exact = False  # bytes fed now were written by the file's mtime (not a first read's)
        self._saved_offset = -1
        self._saved_at = 0.0

    # -- the reader's listener -------------------------------------------------------------------------

    def log_data(self, log: LogFile, data: bytes, offset: int) -> None:
        if not self._synced:
            self._sync(log, offset)
        progress = self.progress
        if offset < progress.offset:  # the checkpoint went further (it had the unterminated last line)
            data = data[progress.offset - offset:]
            offset = progress.offset
        if not data:
            return
        progress.tracker.feed_bytes(data)
        self.serving.feed_bytes(data)
        progress.offset = offset + len(data)
        progress.identity = log.identity
        progress.fingerprint = (progress.fingerprint + data[-log_checkpoint.FINGERPRINT_BYTES:])[
            -log_checkpoint.FINGERPRINT_BYTES:
        ]
        self._note(data, log.last_mtime, exact=self._exact)
        self._exact = True

    def log_reset(self, log: LogFile) -> None:
        """Truncated or rotated: the next bytes are the new file's, from offset 0."""
        self.progress = log_checkpoint.LogProgress(StartupTracker())
        self.serving.reset()
        self._saved_offset = -1
        self._save_now = True
        self._synced = True  # nothing to catch up: the reader reads the new file from its start
        self._exact = False

    # -- the status's side -----------------------------------------------------------------------------

    def opened(self) -> None:
        """A (new) reader opened the log: check the progress against it before its first bytes."""
        self._synced = False

    def sync(self, log: LogFile) -> None:
        """Catch up to where the reader is (a status whose poll found nothing new still reads the log)."""
        if not self._synced and log.identity is not None:
            self._sync(log, log.read_offset)

    def _sync(self, log: LogFile, offset: int) -> None:
        """Resume from the checkpoint when it is this file's, else from the start; catch the tracker up to
        ``offset`` (where the reader's first bytes start) through the reader's head and tail windows."""
        self._synced = True
        size = log.last_size
        fresh = checked = False  # fresh: the serving view has not seen the log up to the progress's offset
        if not self._checkpoint_read:
            self._checkpoint_read = fresh = True
            saved = log_checkpoint.load(self.session_dir, log, size)  # (checked against this file)
            if saved is not None:
                self.progress, checked = saved, True
                self._saved_offset, self._saved_at = saved.offset, time.monotonic()
        if not checked and not log_checkpoint.still_valid(self.progress, log, size):  # truncated, replaced
            self.progress = log_checkpoint.LogProgress(StartupTracker())
            self._saved_offset = -1
            fresh = True
        progress = self.progress
        progress.identity = log.identity
        self._exact = False
        if progress.offset < offset:
            chunk, _ = log_checkpoint.advance(progress, log, offset)
            progress.offset = offset
            fingerprint = chunk[-log_checkpoint.FINGERPRINT_BYTES:]
            progress.fingerprint = (fingerprint if len(fingerprint) == min(offset, log_checkpoint.FINGERPRINT_BYTES)
                                    else log_checkpoint.fingerprint_at(log, offset))
            self._note(chunk, log.last_mtime, exact=False)
            fresh = True
        if fresh:  # the serving view is not saved: its figures are the latest lines', read from the tail
            self._save_now = True
            self.serving.reset()
            self.serving.feed_bytes(log_checkpoint.serving_tail(log, progress.offset))

    def _note(self, chunk: bytes, mtime: float, exact: bool) -> None:
        if not chunk:
            return
        progress = self.progress
        progress.tail = (progress.tail + chunk[-TAIL_KEEP_BYTES:])[-TAIL_KEEP_BYTES:]
        activity_at = last_activity_at(chunk, mtime, exact)
        if activity_at is not None:
            progress.activity_at = max(activity_at, progress.activity_at or 0.0)

    def save_if_due(self) -> None:
        """Save the checkpoint when the log was read further: on a process's first read, then after
        `SAVE_EVERY_BYTES` more or `SAVE_EVERY_S` (a watcher polls every second: it must not write a file
        every second; a status that found nothing new writes nothing)."""
        progress = self.progress
        now = time.monotonic()
        due = progress.offset != self._saved_offset and (
            self._save_now
            or progress.offset - self._saved_offset >= log_checkpoint.SAVE_EVERY_BYTES
            or now - self._saved_at >= log_checkpoint.SAVE_EVERY_S
        )
        if due and self.session_dir.is_dir() and log_checkpoint.save(self.session_dir, progress):
            self._saved_offset, self._saved_at = progress.offset, now
            self._save_now = False


def last_activity_at(chunk: bytes, mtime: float, exact: bool) -> float | None:
    """When the server last wrote something in ``chunk`` other than the access lines of /ready and
    /model_info probes (uvicorn logs each request): those would keep a hung warmup looking busy.

    ``exact``: the chunk is what the log gained since the previous look, so its non-probe text was
    written by ``mtime``.  A first read of a whole log dates its last non-probe line by its own
    timestamp when probe lines follow it.  None: nothing but probe lines.
    """
    segments = [s for s in re.split(rb"[\r\n]", chunk) if s.strip()]
    for i in range(len(segments) - 1, -1, -1):
        if PROBE_ACCESS_LINE.search(segments[i]):
            continue
        if exact or i == len(segments) - 1:
            return mtime
        match = _LINE_TIME.match(segments[i])
        if match:
            try:
                stamp = time.mktime(time.strptime(match.group(1).decode(), _LOG_TIME_FORMAT))
            except ValueError:
                return mtime
            return min(stamp, mtime)
        return mtime
    return None
