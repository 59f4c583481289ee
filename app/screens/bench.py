"""The bench screen (key ``b``): bench the selected ready session, then compare the kept results.

With a session it runs `sessions.bench.session_bench.bench_session` in a thread worker (warm-up, then
concurrency 1, 8, 32) with a progress bar, shows the per-concurrency table (bench_serving's figures) and
keeps the result.  Below, every kept result side by side: profile, date, key flag differences against the
best row, single-stream tok/s, TTFT and throughput at the highest concurrency; the best is starred.
``space`` marks rows: with two marked (or one, against the best) the full flag diff is shown.
``c`` compares two profiles with `sessions.bench.compare.run_compare` (A = the first marked row's profile,
B = the second's; with fewer than two marked, type ``A B``: profiles or sessions): each is launched if
needed, both are benched `BenchScreen.rounds` times, alternating, and stopped after; the screen shows the
workload, B against A per concurrency (medians with their min-max range over rounds) and the verdict.
A compare that is still running when the screen closes (``escape``) or the TUI quits is ended there and
then, and stops the servers it launched (`end_compare`): the CLI does the same on its signals, and the
TUI's thread worker is reached by none.  Quitting waits for those stops and says so on the screen.
The top pane scrolls both ways (``tab`` focuses it, then the arrows, PgUp/PgDn, Home/End), so at 80x24 no
row or column of the tables is out of reach.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import ScrollableContainer, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, ProgressBar, Static

from sessions.bench.metrics import RUN_HEAD, run_notes, run_rows

COMPARE_COLUMNS = ("conc", "A tok/s", "B tok/s", "speedup", "A ITL med", "B ITL med", "ITL ratio",
                   "accept len", "accept rate", "break-even", "verdict")
HISTORY_COLUMNS = ("", "profile", "date", "flags vs best", "1-stream tok/s", "TTFT ms", "top conc",
                   "top tok/s")


def _failure_text(exc: Exception) -> str:
    """A bench's refusal as the screen says it: the message of an expected failure (a BenchError, a file
    or value problem), the type too for anything else."""
    from sessions.bench.runner import BenchError

    return str(exc) if isinstance(exc, (BenchError, OSError, ValueError)) else f"{type(exc).__name__}: {exc}"


class BenchScreen(Screen):
    """See the module docstring."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back"),
        Binding("space", "mark", "Mark"),
        Binding("r", "rerun", "Bench again"),
        Binding("c", "compare", "Compare A/B"),
    ]
    DEFAULT_CSS = """
    BenchScreen { layout: vertical; }
    BenchScreen .pane { border: round $panel-lighten-2; padding: 0 1; height: auto; }
    BenchScreen #run-pane { height: auto; max-height: 60%; }
    BenchScreen #run-pane:focus { border: round $accent; }
    BenchScreen #run-pane > * { width: auto; min-width: 100%; }
    BenchScreen #run-status { width: 100%; }
    BenchScreen #progress { display: none; }
    BenchScreen #progress.-running { display: block; }
    BenchScreen #results { height: auto; width: auto; }
    BenchScreen #results.-hidden { display: none; }
    BenchScreen #compare { height: auto; width: auto; display: none; }
    BenchScreen #compare.-shown { display: block; }
    BenchScreen #compare-input { display: none; }
    BenchScreen #compare-input.-shown { display: block; }
    BenchScreen #history-pane { height: 1fr; }
    BenchScreen #history { height: 1fr; }
    BenchScreen #diff { height: auto; max-height: 10; }
    """

    # what `b` runs (the CLI's defaults: input 256, output 128, concurrency 1, 8, 32)
    default_options: Any = None
    rounds = 3  # of each side in a compare (the CLI's --rounds default)

    def __init__(self, home: Any, session_id: str | None = None) -> None:
        super().__init__()
        self.home = home
        self.session_id = session_id
        self.running = False
        self.last_result: dict[str, Any] | None = None
        self.rows: list[Any] = []
        self.marked: list[str] = []
        self.last_compare: dict[str, Any] | None = None
        self.comparing = False  # a compare's worker runs (until its cleanup has stopped what it launched)
        self.compare_ended = threading.Event()  # set: the running compare is asked to end
        self._after_compare: Callable[[], Any] | None = None

    def compose(self) -> ComposeResult:
        with ScrollableContainer(id="run-pane", classes="pane", can_focus=True):
            yield Static(id="run-status")
            yield ProgressBar(id="progress", total=1, show_eta=False)
            yield DataTable(id="results", cursor_type="none", zebra_stripes=True)
            yield DataTable(id="compare", cursor_type="none", zebra_stripes=True)
            yield Input(id="compare-input", placeholder="A B: two profiles or sessions to compare (Enter)")
        with Vertical(id="history-pane", classes="pane"):
            yield DataTable(id="history", cursor_type="row", zebra_stripes=True)
            yield Static(id="diff")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#run-pane").border_title = "Bench (tab: focus, arrows scroll)"
        self.query_one("#history-pane").border_title = "Kept results (best ★, space marks two to diff, c compares A/B)"
        self.query_one("#results", DataTable).add_columns(*RUN_HEAD)
        self.query_one("#compare", DataTable).add_columns(*COMPARE_COLUMNS)
        self.query_one("#history", DataTable).add_columns(*HISTORY_COLUMNS)
        self.load_history()
        if self.session_id is not None:
            self.start_bench()
        else:
            self.query_one("#run-status", Static).update("No ready session selected: kept results only.")

    # -- running ------------------------------------------------------------------------------------------

    def start_bench(self) -> None:
        if self.running or self.session_id is None:
            return
        self.running = True
        self.query_one("#results", DataTable).clear()  # rows come in one per concurrency as each ends
        self.query_one("#results", DataTable).remove_class("-hidden")
        self.query_one("#compare", DataTable).remove_class("-shown")
        self.query_one("#progress", ProgressBar).add_class("-running")
        self.query_one("#run-status", Static).update(f"Benchmarking {self.session_id}: warm-up ...")
        self._bench(self.session_id)

    @work(thread=True, exclusive=True, group="bench")
    def _bench(self, session_id: str) -> None:
        from sessions.bench.session_bench import BenchOptions, bench_session
        from sessions.bench.store import save_result
        from sessions.server import ServerSession

        app = self.app  # while the screen is attached: a closed screen no longer reaches its app

        def report(draw: Callable[..., None], *args: Any) -> None:
            app.call_from_thread(self._while_shown, draw, *args)

        def progress(concurrency: int, done: int, total: int) -> None:
            report(self._progress, concurrency, done, total)

        try:
            session = ServerSession.load(session_id, self.home)
            options = self.default_options or BenchOptions()
            result = bench_session(session, options, progress,
                                   bench_argv=["eagle3-tui", "bench", session_id],
                                   on_result=lambda run: report(self._run_done, run))
            path = save_result(self.home, result)
        except Exception as exc:  # noqa: BLE001 - shown on the screen, the TUI keeps running
            report(self._failed, _failure_text(exc))
            return
        report(self._done, result, str(path))

    def _while_shown(self, draw: Callable[..., None], *args: Any) -> None:
        """Draw what the bench's thread reports, unless the screen was closed meanwhile (Esc while it runs):
        the thread runs on (its result is kept in the history all the same), and a draw on the closed screen
        found no widgets (NoMatches), which `call_from_thread` raised in the thread, failing the worker and
        ending the app (tests/test_tui_fuzz.py: ``b`` then Esc).  The thread reaches the app it captured at
        its start: ``self.app`` of a screen already removed raises there."""
        if self in self.app.screen_stack:  # popped at once by Esc; its widgets go later
            draw(*args)

    def _progress(self, concurrency: int, done: int, total: int) -> None:
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=total, progress=done)
        self.query_one("#run-status", Static).update(
            f"Benchmarking {self.session_id}: concurrency {concurrency}, {done}/{total} requests")

    def _run_done(self, run: dict[str, Any]) -> None:
        """One concurrency finished: its row appears now (the single stream's tok/s after the first run)."""
        if self.running:
            self.query_one("#results", DataTable).add_row(*run_rows([run])[0])

    def _failed(self, message: str) -> None:
        self.running = False
        self.query_one("#progress", ProgressBar).remove_class("-running")
        self.query_one("#run-status", Static).update(Text(f"Bench failed: {message}", style="bold red"))
        self.notify(f"Bench failed: {message}", severity="error")

    def _done(self, result: dict[str, Any], path: str) -> None:
        self.running = False
        self.last_result = result
        self.query_one("#progress", ProgressBar).remove_class("-running")
        single = next((r for r in result["runs"] if r["max_concurrency"] == 1), None)
        headline = f", single stream {single['output_throughput']:.1f} tok/s" if single else ""
        self.query_one("#run-status", Static).update(
            f"{result['profile']} ({result['session']}){headline} · SGLang {result.get('sglang_version') or '?'}"
            f" · kept as {path} · latencies in ms" + "".join(f"\n{note}" for note in run_notes(result["runs"])))
        for note in run_notes(result["runs"]):
            self.notify(note, severity="warning")
        table = self.query_one("#results", DataTable)
        table.clear()
        for row in run_rows(result["runs"]):
            table.add_row(*row)
        self.load_history()

    # -- history ------------------------------------------------------------------------------------------

    def load_history(self) -> None:
        from sessions.bench.store import best_row, load_history, short_changes

        rows, problems = load_history(self.home)
        for problem in problems:
            self.notify(problem, severity="warning")
        self.rows = rows
        best = best_row(rows)
        table = self.query_one("#history", DataTable)
        table.clear()
        for row in reversed(rows):  # newest first
            star = "★" if row is best else ("•" if row.id in self.marked else "")
            flags = "best" if row is best or best is None else short_changes(best, row)
            table.add_row(
                star, row.profile, time.strftime("%Y-%m-%d %H:%M", time.localtime(row.time)), flags[:60],
                _num(row.single_stream_tok_s, ".1f"), _num(row.ttft_ms, ".1f"), _num(row.top_concurrency, "d"),
                _num(row.top_throughput, ".1f"), key=row.id,
            )
        self._show_diff()

    def action_mark(self) -> None:
        table = self.query_one("#history", DataTable)
        if not self.rows or table.row_count == 0:
            return
        row_key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if row_key is None:  # every row is added with its result's key
            return
        if row_key in self.marked:
            self.marked.remove(row_key)
        else:
            self.marked = (self.marked + [row_key])[-2:]
        self.load_history()

    def _show_diff(self) -> None:
        from sessions.bench.store import best_row, flag_changes

        by_id = {r.id: r for r in self.rows}
        chosen = [by_id[i] for i in self.marked if i in by_id]
        if len(chosen) == 1 and best_row(self.rows) not in (None, chosen[0]):
            chosen = [best_row(self.rows), chosen[0]]
        diff = self.query_one("#diff", Static)
        if len(chosen) != 2:
            diff.update(Text("Mark two rows with space to see their flag diff.", style="dim"))
            return
        a, b = chosen
        lines = flag_changes(a.command, b.command) or ["(same flags)"]
        head = f"{a.profile} {time.strftime('%m-%d %H:%M', time.localtime(a.time))} -> " \
               f"{b.profile} {time.strftime('%m-%d %H:%M', time.localtime(b.time))}"
        diff.update(Text("\n".join([head, *lines])))

    def action_rerun(self) -> None:
        if self.session_id is None:
            self.notify("No ready session to bench: select one on the dashboard and press b.", severity="warning")
            return
        self.start_bench()

    # -- compare ------------------------------------------------------------------------------------------

    def action_compare(self) -> None:
        if self.running:
            self.notify("A bench is running: wait for it to end.", severity="warning")
            return
        by_id = {r.id: r for r in self.rows}
        chosen = [by_id[i] for i in self.marked if i in by_id]
        if len(chosen) == 2:
            self.start_compare(chosen[0].profile, chosen[1].profile)
            return
        box = self.query_one("#compare-input", Input)
        box.add_class("-shown")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "compare-input":
            return
        refs = event.value.split()
        if len(refs) != 2:
            self.notify(f"Type two names, A then B (profiles or sessions), not {event.value!r}.",
                        severity="warning")
            return
        event.input.remove_class("-shown")
        event.input.value = ""
        self.query_one("#history", DataTable).focus()
        self.start_compare(refs[0], refs[1])

    def start_compare(self, a: str, b: str) -> None:
        if self.running:
            return
        self.running = True
        self.comparing = True
        self.compare_ended.clear()
        self.query_one("#results", DataTable).add_class("-hidden")  # a compare shows its own table
        self.query_one("#progress", ProgressBar).add_class("-running")
        self.query_one("#run-status", Static).update(f"Comparing {a} (A) with {b} (B), {self.rounds} rounds ...")
        self._compare(a, b)

    @work(thread=True, exclusive=True, group="bench")
    def _compare(self, a: str, b: str) -> None:
        from sessions.bench.compare import run_compare
        from sessions.bench.session_bench import BenchOptions, demo_compare_options

        app = self.app  # while the screen is attached: a closed screen no longer reaches its app

        def tell(callback: Callable[..., Any], *args: Any) -> bool:
            # The screen may be closed and the app gone while the compare unwinds: a note that cannot be
            # shown is dropped, so that nothing keeps the cleanup from stopping what was launched.
            try:
                app.call_from_thread(callback, *args)
            except Exception:  # noqa: BLE001 - see above
                return False
            return True

        def say(note: str) -> None:
            tell(self._say, note)

        def progress(concurrency: int, done: int, total: int) -> None:
            tell(self._compare_progress, concurrency, done, total)

        try:
            options = self.default_options or (demo_compare_options() if self.home.demo else BenchOptions())
            report = run_compare(a, b, options, self.home, say, progress,
                                 argv=["eagle3-tui", "bench", "compare", a, b], rounds=self.rounds,
                                 stop_requested=self.compare_ended.is_set)
        except Exception as exc:  # noqa: BLE001 - shown on the screen, the TUI keeps running
            tell(self._failed, _failure_text(exc))
            return
        finally:
            if not tell(self._compare_over):
                self.comparing = False  # the app is gone: nobody waits for `then`
        tell(self._compared, report)

    def end_compare(self, then: Callable[[], Any] | None = None) -> bool:
        """Ask the running compare to end (it stops the servers it launched), and call ``then`` once its
        cleanup is done.  False when there is no compare to end, or it is already ending."""
        if not self.comparing or self.compare_ended.is_set():
            return False
        self.compare_ended.set()
        self._after_compare = then
        note = "Ending the compare: stopping the servers it launched" + (", then quitting ..." if then else " ...")
        self.notify(note, title="bench compare", timeout=20)
        if self.is_attached:
            self.query_one("#run-status", Static).update(Text(note, style="bold yellow"))
        return True

    def _compare_over(self) -> None:
        self.comparing = False
        then, self._after_compare = self._after_compare, None
        if then is not None:
            then()

    def _say(self, note: str) -> None:
        self.query_one("#run-status", Static).update(note)

    def _compare_progress(self, concurrency: int, done: int, total: int) -> None:
        self.query_one("#progress", ProgressBar).update(total=total, progress=done)

    def _compared(self, report: dict[str, Any]) -> None:
        self.running = False
        self.last_compare = report
        self.query_one("#results", DataTable).add_class("-hidden")
        self.query_one("#progress", ProgressBar).remove_class("-running")
        from sessions.bench.ab_report import compare_rows, workload_text

        self.query_one("#run-status", Static).update(Text.assemble(
            (f"A = {report['a'].get('profile')}, B = {report['b'].get('profile')} · ", "dim"),
            (report["verdict"], "bold"), (f"\n{workload_text(report)}", ""),
            ("\neach cell: median over the rounds, then min–max; ITL in ms", "dim"),
            (f"\nkept as {report['saved_to']}", "dim")))
        table = self.query_one("#compare", DataTable)
        table.clear()
        for row in compare_rows(report):
            table.add_row(*row)
        table.add_class("-shown")
        self.load_history()

    def action_close(self) -> None:
        self.end_compare()  # the compare's table lives on this screen: leaving it ends the compare
        self.app.pop_screen()


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)
