"""What a job run tells the world: its log lines, the progress file (``progress.json``) and the output's
``dataset.json``.  `RunReport` is the first layer of `sessions.extraction.runner.JobRun`; it reads the run's
state and writes nothing else.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions.extraction.model_dims import draft_layer_ids
from sessions.extraction.progress import PROGRESS_FILE
from sessions.home import atomic_write_text
from sessions.redaction import redact_text

if TYPE_CHECKING:  # type-only: the runner imports these (collector and rendering lazily) at run time
    from sessions.extraction.backpressure import CaptureSpaceGate
    from sessions.extraction.client import ExtractionClient
    from sessions.extraction.collector import CaptureShape
    from sessions.extraction.model_dims import ModelDims
    from sessions.extraction.output import OutputDir
    from sessions.extraction.progress import RateMeter
    from sessions.extraction.rendering import ChatRenderer
    from sessions.extraction.spec import JobSpec


# The fields of a resumed job's last progress file that stand until the new run has counted its manifest.
CARRIED_FIELDS = ("name", "total", "done", "ok", "skipped", "failed_lines", "extraction_failures", "tokens",
                  "supervised_tokens", "bytes")


class RunReport:
    """The reporting of a job run (its state is set in `JobRun.__init__` and its start-up)."""

    # The run's state that this layer reports.  Declared, not set, here: `JobRun.__init__` gives each its
    # first value (``dims`` and ``renderer`` are set by `JobRun.setup`, before anything reads them).
    job_dir: Path
    job_id: str
    meta: dict[str, Any]
    spec: JobSpec | None
    output: OutputDir | None
    started_at: float
    state: str
    reason: str | None
    pause_reasons: dict[str, str]
    total: int
    counts: dict[str, int]
    tokens: int
    supervised_tokens: int
    bytes: int
    rates: RateMeter
    last_progress_at: float | None
    shape: CaptureShape | None
    client: ExtractionClient | None
    gate: CaptureSpaceGate | None
    estimated_output_bytes: int | None
    storage: dict[str, Any] | None
    pipeline_started_at: float | None
    done_at_pipeline_start: int
    dims: ModelDims
    renderer: ChatRenderer
    carried: dict[str, Any]  # the last run's name and counts, shown until this run has counted
    counted: bool

    def log(self, message: str) -> None:
        # job.log is read by `extract status` and the TUI: a URL's password or a key never reaches it.
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{self.job_id}] {redact_text(message)}", flush=True)

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def snapshot(self) -> dict[str, Any]:
        samples_s, tokens_s, bytes_s = self.rates.rates()
        remaining = max(0, self.total - self.done)
        state = self.state
        reason = self.reason
        if state in ("running", "starting") and self.pause_reasons:
            state = "paused"
            reason = "; ".join(self.pause_reasons.values())
        spec = self.spec
        gate = self.gate
        fill = None
        if gate is not None and gate._usage is not None:
            fill = round(gate._usage.fill, 4)
        snapshot = {
            "job_id": self.job_id,
            "name": spec.name if spec else self.carried.get("name", ""),
            "pid": os.getpid(),
            "create_time": _own_create_time(),
            "python": str(spec.python) if spec and spec.python else sys.executable,
            "state": state,
            "reason": reason,
            "total": self.total,
            "done": self.done,
            "ok": self.counts["ok"],
            "skipped": self.counts["skipped"],
            "failed_lines": self.counts["error"] + self.counts["failed"],
            "extraction_failures": self.counts["failed"],
            "tokens": self.tokens,
            "supervised_tokens": self.supervised_tokens,
            "bytes": self.bytes,
            "samples_per_s": round(samples_s, 3),
            "tokens_per_s": round(tokens_s, 1),
            "gb_per_s": round(bytes_s / 1e9, 4),
            # An ETA only while it runs: a paused, cancelled or failed job has no arrival time.
            "eta_s": (round(remaining / samples_s, 1) if samples_s > 0 and remaining else None)
            if state == "running" else None,
            "output_dir": str(spec.output_dir) if spec else "",
            "dataset": str(spec.dataset) if spec else "",
            "server_url": redact_text(spec.server_url) if spec and spec.server_url else None,
            "started_at": self.started_at,
            "updated_at": time.time(),
            "finished_at": time.time() if self.state in ("done", "failed", "cancelled") else None,
            "last_progress_at": self.last_progress_at,
            "in_flight": gate.in_flight if gate else 0,
            "retries": self.client.retries if self.client else 0,
            "backpressure_waits": gate.waits if gate else 0,
            "peak_reserved_capture_bytes": gate.peak_reserved_bytes if gate else 0,
            "capture_fill": fill,
            "paused_by_user": "user" in self.pause_reasons,
            "estimated_output_bytes": self.estimated_output_bytes,
            "storage": self.storage,  # the estimate against each filesystem's free space (storage.py)
            # For benches: this run's own rate, from the first request to the last recorded outcome
            # (last_progress_at).
            "pipeline_started_at": self.pipeline_started_at,
            "done_this_run": self.done - self.done_at_pipeline_start if self.pipeline_started_at else 0,
        }
        if not self.counted:
            snapshot.update({k: v for k, v in self.carried.items() if k != "name" and (k != "total" or not self.total)})
        return snapshot

    # Snapshots are numbered when taken and a writer never puts an older one over a newer one: the report
    # loop writes from a worker thread while the loop goes on, and the final state written by the loop
    # itself (done, failed) must not be undone by a slow write of a "running" snapshot behind it.
    _progress_lock = threading.Lock()
    _progress_taken = 0
    _progress_written = 0

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

    def _write_dataset_json(self, complete: bool) -> None:
        spec = self.spec
        assert spec is not None and self.output is not None
        shape = self.shape
        points = shape.layers if shape else None
        draft_ids = (list(shape.draft_layer_ids) if shape and shape.draft_layer_ids
                     else draft_layer_ids(points, self.dims))
        previous = self.output.read_dataset_json() or {}
        info = {
            "format": "specforge_hidden_states_v1",
            "writer": "eagle3-tui",
            "job_id": self.job_id,
            "name": spec.name,
            "complete": complete,
            "created_at": previous.get("created_at", self.started_at),
            "updated_at": time.time(),
            "model": {"path": str(spec.model_path), "architectures": list(self.dims.architectures),
                      "model_type": self.dims.model_type, "num_hidden_layers": self.dims.num_layers,
                      "hidden_size": self.dims.hidden_size, "vocab_size": self.dims.vocab_size},
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
            "server_identity": self.meta.get("server_identity"),
            # A job over several servers: each one, and the model identity they all showed.
            "servers": self.meta.get("servers"),
            "model_identity": self.meta.get("model_identity"),
            "accepted_server_changes": list(self.meta.get("accepted_server_changes") or []),
            "session": spec.session,
            "rid_prefix": spec.rid_prefix,
            "dataset": {**(self.meta.get("dataset") or {}), "format": spec.dataset_format},
            "rendering": self.renderer.describe(),
            "file_group_size": spec.file_group_size,
            "counts": {"lines": self.total, **self.counts, "tokens": self.tokens,
                       "supervised_tokens": self.supervised_tokens, "bytes": self.bytes},
            "vocab_mapping": ("vocab_mapping/vocab_mapping.pt"
                              if spec.draft_vocab_size and self.output.vocab_mapping_path.exists() else None),
        }
        self.output.write_dataset_json(info)


_CREATE_TIME: float | None = None


def _own_create_time() -> float | None:
    global _CREATE_TIME
    if _CREATE_TIME is None:
        import psutil

        _CREATE_TIME = psutil.Process().create_time()
    return _CREATE_TIME
