"""DiagnoseScreen: why a session is not ready, on one screen (DESIGN §4, issue 5).

Opened with ``d`` (or from the stall notification) on a session: it runs `sessions.diagnosis.diagnose`
in a thread worker, so the UI never waits on py-spy, psutil or NVML, then shows, in this order: the
verdict and which good start it is compared with, the hints this start's evidence backs (one whose
trigger changed since the baseline first), what changed since the baseline (the changes a known cause
points at first, highlighted), the hints the baseline speaks against, the process table, one collapsible
stack per rank, the last log lines, the phase table and the GPUs; general advice for the phase is folded
at the bottom (``a`` opens it), so at 80x24 the first screen holds the verdict and the top hint.
``p`` lists the good starts to compare with and diagnoses again against the one picked, ``b`` saves the
redacted bundle next to the session, ``r`` diagnoses again, Esc goes back.
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
from textual.screen import ModalScreen, Screen
from textual.widgets import Collapsible, DataTable, Footer, OptionList, Static
from textual.widgets.option_list import Option

from sessions.history import format_duration_s
from widgets.confirm_modal import DismissOnce

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


def _hint_text(hints: Any, with_detail: bool = True) -> Text:
    """One entry per hint: its title and id, why the baseline ranks it there, and (optionally) its detail."""
    text = Text()
    for i, hint in enumerate(hints):
        if i:
            text.append("\n")
        text.append(f"• {hint.title}", style="bold")
        text.append(f"  [{hint.id}]", style="dim")
        if hint.why:
            text.append(f"\n  {hint.why}", style="bold yellow" if hint.rank == "changed" else "italic")
        if with_detail and hint.detail:
            text.append(f"\n  {hint.detail}")
    return text


class BaselinePicker(DismissOnce, ModalScreen[str | None]):
    """The good starts a diagnosis may be compared with (`sessions.baseline.candidates`): Enter picks the
    highlighted one (its session id is the result), Esc keeps the current baseline (None)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="diagnose.baseline.cancel")]
    DEFAULT_CSS = """
    BaselinePicker { align: center middle; }
    BaselinePicker > Vertical {
        width: 90%; max-width: 110; height: auto; max-height: 90%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    BaselinePicker OptionList { height: auto; max-height: 16; }
    """

    def __init__(self, choices: Any, current: str | None) -> None:
        super().__init__()
        self.choices = list(choices)
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("Compare with which good start? (Enter picks, Esc keeps the current one)",
                              style="bold"))
            if not self.choices:
                yield Static(Text("no start of any profile has reached ready yet", style="dim"))
                return
            options = []
            for choice in self.choices:
                record = choice.record
                label = Text(f"{record.profile} at {choice.when}  {record.session_id}")
                if choice.same_shape:
                    label.append("  same model, TP/PP/DP and SGLang version", style="green")
                if record.session_id == self.current:
                    label.append("  (current)", style="dim")
                options.append(Option(label, id=record.session_id))
            yield OptionList(*options, id="baseline-choices")

    def on_mount(self) -> None:
        if self.choices:
            self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


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
    DiagnoseScreen #advice { margin-top: 1; }
    DiagnoseScreen .stack-text { padding-left: 2; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b", "save_bundle", "Save bundle", id="diagnose.bundle"),
        Binding("r", "rediagnose", "Again", id="diagnose.again"),
        Binding("p", "pick_baseline", "Baseline", id="diagnose.baseline"),
        Binding("a", "toggle_advice", "Advice", id="diagnose.advice"),
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
        self.baseline: str | None = None  # a good start picked with p (session id); None: picked automatically
        self.diagnosis: Any = None  # the latest `Diagnosis`, for tests and the bundle action
        self.bundle_path: Any = None
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="diagnose-body"):
            yield Static(Text(f"Diagnosing {self.session_id}: reading the log, the processes and the "
                              "stacks of every rank…"), id="verdict")
            yield Static("", id="compare")
            yield Static("Hints from this start's evidence", classes="section-title")
            yield Static("", id="hints")
            yield Static("Changes since the baseline", classes="section-title")
            yield Static("", id="changes")
            yield Static("Hints the baseline speaks against", classes="section-title", id="demoted-title")
            yield Static("", id="demoted")
            yield Static("Processes", classes="section-title")
            yield DataTable(id="processes", cursor_type="row", zebra_stripes=True)
            yield Static("Stacks", classes="section-title")
            yield Vertical(id="stacks")
            yield Static("Last log lines", classes="section-title")
            yield Static("", id="last-lines")
            yield Static("Baseline phases (the good start and this one)", classes="section-title",
                         id="baseline-title")
            yield DataTable(id="baseline", cursor_type="row")
            yield Static("GPUs", classes="section-title")
            yield Static("", id="gpus")
            with Collapsible(title="General advice for this phase", collapsed=True, id="advice"):
                yield Static("", id="advice-text")
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
                self._load_session(), with_stacks=self._with_stacks, stack_timeout_s=self._stack_timeout_s,
                baseline=self.baseline,
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

    def action_toggle_advice(self) -> None:
        advice = self.query_one("#advice", Collapsible)
        advice.collapsed = not advice.collapsed
        if not advice.collapsed:
            advice.scroll_visible()

    def action_pick_baseline(self) -> None:
        self._load_candidates()

    @work(thread=True, exclusive=True, group="baseline-candidates")
    def _load_candidates(self) -> None:
        """The good starts to offer (history files are read here, off the UI thread)."""
        from sessions import start_facts
        from sessions.baseline import candidates

        try:
            session = self._load_session()
            facts = start_facts.read(session.session_dir)
            found = candidates(session.home, session.profile_name, session.session_id, facts)
        except Exception as exc:  # noqa: BLE001 - shown, never crashes the TUI
            self.app.call_from_thread(self.notify, f"Good starts not read: {type(exc).__name__}: {exc}",
                                      severity="error")
            return
        self.app.call_from_thread(self._offer_candidates, found)

    def _offer_candidates(self, found: Any) -> None:
        current = self.diagnosis.baseline.session_id if self.diagnosis is not None and self.diagnosis.baseline else None
        self.app.push_screen(BaselinePicker(found, current), self._baseline_picked)

    def _baseline_picked(self, session_id: str | None) -> None:
        if not session_id:
            return
        self.baseline = session_id
        self.query_one("#verdict", Static).update(Text(f"Diagnosing {self.session_id} against {session_id}…"))
        self.collect()

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
        if d.silence:  # before ready only: an idle ready server is quiet, not silent
            verdict.append(f" · {d.silence}")
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
        # Without the session id (the picker and the report show it): the top hint stays on an 80x24 screen.
        compare = Text(d.baseline_text(with_id=False), style="bold" if d.baseline_choice is not None else "dim")
        compare.append("  (p picks another)", style="dim")
        compare.append(f"\n{d.compare}", style="italic")
        self.query_one("#compare", Static).update(compare)
        self.query_one("#changes", Static).update(_changes_text(d))

        from sessions.diagnosis.ranking import ADVICE_RANKS, DEMOTED_RANKS, EVIDENCE_RANKS

        first = [h for h in d.hints if h.rank in EVIDENCE_RANKS]
        demoted = [h for h in d.hints if h.rank in DEMOTED_RANKS]
        advice = [h for h in d.hints if h.rank in ADVICE_RANKS]
        self.query_one("#hints", Static).update(
            _hint_text(first) if first else Text("no hint from this start's evidence", style="dim")
        )
        self.query_one("#demoted", Static).update(_hint_text(demoted, with_detail=False))
        self.query_one("#demoted", Static).display = self.query_one("#demoted-title").display = bool(demoted)
        box = self.query_one("#advice", Collapsible)
        box.title = f"General advice for this phase ({len(advice)})" + (
            f" and details of the {len(demoted)} hint(s) above" if demoted else "") + " · a opens it"
        box.display = bool(advice or demoted)
        self.query_one("#advice-text", Static).update(
            _hint_text([*advice, *demoted]) if advice or demoted else Text("")
        )

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
