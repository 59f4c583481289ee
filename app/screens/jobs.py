"""The jobs screen (key ``x``): one progress bar per extraction job, its rates, pause/resume/cancel, and a
notification when a job finishes, fails, dies or stalls.  ``n`` starts a job from a spec (in the demo home
the prompt holds the demo job's spec, so Enter starts it); ``r`` also resumes a job whose process died
(``interrupted``) as a new process that continues from the output's manifest.

It reads ``JobProgress`` snapshots (``sessions.extraction.progress``, no torch) in a thread worker and
re-arms a one-shot timer after each render, so polls never pile up (dolphie's loop).  Actions go through
``sessions.extraction.job``, the same functions the CLI uses.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, ListItem, ListView, ProgressBar, Static

from sessions import safe_files
from sessions.extraction.progress import server_row_text
from widgets.confirm_modal import DismissOnce
from widgets.inputs import InOrderInput

if TYPE_CHECKING:
    from sessions.extraction.progress import JobProgress

POLL_INTERVAL_S = 1.0
STALL_AFTER_S = 120.0  # a running job with no sample finished for this long is worth a notification
_STATE_STYLE = {"running": "bold green", "paused": "bold yellow", "starting": "bold cyan", "done": "bold blue",
                "failed": "bold red", "interrupted": "bold red", "cancelled": "dim"}
_FINAL = ("done", "failed", "cancelled", "interrupted")


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA n/a"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"ETA {seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"ETA {seconds // 60}m{seconds % 60:02d}s"


def stalled_for_s(progress: Any, now: float | None = None) -> float | None:
    """Seconds since the last sample finished, for a running job that has stopped moving (else None)."""
    if progress.state != "running":
        return None
    since = progress.last_progress_at or progress.started_at
    if since is None:
        return None
    idle = (now or time.time()) - since
    return idle if idle >= STALL_AFTER_S else None


class JobRow(ListItem):
    """One job: title and state, a progress bar, and a line of rates."""

    DEFAULT_CSS = """
    JobRow { height: auto; padding: 0 1; }
    JobRow > Vertical { height: auto; }
    JobRow ProgressBar { width: 100%; }
    JobRow ProgressBar Bar { width: 1fr; }
    JobRow .job-rates { color: $text-muted; }
    """

    def __init__(self, progress: JobProgress, errors: tuple[tuple[str, int], ...] = ()) -> None:
        # No DOM id: rows are keyed by job id in the screen's own map, so a row being removed while its
        # successor mounts can never clash (the DuplicateIds crash when the set of jobs changed).
        super().__init__()
        self.progress = progress
        self.errors = errors

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(id="title", markup=False)
            yield ProgressBar(total=max(1, self.progress.total), show_eta=False, id="bar")
            yield Static(classes="job-rates", id="rates", markup=False)

    def on_mount(self) -> None:
        self.show(self.progress, self.errors)

    def show(self, p: JobProgress, errors: tuple[tuple[str, int], ...] = ()) -> None:
        self.progress = p
        self.errors = errors
        title = Text()
        title.append(p.name or p.job_id, style="bold")
        title.append(f"  {p.job_id}  ")
        title.append(p.state, style=_STATE_STYLE.get(p.state, "bold"))
        if p.state == "interrupted":  # the process died (SIGKILL, OOM, reboot): nothing is lost, r continues
            title.append(" · r resumes", style="bold")
        if p.reason:
            title.append(f"  {p.reason}", style="italic")
        self.query_one("#title", Static).update(title)
        self.query_one("#bar", ProgressBar).update(total=max(1, p.total), progress=p.done)
        error_count = f"{p.failed_lines} error{'' if p.failed_lines == 1 else 's'}"
        if p.mode == "regenerate":
            self.query_one("#rates", Static).update(Text(regeneration_rates(p)))
            return
        # What is written against the storage estimate, so a disk that cannot hold the job shows early.
        written = _bytes(p.bytes) + (f" of ~{_bytes(p.estimated_output_bytes)} est."
                                     if p.estimated_output_bytes else "")
        rates = (f"{p.done}/{p.total} samples · {error_count} · {p.tokens:,} tokens · {written}"
                 f" · {p.samples_per_s:.1f} samples/s · {p.tokens_per_s:,.0f} tok/s · {p.gb_per_s:.3f} GB/s"
                 f"{' · ' + _eta(p.eta_s) if p.state == 'running' else ''}"
                 f"{' · capture fs ' + format(p.capture_fill, '.0%') if p.capture_fill is not None else ''}")
        line = Text(rates)
        short = [fs for fs in ((p.storage or {}).get("filesystems") or []) if not fs.get("fits")]
        for fs in short:  # --allow-partial ran it anyway: say where it will run out
            line.append(f"\nstorage: {', '.join(fs.get('folders', []))} needs {_bytes(fs.get('needed_bytes', 0))}, "
                        f"{_bytes(fs.get('free_bytes', 0))} free", style="yellow")
        if p.servers and len(p.servers) > 1:  # several servers: one line each (state, done, rate, failures)
            for row in p.servers:
                style = "green" if row.get("state") == "live" else "yellow" if row.get("state") == "down" else "red"
                line.append("\n" + server_row_text(row), style=style)
        if errors:  # why the samples failed, from the job's errors.jsonl, most common first
            line.append("\nwhy: " + " · ".join(f"{reason} ({count})" if count > 1 else reason
                                               for reason, count in errors), style="red")
        self.query_one("#rates", Static).update(line)


class PipelineRow(ListItem):
    """One pipeline (a regeneration, then the extraction of its output): a title, then a bar and a line of
    rates per stage, each drawn as that stage's own job row draws it."""

    DEFAULT_CSS = """
    PipelineRow { height: auto; padding: 0 1; }
    PipelineRow > Vertical { height: auto; }
    PipelineRow ProgressBar { width: 100%; }
    PipelineRow ProgressBar Bar { width: 1fr; }
    PipelineRow .job-rates { color: $text-muted; }
    PipelineRow .stage { text-style: bold; }
    """

    def __init__(self, progress: Any, errors: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__()
        self.progress = progress
        self.errors = errors

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(id="title", markup=False)
            for stage in ("regenerate", "extract"):
                yield Static(classes="stage", id=f"{stage}-label", markup=False)
                yield ProgressBar(total=1, show_eta=False, id=f"{stage}-bar")
                yield Static(classes="job-rates", id=f"{stage}-rates", markup=False)

    def on_mount(self) -> None:
        self.show(self.progress, self.errors)

    def show(self, p: Any, errors: tuple[tuple[str, int], ...] = ()) -> None:
        self.progress = p
        self.errors = errors
        title = Text()
        title.append(p.name or p.job_id, style="bold")
        title.append(f"  pipeline {p.job_id}  ")
        title.append(p.state, style=_STATE_STYLE.get(p.state, "bold"))
        title.append(f" ({p.stage})")
        if p.state == "interrupted":
            title.append(" · r resumes", style="bold")
        if p.reason:
            title.append(f"  {p.reason}", style="italic")
        self.query_one("#title", Static).update(title)
        for stage, job in (("regenerate", p.regenerate), ("extract", p.extract)):
            label = Text(f"{'1 regenerate' if stage == 'regenerate' else '2 extract'}", style="bold")
            if job is not None:
                label.append(f"  {job.job_id}  ", style="")
                label.append(job.state, style=_STATE_STYLE.get(job.state, "bold"))
            else:
                label.append("  not started", style="dim")
            self.query_one(f"#{stage}-label", Static).update(label)
            self.query_one(f"#{stage}-bar", ProgressBar).update(
                total=max(1, job.total if job else 1), progress=job.done if job else 0)
            if job is None:
                rates = Text("waits for the regeneration" if stage == "extract" else "")
            elif stage == "regenerate":
                rates = Text(regeneration_rates(job))
            else:
                rates = Text(extraction_rates(job))
                if errors:
                    rates.append("\nwhy: " + " · ".join(f"{reason} ({count})" if count > 1 else reason
                                                        for reason, count in errors), style="red")
            self.query_one(f"#{stage}-rates", Static).update(rates)


def extraction_rates(p: Any) -> str:
    """An extraction job's line of counts and rates (the pipeline card's second stage)."""
    errors = f"{p.failed_lines} error{'' if p.failed_lines == 1 else 's'}"
    return (f"{p.done}/{p.total} samples · {errors} · {p.tokens:,} tokens · {_bytes(p.bytes)}"
            f" · {p.samples_per_s:.1f} samples/s · {p.tokens_per_s:,.0f} tok/s"
            f"{' · ' + _eta(p.eta_s) if p.state == 'running' else ''}")


def regeneration_rates(p: Any) -> str:
    """A regeneration job's line: rows (success/error/skipped), rates, ETA, then the data's shape."""
    from sessions.regeneration.stats import shape_lines

    text = (f"{p.done}/{p.total} rows · {p.ok} success · {p.failed_lines} error · {p.skipped} skipped"
            f" · {p.tokens:,} tokens · {p.samples_per_s:.1f} rows/s · {p.tokens_per_s:,.0f} tok/s"
            f"{' · ' + _eta(p.eta_s) if p.state == 'running' else ''}")
    return "\n".join([text, *shape_lines(p.stats)])


ERRORS_TAIL_BYTES = 256 * 1024  # the reasons of the latest failures; a huge errors.jsonl is not read whole
ERROR_REASONS_SHOWN = 3


def error_reasons(output_dir: str | Path) -> tuple[tuple[str, int], ...]:
    """The most common reasons in ``<output_dir>/errors.jsonl`` (its last 256 KiB), with their counts.

    Unreadable or partly written lines are skipped: this is a summary for the screen, the file stays the
    record (`extract status` and the file itself have every line)."""
    path = Path(output_dir) / "errors.jsonl"
    try:
        with safe_files.open_file(path, safe_files.OUTPUT_DATA) as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - ERRORS_TAIL_BYTES))
            data = fh.read(ERRORS_TAIL_BYTES)
    except OSError:
        return ()
    counts: Counter[str] = Counter()
    lines = data.splitlines()
    if len(data) == ERRORS_TAIL_BYTES and lines:
        lines = lines[1:]  # the first line may be cut
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            reason = " ".join(str(record.get("reason") or record.get("status") or "unknown").split())
            counts[reason[:160]] += 1
    return tuple(counts.most_common(ERROR_REASONS_SHOWN))


