"""What a job run tells the world: its log lines, the progress file (``progress.json``) and the output's
``dataset.json``.  `RunReport` reads the run's `sessions.extraction.job_state.JobState` and the
scheduler's figures (`sessions.extraction.scheduler.SampleScheduler.totals`, given with `attach`) and
writes nothing else.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from sessions.extraction.model_dims import draft_layer_ids
from sessions.extraction.progress import PROGRESS_FILE
from sessions.home import atomic_write_text
from sessions.redaction import redact_text

if TYPE_CHECKING:  # type-only: the runner imports these (collector and rendering lazily) at run time
    from sessions.extraction.collector import CaptureShape
    from sessions.extraction.job_state import JobState
    from sessions.extraction.model_dims import ModelDims
    from sessions.extraction.output import OutputDir
    from sessions.extraction.rendering import ChatRenderer
    from sessions.extraction.scheduler import SampleScheduler
    from sessions.extraction.spec import JobSpec


def log_line(job_id: str, message: str) -> None:
    """One line of job.log (the job's stdout).  job.log is read by `extract status` and the TUI: a URL's
    password or a key never reaches it."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{job_id}] {redact_text(message)}", flush=True)


# What the progress file shows for the dispatch before the scheduler exists (start-up, a failed start).
_IDLE_DISPATCH: dict[str, Any] = {"in_flight": 0, "retries": 0, "backpressure_waits": 0,
                                  "peak_reserved_capture_bytes": 0, "capture_fill": None}


