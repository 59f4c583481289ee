"""Opening a log safely, and the small whole-file readers (tail, head and tail, blocks, an increment).

Every log the project reads is opened here: ``O_NONBLOCK`` (opening a FIFO never waits for a writer),
then ``fstat`` on the open descriptor (no race with a swapped path), and anything but a regular file
(a FIFO, a device such as ``/dev/zero``, a directory, a socket) is refused at once with an error that
names the path and what it is.  ``follow_symlinks=False`` adds ``O_NOFOLLOW`` (the bundle's inputs).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

from sessions.logs.lines import LogLine, make_line
from sessions.safe_files import Kind, SpecialFileError, open_fd

READ_BLOCK_BYTES = 8 << 20
HINT_LINE_CHARS = 8192  # a longer line keeps its head and its tail (hints look at both ends)


class LogFileError(OSError):
    """A log that cannot be read as one: missing, unreadable, or not a regular file."""

    def __init__(self, path: str | Path, what: str, err: int = errno.EINVAL) -> None:
        super().__init__(err, what, str(path))
        self.path = str(path)
        self.what = what

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


def open_log(path: str | Path, *, follow_symlinks: bool = True) -> int:
    """A read-only descriptor of the regular file at ``path``; `LogFileError` for anything else.

    FileNotFoundError stays itself (a log that does not exist yet is a state, not an error, for a follower).
    The opening itself is `sessions.safe_files`' (the one rule for every input file); this words it for logs.
    """
    try:
        # single_link: a log with a second name (a hard link to /etc/shadow) is never read (issue 22)
        return open_fd(path, Kind("log", None, private=True, nofollow=not follow_symlinks))
    except FileNotFoundError:
        raise
    except SpecialFileError as exc:
        err = exc.errno or errno.EINVAL
        if exc.kind == "a hard link":
            raise LogFileError(path, "has more than one name (a hard link): its lines may be another file's, "
                                     "so it is not read", err) from None
        if exc.kind == "a symlink":
            raise LogFileError(path, "is a symbolic link, which is not followed here", err) from None
        raise LogFileError(path, f"is {exc.kind}, not a log file (only regular files are read)", err) from None
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise LogFileError(path, "permission denied", exc.errno) from None
        raise LogFileError(path, f"cannot open: {exc.strerror or exc}", exc.errno or errno.EIO) from None


def iter_blocks(path: str | Path, max_bytes: int | None = None) -> Iterator[bytes]:
    """The file's bytes from the start, in `READ_BLOCK_BYTES` blocks (memory stays bounded)."""
    fd = open_log(path)
    try:
        offset = 0
        while max_bytes is None or offset < max_bytes:
            want = READ_BLOCK_BYTES if max_bytes is None else min(READ_BLOCK_BYTES, max_bytes - offset)
            data = os.pread(fd, want, offset)
            if not data:
                return
            offset += len(data)
            yield data
    finally:
        os.close(fd)


def read_increment(path: str | Path, offset: int, limit: int) -> tuple[bytes, os.stat_result] | None:
    """Up to ``limit`` bytes from ``offset`` and the file's stat; None when the file does not exist."""
    try:
        fd = open_log(path)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        data = os.pread(fd, max(0, min(limit, st.st_size - offset)), offset) if st.st_size > offset else b""
        return data, st
    finally:
        os.close(fd)


def _bounded(raw: bytes, limit: int) -> bytes:
    if len(raw) <= limit:
        return raw
    half = limit // 2
    return raw[:half] + " \u2026 ".encode() + raw[-half:]


def _lines_of(data: bytes, drop_partial_first: bool, line_bytes: int) -> list[LogLine]:
    parts = data.split(b"\n")
    if drop_partial_first and parts:
        parts = parts[1:]
    if parts and parts[-1] == b"":
        parts.pop()
    out: list[LogLine] = []
    previous: int | None = None
    for part in parts:
        line = make_line(None, _bounded(part, line_bytes).decode("utf-8", "replace").rstrip("\r"), previous)
        previous = line.rank
        out.append(line)
    return out


def read_tail(
    path: str | Path, max_bytes: int, *, follow_symlinks: bool = True, line_bytes: int = 1 << 20
) -> list[LogLine]:
    """The last lines within the file's last ``max_bytes`` (a partial first line dropped), cleaned and
    ranked; numbers are None (the file is not counted)."""
    fd = open_log(path, follow_symlinks=follow_symlinks)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        data = os.pread(fd, size - start, start)
    finally:
        os.close(fd)
    return _lines_of(data, start > 0, line_bytes)


def read_head_and_tail(path: str | Path, whole: int, head: int, tail: int) -> list[LogLine]:
    """The whole file when it is at most ``whole`` bytes, else its first ``head`` and last ``tail`` bytes
    (startup is at the head, a failure at the tail); each line bounded to `HINT_LINE_CHARS`."""
    fd = open_log(path)
    try:
        size = os.fstat(fd).st_size
        if size <= whole:
            return _lines_of(os.pread(fd, size, 0), False, HINT_LINE_CHARS)
        first = _lines_of(os.pread(fd, head, 0), False, HINT_LINE_CHARS)
        start = max(head, size - tail)
        return first + _lines_of(os.pread(fd, size - start, start), True, HINT_LINE_CHARS)
    finally:
        os.close(fd)

