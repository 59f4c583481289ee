"""A server log as the UI reads it: the tail first, any window of lines on demand, new lines as they come.

toolong's way (STYLE.md): the file is never loaded.  An index of newline counts per 256 KiB block is
built with C-speed ``bytes.count`` over ``os.pread`` chunks, lazily or in a background thread; line text
is read with ``os.pread`` and kept in a bounded LRU.  Opening a 2 GB log reads only its end: the tail is
found by scanning backwards for newlines, and line numbers appear once the index has counted that far.

What toolong lacks is here too: ``poll()`` notices truncation (size below the read offset, or the byte
before it no longer a newline) and rotation (another inode at the path: the old file is drained first),
and says so.  Every line is cleaned and ranked by `sessions.logs.lines` (a line read out of order takes
the rank of the lines before it), and filtered by `sessions.logs.filter.LogFilter`.  The file is opened
by `sessions.logs.source.open_log`: a FIFO, a device, a directory or a socket is an error at once.

It is also the one reader of a session's log (issue 23): the status tracker and the log view of one
process share one `LogFile` (`sessions.server.status.SessionReader.session_log`).  ``poll()`` reads each
new byte once and hands it to every listener (``add_listener``: the tracker gets raw bytes, with their
offset, and hears of a truncation or rotation) and, when a view is attached (``attach_view``), queues the
lines for ``view_poll``; the index counts the new bytes from memory, not by reading them again.  The
tracker's head and tail windows (``read_range``, ``count_newlines``, ``line_start_after``) read through the
same object, and every byte read is counted in ``stats`` (`ReadStats`).  Line numbers are 1-based ``\n``
lines everywhere, as ``grep -n`` counts them.

All public methods take one lock, so a worker thread may poll while another builds the index.
"""
from __future__ import annotations

import os
import re
import threading
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Self

from sessions.logs.filter import LogFilter
from sessions.logs.lines import INHERIT, LogLine, clean, own_rank, rank_from_context
from sessions.logs.poll import LogListener, PollResult, ReadStats
from sessions.logs.source import open_log

BLOCK_BYTES = 256 * 1024  # index granularity: one newline count per block
INDEX_STEP_BYTES = 16 << 20  # bytes counted per index step (the lock is held that long, ~10 ms)
BACKGROUND_STEP_BYTES = 4 << 20  # the background count's step, then a pause that yields the GIL
BACKGROUND_PAUSE_S = 0.001
ROTATION_DRAIN_BYTES = 256 << 20  # what is read of a rotated-away file before switching
POLL_MAX_BYTES = 8 << 20  # per poll; `PollResult.more` says when more is waiting (back-pressure)
TAIL_SCAN_BYTES = 1 << 20
LINE_HEAD_BYTES = 32 * 1024  # a longer line is shown as head … tail
LINE_TAIL_BYTES = 8 * 1024
CACHE_MAX_CHARS = 16 << 20  # the LRU of decoded lines holds at most this much text
CONTEXT_BYTES = 64 * 1024  # read back this far for the rank a continuation line inherits
_MARK = " \u2026 ".encode()
# Chunks where a plain substring found in the bytes is also where it is in the shown text (no escapes,
# tabs or control characters that cleaning would change): only the lines holding it are decoded.
_CLEANING_BYTES_RE = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")
_UNKNOWN = object()
VIEW_QUEUE_LINES = 100_000  # lines queued for a view that does not take them: past this, it restarts


def _cut(data: bytes) -> bytes:
    if len(data) <= LINE_HEAD_BYTES + LINE_TAIL_BYTES + len(_MARK):
        return data
    return data[:LINE_HEAD_BYTES] + _MARK + data[-LINE_TAIL_BYTES:]


def _decode(data: bytes) -> str:
    raw = _cut(data).decode("utf-8", "replace")
    return raw.rstrip("\r") if raw.endswith("\r") else raw


