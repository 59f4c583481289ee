"""The pipeline inside the detached job process: ``python -m sessions.extraction.runner --job-dir DIR``.

    dataset lines ─▶ render thread ─▶ dispatcher ─▶ (capture gate, client: /generate with retries)
                                                    └▶ collector thread: dumps → checks → .ckpt (tmp+rename)
                                                       └▶ commit loop: one syncfs per batch → manifest lines

Start-up (fresh or ``--resume``, the same path): lock the output dir, reconcile it with its manifest
(``output.OutputDir.reconcile``), check the dataset is the one the job started on, load the tokenizer,
run the disk preflight, delete stale dumps of this job's rids, then stream every line not yet in the
manifest.  SIGTERM (``extract cancel``) stops dispatching, lets the requests in flight finish and exits
``cancelled``; a SIGKILL loses nothing either, because reconcile redoes whatever was not recorded.

`JobRun` is built in layers: `sessions.extraction.run_report.RunReport` (log, progress file, dataset.json),
`sessions.extraction.bookkeeping.OutputBookkeeping` (counting, group commit, pausing on a full disk), and
here the start-up, the pipeline loop and the end.  A job over several servers (``servers = [...]``) runs
its samples through `sessions.extraction.scheduler.SampleScheduler` (a shared queue, one lane per server)
instead of the one-server client loop; everything else (output, manifest, resume) is the same.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions.extraction.backpressure import CaptureSpaceGate, GateClosed
from sessions.extraction.bookkeeping import OutputBookkeeping
from sessions.extraction.client import (
    AttemptFailed,
    ExtractionClient,
    JobAborted,
    RetryPolicy,
    SampleFailed,
    Stopped,
)
from sessions.extraction.collector import may_have_dumps
from sessions.extraction.datasets import DatasetLineError, count_lines, dataset_fingerprint, iter_dataset
from sessions.extraction.job import (
    CONTROL_FILE,
    JOB_FILE,
    SPEC_FILE,
    JobError,
    capture_dir_problem,
    resolve_endpoints,
    resolve_spec,
)
from sessions.extraction.model_dims import read_model_dims
from sessions.extraction.output import ManifestEntry, OutputDir, OutputDirError
from sessions.extraction.progress import PROGRESS_FILE, RateMeter
from sessions.extraction.run_report import CARRIED_FIELDS
from sessions.extraction.scheduler import AimdWindow, SampleScheduler, ServerLane
from sessions.extraction.servers import ModelAgreement, ServerEndpoint
from sessions.extraction.spec import JobSpec, JobSpecError, load_job_spec
from sessions.extraction.storage import dump_bytes_per_token, estimate_storage
from sessions.home import atomic_write_json, read_json, resolve_home

if TYPE_CHECKING:  # imported where it is used, as the other rendering names are
    from sessions.extraction.rendering import ChatRenderer

REPORT_INTERVAL_S = 0.5
PREFLIGHT_SAMPLE_LINES = 64
CANCEL_GRACE_S = 20.0


class JobFailure(Exception):
    """The job cannot go on; the message becomes the progress file's ``reason``."""