class RunReport:
    """The progress file and dataset.json of a job run."""

    # Snapshots are numbered when taken and a writer never puts an older one over a newer one: the report
    # loop writes from a worker thread while the loop goes on, and the final state written by the loop
    # itself (done, failed) must not be undone by a slow write of a "running" snapshot behind it.
    _progress_lock = threading.Lock()
    _progress_taken = 0
    _progress_written = 0

    def __init__(self, state: JobState) -> None:
        self.state = state
        self.job_dir = state.job_dir
        self.spec: JobSpec | None = None
        self.scheduler: SampleScheduler | None = None

    def attach(self, *, spec: JobSpec | None = None, scheduler: SampleScheduler | None = None) -> None:
        if spec is not None:
            self.spec = spec
        if scheduler is not None:
            self.scheduler = scheduler

    def snapshot(self) -> dict[str, Any]:
        run = self.state
        samples_s, tokens_s, bytes_s = run.rates.rates()
        remaining = max(0, run.total - run.done)
        state = run.state
        reason = run.reason
        if state in ("running", "starting") and run.pause_reasons:
            state = "paused"
            reason = "; ".join(run.pause_reasons.values())
        spec = self.spec
        scheduler = self.scheduler
        dispatch = scheduler.totals() if scheduler is not None else _IDLE_DISPATCH
        rate = samples_s
        if scheduler is not None and len(scheduler.lanes) > 1:
            rate = scheduler.eta_rate()  # the live servers' own rates: a server left out counts for nothing
        snapshot = {
            "job_id": run.job_id,
            "name": spec.name if spec else run.carried.get("name", ""),
            "pid": os.getpid(),
            "create_time": _own_create_time(),
            "python": str(spec.python) if spec and spec.python else sys.executable,
            "state": state,
            "reason": reason,
            "total": run.total,
            "done": run.done,
            "ok": run.counts["ok"],
            "skipped": run.counts["skipped"],
            "failed_lines": run.counts["error"] + run.counts["failed"],
            "extraction_failures": run.counts["failed"],
            "tokens": run.tokens,
            "supervised_tokens": run.supervised_tokens,
            "bytes": run.bytes,
            "samples_per_s": round(samples_s, 3),
            "tokens_per_s": round(tokens_s, 1),
            "gb_per_s": round(bytes_s / 1e9, 4),
            # An ETA only while it runs: a paused, cancelled or failed job has no arrival time.
            "eta_s": (round(remaining / rate, 1) if rate > 0 and remaining else None)
            if state == "running" else None,
            "output_dir": str(spec.output_dir) if spec else "",
            "dataset": str(spec.dataset) if spec else "",
            "server_url": redact_text(spec.server_url) if spec and spec.server_url else None,
            "started_at": run.started_at,
            "updated_at": time.time(),
            "finished_at": time.time() if run.state in ("done", "failed", "cancelled") else None,
            "last_progress_at": run.last_progress_at,
            # in_flight, retries, backpressure_waits, peak_reserved_capture_bytes, capture_fill, and each
            # server's row (``servers``: one row for a one-server job too)
            **dispatch,
            "paused_by_user": "user" in run.pause_reasons,
            "estimated_output_bytes": run.estimated_output_bytes,
            "storage": run.storage,  # the estimate against each filesystem's free space (storage.py)
            # For benches: this run's own rate, from the first request to the last recorded outcome
            # (last_progress_at).
            "pipeline_started_at": run.pipeline_started_at,
            "done_this_run": run.done - run.done_at_pipeline_start if run.pipeline_started_at else 0,
        }
        if not run.counted:
            snapshot.update({k: v for k, v in run.carried.items() if k != "name" and (k != "total" or not run.total)})
        return snapshot

    def write_progress(self) -> None:
        self._write_snapshot(*self._numbered_snapshot())

    async def write_progress_off_loop(self) -> None:
        """``write_progress`` with the disk part (two fsyncs) in a worker thread.  On the event loop those
        fsyncs stalled the job's requests and answers while the output disk was busy (py-spy on the job
        process: the report loop's fsyncs were most of the event loop's own time)."""
        await asyncio.to_thread(self._write_snapshot, *self._numbered_snapshot())

    def _numbered_snapshot(self) -> tuple[int, str]:
        """The next snapshot, numbered, as the text ``atomic_write_json`` writes (encoded here, on the loop,
        so that no thread reads the run's state while the loop changes it)."""
        self._progress_taken += 1
        return self._progress_taken, json.dumps(self.snapshot(), indent=2, sort_keys=True) + "\n"

    def _write_snapshot(self, number: int, text: str) -> None:
        with self._progress_lock:
            if number < self._progress_written:
                return
            atomic_write_text(self.job_dir / PROGRESS_FILE, text)
            self._progress_written = number

    def write_dataset_json(self, output: OutputDir, dims: ModelDims, renderer: ChatRenderer,
                           shape: CaptureShape | None, complete: bool) -> None:
        spec = self.spec
        run = self.state
        assert spec is not None
        points = shape.layers if shape else None
        draft_ids = (list(shape.draft_layer_ids) if shape and shape.draft_layer_ids
                     else draft_layer_ids(points, dims))
        previous = output.read_dataset_json() or {}
        info = {
            "format": "specforge_hidden_states_v1",
            "writer": "eagle3-tui",
            "job_id": run.job_id,
            "name": spec.name,
            "complete": complete,
            "created_at": previous.get("created_at", run.started_at),
            "updated_at": time.time(),
            "model": {"path": str(spec.model_path), "architectures": list(dims.architectures),
                      "model_type": dims.model_type, "num_hidden_layers": dims.num_layers,
                      "hidden_size": dims.hidden_size, "vocab_size": dims.vocab_size},
            "layers": {
                "capture_points": list(points) if points else previous.get("layers", {}).get("capture_points"),
                "draft_config_ids": draft_ids or previous.get("layers", {}).get("draft_config_ids"),
                "meaning": "capture_points: SGLang layers_to_capture (input of decoder layer p = HF "
                           "hidden_states[p]); draft_config_ids: eagle_aux_hidden_state_layer_ids",
            },
            "hidden_size": shape.hidden_size if shape else previous.get("hidden_size"),
            "aux_width": shape.aux_width if shape else previous.get("aux_width"),
            "dtype": "bfloat16",
            "tensors": {"input_ids": "int64 [T]", "loss_mask": "int64 [T]",
                        "hidden_state": "bfloat16 [1, T, H] post-norm final",
                        "aux_hidden_state": "bfloat16 [1, T, K*H] ascending capture points"},
            "sglang_version": (shape.sglang_version if shape else None) or previous.get("sglang_version"),
            # dataset.json is 0644 next to the data: a password in the URL stays in job.json (0600) only.
            "server_url": redact_text(spec.server_url) if spec.server_url else None,
            # What the hidden states came from (sessions.extraction.identity), and every server change an
            # `extract resume --accept-server` let into this dataset.
            "server_identity": run.meta.get("server_identity"),
            # A job over several servers: each one, and the model identity they all showed.
            "servers": run.meta.get("servers"),
            "model_identity": run.meta.get("model_identity"),
            "accepted_server_changes": list(run.meta.get("accepted_server_changes") or []),
            "session": spec.session,
            "rid_prefix": spec.rid_prefix,
            "dataset": {**(run.meta.get("dataset") or {}), "format": spec.dataset_format},
            "rendering": renderer.describe(),
            "file_group_size": spec.file_group_size,
            "counts": {"lines": run.total, **run.counts, "tokens": run.tokens,
                       "supervised_tokens": run.supervised_tokens, "bytes": run.bytes},
            "vocab_mapping": ("vocab_mapping/vocab_mapping.pt"
                              if spec.draft_vocab_size and output.vocab_mapping_path.exists() else None),
        }
        output.write_dataset_json(info)


_CREATE_TIME: float | None = None


def _own_create_time() -> float | None:
    global _CREATE_TIME
    if _CREATE_TIME is None:
        import psutil

        _CREATE_TIME = psutil.Process().create_time()
    return _CREATE_TIME
