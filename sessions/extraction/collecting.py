"""The collector's side of a job run: a pool of threads that turn one answered request's dumps into one
written sample (`sessions.extraction.collector.collect_sample`, then the output through
`sessions.extraction.bookkeeping.OutputBookkeeping.write_until_space`), and the capture dirs' cleaning.

`CollectorPool` owns the threads, the capture shape every sample of the job must share (the first
sample's), and the dump size a token that the capture gates reserve.
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions.extraction.client import AttemptFailed
from sessions.extraction.output import ManifestEntry

if TYPE_CHECKING:
    from collections.abc import Callable

    from sessions.extraction.bookkeeping import OutputBookkeeping
    from sessions.extraction.collector import CaptureShape
    from sessions.extraction.sample_source import SampleSource


class CollectorPool:
    """Collect-and-write in worker threads, one sample at a time each."""

    def __init__(self, books: OutputBookkeeping, source: SampleSource, log: Callable[[str], None],
                 dump_wait_s: float, workers: int, dump_bytes_per_token: int = 0) -> None:
        self.books = books
        self.source = source
        self.log = log
        self.dump_wait_s = dump_wait_s
        self.shape: CaptureShape | None = None  # the first sample's capture shape, which every later one must match
        self.dump_bytes_per_token = dump_bytes_per_token  # the preflight's estimate until the first sample
        self._shape_lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="collector")

    async def collect(self, sample: Any, rid: str, capture_dir: Path) -> ManifestEntry:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.pool, self._collect_and_write, sample, rid,
                                              self.source.sample_id(sample.index), capture_dir)
        except AttemptFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a capture dir refused as unsafe: a failed attempt,
            # counted toward max_consecutive_failures, never a task that dies without an outcome
            raise AttemptFailed(f"collecting {rid} failed: {type(exc).__name__}: {exc}",
                                retryable=isinstance(exc, OSError)) from None

    async def clear(self, capture_dir: Path, rid: str) -> None:
        """Remove ``rid``'s dumps (before an attempt, after a failed one).  A rid with no dumps (the usual
        first attempt) is one file check here, not a wait in the pool's queue behind samples being written."""
        from sessions.extraction.collector import may_have_dumps

        if may_have_dumps(capture_dir, rid):
            await asyncio.get_running_loop().run_in_executor(self.pool, remove_quietly, capture_dir, rid)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.pool.shutdown, True)

    def _collect_and_write(self, sample: Any, rid: str, sample_id: str, capture_dir: Path) -> ManifestEntry:
        """In a collector thread: dumps → checked sample → atomic file → dumps deleted."""
        from sessions.extraction.collector import collect_sample, remove_dumps

        with self._shape_lock:
            expected = self.shape
        data, shape = collect_sample(capture_dir, rid, sample_id, sample.input_ids, sample.loss_mask,
                                     expected, self.dump_wait_s)
        with self._shape_lock:
            if self.shape is None:
                self.shape = shape
                self.log(f"capture: hidden size {shape.hidden_size}, {shape.num_layers} aux layers, capture "
                         f"points {list(shape.layers) if shape.layers else 'unknown'}, SGLang "
                         f"{shape.sglang_version or 'unknown'}")
                self.dump_bytes_per_token = 2 * (shape.aux_width + shape.hidden_size) + 8
            elif (shape.aux_width, shape.hidden_size) != (self.shape.aux_width, self.shape.hidden_size):
                raise AttemptFailed(f"capture widths changed mid-job: aux {shape.aux_width}, hidden "
                                    f"{shape.hidden_size} (job: {self.shape.aux_width}, {self.shape.hidden_size})",
                                    retryable=False)
        rel, size, checksum = self.books.write_until_space(sample.index, data)
        remove_dumps(capture_dir, rid)
        return self.source.entry(sample.index, sample.line, "ok", tokens=len(sample.input_ids),
                                 supervised_tokens=sum(sample.loss_mask), path=rel, bytes=size, checksum=checksum)


def clear_stale_dumps(targets: list[tuple[Path, str]], job_id: str, log: Callable[[str], None]) -> None:
    """Dumps of this job's rids left by a killed run (or still arriving) would mix with new ones:
    ``targets`` are (capture dir, rid prefix) of each server."""
    from sessions.extraction.collector import remove_dumps

    for capture_dir, rid_prefix in targets:
        prefix = f"{rid_prefix}{job_id}-"
        try:
            names = [e.name for e in os.scandir(capture_dir) if e.name.startswith(prefix)]
        except FileNotFoundError:
            continue
        for name in names:
            remove_dumps(capture_dir, name)
        if names:
            log(f"removed {len(names)} stale dump folders of this job from {capture_dir}")


def remove_quietly(capture_dir: Path, rid: str) -> None:
    from sessions.extraction.collector import remove_dumps

    try:
        remove_dumps(capture_dir, rid)
    except OSError:
        pass