class JobRun(OutputBookkeeping):
    """One run of a job process (fresh or resumed)."""

    def __init__(self, job_dir: Path, resume: bool) -> None:
        self.job_dir = job_dir
        self.resume = resume
        meta = read_json(job_dir / JOB_FILE, default={}) or {}
        if "job_id" not in meta:
            raise SystemExit(f"{job_dir} is not a job dir (no {JOB_FILE})")
        self.job_id = meta["job_id"]
        self.meta = meta
        self.spec: JobSpec | None = None
        self.output: OutputDir | None = None
        self.started_at = time.time()
        self.state = "starting"
        self.reason: str | None = None
        self.pause_reasons: dict[str, str] = {}
        self.cancel_requested = False
        self.abort_reason: str | None = None
        self.total = 0
        self.counts = {"ok": 0, "skipped": 0, "error": 0, "failed": 0}
        self.tokens = self.supervised_tokens = self.bytes = 0
        self.rates = RateMeter()
        self.last_progress_at: float | None = None
        self.shape = None  # the first sample's capture shape, which every later one must match
        self._shape_lock = threading.Lock()
        self.client: ExtractionClient | None = None
        self.gate: CaptureSpaceGate | None = None
        self.dump_bytes_per_token = 0
        self.estimated_output_bytes: int | None = None
        self.storage: dict[str, Any] | None = None  # the storage estimate against the free space (progress)
        self.sglang_version: str | None = None
        self.endpoints: list[ServerEndpoint] = []
        self.scheduler: SampleScheduler | None = None  # a job over several servers
        self.agreement = ModelAgreement(meta, lambda: atomic_write_json(job_dir / JOB_FILE, self.meta), self.log)
        self._render_stop = threading.Event()
        self.row_ids: dict[int, str] = {}  # index -> row id, only with sample_ids = "row"
        self.pipeline_started_at: float | None = None
        self.done_at_pipeline_start = 0
        self._uncommitted: list[ManifestEntry] = []
        self._unappended: list[ManifestEntry] = []  # non-ok outcomes waiting for room on the output disk
        # Until this run has counted the manifest (seconds: the tokenizer loads, the output reconciles), its
        # progress file shows what the last run recorded, not 0/0 and a nameless job.
        previous = read_json(job_dir / PROGRESS_FILE, default={}) or {}
        self.carried = {k: previous[k] for k in CARRIED_FIELDS if k in previous} if resume else {}
        if isinstance(previous.get("name"), str):
            self.carried["name"] = previous["name"]
        self.counted = False

    # -- start-up ----------------------------------------------------------------------------------------
    def setup(self) -> Iterator[Any]:
        try:
            spec = load_job_spec(self.job_dir / SPEC_FILE)
        except JobSpecError as exc:
            raise JobFailure(str(exc)) from None
        try:
            spec = resolve_spec(spec, resolve_home())
        except JobError as exc:
            raise JobFailure(str(exc)) from None
        self.spec = spec
        try:
            self.endpoints = resolve_endpoints(spec, resolve_home()) if spec.servers else []
        except JobError as exc:
            raise JobFailure(str(exc)) from None
        for capture_dir in self._capture_dirs():  # again here: a resume, or a change since
            capture_problem = capture_dir_problem(capture_dir)
            if capture_problem:
                raise JobFailure(f"{capture_problem}; `extract resume {self.job_id}` continues once it is fixed")
        if len(self.endpoints) > 1:
            self.meta["servers"] = [e.to_json() for e in self.endpoints]
            self.log(f"{'resuming' if self.resume else 'starting'}: dataset {spec.dataset} → {spec.output_dir} "
                     f"via {len(self.endpoints)} servers: " + ", ".join(
                         f"{e.name} ({e.url}, capture dir {e.capture_dir})" for e in self.endpoints))
        else:
            self.log(f"{'resuming' if self.resume else 'starting'}: dataset {spec.dataset} → {spec.output_dir} "
                     f"via {spec.server_url} (capture dir {spec.capture_dir}, rid prefix {spec.rid_prefix})")
        self.output = OutputDir(spec.output_dir, spec.file_group_size)
        try:
            self.output.acquire(self.job_id, fresh=not self.resume)
        except OutputDirError as exc:
            raise JobFailure(str(exc)) from None
        fingerprint = dataset_fingerprint(spec.dataset)
        known = self.meta.get("dataset")
        if known is None:
            self.meta["dataset"] = fingerprint
            atomic_write_json(self.job_dir / JOB_FILE, self.meta)
        elif known.get("sha256") != fingerprint["sha256"]:
            raise JobFailure(f"dataset {spec.dataset} changed since the job started (sha256 "
                             f"{known.get('sha256', '')[:12]}… → {fingerprint['sha256'][:12]}…); line numbers "
                             "would no longer name the same samples. Start a new job")
        self.total = count_lines(spec.dataset, spec.num_samples)  # before any write: a paused start shows it
        report = self._until_space("reconciling the output", self.output.reconcile)
        if report.redo_missing_files or report.removed_orphans or report.removed_tmp or report.retried_failed:
            self.log(f"reconciled output: {len(report.entries)} recorded, {report.redo_missing_files} to redo "
                     f"(file missing or short), {report.removed_orphans} unrecorded files and "
                     f"{report.removed_tmp} tmp files removed, {report.retried_failed} failed samples to retry")
        for entry in report.entries.values():
            self._count(entry, rate=False)
        self.counted = True
        # resolve_spec filled model_path from the session; the spec check requires it with server_url
        assert spec.model_path is not None
        self.dims = read_model_dims(spec.model_path)
        self.renderer = self._load_renderer(spec)
        self._until_space("writing dataset.json", lambda: self._write_dataset_json(complete=False))
        self._clear_stale_dumps()
        records = iter_dataset(spec.dataset, spec.dataset_format, skip=set(report.entries),
                               limit=spec.num_samples)
        rendered = self._rendered(records)
        head = [item for _, item in zip(range(PREFLIGHT_SAMPLE_LINES), rendered)]
        self._disk_preflight(head)
        return _chain(head, rendered)

    def _load_renderer(self, spec: JobSpec) -> ChatRenderer:
        from sessions.extraction.rendering import ChatRenderer, RendererSetupError

        assert spec.model_path is not None

        try:
            renderer = ChatRenderer.load(
                spec.model_path, trust_remote_code=spec.trust_remote_code, max_length=spec.max_length,
                on_too_long=spec.on_too_long, system_prompt=spec.system_prompt, thinking=spec.thinking,
                chat_template_kwargs=spec.chat_template_kwargs,
            )
        except RendererSetupError as exc:
            raise JobFailure(str(exc)) from None
        needs_template = spec.dataset_format != "tokenized"
        problems = renderer.setup_problems(needs_template)
        if problems:
            raise JobFailure("; ".join(problems))
        return renderer

    def _rendered(self, records: Iterator[Any]) -> Iterator[Any]:
        """Records → RenderedSample, or the ManifestEntry of a line that cannot become a sample."""
        from sessions.extraction.rendering import RenderError

        for record in records:
            if self._render_stop.is_set():
                return
            if isinstance(record, DatasetLineError):
                yield self._entry(record.index, record.line, "error", reason=record.reason)
                continue
            if self.spec is not None and self.spec.sample_ids == "row" and record.row_id:
                self.row_ids[record.index] = record.row_id
            try:
                yield self.renderer.render(record)
            except RenderError as exc:
                yield self._entry(record.index, record.line, exc.status, reason=str(exc))
            except Exception as exc:  # noqa: BLE001 - a tokenizer or template error on one line: a bad line
                yield self._entry(record.index, record.line, "error",
                                  reason=f"cannot render: {type(exc).__name__}: {exc}")

    def _entry(self, index: int, line: int, status: str, **fields: Any) -> ManifestEntry:
        return ManifestEntry(index=index, line=line, sample_id=self._sample_id(index), status=status, **fields)

    def _sample_id(self, index: int) -> str:
        """``<job id>-<index>``, or the row's own id when the spec says ``sample_ids = "row"`` (a dataset
        written by a regeneration job: the ids follow its rows)."""
        return self.row_ids.get(index) or f"{self.job_id}-{index}"

    def _disk_preflight(self, head: list[Any]) -> None:
        """Before the first request: the output's and the capture dirs' need against their free space
        (`sessions.extraction.storage`); refused with the numbers unless --allow-partial (or the spec's
        ``disk_preflight = false``)."""
        spec = self.spec
        assert spec is not None
        hidden = self.dims.hidden_size
        if not hidden:
            self.log("disk preflight skipped: config.json has no hidden_size")
            return
        layers = len(spec.capture_layers) if spec.capture_layers else 3
        self.dump_bytes_per_token = dump_bytes_per_token(hidden, layers)
        lengths = [len(item.input_ids) for item in head if not isinstance(item, ManifestEntry)]
        pending = self.total - self.done
        if not lengths or pending <= 0:
            return
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        captures = self._capture_dirs()
        estimate = estimate_storage(lengths, pending, hidden, layers, spec.concurrency, spec.output_dir, captures)
        self.estimated_output_bytes = estimate.output_bytes
        self.storage = estimate.to_json()
        self.log(f"disk preflight: {estimate.summary()}")
        if estimate.fits:
            return
        allowed = bool((read_json(self.job_dir / CONTROL_FILE, default={}) or {}).get("allow_partial"))
        if allowed or not spec.disk_preflight:
            why = "--allow-partial" if allowed else "disk_preflight = false"
            self.log(f"{estimate.refusal()}\ngoing on ({why}): the job writes what fits and pauses when full")
            return
        raise JobFailure(estimate.refusal())

    def _capture_dirs(self) -> list[Path]:
        """Every capture dir the job reads (one per server)."""
        if len(self.endpoints) > 1:
            return [e.capture_dir for e in self.endpoints]
        return [self.spec.capture_dir] if self.spec is not None and self.spec.capture_dir is not None else []

    def _clear_stale_dumps(self) -> None:
        """Dumps of this job's rids left by a killed run (or still arriving) would mix with new ones."""
        spec = self.spec
        assert spec is not None and spec.capture_dir is not None
        targets = ([(e.capture_dir, e.rid_prefix) for e in self.endpoints] if len(self.endpoints) > 1
                   else [(spec.capture_dir, spec.rid_prefix or "")])
        from sessions.extraction.collector import remove_dumps

        for capture_dir, rid_prefix in targets:
            prefix = f"{rid_prefix}{self.job_id}-"
            try:
                names = [e.name for e in os.scandir(capture_dir) if e.name.startswith(prefix)]
            except FileNotFoundError:
                continue
            for name in names:
                remove_dumps(capture_dir, name)
            if names:
                self.log(f"removed {len(names)} stale dump folders of this job from {capture_dir}")

    def _on_server_state(self, up: bool, reason: str | None) -> None:
        if up:
            self.pause_reasons.pop("server", None)
            self.log("server is back; continuing")
        else:
            self.pause_reasons["server"] = reason or "server unreachable"
            self.log(f"paused: {reason}")
        self.write_progress()

    async def _identity_problem(self) -> str | None:
        """None when the server at the job's URL is the one the job started with (recorded on first
        contact), else the pause reason naming what differs."""
        from sessions.extraction.identity import (
            IdentityUnavailable,
            identity_differences,
            mismatch_reason,
            server_identity,
        )

        spec = self.spec
        assert spec is not None and spec.server_url is not None
        try:
            found = await asyncio.to_thread(server_identity, spec.server_url)
        except IdentityUnavailable as exc:
            return f"server unreachable at {spec.server_url}: {exc}"
        expected = self.meta.get("server_identity")
        if not isinstance(expected, dict):
            self.meta["server_identity"] = found
            atomic_write_json(self.job_dir / JOB_FILE, self.meta)
            self.log("server identity: " + ", ".join(
                f"{k} {v if k != 'weights' else f'{len(v or {})} checkpoint files'}" for k, v in found.items()))
            return None
        differences = identity_differences(expected, found)
        accepted = bool((read_json(self.job_dir / CONTROL_FILE, default={}) or {}).get("accept_server"))
        if accepted:  # one acceptance, for the server that answers now: a later change pauses again
            _clear_control_flag(self.job_dir, "accept_server")
        if not differences:
            return None
        if not accepted:
            return mismatch_reason(spec.server_url, differences, self.job_id)
        self._accept_server(found, differences)
        return None

    def _accept_server(self, found: dict[str, Any], differences: list[str]) -> None:
        """`extract resume JOB --accept-server`: the server that answers now becomes the job's, and the change
        is kept on the record (job.json, and the output's dataset.json: the dataset now holds states of
        both servers, and whoever trains on it can see which changed and when)."""
        change = {"at": time.time(), "differences": differences, "previous": self.meta.get("server_identity"),
                  "accepted": found, "by": "extract resume --accept-server"}
        self.meta.setdefault("accepted_server_changes", []).append(change)
        self.meta["server_identity"] = found
        atomic_write_json(self.job_dir / JOB_FILE, self.meta)
        self.log(f"server change accepted (--accept-server): {'; '.join(differences)}")
        if self.output is not None and self.spec is not None:
            self._until_space("writing dataset.json",
                              lambda: self._write_dataset_json(complete=False))

    def _read_control(self) -> None:
        control = read_json(self.job_dir / CONTROL_FILE, default={}) or {}
        if control.get("cancel"):
            self.request_cancel()
        if control.get("pause") and "user" not in self.pause_reasons:
            self.pause_reasons["user"] = "paused by user"
            self.log("paused by user")
        elif not control.get("pause") and "user" in self.pause_reasons:
            self.pause_reasons.pop("user")
            self.log("continued by user")

    def request_cancel(self) -> None:
        if not self.cancel_requested:
            self.cancel_requested = True
            self._stop_sending()
            self.log("cancel requested: finishing the requests in flight")

    def _stop_sending(self) -> None:
        self._render_stop.set()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.client is not None:
            self.client.stop()
        if self.gate is not None:
            self.gate.closed = True

    async def _report_loop(self) -> None:
        last_sync = time.monotonic()
        while True:
            self._read_control()
            gate = self.gate
            if gate is not None and gate.blocked_reason:
                self.pause_reasons["capture"] = gate.blocked_reason
            else:
                self.pause_reasons.pop("capture", None)
            await self.write_progress_off_loop()
            if time.monotonic() - last_sync > 2.0 and self.output is not None:
                await asyncio.to_thread(self.output.sync_manifest)
                last_sync = time.monotonic()
            await asyncio.sleep(REPORT_INTERVAL_S)

    async def pipeline(self, items: Iterator[Any]) -> None:
        if len(self.endpoints) > 1:
            await self._pipeline_many(items)
            return
        spec = self.spec
        assert spec is not None and spec.capture_dir is not None and spec.server_url is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self.request_cancel)
        self.client = ExtractionClient(
            spec.server_url, concurrency=spec.concurrency,
            retry=RetryPolicy(spec.max_retries, spec.retry_backoff_s, spec.retry_backoff_max_s),
            request_timeout_s=spec.request_timeout_s, max_consecutive_failures=spec.max_consecutive_failures,
            server_down_timeout_s=spec.server_down_timeout_s, on_server_state=self._on_server_state,
            identity_check=self._identity_problem,
        )
        self.gate = CaptureSpaceGate(spec.capture_dir, spec.capture_fill_threshold, spec.capture_budget_bytes)
        self.pool = ThreadPoolExecutor(max_workers=max(2, min(8, spec.concurrency)),
                                       thread_name_prefix="collector")
        self.state = "running"
        self.rates.start(self.done, self.tokens, self.bytes)  # this run's own window, not the resumed past
        problem = await self._identity_problem()
        if problem is not None:
            self.client.hold(problem)  # a resume against another server waits: nothing is sent to it
        self.pipeline_started_at = time.time()  # from the first request (the identity read comes before)
        self.done_at_pipeline_start = self.done
        reporter = loop.create_task(self._report_loop())
        commit_stop = asyncio.Event()
        committer = loop.create_task(self._commit_loop(commit_stop))
        ready: queue.Queue = queue.Queue(maxsize=max(64, 4 * spec.concurrency))
        renderer_thread = threading.Thread(target=self._render_into, args=(items, ready), daemon=True,
                                           name="render")
        renderer_thread.start()
        slots = asyncio.Semaphore(2 * spec.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self.cancel_requested and not self.abort_reason:
                try:
                    item = ready.get_nowait()
                except queue.Empty:
                    await asyncio.sleep(0.002)
                    continue
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise JobFailure(f"reading the dataset failed: {item}")
                if isinstance(item, ManifestEntry):
                    self._record(item)
                    continue
                while "user" in self.pause_reasons and not self.cancel_requested:
                    await asyncio.sleep(0.1)
                if not await _acquire_unless(slots, lambda: self.cancel_requested or bool(self.abort_reason)):
                    break
                task = loop.create_task(self._process(item))
                tasks.add(task)
                task.add_done_callback(_done_callback(tasks, slots))
            if tasks:
                timeout = CANCEL_GRACE_S if (self.cancel_requested or self.abort_reason) else None
                _done, pending = await asyncio.wait(set(tasks), timeout=timeout)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending)
        finally:
            self._render_stop.set()
            reporter.cancel()
            await self.client.aclose()
            await asyncio.to_thread(self.pool.shutdown, True)
            commit_stop.set()
            await committer  # its last round commits everything the collectors wrote
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    # -- a job over several servers (sessions.extraction.scheduler) --------------------------------------
    async def _pipeline_many(self, items: Iterator[Any]) -> None:
        spec = self.spec
        assert spec is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self.request_cancel)
        retry = RetryPolicy(spec.max_retries, spec.retry_backoff_s, spec.retry_backoff_max_s)
        lanes = [ServerLane(e, ExtractionClient(e.url, concurrency=spec.concurrency, retry=retry,
                                                request_timeout_s=spec.request_timeout_s),
                            CaptureSpaceGate(e.capture_dir, spec.capture_fill_threshold, spec.capture_budget_bytes),
                            AimdWindow(spec.concurrency))
                 for e in self.endpoints]

        async def clear(lane: ServerLane, rid: str) -> None:
            if may_have_dumps(lane.endpoint.capture_dir, rid):
                await loop.run_in_executor(self.pool, _remove_quietly, lane.endpoint.capture_dir, rid)

        self.scheduler = scheduler = SampleScheduler(
            lanes, job_id=self.job_id, retry=retry, max_straight_failures=spec.max_consecutive_failures,
            identity_check=lambda lane: self.agreement.problem(lane.endpoint.url), on_change=self._on_lanes_changed,
            log=self.log,
            clear=clear, dump_bytes_per_token=lambda: self.dump_bytes_per_token)
        self.pool = ThreadPoolExecutor(max_workers=max(2, min(16, spec.concurrency * len(lanes))),
                                       thread_name_prefix="collector")
        self.state = "running"
        self.rates.start(self.done, self.tokens, self.bytes)
        await self._check_lanes(lanes)
        self.pipeline_started_at = time.time()  # from the first request (the identity reads come before)
        self.done_at_pipeline_start = self.done
        reporter = loop.create_task(self._report_loop())
        commit_stop = asyncio.Event()
        committer = loop.create_task(self._commit_loop(commit_stop))
        ready: queue.Queue = queue.Queue(maxsize=max(64, 4 * spec.concurrency * len(lanes)))
        threading.Thread(target=self._render_into, args=(items, ready), daemon=True, name="render").start()

        def take() -> Any:
            try:
                item = ready.get_nowait()
            except queue.Empty:
                return _EMPTY
            if isinstance(item, BaseException):
                raise JobFailure(f"reading the dataset failed: {item}")
            return item

        def fail(sample: Any, reason: str) -> ManifestEntry:
            return self._entry(sample.index, sample.line, "failed", tokens=len(sample.input_ids), reason=reason)

        async def collect(lane: ServerLane, sample: Any, rid: str) -> ManifestEntry:
            return await self._collect_in_pool(sample, rid, lane.endpoint.capture_dir)

        def stopped() -> bool:
            return self.cancel_requested or bool(self.abort_reason)

        try:
            await scheduler.run(take, _END, _EMPTY, self._record, collect, fail, stopped,
                                held=lambda: "user" in self.pause_reasons)
            if scheduler.abort_reason and not self.abort_reason:
                self.abort_reason = scheduler.abort_reason
                self.log(f"aborting: {scheduler.abort_reason}")
                self._stop_sending()
            if scheduler.tasks:
                timeout = CANCEL_GRACE_S if stopped() else None
                _done, pending = await asyncio.wait(set(scheduler.tasks), timeout=timeout)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending)
        finally:
            self._render_stop.set()
            scheduler.stop()
            reporter.cancel()
            await scheduler.aclose()
            await asyncio.to_thread(self.pool.shutdown, True)
            commit_stop.set()
            await committer
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    async def _check_lanes(self, lanes: list[ServerLane]) -> None:
        """Before the first request: every server's identity; the odd one is left out, named, with the
        reason (`sessions.extraction.servers.ModelAgreement`), and one that does not answer waits for its
        prober."""
        states = await self.agreement.check([lane.endpoint.url for lane in lanes])
        for lane, (state, reason) in zip(lanes, states):
            lane.state, lane.reason = state, reason
            self.log(f"server {lane.name} ({lane.endpoint.url}): {state}" + (f": {reason}" if reason else ""))
        self._on_lanes_changed()

    def _on_lanes_changed(self) -> None:
        """The job pauses while no server is live, the reason naming each one."""
        reason = self.scheduler.no_server_reason() if self.scheduler is not None else None
        if reason:
            if self.pause_reasons.get("server") != reason:
                self.log(f"paused: {reason}")
            self.pause_reasons["server"] = reason
        elif self.pause_reasons.pop("server", None) is not None:
            self.log("a server is live again; continuing")
        self.write_progress()

    def snapshot(self) -> dict[str, Any]:
        snapshot = super().snapshot()
        scheduler = self.scheduler
        if scheduler is None:
            return snapshot
        snapshot.update(scheduler.totals())
        remaining = max(0, self.total - self.done)
        rate = scheduler.eta_rate()  # the live servers' own rates: a server left out counts for nothing
        snapshot["eta_s"] = (round(remaining / rate, 1) if rate > 0 and remaining else None) \
            if snapshot["state"] == "running" else None
        return snapshot

    def _render_into(self, items: Iterator[Any], ready: queue.Queue) -> None:
        def put(value: Any) -> bool:
            while not self._render_stop.is_set():
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
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop, which fails the job
            put(exc)

    async def _process(self, sample: Any) -> None:
        spec = self.spec
        assert spec is not None and spec.capture_dir is not None and self.client and self.gate
        capture_dir = spec.capture_dir
        rid = f"{spec.rid_prefix}{self.job_id}-{sample.index}"
        sample_id = self._sample_id(sample.index)
        loop = asyncio.get_running_loop()

        async def collect(_meta: dict[str, Any]) -> ManifestEntry:
            return await self._collect_in_pool(sample, rid, capture_dir)

        async def clear() -> None:
            if may_have_dumps(capture_dir, rid):
                await loop.run_in_executor(self.pool, _remove_quietly, capture_dir, rid)

        try:
            async with self.gate.reserve(len(sample.input_ids) * self.dump_bytes_per_token):
                entry = await self.client.extract(rid, sample.input_ids, collect, before_attempt=clear)
        except SampleFailed as exc:
            entry = self._entry(sample.index, sample.line, "failed", tokens=len(sample.input_ids),
                                reason=exc.reason)
            await loop.run_in_executor(self.pool, _remove_quietly, capture_dir, rid)
        except JobAborted as exc:
            if not self.abort_reason:
                self.abort_reason = str(exc)
                self.log(f"aborting: {exc}")
                self._stop_sending()
            return
        except (Stopped, GateClosed):
            return  # cancelled before it was sent: the next run sends it
        except Exception as exc:  # noqa: BLE001 - a sample must end with an outcome, not a silent dead task
            self.log(f"sample {sample_id}: {traceback.format_exc()}")
            entry = self._entry(sample.index, sample.line, "failed", tokens=len(sample.input_ids),
                                reason=f"{type(exc).__name__}: {exc}")
        self._record(entry)

    async def _collect_in_pool(self, sample: Any, rid: str, capture_dir: Path) -> ManifestEntry:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.pool, self._collect_and_write, sample, rid,
                                              self._sample_id(sample.index), capture_dir)
        except AttemptFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a capture dir refused as unsafe: a failed attempt,
            # counted toward max_consecutive_failures, never a task that dies without an outcome
            raise AttemptFailed(f"collecting {rid} failed: {type(exc).__name__}: {exc}",
                                retryable=isinstance(exc, OSError)) from None

    def _collect_and_write(self, sample: Any, rid: str, sample_id: str, capture_dir: Path) -> ManifestEntry:
        """In a collector thread: dumps → checked sample → atomic file → dumps deleted."""
        from sessions.extraction.collector import collect_sample, remove_dumps

        spec = self.spec
        assert spec is not None and self.output is not None
        with self._shape_lock:
            expected = self.shape
        data, shape = collect_sample(capture_dir, rid, sample_id, sample.input_ids, sample.loss_mask,
                                     expected, spec.dump_wait_s)
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
        rel, size, checksum = self._write_until_space(sample.index, data)
        remove_dumps(capture_dir, rid)
        return self._entry(sample.index, sample.line, "ok", tokens=len(sample.input_ids),
                           supervised_tokens=sum(sample.loss_mask), path=rel, bytes=size, checksum=checksum)

    # -- the end -----------------------------------------------------------------------------------------
    def finish(self) -> None:
        spec = self.spec
        assert spec is not None and self.output is not None
        self.output.sync_manifest()
        self._clear_stale_dumps()
        if self.abort_reason:
            self.state, self.reason = "failed", self.abort_reason
        elif self.cancel_requested:
            self.state, self.reason = "cancelled", "cancelled by user"
        else:
            if spec.draft_vocab_size and self.counts["ok"]:
                self.log("counting supervised tokens for vocab_mapping/vocab_mapping.pt")
                entries, _ = self.output.read_manifest()
                counts = self.output.token_counts(entries.values())
                target_vocab = self.dims.vocab_size or self.renderer.vocab_size
                self.output.write_vocab_mapping(counts, spec.draft_vocab_size, target_vocab)
            self.state, self.reason = "done", None
            if self.done < self.total:  # every line must have an outcome; a gap means a bug, not success
                self.state = "failed"
                self.reason = (f"{self.total - self.done} lines have no outcome; `extract resume` retries them")
        self.pause_reasons.clear()
        self._until_space("writing dataset.json", lambda: self._write_dataset_json(complete=self.state == "done"))
        self.log(f"{self.state}: {self.counts['ok']} samples written, {self.counts['skipped']} skipped, "
                 f"{self.counts['error']} bad lines, {self.counts['failed']} failed"
                 + (f" ({self.reason})" if self.reason else ""))

    def run(self) -> int:
        try:
            self.write_progress()
            items = self.setup()
            self.write_progress()
            asyncio.run(self.pipeline(items))
            self.finish()
            self.write_progress()
            return 0 if self.state in ("done", "cancelled") else 1
        except JobFailure as exc:
            self.state, self.reason = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - any crash must end as a readable state, not a silent death
            self.log(traceback.format_exc())
            self.state, self.reason = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            if self.output is not None:
                self.output.release()
        self.pause_reasons.clear()
        self.log(f"failed: {self.reason}")
        self.write_progress()
        return 1


