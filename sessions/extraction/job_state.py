"""The state of one job run: its identity, counts and flags (issue 24 item 6).

`JobState` is the one place the run's outcome counts and its stop flags live.  The other parts of the run
(`sessions.extraction.bookkeeping.OutputBookkeeping`, `sessions.extraction.run_report.RunReport`, the
scheduler, the collector pool) are handed this object and call its methods; none of them reaches into
another's attributes.  Stopping is a broadcast: `abort` and `request_cancel` set the flag once and call the
listeners registered with `on_stop` (the orchestrator's "send no more requests").
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessions.extraction.output import ManifestEntry
from sessions.extraction.progress import PROGRESS_FILE, RateMeter
from sessions.home import read_json

# The fields of a resumed job's last progress file that stand until the new run has counted its manifest.
CARRIED_FIELDS = ("name", "total", "done", "ok", "skipped", "failed_lines", "extraction_failures", "tokens",
                  "supervised_tokens", "bytes")


class JobState:
    """Counts, rates, pause reasons, and the cancel/abort flags of one run (fresh or resumed)."""

    def __init__(self, job_dir: Path, meta: dict[str, Any], resume: bool, log: Callable[[str], None]) -> None:
        self.job_dir = job_dir
        self.job_id: str = meta["job_id"]
        self.meta = meta  # job.json, kept in memory and written back by whoever changes it
        self.resume = resume
        self.log = log
        self.started_at = time.time()
        self.state = "starting"
        self.reason: str | None = None
        self.pause_reasons: dict[str, str] = {}  # "user", "server", "capture", "output" -> why
        self.cancel_requested = False
        self.abort_reason: str | None = None
        self.total = 0
        self.counts = {"ok": 0, "skipped": 0, "error": 0, "failed": 0}
        self.tokens = self.supervised_tokens = self.bytes = 0
        self.rates = RateMeter()
        self.last_progress_at: float | None = None
        self.pipeline_started_at: float | None = None
        self.done_at_pipeline_start = 0
        self.estimated_output_bytes: int | None = None
        self.storage: dict[str, Any] | None = None  # the storage estimate against the free space
        self._stop_listeners: list[Callable[[], None]] = []
        # Until this run has counted the manifest (seconds: the tokenizer loads, the output reconciles), its
        # progress file shows what the last run recorded, not 0/0 and a nameless job.
        previous = read_json(job_dir / PROGRESS_FILE, default={}) or {}
        self.carried: dict[str, Any] = ({k: previous[k] for k in CARRIED_FIELDS if k in previous}
                                        if resume else {})
        if isinstance(previous.get("name"), str):
            self.carried["name"] = previous["name"]
        self.counted = False

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    @property
    def stopped(self) -> bool:
        """Cancelled or aborted: nothing more is sent."""
        return self.cancel_requested or bool(self.abort_reason)

    def count(self, entry: ManifestEntry, rate: bool = True) -> None:
        """One recorded outcome (``rate=False``: one counted from the manifest at start-up)."""
        self.counts[entry.status] = self.counts.get(entry.status, 0) + 1
        if entry.status == "ok":
            self.tokens += entry.tokens
            self.supervised_tokens += entry.supervised_tokens
            self.bytes += entry.bytes
        if rate:
            self.last_progress_at = time.time()
            self.rates.add(self.done, self.tokens, self.bytes)

    def start_pipeline(self) -> None:
        """The first request is about to go: this run's own rate window and counts start here."""
        self.state = "running"
        self.rates.start(self.done, self.tokens, self.bytes)  # this run's own window, not the resumed past
        self.pipeline_started_at = time.time()
        self.done_at_pipeline_start = self.done

    # -- stopping ------------------------------------------------------------------------------------------
    def on_stop(self, listener: Callable[[], None]) -> None:
        self._stop_listeners.append(listener)

    def _stop_sending(self) -> None:
        for listener in self._stop_listeners:
            listener()

    def abort(self, reason: str) -> None:
        """The job cannot go on: the first reason stands, and nothing more is sent."""
        if self.abort_reason:
            return
        self.abort_reason = reason
        self.log(f"aborting: {reason}")
        self._stop_sending()

    def request_cancel(self) -> None:
        if not self.cancel_requested:
            self.cancel_requested = True
            self._stop_sending()
            self.log("cancel requested: finishing the requests in flight")

    # -- pauses --------------------------------------------------------------------------------------------
    def set_user_pause(self, paused: bool) -> None:
        if paused and "user" not in self.pause_reasons:
            self.pause_reasons["user"] = "paused by user"
            self.log("paused by user")
        elif not paused and "user" in self.pause_reasons:
            self.pause_reasons.pop("user")
            self.log("continued by user")

    @property
    def held_by_user(self) -> bool:
        return "user" in self.pause_reasons
