"""The pipeline inside the detached job process: ``python -m sessions.extraction.runner --job-dir DIR``.

    dataset lines ─▶ SampleSource (render thread) ─▶ SampleScheduler (one lane per server; one for a
                     one-server job) ─▶ /generate ─▶ CollectorPool: dumps → checks → .ckpt (tmp+rename)
                                                      └▶ OutputBookkeeping: one syncfs per batch → manifest

Start-up (fresh or ``--resume``, the same path): lock the output dir, reconcile it with its manifest
(``output.OutputDir.reconcile``), check the dataset is the one the job started on, load the tokenizer,
run the disk preflight, delete stale dumps of this job's rids, then stream every line not yet in the
manifest.  SIGTERM (``extract cancel``) stops dispatching, lets the requests in flight finish and exits
``cancelled``; a SIGKILL loses nothing either, because reconcile redoes whatever was not recorded.

`JobRun` is the orchestrator (set up, run, finish) of parts that each own one concern and talk through
explicit calls (issue 24 item 6): `sessions.extraction.job_state.JobState` (counts, flags, the job's
identity), `sessions.extraction.bookkeeping.OutputBookkeeping` (group commit, manifest appends, the
full-disk pause), `sessions.extraction.run_report.RunReport` (progress file, dataset.json, log),
`sessions.extraction.sample_source.SampleSource` (rendering), `sessions.extraction.collecting.CollectorPool`
(the collector's threads) and `sessions.extraction.scheduler.SampleScheduler` (the one dispatch loop).
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions.extraction.backpressure import CaptureSpaceGate
from sessions.extraction.bookkeeping import OutputBookkeeping
from sessions.extraction.client import ExtractionClient, RetryPolicy
from sessions.extraction.collecting import CollectorPool, clear_stale_dumps
from sessions.extraction.datasets import count_lines, dataset_fingerprint, iter_dataset
from sessions.extraction.job import (
    CONTROL_FILE,
    JOB_FILE,
    SPEC_FILE,
    JobError,
    capture_dir_problem,
    resolve_endpoints,
    resolve_spec,
)
from sessions.extraction.job_state import JobState
from sessions.extraction.model_dims import ModelDims, read_model_dims
from sessions.extraction.output import ManifestEntry, OutputDir, OutputDirError
from sessions.extraction.run_report import RunReport, log_line
from sessions.extraction.sample_source import EMPTY, END, SampleSource, SourceFailed
from sessions.extraction.scheduler import AimdWindow, SampleScheduler, ServerLane
from sessions.extraction.servers import ModelAgreement, ServerEndpoint, ServerIdentityCheck
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


class JobRun:
    """One run of a job process (fresh or resumed): wires the parts, then set up, run, finish."""

    def __init__(self, job_dir: Path, resume: bool) -> None:
        meta = read_json(job_dir / JOB_FILE, default={}) or {}
        if "job_id" not in meta:
            raise SystemExit(f"{job_dir} is not a job dir (no {JOB_FILE})")
        self.job_dir = job_dir
        self.log = functools.partial(log_line, meta["job_id"])
        self.state = JobState(job_dir, meta, resume, self.log)
        self.report = RunReport(self.state)
        self.books = OutputBookkeeping(self.state, write_progress=self.report.write_progress,
                                       read_control=self.read_control)
        self.agreement = ModelAgreement(meta, self._save_meta, self.log)
        self.spec: JobSpec | None = None
        self.output: OutputDir | None = None
        self.endpoints: list[ServerEndpoint] = []
        self.source = SampleSource(self.state.job_id, row_ids_wanted=False)
        self.collector: CollectorPool | None = None
        self.scheduler: SampleScheduler | None = None
        self.dims: ModelDims | None = None
        self.renderer: ChatRenderer | None = None
        self.preflight_bytes_per_token = 0
        self.state.on_stop(self._stop_sending)

    @property
    def job_id(self) -> str:
        return self.state.job_id

    def _save_meta(self) -> None:
        atomic_write_json(self.job_dir / JOB_FILE, self.state.meta)

    # -- start-up ----------------------------------------------------------------------------------------
    def setup(self) -> Iterator[Any]:
        state = self.state
        try:
            spec = load_job_spec(self.job_dir / SPEC_FILE)
        except JobSpecError as exc:
            raise JobFailure(str(exc)) from None
        try:
            spec = resolve_spec(spec, resolve_home())
        except JobError as exc:
            raise JobFailure(str(exc)) from None
        self.spec = spec
        self.report.attach(spec=spec)
        self.books.output_root = spec.output_dir
        self.source = SampleSource(self.job_id, row_ids_wanted=spec.sample_ids == "row")
        try:
            many = resolve_endpoints(spec, resolve_home()) if spec.servers else []
        except JobError as exc:
            raise JobFailure(str(exc)) from None
        verb = "resuming" if state.resume else "starting"
        if len(many) > 1:
            self.endpoints = many
            state.meta["servers"] = [e.to_json() for e in many]
            self.log(f"{verb}: dataset {spec.dataset} → {spec.output_dir} via {len(many)} servers: " + ", ".join(
                f"{e.name} ({e.url}, capture dir {e.capture_dir})" for e in many))
        else:  # one server: a list of one lane, from the spec as resolve_spec filled it
            assert spec.server_url is not None and spec.capture_dir is not None
            self.endpoints = [ServerEndpoint(spec.session or spec.server_url, spec.server_url, spec.capture_dir,
                                             spec.rid_prefix or "", spec.model_path, spec.session)]
            self.log(f"{verb}: dataset {spec.dataset} → {spec.output_dir} "
                     f"via {spec.server_url} (capture dir {spec.capture_dir}, rid prefix {spec.rid_prefix})")
        for endpoint in self.endpoints:  # again here: a resume, or a change since
            capture_problem = capture_dir_problem(endpoint.capture_dir)
            if capture_problem:
                raise JobFailure(f"{capture_problem}; `extract resume {self.job_id}` continues once it is fixed")
        self.output = OutputDir(spec.output_dir, spec.file_group_size)
        try:
            self.output.acquire(self.job_id, fresh=not state.resume)
        except OutputDirError as exc:
            raise JobFailure(str(exc)) from None
        self.books.attach(self.output)
        fingerprint = dataset_fingerprint(spec.dataset)
        known = state.meta.get("dataset")
        if known is None:
            state.meta["dataset"] = fingerprint
            self._save_meta()
        elif known.get("sha256") != fingerprint["sha256"]:
            raise JobFailure(f"dataset {spec.dataset} changed since the job started (sha256 "
                             f"{known.get('sha256', '')[:12]}… → {fingerprint['sha256'][:12]}…); line numbers "
                             "would no longer name the same samples. Start a new job")
        state.total = count_lines(spec.dataset, spec.num_samples)  # before any write: a paused start shows it
        report = self.books.until_space("reconciling the output", self.output.reconcile)
        if report.redo_missing_files or report.removed_orphans or report.removed_tmp or report.retried_failed:
            self.log(f"reconciled output: {len(report.entries)} recorded, {report.redo_missing_files} to redo "
                     f"(file missing or short), {report.removed_orphans} unrecorded files and "
                     f"{report.removed_tmp} tmp files removed, {report.retried_failed} failed samples to retry")
        for entry in report.entries.values():
            state.count(entry, rate=False)
        state.counted = True
        # resolve_spec filled model_path from the session; the spec check requires it with server_url
        assert spec.model_path is not None
        self.dims = read_model_dims(spec.model_path)
        self.renderer = self._load_renderer(spec)
        self.books.until_space("writing dataset.json", lambda: self.write_dataset_json(complete=False))
        self._clear_stale_dumps()
        records = iter_dataset(spec.dataset, spec.dataset_format, skip=set(report.entries),
                               limit=spec.num_samples)
        rendered = self.source.rendered(records, self.renderer)
        head = [item for _, item in zip(range(PREFLIGHT_SAMPLE_LINES), rendered)]
        self._disk_preflight(head)
        return _chain(head, rendered)

    def write_dataset_json(self, complete: bool) -> None:
        assert self.output is not None and self.dims is not None and self.renderer is not None
        shape = self.collector.shape if self.collector is not None else None
        self.report.write_dataset_json(self.output, self.dims, self.renderer, shape, complete)
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

    def _disk_preflight(self, head: list[Any]) -> None:
        """Before the first request: the output's and the capture dirs' need against their free space
        (`sessions.extraction.storage`); refused with the numbers unless --allow-partial (or the spec's
        ``disk_preflight = false``)."""
        spec = self.spec
        assert spec is not None
        assert self.dims is not None
        hidden = self.dims.hidden_size
        if not hidden:
            self.log("disk preflight skipped: config.json has no hidden_size")
            return
        layers = len(spec.capture_layers) if spec.capture_layers else 3
        self.preflight_bytes_per_token = dump_bytes_per_token(hidden, layers)
        lengths = [len(item.input_ids) for item in head if not isinstance(item, ManifestEntry)]
        pending = self.state.total - self.state.done
        if not lengths or pending <= 0:
            return
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        captures = [e.capture_dir for e in self.endpoints]
        estimate = estimate_storage(lengths, pending, hidden, layers, spec.concurrency, spec.output_dir, captures)
        self.state.estimated_output_bytes = estimate.output_bytes
        self.state.storage = estimate.to_json()
        self.log(f"disk preflight: {estimate.summary()}")
        if estimate.fits:
            return
        allowed = bool((read_json(self.job_dir / CONTROL_FILE, default={}) or {}).get("allow_partial"))
        if allowed or not spec.disk_preflight:
            why = "--allow-partial" if allowed else "disk_preflight = false"
            self.log(f"{estimate.refusal()}\ngoing on ({why}): the job writes what fits and pauses when full")
            return
        raise JobFailure(estimate.refusal())

    def _clear_stale_dumps(self) -> None:
        clear_stale_dumps([(e.capture_dir, e.rid_prefix) for e in self.endpoints], self.job_id, self.log)

    # -- control -------------------------------------------------------------------------------------------
    def read_control(self) -> None:
        control = read_json(self.job_dir / CONTROL_FILE, default={}) or {}
        if control.get("cancel"):
            self.state.request_cancel()
        self.state.set_user_pause(bool(control.get("pause")))

    def _stop_sending(self) -> None:
        self.source.stop.set()
        if self.scheduler is not None:
            self.scheduler.stop()

    def _on_lanes_changed(self) -> None:
        """The job pauses while no server is live, the reason naming each one (with one server, its own)."""
        pauses = self.state.pause_reasons
        reason = self.scheduler.no_server_reason() if self.scheduler is not None else None
        if reason:
            if pauses.get("server") != reason:
                self.log(f"paused: {reason}")
            pauses["server"] = reason
        elif pauses.pop("server", None) is not None:
            self.log("server is back; continuing" if len(self.endpoints) == 1
                     else "a server is live again; continuing")
        self.report.write_progress()

    async def _report_loop(self) -> None:
        last_sync = time.monotonic()
        while True:
            self.read_control()
            blocked = self.scheduler.capture_blocked_reason() if self.scheduler is not None else None
            if blocked:
                self.state.pause_reasons["capture"] = blocked
            else:
                self.state.pause_reasons.pop("capture", None)
            await self.report.write_progress_off_loop()
            if time.monotonic() - last_sync > 2.0 and self.output is not None:
                await asyncio.to_thread(self.output.sync_manifest)
                last_sync = time.monotonic()
            await asyncio.sleep(REPORT_INTERVAL_S)

    # -- the pipeline: the scheduler over the job's lanes (one for a one-server job) ----------------------
    async def pipeline(self, items: Iterator[Any]) -> None:
        spec = self.spec
        state = self.state
        assert spec is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, state.request_cancel)
        retry = RetryPolicy(spec.max_retries, spec.retry_backoff_s, spec.retry_backoff_max_s)
        lanes = [ServerLane(e, ExtractionClient(e.url, concurrency=spec.concurrency, retry=retry,
                                                request_timeout_s=spec.request_timeout_s),
                            CaptureSpaceGate(e.capture_dir, spec.capture_fill_threshold, spec.capture_budget_bytes),
                            AimdWindow(spec.concurrency))
                 for e in self.endpoints]
        # Many servers are held to one model (ModelAgreement); one server to its whole identity, which
        # `extract resume --accept-server` may change (ServerIdentityCheck).
        identity: ModelAgreement | ServerIdentityCheck = self.agreement if len(lanes) > 1 else ServerIdentityCheck(
            state.meta, self._save_meta, self.log, self.job_id, self.job_dir / CONTROL_FILE,
            on_accept=lambda: self.books.until_space("writing dataset.json",
                                                     lambda: self.write_dataset_json(complete=False)))
        workers = max(2, min(8 * len(lanes), 16, spec.concurrency * len(lanes)))
        self.collector = collector = CollectorPool(self.books, self.source, self.log, spec.dump_wait_s, workers,
                                                   self.preflight_bytes_per_token)

        async def clear(lane: ServerLane, rid: str) -> None:
            await collector.clear(lane.endpoint.capture_dir, rid)

        async def identity_check(lane: ServerLane) -> str | None:
            return await identity.problem(lane.endpoint.url)

        self.scheduler = scheduler = SampleScheduler(
            lanes, job_id=self.job_id, retry=retry, max_straight_failures=spec.max_consecutive_failures,
            identity_check=identity_check, on_change=self._on_lanes_changed, log=self.log, clear=clear,
            dump_bytes_per_token=lambda: collector.dump_bytes_per_token, down_timeout_s=spec.server_down_timeout_s)
        self.report.attach(scheduler=scheduler)
        state.start_pipeline()
        await self._check_lanes(lanes, identity)
        state.pipeline_started_at = time.time()  # from the first request (the identity reads come before)
        reporter = loop.create_task(self._report_loop())
        commit_stop = asyncio.Event()
        committer = loop.create_task(self.books.commit_loop(commit_stop))
        self.source.start(items, depth=max(64, 4 * spec.concurrency * len(lanes)))

        async def collect(lane: ServerLane, sample: Any, rid: str) -> ManifestEntry:
            return await collector.collect(sample, rid, lane.endpoint.capture_dir)

        try:
            try:
                await scheduler.run(self.source.take, END, EMPTY, self.books.record, collect, self.source.failed,
                                    lambda: state.stopped, held=lambda: state.held_by_user)
            except SourceFailed as exc:
                raise JobFailure(str(exc)) from None
            if scheduler.abort_reason:
                state.abort(scheduler.abort_reason)
            if scheduler.tasks:
                timeout = CANCEL_GRACE_S if state.stopped else None
                _done, pending = await asyncio.wait(set(scheduler.tasks), timeout=timeout)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending)
        finally:
            self.source.stop.set()
            scheduler.stop()
            reporter.cancel()
            await scheduler.aclose()
            await collector.shutdown()
            commit_stop.set()
            await committer  # its last round commits everything the collectors wrote
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    async def _check_lanes(self, lanes: list[ServerLane], identity: ModelAgreement | ServerIdentityCheck) -> None:
        """Before the first request: every server's identity; the odd one is left out, named, with the
        reason, and one that does not answer waits for its prober.  A one-server job against another server
        on its port stays paused: nothing is sent to it."""
        states = await identity.check([lane.endpoint.url for lane in lanes])
        for lane, (lane_state, reason) in zip(lanes, states):
            lane.state, lane.reason = lane_state, reason
            if len(lanes) > 1 or reason:
                self.log(f"server {lane.name} ({lane.endpoint.url}): {lane_state}" + (f": {reason}" if reason else ""))
        assert self.scheduler is not None
        self.scheduler.lanes_checked()
        self._on_lanes_changed()

    # -- the end -----------------------------------------------------------------------------------------
    def finish(self) -> None:
        spec = self.spec
        state = self.state
        assert spec is not None and self.output is not None and self.dims is not None and self.renderer is not None
        self.output.sync_manifest()
        self._clear_stale_dumps()
        if state.abort_reason:
            state.state, state.reason = "failed", state.abort_reason
        elif state.cancel_requested:
            state.state, state.reason = "cancelled", "cancelled by user"
        else:
            if spec.draft_vocab_size and state.counts["ok"]:
                self.log("counting supervised tokens for vocab_mapping/vocab_mapping.pt")
                entries, _ = self.output.read_manifest()
                counts = self.output.token_counts(entries.values())
                target_vocab = self.dims.vocab_size or self.renderer.vocab_size
                self.output.write_vocab_mapping(counts, spec.draft_vocab_size, target_vocab)
            state.state, state.reason = "done", None
            if state.done < state.total:  # every line must have an outcome; a gap means a bug, not success
                state.state = "failed"
                state.reason = f"{state.total - state.done} lines have no outcome; `extract resume` retries them"
        state.pause_reasons.clear()
        self.books.until_space("writing dataset.json", lambda: self.write_dataset_json(complete=state.state == "done"))
        self.log(f"{state.state}: {state.counts['ok']} samples written, {state.counts['skipped']} skipped, "
                 f"{state.counts['error']} bad lines, {state.counts['failed']} failed"
                 + (f" ({state.reason})" if state.reason else ""))

    def run(self) -> int:
        state = self.state
        try:
            self.report.write_progress()
            items = self.setup()
            self.report.write_progress()
            asyncio.run(self.pipeline(items))
            self.finish()
            self.report.write_progress()
            return 0 if state.state in ("done", "cancelled") else 1
        except JobFailure as exc:
            state.state, state.reason = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - any crash must end as a readable state, not a silent death
            self.log(traceback.format_exc())
            state.state, state.reason = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            if self.output is not None:
                self.output.release()
        state.pause_reasons.clear()
        self.log(f"failed: {state.reason}")
        self.report.write_progress()
        return 1


def _chain(head: list[Any], rest: Iterator[Any]) -> Iterator[Any]:
    yield from head
    yield from rest


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