_END = object()
_EMPTY = object()


def _done_callback(tasks: set[asyncio.Task[None]],
                   slots: asyncio.Semaphore) -> Callable[[asyncio.Task[None]], None]:
    """A finished sample task leaves the in-flight set and gives its slot back."""
    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        slots.release()

    return done


async def _acquire_unless(slots: asyncio.Semaphore, stop: Any) -> bool:
    """Take a slot, or give up (False) once ``stop()`` is true: slots may be held by waiting samples."""
    while True:
        try:
            await asyncio.wait_for(slots.acquire(), timeout=0.2)
        except TimeoutError:
            if stop():
                return False
            continue
        if stop():
            slots.release()
            return False
        return True


def _clear_control_flag(job_dir: Path, flag: str) -> None:
    control = read_json(job_dir / CONTROL_FILE, default={}) or {}
    if control.get(flag):
        control[flag] = False
        atomic_write_json(job_dir / CONTROL_FILE, control)


def _chain(head: list[Any], rest: Iterator[Any]) -> Iterator[Any]:
    yield from head
    yield from rest


def _remove_quietly(capture_dir: Path, rid: str) -> None:
    from sessions.extraction.collector import remove_dumps

    try:
        remove_dumps(capture_dir, rid)
    except OSError:
        pass



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessions.extraction.runner")
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    try:
        import setproctitle

        setproctitle.setproctitle(f"eagle3-tui::extract {args.job_dir.name}")
    except ImportError:
        pass
    return JobRun(args.job_dir, args.resume).run()


if __name__ == "__main__":
    sys.exit(main())
