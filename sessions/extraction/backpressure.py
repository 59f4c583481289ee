"""Back-pressure on the capture filesystem: stop sending before the dumps fill it (``/dev/shm`` is small).

The server writes each request's dumps to the capture dir and the collector deletes them once consumed.
Between the two they occupy space, so the gate admits a request only when

    measured_used + reserved_in_flight + this_request  <=  threshold × capacity

where ``reserved_in_flight`` is the estimated size (tokens × bytes per token) of every request still
between dispatch and collection.  ``measured_used`` is the filesystem's used bytes (``statvfs``), or, when
the job sets ``capture_budget_bytes``, the bytes of the files under the capture dir against that budget:
a directory-size budget is how a small filesystem is simulated in tests and how a shared ``/dev/shm`` is
given a private share.  One request is always admitted when nothing is in flight and the measured fill is
under the threshold, so a sample bigger than the budget cannot deadlock the job; when nothing is in
flight and the fill is still over the threshold (someone else's files), the gate reports that it is
blocked, and the job shows ``paused`` with the reason.
"""
from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CaptureUsage:
    used_bytes: int
    capacity_bytes: int
    source: str  # "filesystem" | "budget"

    @property
    def fill(self) -> float:
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks are not followed)."""
    total = 0
    stack = [os.fspath(path)]
    while stack:
        current = stack.pop()
        try:
            entries = os.scandir(current)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # consumed by the collector meanwhile
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def measure_capture_usage(capture_dir: Path, budget_bytes: int = 0) -> CaptureUsage:
    if budget_bytes > 0:
        return CaptureUsage(directory_bytes(capture_dir), budget_bytes, "budget")
    # The server makes its capture dir (and its parents) on its first dump: before that, the filesystem is
    # the one of the nearest folder that exists (a group member's <dir>/replica-i under a <dir> not made yet).
    probe = capture_dir
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    st = os.statvfs(probe)
    capacity = st.f_blocks * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return CaptureUsage(used, capacity, "filesystem")


class GateClosed(Exception):
    """The job is being cancelled: nothing more is admitted."""


class CaptureSpaceGate:
    """Admits requests while the capture filesystem has room for their dumps (see the module docstring)."""

    def __init__(self, capture_dir: Path, threshold: float = 0.9, budget_bytes: int = 0,
                 refresh_s: float = 0.1) -> None:
        self.capture_dir = Path(capture_dir)
        self.threshold = threshold
        self.budget_bytes = budget_bytes
        self.refresh_s = refresh_s
        self.reserved_bytes = 0
        self.in_flight = 0
        self.waits = 0  # requests that had to wait at least once
        self.peak_reserved_bytes = 0
        self.blocked_reason: str | None = None
        self._usage: CaptureUsage | None = None
        self._measured_at = 0.0
        self._changed = asyncio.Condition()
        self.closed = False

    def usage(self, max_age_s: float | None = None) -> CaptureUsage:
        age = self.refresh_s if max_age_s is None else max_age_s
        now = time.monotonic()
        if self._usage is None or now - self._measured_at >= age:
            self._usage = measure_capture_usage(self.capture_dir, self.budget_bytes)
            self._measured_at = now
        return self._usage

    @property
    def last_fill(self) -> float | None:
        """The fill last measured (None before the first measurement): for the progress file."""
        return self._usage.fill if self._usage is not None else None

    def _admits(self, nbytes: int) -> bool:
        usage = self.usage()
        limit = self.threshold * usage.capacity_bytes
        if self.in_flight == 0:
            if usage.used_bytes <= limit:
                self.blocked_reason = None
                return True
            self.blocked_reason = (
                f"capture {'dir' if usage.source == 'budget' else 'filesystem'} at {self.capture_dir} is "
                f"{usage.fill:.0%} full (threshold {self.threshold:.0%}); waiting for space"
            )
            return False
        self.blocked_reason = None
        return usage.used_bytes + self.reserved_bytes + nbytes <= limit

    @asynccontextmanager
    async def reserve(self, nbytes: int) -> AsyncIterator[None]:
        """Hold room for ``nbytes`` of dumps from dispatch until the collector has deleted them."""
        async with self._changed:
            waited = False
            while not self._admits(nbytes):
                if self.closed:
                    raise GateClosed()
                if not waited:
                    self.waits += 1
                    waited = True
                try:  # woken by a release, or on a timer to re-measure (someone else may free space)
                    await asyncio.wait_for(self._changed.wait(), timeout=self.refresh_s)
                except TimeoutError:
                    pass
            if self.closed:
                raise GateClosed()
            self.reserved_bytes += nbytes
            self.in_flight += 1
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        try:
            yield
        finally:
            async with self._changed:
                self.reserved_bytes -= nbytes
                self.in_flight -= 1
                self._measured_at = 0.0  # the collector just freed space: measure again
                self._changed.notify_all()
