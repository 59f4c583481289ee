"""The home's launch lock: one launch at a time, waited on with a timeout and a way out.

Two launches at the same moment must start exactly one server, so a launch holds ``launch.lock`` in the
state dir while it checks (already running, profile, port, GPUs) and starts.  The wait for it is bounded
and cancellable: a plain blocking ``flock`` kept the TUI's worker thread, and with it the whole TUI, alive
after `q` for as long as another process held the lock (issue 22 item 17).  The holder writes its pid into
the file, so a wait that gives up names who holds it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sessions import safe_files
from sessions.server.model import LaunchError

LAUNCH_LOCK_TIMEOUT_S = 60.0
_POLL_S = 0.05


class LaunchLockTimeout(LaunchError):
    """Another launch held the lock past the timeout."""


class LaunchCancelled(LaunchError):
    """The caller gave up waiting (the TUI is quitting, the worker was cancelled)."""


def lock_holder(lock_path: Path) -> str:
    """Who holds the lock, as far as its file says: "pid N (name)", else "another process"."""
    import psutil

    try:
        # a private file of ours holding "pid ..."; through the one reader (a FIFO or a link in its place
        # is refused, never waited on)
        text = safe_files.read_bytes(lock_path, safe_files.NOTE)[:64].decode("ascii", errors="replace").strip()
        pid = int(text.split()[0]) if text else 0
    except (OSError, ValueError, IndexError):
        return "another process"
    if pid <= 0:
        return "another process"
    try:
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline()[:4]) or proc.name()
    except psutil.Error:
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:80]})"


@contextmanager
def launch_lock(
    lock_path: Path,
    timeout_s: float | None = LAUNCH_LOCK_TIMEOUT_S,
    *,
    cancelled: Callable[[], bool] | None = None,
    on_wait: Callable[[str, float], None] | None = None,
) -> Iterator[None]:
    """Hold ``lock_path`` exclusively.  Waits at most ``timeout_s`` (None: no limit) and stops waiting as
    soon as ``cancelled()`` is true; ``on_wait(holder, waited_s)`` is told, about once a second, who
    holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        t0 = time.monotonic()
        told = -1.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            waited = time.monotonic() - t0
            if cancelled is not None and cancelled():
                raise LaunchCancelled(f"launch cancelled while waiting for {lock_path}")
            if timeout_s is not None and waited >= timeout_s:
                raise LaunchLockTimeout(
                    f"another launch holds {lock_path} ({lock_holder(lock_path)}) and did not finish within "
                    f"{timeout_s:g}s; try again when it is done (or give --lock-timeout more seconds)"
                )
            if on_wait is not None and waited - told >= 1.0:
                told = waited
                on_wait(lock_holder(lock_path), waited)
            time.sleep(_POLL_S)
        with contextlib.suppress(OSError):  # who holds it, for the next waiter's message
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # released: no stale pid for the next waiter to name
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