def known_specs(home: Any) -> list[str]:
    """Job specs kept under ``<config>/jobs/*.toml`` (the demo's among them), newest first."""
    folder = home.config_root / "jobs"
    try:
        paths = [p for p in folder.glob("*.toml") if p.is_file() and not p.name.startswith(".")]
        paths.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:  # a folder we cannot read lists nothing; the path can still be typed
        return []
    return [str(p) for p in paths]


def default_spec(home: Any) -> str:
    """What the new-job prompt starts with: the demo job's spec in the demo home (Enter runs it)."""
    if not getattr(home, "demo", False):
        return ""
    from sessions.demo import demo_job_spec_path

    path = demo_job_spec_path(home)
    return str(path) if path.is_file() else ""


class SpecPathModal(DismissOnce, ModalScreen[str | None]):
    """Asks for a job spec path (Enter starts the job, Esc cancels); lists the specs under <config>/jobs."""

    DEFAULT_CSS = """
    SpecPathModal { align: center middle; }
    SpecPathModal > Vertical { width: 90%; max-width: 110; height: auto; border: thick $accent;
                               background: $surface; padding: 0 1; }
    SpecPathModal #known-specs { color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="jobs.new.cancel")]

    def __init__(self, default: str = "", known: list[str] | None = None) -> None:
        super().__init__()
        self.default = default
        self.known = list(known or [])

    def compose(self) -> ComposeResult:
        from textual.suggester import SuggestFromList

        with Vertical():
            yield Static("Start a job from a spec (TOML with a [job] table, or [regenerate] then [extract]):",
                         markup=False)
            yield InOrderInput(value=self.default, placeholder="/path/to/job.toml", id="spec-path",
                        suggester=SuggestFromList(self.known) if self.known else None)
            if self.known:
                shown = self.known[:8]
                more = f"\n  … and {len(self.known) - len(shown)} more" if len(self.known) > len(shown) else ""
                yield Static("Known specs (→ completes):\n" + "\n".join(f"  {k}" for k in shown) + more,
                             id="known-specs", markup=False)

    def on_mount(self) -> None:
        self.query_one("#spec-path", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class JobsScreen(Screen):
    """Every extraction job of the home (demo-aware through ``resolve_home``)."""

    DEFAULT_CSS = """
    JobsScreen { layout: vertical; }
    JobsScreen #jobs-header { padding: 0 1; text-style: bold; }
    JobsScreen #jobs-empty { padding: 1 2; color: $text-muted; }
    JobsScreen ListView { height: 1fr; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "new", "New job", id="jobs.new"),
        Binding("p", "pause", "Pause", id="jobs.pause"),
        Binding("r", "resume", "Resume", id="jobs.resume"),
        Binding("c", "cancel", "Cancel", id="jobs.cancel"),
        Binding("escape", "back", "Back", id="jobs.back"),
    ]

    def __init__(self, home: Any = None) -> None:
        super().__init__()
        self._home = home
        self.jobs: list[Any] = []
        self._states: dict[str, str] = {}
        self._stall_notified: set[str] = set()
        self._first_poll = True
        self._rows: dict[str, JobRow | PipelineRow] = {}  # job id -> its row, the one source for what is on screen
        self._errors: dict[str, tuple[tuple[str, int], ...]] = {}
        self._show_lock = asyncio.Lock()
        self._poll_timer: Any = None
        self.cursor_to: str | None = None  # a job just started here: the cursor goes to it once it is listed

    @property
    def home(self) -> Any:
        if self._home is None:
            from sessions.home import resolve_home

            self._home = resolve_home()
        return self._home

    def compose(self) -> ComposeResult:
        yield Static("Extraction jobs", id="jobs-header")
        yield Static("No extraction jobs yet. Press n to start one from a spec "
                     "(or run `eagle3-tui extract run JOB.toml`).", id="jobs-empty", markup=False)
        yield ListView(id="jobs")
        yield Footer()

    def on_mount(self) -> None:
        self.poll()

    # -- polling ----------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="jobs-poll")
    def poll(self) -> None:
        from sessions.extraction.progress import list_jobs
        from sessions.regeneration.pipeline import list_pipelines

        try:
            jobs: list[Any] = list_jobs(self.home)
            # A pipeline's two stage jobs are shown on its one card, not as rows of their own.
            pipelines = list_pipelines(self.home)
            staged = {stage.job_id for p in pipelines for stage in (p.regenerate, p.extract) if stage is not None}
            jobs = sorted([*pipelines, *(p for p in jobs if p.job_id not in staged)],
                          key=lambda p: p.started_at or 0.0, reverse=True)
        except Exception as exc:  # noqa: BLE001 - an unreadable jobs dir is shown, never crashes the TUI
            self.app.call_from_thread(self.notify, f"Cannot read jobs: {exc}", severity="error")
            jobs = self.jobs
        errors = {}
        for p in jobs:
            shown = p.extract if getattr(p, "mode", None) == "pipeline" else p
            if shown is not None and shown.failed_lines and shown.output_dir:
                errors[p.job_id] = error_reasons(shown.output_dir)
        # Textual's call_from_thread solves its return TypeVar to Never for an async callback returning None.
        self.app.call_from_thread(self._show, jobs, errors)  # type: ignore[arg-type]

    async def _show(self, jobs: list[Any], errors: dict[str, tuple[tuple[str, int], ...]] | None = None) -> None:
        """Bring the rows in line with ``jobs``, in place: a row per job id, updated, added or removed.

        Polls can overlap (an action asks for one while the timer's runs), so updates take turns."""
        async with self._show_lock:
            try:
                view = self.query_one("#jobs", ListView)
                empty = self.query_one("#jobs-empty", Static)
            except NoMatches:
                return  # the screen was closed while this poll was in flight: no repaint, no next poll
            self._notify_changes(jobs)
            self.jobs = jobs
            self._errors = dict(errors or {})
            empty.display = not jobs
            selected = self.selected()
            wanted = {p.job_id for p in jobs}
            gone = [row for job_id, row in self._rows.items() if job_id not in wanted]
            for gone_row in gone:
                del self._rows[gone_row.progress.job_id]
            if gone:
                await view.remove_items([view.children.index(row) for row in gone if row in view.children])
            for position, p in enumerate(jobs):  # newest first, as list_jobs orders them
                row = self._rows.get(p.job_id)
                children = list(view.children)
                if row is None:
                    kind = PipelineRow if getattr(p, "mode", None) == "pipeline" else JobRow
                    row = self._rows[p.job_id] = kind(p, self._errors.get(p.job_id, ()))
                    if position < len(children):
                        await view.mount(row, before=position)
                    else:
                        await view.mount(row)
                    continue
                row.show(p, self._errors.get(p.job_id, ()))
                if position < len(children) and children[position] is not row:
                    view.move_child(row, before=position)  # a job's start time became known
            if jobs:
                keep = selected.job_id if selected is not None else None
                if self.cursor_to in wanted:  # a new job gets the cursor, so r, p and c act on it
                    keep, self.cursor_to = self.cursor_to, None
                rows = list(view.children)
                index = next((i for i, r in enumerate(rows) if isinstance(r, (JobRow, PipelineRow))
                              and r.progress.job_id == keep), None)
                view.index = index if index is not None else min(view.index or 0, len(rows) - 1)
            self._arm_poll()

    def _arm_poll(self) -> None:
        """One poll timer at a time: an extra poll (after an action) must not start a second chain."""
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self._poll_timer = self.set_timer(POLL_INTERVAL_S, self.poll)

    def _notify_changes(self, jobs: list[Any]) -> None:
        for p in jobs:
            before = self._states.get(p.job_id)
            self._states[p.job_id] = p.state
            if before is not None and before != p.state and p.state in _FINAL and not self._first_poll:
                severity: SeverityLevel = "information" if p.state in ("done", "cancelled") else "error"
                detail = f": {p.reason}" if p.reason else ""
                self.notify(f"Job {p.name or p.job_id} {p.state} ({p.done}/{p.total} samples){detail}",
                            severity=severity, timeout=10)
            idle = stalled_for_s(p)
            if idle is not None and p.job_id not in self._stall_notified:
                self._stall_notified.add(p.job_id)
                self.notify(f"Job {p.name or p.job_id} stalled: no sample finished for {idle:.0f} s",
                            severity="warning", timeout=10)
            elif idle is None:
                self._stall_notified.discard(p.job_id)
        self._first_poll = False

    # -- actions ----------------------------------------------------------------------------------------
    def selected(self) -> Any:
        view = self.query_one("#jobs", ListView)
        item = view.highlighted_child
        return item.progress if isinstance(item, (JobRow, PipelineRow)) else None

    def action_pause(self) -> None:
        self._act("pause")

    def action_resume(self) -> None:
        self._act("resume")

    def action_cancel(self) -> None:
        job = self.selected()
        if job is None:
            self.notify("No job selected.", severity="warning")
            return
        if job.state in ("done", "cancelled"):  # nothing runs: no question, and never "cancelled" of done data
            self.notify(f"Job {job.job_id} is already {job.state}: nothing to cancel.", severity="warning")
            return
        from widgets.confirm_modal import ConfirmModal

        def answered(yes: bool | None) -> None:
            if yes:
                self._act("cancel")

        self.app.push_screen(ConfirmModal(f"Cancel job {job.job_id} ({job.name or 'unnamed'}, {job.state})?",
                                          "Requests in flight finish and are kept; `resume` continues later."),
                             answered)

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_new(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self._start(path)

        self.app.push_screen(SpecPathModal(default_spec(self.home), known_specs(self.home)), chosen)

    @work(thread=True, group="jobs-action")
    def _start(self, path: str) -> None:
        from sessions.extraction import job as jobs
        from sessions.regeneration.pipeline import run_any_job

        try:
            job_id = run_any_job(path, self.home)
        except jobs.JobError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=15)
            return
        self.app.call_from_thread(self._started, job_id)

    def _started(self, job_id: str) -> None:
        self.notify(f"Started job {job_id}.")
        self.cursor_to = job_id
        self.poll()

    def _act(self, action: str) -> None:
        job = self.selected()
        if job is None:
            self.notify("No job selected.", severity="warning")
            return
        self._run_action(action, job.job_id)

    @work(thread=True, group="jobs-action")
    def _run_action(self, action: str, job_id: str) -> None:
        from sessions.extraction import job as jobs
        from sessions.regeneration import pipeline

        functions = {"pause": jobs.pause_job, "resume": jobs.resume_job, "cancel": jobs.cancel_job}
        try:
            if pipeline.is_pipeline(job_id, self.home):  # resume: the stage that stopped; else the running one
                progress = pipeline.resume_pipeline(job_id, self.home) if action == "resume" else \
                    functions[action](pipeline.stage_job_id(job_id, self.home), self.home)
            else:
                progress = functions[action](job_id, self.home)
        except jobs.JobError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="warning")
            return
        # What happened, from the job's own record: a cancel may find it already ended on its own.
        said = {"pause": "pausing", "resume": "resumed", "cancel": f"is {progress.state}"}[action]
        self.app.call_from_thread(self.notify, f"Job {job_id} {said}.")
        self.app.call_from_thread(self.poll)
