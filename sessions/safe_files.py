"""Open input files so that a special file is answered at once, never waited on.

A FIFO blocks ``open()`` until a writer comes, ``/dev/zero`` and ``/dev/urandom`` never end, a directory or
a socket is no file at all.  Every reader of a user-named or session file (datasets, job specs, profiles,
model configs, the diagnosis bundle's inputs) opens with ``O_NONBLOCK`` (a FIFO opens at once), checks
``fstat`` and refuses anything but a regular file with a clear error naming the path and its kind.
``nofollow`` also refuses a symlink (the bundle: a ``server.log`` linked to ``/etc/shadow`` is not read).
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


class SpecialFileError(OSError):
    """The path is not a regular file (or is a symlink where none is followed); the message says which, and
    ``kind`` names what it is ("a FIFO (named pipe)", "a symlink", ...) for callers that word it their way."""

    def __init__(self, err: int, message: str, kind: str = "not a regular file") -> None:
        super().__init__(err, message)
        self.kind = kind


def file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "not a regular file"


def open_regular_fd(path: str | os.PathLike, what: str = "file", nofollow: bool = False) -> int:
    """An fd (blocking again) of the regular file at ``path``; `SpecialFileError` for anything else.

    Other OSErrors (missing, no permission, a name too long) pass through for the caller to word.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if nofollow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if nofollow and exc.errno == errno.ELOOP:
            raise SpecialFileError(errno.ELOOP, f"{what} {path} is a symlink; it is not followed",
                                   "a symlink") from None
        if exc.errno == errno.ENXIO:  # a socket file, or a FIFO opened for writing without a reader
            raise SpecialFileError(errno.ENXIO, f"{what} {path} is a socket (or a device with nothing behind it), "
                                                "not a regular file", "a socket") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = file_kind(mode)
            raise SpecialFileError(errno.EINVAL, f"{what} {path} is {kind}, not a regular file", kind)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def open_regular(path: str | os.PathLike, what: str = "file", nofollow: bool = False) -> Iterator[BinaryIO]:
    """``open(path, "rb")`` for regular files only (see `open_regular_fd`)."""
    fd = open_regular_fd(path, what, nofollow)
    with os.fdopen(fd, "rb") as fh:
        yield fh


def read_regular_bytes(path: str | os.PathLike, what: str = "file", nofollow: bool = False,
                       limit: int | None = None) -> bytes:
    with open_regular(path, what, nofollow) as fh:
        return fh.read() if limit is None else fh.read(limit)


def read_regular_text(path: str | os.PathLike, what: str = "file", nofollow: bool = False,
                      errors: str = "strict") -> str:
    return read_regular_bytes(path, what, nofollow).decode("utf-8", errors=errors)


def read_regular_tail(path: str | os.PathLike, max_bytes: int, what: str = "file",
                      nofollow: bool = False) -> tuple[bytes, int]:
    """The last ``max_bytes`` of a regular file and the offset they start at."""
    with open_regular(path, what, nofollow) as fh:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - max_bytes)
        fh.seek(start)
        return fh.read(max_bytes), start


def check_regular(path: str | Path, what: str = "file") -> None:
    """Raise `SpecialFileError` now when ``path`` exists and is not a regular file (never opens a FIFO)."""
    os.close(open_regular_fd(path, what))
