"""The output's bookkeeping in a job run: outcomes counted, written samples made durable by a group commit
before their manifest lines are appended, and a full output disk turned into a pause (never a crash, never
a failed sample) that continues once there is room.

`OutputBookkeeping` owns the outcomes held back (written samples waiting for the group commit, other
outcomes waiting for room on the disk).  It is driven by explicit calls (`record`, `commit`,
`commit_loop`, `write_until_space`, `until_space`) and reports through what it is given: the run's
`sessions.extraction.job_state.JobState` (counts, pause reasons, abort) and two callables, one that
writes the progress file and one that reads the job's control file while it waits for room.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessions.extraction.client import AttemptFailed
from sessions.extraction.job_state import JobState
from sessions.extraction.output import ManifestEntry, OutputDir

COMMIT_INTERVAL_S = 0.25  # the group commit: written samples become durable, then recorded
COMMIT_MAX_BATCH = 256
_OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
# A write that fails while the output filesystem has less than this (plus the write's own size) free is a
# full disk, whatever it raised.
LOW_SPACE_MARGIN_BYTES = 4 << 20
OUTPUT_FULL_RETRY_S = 1.0


class OutputBookkeeping:
    """Recording outcomes: counted, committed in groups, and paused (never failed) while the output disk is full."""

    def __init__(self, state: JobState, output_root: Path | None = None, *,
                 write_progress: Callable[[], None] = lambda: None,
                 read_control: Callable[[], None] = lambda: None) -> None:
        self.state = state
        self.output: OutputDir | None = None  # set by `attach` once the output dir is locked
        self.output_root = output_root  # where a full disk is measured before then
        self.write_progress = write_progress
        self.read_control = read_control
        self.uncommitted: list[ManifestEntry] = []  # written samples waiting for the next group commit
        self.unappended: list[ManifestEntry] = []  # non-ok outcomes waiting for room on the output disk

    def attach(self, output: OutputDir) -> None:
        self.output = output
        self.output_root = output.root

    def log(self, message: str) -> None:
        self.state.log(message)

    @property
    def pause_reasons(self) -> dict[str, str]:
        return self.state.pause_reasons

    def record(self, entry: ManifestEntry) -> None:
        """An outcome.  A written sample waits for the next group commit; the others go straight in."""
        assert self.output is not None
        if entry.status == "ok" and entry.path:
            self.uncommitted.append(entry)
            return
        if self.unappended:  # keep the manifest in outcome order behind lines waiting for space
            self.unappended.append(entry)
            return
        try:
            self.output.append(entry)
        except Exception as exc:
            if not self.output_full(exc):
                raise
            self.pause_for_space(exc)
            self.unappended.append(entry)  # the commit loop appends it once there is room
            return
        self.state.count(entry)

    async def commit(self) -> None:
        """Make the written samples durable with one flush, then append their manifest lines."""
        assert self.output is not None
        state = self.state
        while self.unappended:
            entry = self.unappended[0]
            try:
                self.output.append(entry)
            except Exception as exc:
                if not self.output_full(exc):
                    raise
                self.pause_for_space(exc)
                return
            self.unappended.pop(0)
            state.count(entry)
            if not self.unappended:
                self.space_again()
        while self.uncommitted:
            batch, self.uncommitted = self.uncommitted[:COMMIT_MAX_BATCH], self.uncommitted[COMMIT_MAX_BATCH:]
            try:
                await asyncio.to_thread(self.output.commit, batch)
            except Exception as exc:
                if self.output_full(exc) and not state.stopped:
                    # Nothing of the batch is recorded yet: keep it, pause, and commit it once there is room.
                    self.uncommitted = batch + self.uncommitted
                    self.pause_for_space(exc)
                    return
                if not isinstance(exc, OSError):
                    raise
                # Nothing of the batch is recorded: their files are removed by the next reconcile and the
                # samples written again by a resume.  Stop here rather than write into a failing disk.
                state.abort(f"flushing {len(batch)} samples to {self.output.root} failed: "
                            f"{exc.strerror or exc}; `extract resume` writes them again")
                return
            for entry in batch:
                state.count(entry)
            if not self.unappended:
                self.space_again()

    async def commit_loop(self, stop: asyncio.Event) -> None:
        # Stopped by the event, never cancelled: a cancel inside ``to_thread`` would record a batch
        # without counting it.
        # The interval runs from one commit's start to the next: when a flush takes longer than the interval
        # (the disk is the limit), the next one starts at once, so the disk never idles between commits.
        last_start = time.monotonic()
        while not stop.is_set() or self.waiting_for_space():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, last_start + COMMIT_INTERVAL_S - time.monotonic()))
            last_start = time.monotonic()
            if stop.is_set() and self.waiting_for_space():
                self.read_control()  # a cancel while the disk is full ends the wait: a resume redoes them
                self.write_progress()
                await asyncio.sleep(OUTPUT_FULL_RETRY_S)
            await self.commit()

    def waiting_for_space(self) -> bool:
        """Outcomes are held back by a full output disk and the job was not cancelled."""
        return bool((self.uncommitted or self.unappended) and "output" in self.pause_reasons
                    and not self.state.stopped)

    def write_until_space(self, index: int, data: dict[str, Any]) -> tuple[str, int, str]:
        """Write the sample; when the output filesystem is full, pause (no crash, no failed sample) and retry.

        Full is judged by the filesystem, not by the exception: ``torch.save`` into a full disk raises
        ``RuntimeError: ... unexpected pos ...``, not ``OSError(ENOSPC)``.
        """
        assert self.output is not None
        needed = sum(getattr(t, "nbytes", 0) for t in data.values())
        while True:
            try:
                result = self.output.write_sample(index, data)
            except Exception as exc:
                if not self.output_full(exc, needed):
                    raise
                if self.state.stopped:
                    raise AttemptFailed("output filesystem full at cancel", retryable=False) from None
                self.pause_for_space(exc)
                time.sleep(OUTPUT_FULL_RETRY_S)
                continue
            self.space_again()
            return result

    def output_full(self, exc: BaseException, needed: int = 0) -> bool:
        """The write failed because the output filesystem is (nearly) full, whatever ``exc``'s type."""
        seen: BaseException | None = exc
        while seen is not None:  # ENOSPC anywhere in the chain (a wrapped OSError)
            if isinstance(seen, OSError) and seen.errno in _OUT_OF_SPACE:
                return True
            seen = seen.__cause__ or seen.__context__
        root = self.output_root
        if root is None:
            return False
        try:
            free = shutil.disk_usage(root).free
        except OSError:
            return False
        return free < needed + LOW_SPACE_MARGIN_BYTES

    def pause_for_space(self, exc: BaseException) -> None:
        if "output" not in self.pause_reasons:
            root = self.output_root
            try:
                free = f"{shutil.disk_usage(root).free / 1e6:.1f} MB free" if root else "free space unknown"
            except OSError:
                free = "free space unknown"
            detail = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {str(exc)[:240]}"
            self.pause_reasons["output"] = (f"output filesystem full at {root} ({free}; {detail}); "
                                            "continues when there is room")
            self.log(f"paused: {self.pause_reasons['output']}")

    def space_again(self) -> None:
        if self.pause_reasons.pop("output", None) is not None:
            self.log("output filesystem has space again; continuing")

    def until_space(self, what: str, action: Callable[[], Any]) -> Any:
        """Run a start-up or end-of-job write, pausing (progress says why) while the output disk is full."""
        while True:
            try:
                result = action()
            except Exception as exc:
                if not self.output_full(exc) or self.state.cancel_requested:
                    raise
                self.pause_for_space(exc)
                self.write_progress()
                time.sleep(OUTPUT_FULL_RETRY_S)
                continue
            self.space_again()
            return result
