"""The samples of a job run: dataset records rendered into samples in a thread, handed to the scheduler.

`SampleSource` owns the render thread, its stop flag, the sample ids (``<job id>-<index>``, or a row's own
id with ``sample_ids = "row"``) and the manifest entries of lines that cannot become a sample.  The
scheduler pulls with `take`, which never blocks: a sample, a `ManifestEntry`, `END` or `EMPTY`.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sessions.extraction.datasets import DatasetLineError
from sessions.extraction.output import ManifestEntry

if TYPE_CHECKING:  # imported where it is used, as the other rendering names are
    from sessions.extraction.rendering import ChatRenderer

END = object()
EMPTY = object()


class SourceFailed(Exception):
    """Reading or rendering the dataset failed (not one bad line: the reader itself)."""


class SampleSource:
    """Records → samples (or the entries of bad lines), rendered ahead in a thread into a bounded queue."""

    def __init__(self, job_id: str, row_ids_wanted: bool) -> None:
        self.job_id = job_id
        self.row_ids_wanted = row_ids_wanted
        self.row_ids: dict[int, str] = {}  # index -> row id, only with sample_ids = "row"
        self.stop = threading.Event()
        self._ready: queue.Queue[Any] | None = None

    def sample_id(self, index: int) -> str:
        """``<job id>-<index>``, or the row's own id when the spec says ``sample_ids = "row"`` (a dataset
        written by a regeneration job: the ids follow its rows)."""
        return self.row_ids.get(index) or f"{self.job_id}-{index}"

    def entry(self, index: int, line: int, status: str, **fields: Any) -> ManifestEntry:
        return ManifestEntry(index=index, line=line, sample_id=self.sample_id(index), status=status, **fields)

    def failed(self, sample: Any, reason: str) -> ManifestEntry:
        """The entry of a sample whose extraction failed."""
        return self.entry(sample.index, sample.line, "failed", tokens=len(sample.input_ids), reason=reason)

    def rendered(self, records: Iterator[Any], renderer: ChatRenderer) -> Iterator[Any]:
        """Records → RenderedSample, or the ManifestEntry of a line that cannot become a sample."""
        from sessions.extraction.rendering import RenderError

        for record in records:
            if self.stop.is_set():
                return
            if isinstance(record, DatasetLineError):
                yield self.entry(record.index, record.line, "error", reason=record.reason)
                continue
            if self.row_ids_wanted and record.row_id:
                self.row_ids[record.index] = record.row_id
            try:
                yield renderer.render(record)
            except RenderError as exc:
                yield self.entry(record.index, record.line, exc.status, reason=str(exc))
            except Exception as exc:  # noqa: BLE001 - a tokenizer or template error on one line: a bad line
                yield self.entry(record.index, record.line, "error",
                                 reason=f"cannot render: {type(exc).__name__}: {exc}")

    def start(self, items: Iterator[Any], depth: int) -> None:
        """Render ``items`` ahead in a thread, at most ``depth`` waiting."""
        self._ready = queue.Queue(maxsize=depth)
        threading.Thread(target=self._render_into, args=(items, self._ready), daemon=True, name="render").start()

    def take(self) -> Any:
        assert self._ready is not None
        try:
            item = self._ready.get_nowait()
        except queue.Empty:
            return EMPTY
        if isinstance(item, BaseException):
            raise SourceFailed(f"reading the dataset failed: {item}")
        return item

    def _render_into(self, items: Iterator[Any], ready: queue.Queue[Any]) -> None:
        def put(value: Any) -> bool:
            while not self.stop.is_set():
                try:
                    ready.put(value, timeout=0.2)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for item in items:
                if not put(item):
                    return
            put(END)
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop, which fails the job
            put(exc)
