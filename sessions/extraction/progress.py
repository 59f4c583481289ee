"""``JobProgress``: the snapshot of one extraction job that the CLI and the TUI read (never torch).

The job process rewrites ``<jobs_dir>/<job-id>/progress.json`` atomically about twice a second.  A reader
turns it into a frozen ``JobProgress``; a job whose file says ``running``/``paused``/``starting`` but whose
process (pid + create time, never pid alone) is gone reads as ``interrupted``.  ``RateMeter`` is the
sliding window the job process uses for samples/s, tokens/s and GB/s.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from sessions.home import Home, read_json

STATES = ("starting", "running", "paused", "done", "failed", "cancelled", "interrupted")
LIVE_STATES = ("starting", "running", "paused")
PROGRESS_FILE = "progress.json"


@dataclass(frozen=True)
class JobProgress:
    """One job, as its progress file last said (``state`` already corrected for a dead process)."""

    job_id: str
    state: str
    pid: int | None = None
    create_time: float | None = None
    name: str = ""
    reason: str | None = None  # why paused / failed
    total: int = 0
    done: int = 0
    ok: int = 0
    skipped: int = 0
    failed_lines: int = 0  # lines recorded in errors.jsonl (bad input or failed extraction)
    extraction_failures: int = 0  # of those, samples the server path failed (a resume retries them)
    tokens: int = 0
    supervised_tokens: int = 0
    bytes: int = 0
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0
    gb_per_s: float = 0.0
    eta_s: float | None = None
    output_dir: str = ""
    dataset: str = ""
    server_url: str | None = None
    started_at: float | None = None
    updated_at: float | None = None
    finished_at: float | None = None
    last_progress_at: float | None = None  # wall clock of the last sample that reached an outcome
    in_flight: int = 0
    retries: int = 0
    backpressure_waits: int = 0
    capture_fill: float | None = None
    paused_by_user: bool = False
    job_dir: str = ""
    python: str | None = None  # the interpreter running the job
    mode: str = "extract"  # "extract" | "regenerate" (sessions.regeneration writes the same file)
    stats: dict[str, Any] | None = None  # regeneration: the data's shape (answer lengths, finish reasons, ...)
    estimated_output_bytes: int | None = None  # the storage estimate of the whole output (bytes: written)
    storage: dict[str, Any] | None = None  # the estimate against each filesystem (sessions.extraction.storage)
    # A job over several servers: one row per server (name, url, state, reason, done, samples_per_s,
    # failures, in_flight, window), written by `sessions.extraction.scheduler.ServerLane.row`.
    servers: list[dict[str, Any]] | None = None

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobProgress:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def server_row_text(row: dict[str, Any]) -> str:
    """One server of a job over several (``JobProgress.servers``), for ``extract status`` and the jobs
    screen: ``server NAME  STATE  N done, R samples/s, F failures, I/W in flight (reason)``."""
    text = (f"server {row.get('name')}  {row.get('state')}  {row.get('done', 0)} done, "
            f"{float(row.get('samples_per_s') or 0):.1f} samples/s, {row.get('failures', 0)} failures, "
            f"{row.get('in_flight', 0)}/{row.get('window', 0)} in flight")
    return text + (f" ({row['reason']})" if row.get("reason") else "")


def process_alive(pid: int | None, create_time: float | None) -> bool:
    """The process ``pid`` exists and is the one that started at ``create_time`` (pids are reused)."""
    if not pid:
        return False
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.5
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def read_progress(job_dir: Path) -> JobProgress | None:
    """The job in ``job_dir``, or None when it has no readable progress file yet."""
    raw = read_json(Path(job_dir) / PROGRESS_FILE)
    if not isinstance(raw, dict) or "job_id" not in raw:
        return None
    progress = JobProgress.from_json({**raw, "job_dir": str(job_dir)})
    if progress.state in LIVE_STATES and not process_alive(progress.pid, progress.create_time):
        from dataclasses import replace

        progress = replace(progress, state="interrupted", eta_s=None, samples_per_s=0.0, tokens_per_s=0.0,
                           gb_per_s=0.0,
                           reason="the job process is gone (killed, or the machine restarted); "
                                  f"`{'regenerate' if progress.mode == 'regenerate' else 'extract'} resume` "
                                  "continues it")
    return progress


def list_jobs(home: Home) -> list[JobProgress]:
    """Every job under the home's jobs dir, newest first."""
    from sessions import safe_files

    jobs_dir = home.jobs_dir
    if not safe_files.folder_exists(jobs_dir, "jobs folder"):
        return []
    found = [p for d in jobs_dir.iterdir() if d.is_dir() and (p := read_progress(d)) is not None]
    return sorted(found, key=lambda p: p.started_at or 0.0, reverse=True)


@dataclass
class RateMeter:
    """Rates over a sliding window of (time, samples, tokens, bytes) readings of this run only.

    ``start`` sets the baseline when this run begins sending, so a resume's recorded samples never count
    as this run's work.  The rates divide by the time up to now (not to the last reading): a batch of
    outcomes recorded in one instant, or a job that stopped moving, never reads as absurd speed.  No
    rate is given before ``MIN_SPAN_S`` of this run has passed.
    """

    window_s: float = 15.0
    _points: deque = field(default_factory=deque)
    MIN_SPAN_S = 1.0

    def start(self, samples: int, tokens: int, nbytes: int, now: float | None = None) -> None:
        self._points.clear()
        self._points.append((time.monotonic() if now is None else now, samples, tokens, nbytes))

    def add(self, samples: int, tokens: int, nbytes: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._points.append((now, samples, tokens, nbytes))
        while len(self._points) > 2 and now - self._points[1][0] > self.window_s:
            self._points.popleft()

    def rates(self, now: float | None = None) -> tuple[float, float, float]:
        """(samples/s, tokens/s, bytes/s); zeros until two readings and ``MIN_SPAN_S`` exist."""
        if len(self._points) < 2:
            return 0.0, 0.0, 0.0
        now = time.monotonic() if now is None else now
        t0, s0, k0, b0 = self._points[0]
        _t1, s1, k1, b1 = self._points[-1]
        span = now - t0
        if span < self.MIN_SPAN_S:
            return 0.0, 0.0, 0.0
        return (s1 - s0) / span, (k1 - k0) / span, (b1 - b0) / span
