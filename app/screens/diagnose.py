"""DiagnoseScreen: why a session is not ready, on one screen (DESIGN §4, issue 5).

Opened with ``d`` (or from the stall notification) on a session: it runs `sessions.diagnosis.diagnose`
in a thread worker, so the UI never waits on py-spy, psutil or NVML, then shows the verdict and the
baseline comparison, what changed since the last good start (the changes a known cause points at first,
highlighted), the hints, the process table, one collapsible stack per rank, the GPUs and the last
log lines.  ``b`` saves the redacted bundle next to the session, ``r`` diagnoses again, Esc goes back.
Everything shown is already redacted by the diagnosis; text is rendered without markup, because log
lines and stacks are full of square brackets.
"""
from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Collapsible, DataTable, Footer, Static

from sessions.history import format_duration_s

_STATE_STYLE = {"stalled": "bold yellow", "crashed": "bold red", "ready": "bold green"}


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / (1 << 20):,.0f} MiB"


def _secs(value: float | None) -> str:
    return "" if value is None else format_duration_s(value)


def _changes_text(d: Any) -> Text:
    """One line per change; those a known cause points at in bold yellow, with the causes' ids (``*``: the
    cause matches this start now)."""
    changes = getattr(d, "changes_since_last_good", None)
    if not changes:
        return Text(getattr(d, "changes_note", None) or "nothing to compare with", style="dim")
    text = Text()
    for i, change in enumerate(changes):
        if i:
            text.append("\n")
        if change.implicated_by:
            text.append(f"! {change.describe()}", style="bold yellow")
            causes = ", ".join(f"{c}*" if c in change.hinted_by else c for c in change.implicated_by)
            text.append(f"  known causes: {causes}", style="dim")
        else:
            text.append(f"  {change.describe()}")
    if any(c.implicated_by for c in changes):
        text.append("\n! a known cause points at this change; * that cause matches this start now", style="dim")
    return text