class LogFile:
    """A log file opened for viewing and following. Cheap to open whatever its size.

    ``follow_from="end"`` (default) makes ``poll()`` start after the last complete line at open time, as
    a tail does; ``"start"`` makes it deliver the whole file first, in ``POLL_MAX_BYTES`` steps.
    """

    def __init__(self, path: str | Path, follow_from: str = "end", *, lines: bool = True) -> None:
        if follow_from not in ("end", "start"):
            raise ValueError(f"follow_from must be 'end' or 'start', not {follow_from!r}")
        self.path = Path(path)
        self._follow_from = follow_from
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self.stats = ReadStats()
        self._listeners: list[LogListener] = []
        # ``poll()`` builds `LogLine`s only for someone who reads them (``lines``, or an attached view); the
        # tracker alone needs the bytes, and a status of a session nobody views decodes no line.
        self._build_lines = self._lines_wanted = lines
        self._view_queue: list[PollResult] | None = None  # results not yet taken by the attached view
        self._view_queued_lines = 0
        self._last_size = 0  # the file's size at the last poll
        self._last_mtime = 0.0
        self._reset_state()
        self._index_thread: threading.Thread | None = None
        self._stop_index = threading.Event()
        self._open_if_there()

    @classmethod
    def open(cls, path: str | Path, follow_from: str = "end") -> LogFile:
        return cls(path, follow_from)

    # -- state -----------------------------------------------------------------------------------------

    def _reset_state(self) -> None:
        self._cum = array("q", [0])  # newlines before each block boundary (block b starts at b * BLOCK_BYTES)
        self._indexed_to = 0  # bytes counted so far
        self._partial_nl = 0  # newlines in [last boundary, _indexed_to)
        self._follow_offset = 0  # poll() has delivered every complete line before this offset
        self._read_to = 0  # poll() has read the file up to here (the rest of it is in _pending)
        self._next_number: int | None = 1
        self._pending = bytearray()  # the unterminated last line read by poll (head + tail when huge)
        self._pending_cut = False
        self._cache: OrderedDict[int, LogLine] = OrderedDict()
        self._cache_chars = 0
        self._rank: object = None  # rank of the last line poll() delivered (None at the file's start)

    # -- reading, counted ---------------------------------------------------------------------------

    def _pread(self, n: int, offset: int, purpose: str = "read") -> bytes:
        assert self._fd is not None
        data = os.pread(self._fd, n, offset)
        stats = self.stats
        stats.reads += 1
        stats.bytes_read += len(data)
        stats.by_purpose[purpose] = stats.by_purpose.get(purpose, 0) + len(data)
        return data

    def _fstat(self) -> os.stat_result:
        assert self._fd is not None
        self.stats.stats += 1
        return os.fstat(self._fd)

    def read_range(self, start: int, end: int, purpose: str = "window") -> bytes:
        """The file's bytes in [start, end) (fewer at its end): the tracker's head and tail windows."""
        with self._lock:
            if self._fd is None or end <= start:
                return b""
            return self._pread(end - start, start, purpose)

    def count_newlines(self, start: int, end: int, block: int = 16 << 20) -> int:
        """Newlines in [start, end), counted at C speed in blocks, never decoded."""
        count = 0
        with self._lock:
            while start < end and self._fd is not None:
                data = self._pread(min(block, end - start), start, "count")
                if not data:
                    break
                count += data.count(b"\n")
                start += len(data)
        return count

    def line_start_after(self, offset: int, limit: int) -> int:
        """The start of the first line that begins at or after ``offset`` (``limit`` when none does)."""
        if offset <= 0:
            return 0
        pos = offset - 1
        with self._lock:
            while pos < limit and self._fd is not None:
                data = self._pread(min(1 << 16, limit - pos), pos, "window")
                nl = data.find(b"\n")
                if nl >= 0:
                    return pos + nl + 1
                if not data:
                    break
                pos += len(data)
        return limit

    @property
    def identity(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of the file open now (None while there is none)."""
        return self._identity

    @property
    def last_size(self) -> int:
        """The file's size as of the last ``poll()`` (what it has read up to, with its unterminated line)."""
        return self._last_size

    @property
    def last_mtime(self) -> float:
        """The file's mtime as of the last ``poll()``."""
        return self._last_mtime

    @property
    def read_offset(self) -> int:
        """``poll()`` has read the file up to here (its listeners have had every byte before it)."""
        return self._read_to

    # -- consumers ---------------------------------------------------------------------------------

    def add_listener(self, listener: LogListener) -> None:
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def attach_view(self) -> None:
        """A log view reads this file from now on: polls build lines and queue them for ``view_poll``."""
        with self._lock:
            self._build_lines = True
            if self._view_queue is None:
                self._view_queue = []
                self._view_queued_lines = 0

    def detach_view(self) -> None:
        with self._lock:
            self._view_queue = None
            self._view_queued_lines = 0
            self._build_lines = self._lines_wanted

    @property
    def has_view(self) -> bool:
        return self._view_queue is not None

    def view_poll(self, max_bytes: int = POLL_MAX_BYTES) -> PollResult:
        """What the view has not seen: the polls since it last asked, merged (a poll of its own when there
        was none since: the file is read once per poll, whoever asks first)."""
        with self._lock:
            if self._view_queue is None:
                self.attach_view()
            if not self._view_queue:
                self.poll(max_bytes)
            queued = self._view_queue or []
            self._view_queue = []
            self._view_queued_lines = 0
            if len(queued) == 1:
                return queued[0]
            if not queued:
                return PollResult()
            last = queued[-1]
            return PollResult(
                tuple(line for r in queued for line in r.lines),
                truncated=any(r.truncated for r in queued),
                rotated=any(r.rotated for r in queued),
                partial=last.partial,
                more=last.more,
                exists=last.exists,
                gap=any(r.gap for r in queued),
            )

    def _queue_for_view(self, result: PollResult) -> None:
        queue = self._view_queue
        if queue is None:
            return
        self._view_queued_lines += len(result.lines)
        if self._view_queued_lines > VIEW_QUEUE_LINES:  # nobody takes them: the view starts over
            queue[:] = [replace(result, lines=(), gap=True)]
            self._view_queued_lines = 0
        else:
            queue.append(result)

    def _context_rank(self, offset: int) -> int | None:
        """The rank a continuation line at ``offset`` inherits, read back from the lines before it."""
        if self._fd is None or offset <= 0:
            return None
        start = max(0, offset - CONTEXT_BYTES)
        parts = self._pread(offset - start, start, "context").split(b"\n")
        if parts and parts[-1] == b"":
            parts.pop()
        if start > 0 and parts:
            parts = parts[1:]  # cut in the middle
        return rank_from_context([clean(_decode(p)) for p in parts])

    def _line(self, number: int | None, data: bytes, offset: int, previous: object = _UNKNOWN) -> LogLine:
        """A cleaned, ranked line; ``previous`` is the rank of the line before it, when the reader knows it."""
        raw = _decode(data)
        text = clean(raw)
        rank = own_rank(text)
        if rank == INHERIT:
            rank = self._context_rank(offset) if previous is _UNKNOWN else previous  # type: ignore[assignment]
        return LogLine(number, raw, text, rank, offset)

    def _open_if_there(self, from_start: bool = False) -> bool:
        try:
            fd = open_log(self.path)  # a FIFO, device, directory or socket: LogFileError, at once
        except (FileNotFoundError, NotADirectoryError):
            return False
        self.stats.stats += 1
        st = os.fstat(fd)
        self._fd = fd
        self._identity = (st.st_dev, st.st_ino)
        self._reset_state()
        if self._follow_from == "end" and not from_start:
            self._follow_offset = self._read_to = self._last_newline_end(st.st_size)
            self._next_number = None if self._follow_offset else 1
            self._rank = _UNKNOWN if self._follow_offset else None
        return True

    def close(self) -> None:
        self._stop_index.set()
        thread = self._index_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._fstat().st_size if self._fd is not None else 0

    @property
    def delivered_offset(self) -> int:
        """``poll()`` has delivered every complete line before this byte offset (at open: where it starts)."""
        with self._lock:
            return self._follow_offset

    # -- the index -------------------------------------------------------------------------------------

    def _newlines_before_indexed(self) -> int:
        return self._cum[-1] + self._partial_nl

    def index_step(self, max_bytes: int = INDEX_STEP_BYTES) -> bool:
        """Count newlines in up to ``max_bytes`` more of the file; True once the index reaches its end."""
        with self._lock:
            if self._fd is None:
                return True
            size = self._fstat().st_size
            stop = min(size, self._indexed_to + max_bytes)
            while self._indexed_to < stop:
                boundary = (len(self._cum)) * BLOCK_BYTES  # the end of the block being counted
                end = min(stop, boundary, self._indexed_to + (4 << 20))
                data = self._pread(end - self._indexed_to, self._indexed_to, "index")
                if not data:
                    break
                self._partial_nl += data.count(b"\n")
                self._indexed_to += len(data)
                if self._indexed_to == boundary:
                    self._cum.append(self._cum[-1] + self._partial_nl)
                    self._partial_nl = 0
            return self._indexed_to >= size

    def build_index(self, background: bool = True) -> None:
        """Index the whole file, in a daemon thread (``background``) or now."""
        if not background:
            while not self.index_step():
                pass
            return
        if self._index_thread is not None and self._index_thread.is_alive():
            return

        def run() -> None:
            while not self._stop_index.is_set():
                try:
                    if self.index_step(BACKGROUND_STEP_BYTES):
                        return
                except OSError:
                    return
                # Let go of the GIL between steps, so the UI thread next to the count gets it at once.
                self._stop_index.wait(BACKGROUND_PAUSE_S)

        self._index_thread = threading.Thread(target=run, name=f"log-index:{self.path.name}", daemon=True)
        self._index_thread.start()

    @property
    def indexed(self) -> bool:
        """Whether the index has counted the whole file (``line_count`` is then exact)."""
        with self._lock:
            return self._fd is None or self._indexed_to >= self._fstat().st_size

    @property
    def line_count(self) -> int:
        """Lines in the file (a last line without newline counts). Approximate until ``indexed``:
        then it is extrapolated from the bytes counted so far (or from the tail's line lengths)."""
        with self._lock:
            if self._fd is None:
                return 0
            size = self._fstat().st_size
            counted = self._newlines_before_indexed()
            if self._indexed_to >= size:
                last = self._pread(1, size - 1, "count") if size else b"\n"
                return counted + (0 if last == b"\n" else 1)
            if self._indexed_to >= (1 << 20):
                return counted + round((size - self._indexed_to) * counted / self._indexed_to)
            sample = self._pread(min(size, 1 << 20), max(0, size - (1 << 20)), "count")
            per_byte = max(sample.count(b"\n"), 1) / max(len(sample), 1)
            return counted + round((size - self._indexed_to) * per_byte)

    def _newlines_before(self, offset: int) -> int | None:
        """Newlines in [0, offset), if the index has counted that far."""
        if offset > self._indexed_to or self._fd is None:
            return None
        block = offset // BLOCK_BYTES
        if block >= len(self._cum):
            block = len(self._cum) - 1
        start = block * BLOCK_BYTES
        if offset == start:
            return self._cum[block]
        return self._cum[block] + self._pread(offset - start, start, "locate").count(b"\n")

    def line_number_at(self, offset: int) -> int | None:
        """How many lines come before byte ``offset`` (a line start), once the index has counted that far."""
        with self._lock:
            return self._newlines_before(offset)

    def _ensure_indexed_newlines(self, k: int) -> bool:
        """Index until at least ``k`` newlines are counted (or the end); True if there are that many."""
        while self._newlines_before_indexed() < k:
            if self.index_step():
                break
        return self._newlines_before_indexed() >= k

    def _offset_after_newline(self, k: int) -> int | None:
        """The offset just after the k-th newline (k >= 1), or None when the file has fewer."""
        if not self._ensure_indexed_newlines(k):
            return None
        assert self._fd is not None
        block = bisect_left(self._cum, k) - 1  # the last boundary with fewer than k newlines before it
        start = block * BLOCK_BYTES
        need = k - self._cum[block]
        data = self._pread(min(BLOCK_BYTES, self._indexed_to - start), start, "locate")
        pos = -1
        for _ in range(need):
            pos = data.find(b"\n", pos + 1)
            if pos < 0:
                return None
        return start + pos + 1

    def _line_start(self, number: int) -> int | None:
        if number < 1:
            return None
        if number == 1:
            return 0
        return self._offset_after_newline(number - 1)

    # -- reading lines ---------------------------------------------------------------------------------

    def _read_line_at(self, start: int, size: int) -> tuple[bytes, int, bool]:
        """(the line at ``start`` without its newline, cut to head … tail if huge; the offset after it;
        whether it ends with a newline).  Memory stays bounded whatever the line's length."""
        assert self._fd is not None
        head = self._pread(min(LINE_HEAD_BYTES + LINE_TAIL_BYTES + len(_MARK), size - start), start)
        nl = head.find(b"\n")
        if nl >= 0:
            return head[:nl], start + nl + 1, True
        pos = start + len(head)
        end, terminated = size, False
        while pos < size:  # a long line: find its end without keeping it
            chunk = self._pread(min(TAIL_SCAN_BYTES, size - pos), pos)
            if not chunk:
                break
            nl = chunk.find(b"\n")
            if nl >= 0:
                end, terminated = pos + nl, True
                break
            pos += len(chunk)
        if end - start <= len(head):
            return head[: end - start], end + terminated, terminated
        tail_len = min(LINE_TAIL_BYTES, end - start)
        tail = self._pread(tail_len, end - tail_len)
        return head[:LINE_HEAD_BYTES] + _MARK + tail, end + terminated, terminated

    def _remember(self, line: LogLine) -> None:
        if line.number is None:
            return
        old = self._cache.pop(line.number, None)
        if old is not None:
            self._cache_chars -= len(old.raw) + len(old.text)
        self._cache[line.number] = line
        self._cache_chars += len(line.raw) + len(line.text)
        while self._cache_chars > CACHE_MAX_CHARS and self._cache:
            _, dropped = self._cache.popitem(last=False)
            self._cache_chars -= len(dropped.raw) + len(dropped.text)

    def lines(self, first: int, count: int) -> list[LogLine]:
        """Lines ``first`` .. ``first + count - 1`` (1-based; fewer at the end of the file)."""
        with self._lock:
            if self._fd is None or count <= 0 or first < 1:
                return []
            out: list[LogLine] = []
            number = first
            while number < first + count and number in self._cache:
                self._cache.move_to_end(number)
                out.append(self._cache[number])
                number += 1
            if number >= first + count:
                return out
            start = self._line_start(number)
            size = self._fstat().st_size
            previous: object = out[-1].rank if out else _UNKNOWN
            while start is not None and start < size and number < first + count:
                data, after, terminated = self._read_line_at(start, size)
                line = self._line(number, data, start, previous)
                if terminated:  # an unterminated last line may still grow: not cached
                    self._remember(line)
                out.append(line)
                previous = line.rank
                number += 1
                start = after
            return out

    def line(self, number: int) -> LogLine | None:
        """Line ``number`` (1-based), or None past the end."""
        got = self.lines(number, 1)
        return got[0] if got else None

    def _last_newline_end(self, size: int) -> int:
        """The offset after the file's last newline (0 when it has none), read backwards from the end."""
        assert self._fd is not None
        pos, step = size, 4096  # a log's last line is short: read back a page first, then more
        while pos > 0:
            start = max(0, pos - step)
            chunk = self._pread(pos - start, start, "open")
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                return start + nl + 1
            pos = start
            step = min(step * 4, TAIL_SCAN_BYTES)
        return 0

    def tail_lines(self, n: int) -> list[LogLine]:
        """The last ``n`` complete lines (up to where ``poll()`` has delivered), without indexing the file:
        it reads backwards from the end.  Numbers are filled in when the index covers them, else None."""
        with self._lock:
            if self._fd is None or n <= 0 or self._follow_offset == 0:
                return []
            starts: list[int] = []
            pos = self._follow_offset - 1  # skip the newline that ends the last complete line
            while pos > 0 and len(starts) < n:
                lo = max(0, pos - TAIL_SCAN_BYTES)
                chunk = self._pread(pos - lo, lo, "tail")
                cut = len(chunk)
                while len(starts) < n:
                    nl = chunk.rfind(b"\n", 0, cut)
                    if nl < 0:
                        break
                    starts.append(lo + nl + 1)
                    cut = nl
                pos = lo
            if len(starts) < n:
                starts.append(0)  # the file's first line
            starts.reverse()
            before = self._newlines_before(starts[0])
            size = self._fstat().st_size
            out: list[LogLine] = []
            previous: object = _UNKNOWN
            for i, start in enumerate(starts):
                data, _, _ = self._read_line_at(start, size)
                line = self._line(before + 1 + i if before is not None else None, data, start, previous)
                self._remember(line)
                out.append(line)
                previous = line.rank
            return out

    # -- following -------------------------------------------------------------------------------------

    def poll(self, max_bytes: int = POLL_MAX_BYTES) -> PollResult:
        """The lines completed since the last poll; notices truncation and rotation.  Every byte read is
        handed to the listeners; with a view attached, the result is queued for ``view_poll`` too."""
        with self._lock:
            result = self._poll(max_bytes)
            self.stats.polls += 1
            self._queue_for_view(result)
            return result

    def _poll(self, max_bytes: int) -> PollResult:
        truncated = rotated = False
        drained: list[LogLine] = []
        if self._fd is None and not self._open_if_there(from_start=True):
            return PollResult(exists=False)  # (a file that appears later is read from its start)
        try:
            self.stats.stats += 1
            st_path: os.stat_result | None = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            st_path = None  # deleted: keep reading the open file until a new one appears
        if st_path is not None and (st_path.st_dev, st_path.st_ino) != self._identity:
            # rotated: finish the old file (its unterminated last line counts), then read the new one
            more, budget = True, ROTATION_DRAIN_BYTES
            while more and budget > 0:  # the old file is gone for good after this: drain it
                got, more = self._read_new(min(max_bytes, budget), self._fstat())
                drained += got
                budget -= max_bytes
            if self._pending:
                line = self._pending_as_line()
                if self._build_lines:
                    drained.append(line)
            os.close(self._fd)  # type: ignore[arg-type]
            self._fd = None
            rotated = True
            self._tell_reset()
            if not self._open_if_there(from_start=True):
                return PollResult(tuple(drained), rotated=True, exists=False)
            st_path = None
        # the path's stat is the open file's own when it names it (one call, not two)
        st = st_path if st_path is not None else self._fstat()
        if self._is_truncated(st.st_size):
            self._reset_state()
            truncated = True
            self._tell_reset()
        got, more = self._read_new(max_bytes, st)
        return PollResult(tuple(drained + got), truncated, rotated, self._partial_text(), more)

    def _tell_reset(self) -> None:
        for listener in self._listeners:
            listener.log_reset(self)

    def follow(self, interval_s: float = 0.05, stop: threading.Event | None = None) -> Iterator[PollResult]:
        """``poll()`` until ``stop`` is set, yielding every result that has news; it sleeps only when the
        file has nothing more (a backlog is read back to back, one ``POLL_MAX_BYTES`` step per result)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            result = self.poll()
            if result.lines or result.truncated or result.rotated:
                yield result
            if not result.more:
                stop.wait(interval_s)

    def _is_truncated(self, size: int) -> bool:
        assert self._fd is not None
        if size < self._read_to:
            return True
        # copytruncate, then refilled past our offset: the byte before the offset is no longer a newline
        return self._follow_offset > 0 and self._pread(1, self._follow_offset - 1, "probe") != b"\n"

    def _read_new(self, max_bytes: int, st: os.stat_result) -> tuple[list[LogLine], bool]:
        """(complete lines from the bytes after ``_read_to``, whether more bytes wait).  The bytes are read
        once: the listeners, the lines and the index all take them from this read."""
        assert self._fd is not None
        size = st.st_size
        self._last_size, self._last_mtime = size, st.st_mtime
        start = self._read_to
        if start >= size:
            return [], False
        data = self._pread(min(max_bytes, size - start), start, "poll")
        if not data:
            return [], False
        read_to = start + len(data)
        for listener in self._listeners:
            listener.log_data(self, data, start)
        if self._next_number is None:
            # the bytes from the follow point to the index's end are the unterminated line: no newline in
            # them, so the index's count is the number (no read back to the block start)
            before = (self._newlines_before_indexed()
                      if self._follow_offset <= self._indexed_to <= start else self._newlines_before(self._follow_offset))
            if before is not None:
                self._next_number = before + 1
        out: list[LogLine] = []
        pos = 0
        last_nl = data.rfind(b"\n")
        if self._pending and last_nl >= 0:
            first_nl = data.find(b"\n")
            self._add_pending(data[:first_nl])
            pending_line = self._pending_as_line()
            if self._build_lines:
                out.append(pending_line)
            pos = first_nl + 1
        if self._build_lines:
            while pos <= last_nl:
                nl = data.find(b"\n", pos)
                out.append(self._delivered(self._line(self._take_number(), data[pos:nl], start + pos, self._rank)))
                pos = nl + 1
        elif pos <= last_nl:  # nobody reads the lines: count them, decode none
            if self._next_number is not None:
                self._next_number += data.count(b"\n", pos, last_nl + 1)
            self._rank = _UNKNOWN  # a later continuation line reads its rank back from the file
            pos = last_nl + 1
        if last_nl >= 0:
            self._follow_offset = start + last_nl + 1
        if pos < len(data):
            self._add_pending(data[pos:])
        self._read_to = read_to
        if start <= self._indexed_to < read_to:
            self._index_data(data, self._indexed_to - start)
        return out, read_to < size

    def _index_data(self, data: bytes, pos: int) -> None:
        """Count ``data[pos:]`` (the bytes at ``_indexed_to``, just read by a poll) into the index."""
        while pos < len(data):
            boundary = len(self._cum) * BLOCK_BYTES
            take = min(len(data) - pos, boundary - self._indexed_to)
            self._partial_nl += data.count(b"\n", pos, pos + take)
            self._indexed_to += take
            pos += take
            if self._indexed_to == boundary:
                self._cum.append(self._cum[-1] + self._partial_nl)
                self._partial_nl = 0

    def _delivered(self, line: LogLine) -> LogLine:
        self._rank = line.rank
        return line

    def _take_number(self) -> int | None:
        number = self._next_number
        if number is not None:
            self._next_number = number + 1
        return number

    def _add_pending(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) > LINE_HEAD_BYTES + 2 * LINE_TAIL_BYTES + len(_MARK):
            del self._pending[LINE_HEAD_BYTES: len(self._pending) - LINE_TAIL_BYTES]
            self._pending_cut = True

    def _pending_bytes(self) -> bytes:
        data = bytes(self._pending)
        if self._pending_cut:
            return data[:LINE_HEAD_BYTES] + _MARK + data[-LINE_TAIL_BYTES:]
        return data

    def _pending_as_line(self) -> LogLine:
        line = self._delivered(self._line(self._take_number(), self._pending_bytes(), self._follow_offset, self._rank))
        self._pending = bytearray()
        self._pending_cut = False
        return line

    def _partial_text(self) -> str | None:
        if not self._pending:
            return None
        return clean(_decode(self._pending_bytes())) or None

    def partial_line(self) -> str | None:
        """The unterminated last line as shown (a tqdm bar being drawn), as of the last ``poll``."""
        with self._lock:
            return self._partial_text()

    # -- filtering -------------------------------------------------------------------------------------

    def iter_filtered(
        self, log_filter: LogFilter | None = None, *, start_line: int = 1, chunk_bytes: int = 4 << 20
    ) -> Iterator[LogLine]:
        """Every complete line from ``start_line`` that ``log_filter`` keeps (all of them without one),
        with exact numbers (counted here) and ranks.  Streams the file with bounded memory; the lock is
        held per chunk, so polls interleave."""
        if log_filter is not None and not log_filter.active:
            log_filter = None
        literal = log_filter.literal if log_filter is not None and log_filter.rank is None else None
        needle = literal.lower().encode() if literal is not None and literal.isascii() else None
        with self._lock:
            if self._fd is None:
                return
            offset = self._line_start(start_line)
        if offset is None:
            return
        number = start_line
        previous: object = _UNKNOWN
        while True:
            with self._lock:
                if self._fd is None:
                    return
                size = self._fstat().st_size
                if offset >= size:
                    return
                data = self._pread(min(chunk_bytes, size - offset), offset, "filter")
                last_nl = data.rfind(b"\n")
                if last_nl < 0:  # one line longer than the chunk, or the unterminated last line
                    one, after, terminated = self._read_line_at(offset, size)
                    if not terminated:
                        return
                    line = self._line(number, one, offset, previous)
                    previous = line.rank
                    if log_filter is None or log_filter.matches(line):
                        yield line
                    offset, number = after, number + 1
                    continue
            if needle is not None and _CLEANING_BYTES_RE.search(data, 0, last_nl) is None:
                assert log_filter is not None
                yield from self._substring_scan(data, last_nl, offset, number, needle, log_filter)
                previous = _UNKNOWN
            else:
                pos, n = 0, number
                while pos <= last_nl:
                    nl = data.find(b"\n", pos)
                    line = self._line(n, data[pos:nl], offset + pos, previous)
                    previous = line.rank
                    if log_filter is None or log_filter.matches(line):
                        yield line
                    pos, n = nl + 1, n + 1
            number += data.count(b"\n", 0, last_nl + 1)
            offset += last_nl + 1

    def _substring_scan(
        self, data: bytes, last_nl: int, offset: int, number: int, needle: bytes, log_filter: LogFilter
    ) -> Iterator[LogLine]:
        """Jump from one occurrence of ``needle`` (ASCII, lower case) to the next in the lower-cased
        chunk; only those lines are decoded, and the filter has the last word on each."""
        folded = data.lower()
        counted_to = 0
        n = number
        pos = folded.find(needle, 0, last_nl + 1)
        while pos >= 0:
            line_start = data.rfind(b"\n", 0, pos) + 1
            line_end = data.find(b"\n", pos)
            n += data.count(b"\n", counted_to, line_start)
            counted_to = line_start
            with self._lock:
                line = self._line(n, data[line_start:line_end], offset + line_start)
            if log_filter.matches(line):
                yield line
            pos = folded.find(needle, line_end + 1, last_nl + 1)
