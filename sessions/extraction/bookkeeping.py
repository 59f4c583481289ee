"""The output's bookkeeping in a job run: outcomes counted, written samples made durable by a group commit
before their manifest lines are appended, and a full output disk turned into a pause (never a crash, never
a failed sample) that continues once there is room.  `OutputBookkeeping` is a layer of
`sessions.extraction.runner.JobRun`.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import shutil
import time
from pathlib import Path
from typing import Any

from sessions.extraction.client import AttemptFailed
from sessions.extraction.output import ManifestEntry
from sessions.extraction.run_report import RunReport

COMMIT_INTERVAL_S = 0.25  # the group commit: written samples become durable, then recorded
COMMIT_MAX_BATCH = 256
_OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
# A write that fails while the output filesystem has less than this (plus the write's own size) free is a
# full disk, whatever it raised.
LOW_SPACE_MARGIN_BYTES = 4 << 20
OUTPUT_FULL_RETRY_S = 1.0


class OutputBookkeeping(RunReport):
    """Counting, committing and recording outcomes, and pausing while the output disk is full."""

    # The outcomes this layer holds back, and the flags that end the run; `JobRun.__init__` sets them.
    _uncommitted: list[ManifestEntry]  # written samples waiting for the next group commit
    _unappended: list[ManifestEntry]  # non-ok outcomes waiting for room on the output disk
    cancel_requested: bool
    abort_reason: str | None

    def _read_control(self) -> None:
        """Apply the job's control file (cancel, pause); the pipeline layer, `JobRun`, implements it."""
        raise NotImplementedError

    def _stop_sending(self) -> None:
        """Send no more requests; the pipeline layer, `JobRun`, implements it."""
        raise NotImplementedError

    def _count(self, entry: ManifestEntry, rate: bool = True) -> None:
        self.counts[entry.status] = self.counts.get(entry.status, 0) + 1
        if entry.status == "ok":
            self.tokens += entry.tokens
            self.supervised_tokens += entry.supervised_tokens
            self.bytes += entry.bytes
        if rate:
            self.last_progress_at = time.time()
            self.rates.add(self.done, self.tokens, self.bytes)

    def _record(self, entry: ManifestEntry) -> None:
        """An outcome.  A written sample waits for the next group commit; the others go straight in."""
        assert self.output is not None
        if entry.status == "ok" and entry.path:
            self._uncommitted.append(entry)
            return
        if self._unappended:  # keep the manifest in outcome order behind lines waiting for space
            self._unappended.append(entry)
            return
        try:
            self.output.append(entry)
        except Exception as exc:
            if not self._output_full(exc):
                raise
            self._pause_for_space(exc)
            self._unappended.append(entry)  # the commit loop appends it once there is room
            return
        self._count(entry)

    async def _commit(self) -> None:
        """Make the written samples durable with one flush, then append their manifest lines."""
        assert self.output is not None
        while self._unappended:
            entry = self._unappended[0]
            try:
                self.output.append(entry)
            except Exception as exc:
                if not self._output_full(exc):
                    raise
                self._pause_for_space(exc)
                return
            self._unappended.pop(0)
            self._count(entry)
            if not self._unappended:
                self._space_again()
        while self._uncommitted:
            batch, self._uncommitted = self._uncommitted[:COMMIT_MAX_BATCH], self._uncommitted[COMMIT_MAX_BATCH:]
            try:
                await asyncio.to_thread(self.output.commit, batch)
            except Exception as exc:
                if self._output_full(exc) and not (self.cancel_requested or self.abort_reason):
                    # Nothing of the batch is recorded yet: keep it, pause, and commit it once there is room.
                    self._uncommitted = batch + self._uncommitted
                    self._pause_for_space(exc)
                    return
                if not isinstance(exc, OSError):
                    raise
                # Nothing of the batch is recorded: their files are removed by the next reconcile and the
                # samples written again by a resume.  Stop here rather than write into a failing disk.
                if not self.abort_reason:
                    self.abort_reason = (f"flushing {len(batch)} samples to {self.output.root} failed: "
                                         f"{exc.strerror or exc}; `extract resume` writes them again")
                    self.log(f"aborting: {self.abort_reason}")
                    self._stop_sending()
                return
            for entry in batch:
                self._count(entry)
            if not self._unappended:
                self._space_again()

    async def _commit_loop(self, stop: asyncio.Event) -> None:
        # Stopped by the event, never cancelled: a cancel inside ``to_thread`` would record a batch
        # without counting it.
        # The interval runs from one commit's start to the next: when a flush takes longer than the interval
        # (the disk is the limit), the next one starts at once, so the disk never idles between commits.
        last_start = time.monotonic()
        while not stop.is_set() or self._waiting_for_space():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, last_start + COMMIT_INTERVAL_S - time.monotonic()))
            last_start = time.monotonic()
            if stop.is_set() and self._waiting_for_space():
                self._read_control()  # a cancel while the disk is full ends the wait: a resume redoes them
                self.write_progress()
                await asyncio.sleep(OUTPUT_FULL_RETRY_S)
            await self._commit()

    def _waiting_for_space(self) -> bool:
        """Outcomes are held back by a full output disk and the job was not cancelled."""
        return bool((self._uncommitted or self._unappended) and "output" in self.pause_reasons
                    and not self.cancel_requested and not self.abort_reason)

    def _write_until_space(self, index: int, data: dict[str, Any]) -> tuple[str, int, str]:
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
                if not self._output_full(exc, needed):
                    raise
                if self.cancel_requested or self.abort_reason:
                    raise AttemptFailed("output filesystem full at cancel", retryable=False) from None
                self._pause_for_space(exc)
                time.sleep(OUTPUT_FULL_RETRY_S)
                continue
            self._space_again()
            return result

    def _output_full(self, exc: BaseException, needed: int = 0) -> bool:
        """The write failed because the output filesystem is (nearly) full, whatever ``exc``'s type."""
        seen: BaseException | None = exc
        while seen is not None:  # ENOSPC anywhere in the chain (a wrapped OSError)
            if isinstance(seen, OSError) and seen.errno in _OUT_OF_SPACE:
                return True
            seen = seen.__cause__ or seen.__context__
        root = self._output_root()
        if root is None:
            return False
        try:
            free = shutil.disk_usage(root).free
        except OSError:
            return False
        return free < needed + LOW_SPACE_MARGIN_BYTES

    def _output_root(self) -> Path | None:
        if self.output is not None:
            return self.output.root
        return self.spec.output_dir if self.spec is not None else None

    def _pause_for_space(self, exc: BaseException) -> None:
        if "output" not in self.pause_reasons:
            root = self._output_root()
            try:
                free = f"{shutil.disk_usage(root).free / 1e6:.1f} MB free" if root else "free space unknown"
            except OSError:
                free = "free space unknown"
            detail = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {str(exc)[:240]}"
            self.pause_reasons["output"] = (f"output filesystem full at {root} ({free}; {detail}); "
                                            "continues when there is room")
            self.log(f"paused: {self.pause_reasons['output']}")

    def _space_again(self) -> None:
        if self.pause_reasons.pop("output", None) is not None:
            self.log("output filesystem has space again; continuing")

    def _until_space(self, what: str, action: Any) -> Any:
        """Run a start-up or end-of-job write, pausing (progress says why) while the output disk is full."""
        while True:
            try:
                result = action()
            except Exception as exc:
                if not self._output_full(exc) or self.cancel_requested:
                    raise
                self._pause_for_space(exc)
                self.write_progress()
                time.sleep(OUTPUT_FULL_RETRY_S)
                continue
            self._space_again()
            return result