class DiagnoseScreen(Screen):
    """The diagnosis of one session.  ``home`` defaults to the resolved home (demo-aware)."""

    DEFAULT_CSS = """
    DiagnoseScreen { layout: vertical; }
    DiagnoseScreen #diagnose-body { height: 1fr; padding: 0 1; }
    DiagnoseScreen .section-title { text-style: bold; margin-top: 1; }
    DiagnoseScreen #verdict { margin-top: 1; }
    DiagnoseScreen DataTable { height: auto; max-height: 16; }
    DiagnoseScreen #stacks { height: auto; }
    DiagnoseScreen Collapsible { padding-left: 0; }
    DiagnoseScreen .stack-text { padding-left: 2; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b", "save_bundle", "Save bundle", id="diagnose.bundle"),
        Binding("r", "rediagnose", "Again", id="diagnose.again"),
        Binding("escape", "back", "Back", id="diagnose.back"),
    ]

    def __init__(self, session_id: str, home: Any = None, *, with_stacks: bool = True,
                 stack_timeout_s: float = 10.0) -> None:
        super().__init__()
        self.session_id = session_id
        self._home = home
        self._with_stacks = with_stacks
        self._stack_timeout_s = stack_timeout_s
        self._show_lock = asyncio.Lock()
        self.diagnosis: Any = None  # the latest `Diagnosis`, for tests and the bundle action
        self.bundle_path: Any = None
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="diagnose-body"):
            yield Static(Text(f"Diagnosing {self.session_id}: reading the log, the processes and the "
                              "stacks of every rank…"), id="verdict")
            yield Static("", id="compare")
            yield Static("Changes since the last good start", classes="section-title")
            yield Static("", id="changes")
            yield Static("Hints", classes="section-title")
            yield Static("", id="hints")
            yield Static("Processes", classes="section-title")
            yield DataTable(id="processes", cursor_type="row", zebra_stripes=True)
            yield Static("Stacks", classes="section-title")
            yield Vertical(id="stacks")
            yield Static("Baseline (last good start of this profile)", classes="section-title", id="baseline-title")
            yield DataTable(id="baseline", cursor_type="row")
            yield Static("GPUs", classes="section-title")
            yield Static("", id="gpus")
            yield Static("Last log lines", classes="section-title")
            yield Static("", id="last-lines")
        yield Footer()

    def on_mount(self) -> None:
        processes = self.query_one("#processes", DataTable)
        processes.add_columns("proc", "pid", "status", "cpu%", "rss", "thr", "blocked in", "children")
        baseline = self.query_one("#baseline", DataTable)
        baseline.add_columns("phase", "good: at", "good: line", "this: at", "this: line")
        self.collect()

    # -- work -------------------------------------------------------------------------------------------

    def _load_session(self) -> Any:
        from sessions.home import resolve_home
        from sessions.server import ServerSession

        return ServerSession.load(self.session_id, self._home or resolve_home())

    @work(thread=True, exclusive=True, group="diagnose")
    def collect(self) -> None:
        from sessions.diagnosis import diagnose

        try:
            result = diagnose(
                self._load_session(), with_stacks=self._with_stacks, stack_timeout_s=self._stack_timeout_s
            )
        except Exception as exc:  # noqa: BLE001 - a failed diagnosis is shown, never crashes the TUI
            self.app.call_from_thread(self._show_error, f"{type(exc).__name__}: {exc}")
            return
        # Textual's call_from_thread solves its return TypeVar to Never for an async callback (None).
        self.app.call_from_thread(self._show, result)  # type: ignore[arg-type]

    @work(thread=True, exclusive=True, group="bundle")
    def _write_bundle(self) -> None:
        from sessions.diagnosis import default_bundle_path, write_bundle

        try:
            session = self._load_session()
            path = write_bundle(self.diagnosis, session, default_bundle_path(session, self.diagnosis.taken_at))
        except Exception as exc:  # noqa: BLE001
            self.app.call_from_thread(
                self.notify, f"Bundle not written: {type(exc).__name__}: {exc}", severity="error"
            )
            return
        self.app.call_from_thread(self._bundle_written, path)

    # -- actions ----------------------------------------------------------------------------------------

    def action_save_bundle(self) -> None:
        if self.diagnosis is None:
            self.notify("Still diagnosing; the bundle can be saved when it is done.", severity="warning")
            return
        self._write_bundle()

    def action_rediagnose(self) -> None:
        self.query_one("#verdict", Static).update(Text(f"Diagnosing {self.session_id} again…"))
        self.collect()

    def action_back(self) -> None:
        self.app.pop_screen()

    # -- rendering (UI thread) --------------------------------------------------------------------------

    def _bundle_written(self, path: Any) -> None:
        self.bundle_path = path
        self.notify(f"Bundle saved (secrets redacted): {path}", timeout=10)

    def _show_error(self, message: str) -> None:
        self.error = message
        self.query_one("#verdict", Static).update(Text(f"Diagnosis failed: {message}", style="bold red"))

    async def _show(self, d: Any) -> None:
        async with self._show_lock:  # two diagnoses (R pressed twice) draw one after the other
            try:
                await self._draw(d)
            except NoMatches:
                pass  # the screen was closed while this diagnosis was drawn

    async def _draw(self, d: Any) -> None:
        self.diagnosis = d
        self.error = None
        verdict = Text()
        verdict.append(f"{d.state}", style=_STATE_STYLE.get(d.state, "bold"))
        verdict.append(f" in {d.phase}", style="bold")
        verdict.append(f" · log silent for {format_duration_s(d.silent_for_s)}")
        if d.stall_limit_s not in (None, float("inf")):
            verdict.append(f" (limit {format_duration_s(d.stall_limit_s)})")
        verdict.append(f" · port {'listening' if d.port_listening else 'closed'}")
        verdict.append({True: " · /ready 200", False: " · /ready not ready", None: ""}[d.ready])
        if d.silent_ranks:
            verdict.append(f"\nsilent ranks: {', '.join(f'TP{r}' for r in d.silent_ranks)}")
        if d.missing_load_weight_end:
            verdict.append(
                f"\nmissing from Load weight end: {', '.join(f'TP{r}' for r in d.missing_load_weight_end)}",
                style="yellow",
            )
        if d.error:
            verdict.append(f"\nfirst error (line {d.error_line}): {d.error}", style="red")
        self.query_one("#verdict", Static).update(verdict)
        self.query_one("#compare", Static).update(Text(d.compare, style="italic"))
        self.query_one("#changes", Static).update(_changes_text(d))

        hints = Text()
        for i, hint in enumerate(d.hints):
            if i:
                hints.append("\n")
            hints.append(f"• {hint.title}", style="bold")
            hints.append(f"  [{hint.id}]", style="dim")
            if hint.detail:
                hints.append(f"\n  {hint.detail}")
        self.query_one("#hints", Static).update(hints if d.hints else Text("no known cause matched", style="dim"))

        table = self.query_one("#processes", DataTable)
        table.clear()
        for p in d.processes:
            if p.stack is None:
                where = ""
            elif p.stack.ok:
                where = str(p.stack.blocked_in or "?")
            else:
                where = f"[{p.stack.error_kind}]"
            name = p.label if p.role != "other" else (p.title.split(" ")[0].rsplit("/", 1)[-1] or "?")
            table.add_row(
                Text(name), str(p.pid), p.status,
                "n/a" if p.cpu_percent is None else f"{p.cpu_percent:.0f}",
                _mib(p.rss_bytes), "n/a" if p.num_threads is None else str(p.num_threads),
                Text(where), Text(", ".join(c for c in p.children if not c.startswith("sglang::"))),
            )

        stacks_box = self.query_one("#stacks", Vertical)
        # Awaited, and no DOM ids: a second diagnosis (R) must not mount its boxes while the first ones are
        # still being removed (DuplicateIds), and a pid may appear twice (a process listed in two roles).
        await stacks_box.remove_children()
        collapsibles = []
        for p in d.processes:
            if p.stack is None:
                continue
            if p.stack.ok:
                title = f"{p.label} (pid {p.pid}) · blocked in {p.stack.blocked_in}"
                body = p.stack.text
            else:
                title = f"{p.label} (pid {p.pid}) · no stack: {p.stack.error_kind}"
                body = p.stack.error or ""
            collapsibles.append(
                Collapsible(Static(Text(body), classes="stack-text"), title=title, collapsed=True)
            )
        if collapsibles:
            await stacks_box.mount_all(collapsibles)
        else:
            why = "stacks not taken (--no-stacks)" if not d.with_stacks else (d.pyspy.message or "no live ranks")
            await stacks_box.mount(Static(Text(why, style="dim")))

        baseline = self.query_one("#baseline", DataTable)
        baseline.clear()
        # No good start of this profile: no table of blanks (the compare sentence says so).
        baseline.display = self.query_one("#baseline-title").display = d.has_baseline
        for row in d.phase_rows:
            baseline.add_row(
                row.phase, _secs(row.good_at_s), "" if row.good_line is None else str(row.good_line),
                _secs(row.this_at_s), "" if row.this_line is None else str(row.this_line),
            )

        gpus = Text()
        gpus.append(f"{d.gpu_source}: {d.gpu_message or ''}".rstrip(": "), style="dim")
        for g in d.gpus:
            procs = ", ".join(f"{p.label or p.pid} {_mib(p.used_bytes)}" for p in g.processes)
            gpus.append(f"\nGPU{g.index} {_mib(g.memory_used_bytes)} / {_mib(g.memory_total_bytes)}  {procs}")
        self.query_one("#gpus", Static).update(gpus)
        self.query_one("#last-lines", Static).update(Text("\n".join(d.last_lines[-20:])))
