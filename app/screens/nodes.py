"""MultiNodeScreen: one server across nodes up close (issue 26: "It shows as one session ... There is a GPU
panel per node, the log per node, and one merged log").

Opened with Enter on its card in the dashboard's Multi-node pane (5 focuses that pane).  From the top:

* the card (`widgets.nodes_card`): the verdict that names what holds the start, and a line per node;
* the arrival timeline (`widgets.nodes_view.NodeArrivals`): per node, each global TP rank's ``Init parallel
  begin.`` → ``ends`` times, so a rendezvous hang names the node and the ranks that never arrived;
* a GPU panel per node (that host's ``gpus --json``; processes labelled with their global TP rank);
* the log of one node, or the merged log (every node's lines in time order, prefixed ``n0``/``n1``): ``n``
  and ``p`` switch node, ``m`` the merged one; ``/`` filters, ``w`` wraps, ``t`` timestamps, ``f``
  full-screen, End follows, as in the dashboard's log pane.

``s`` stops the server (y/N; node 0 first, then the workers, then every node's GPUs checked free: ``nodes
stop``), ``d`` diagnoses it (every node's ``diagnose --json``: ``nodes diagnose``), Esc goes back (it
first closes the filter bar, clears a filter or leaves full-screen).

Where the data comes from: the dashboard's `NodesMonitor` (a thread per node already asks where each node
is) and this screen's `NodesDetail` (a thread per node for its GPUs and one for its log stream, mirrored
to local files that a `LogFeed` reads as the dashboard reads a local log).  A lost or hung host holds only
its own panel, line and log; this screen's timer only reads what the threads last saw.
"""
from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from app.keymap import NODES_KEYS, bindings
from sessions.home import Home
from sessions.logs import LogFilter
from sessions.server.nodes_detail import MERGED, NodesDetail
from widgets.confirm_modal import ConfirmModal
from widgets.gpu_panel import GpuPanel
from widgets.inputs import InOrderInput
from widgets.log_view import LogPane, LogView
from widgets.nodes_card import NodesCard
from widgets.nodes_view import NodeArrivals, gpu_title, log_title

REFRESH_S = 0.5
STOP_GRACE_S = 30.0


class MultiNodeScreen(Screen):
    """One multi-node server: its card, arrival timeline, a GPU panel per node, and the logs."""

    BINDINGS: ClassVar[list[BindingType]] = bindings(NODES_KEYS)
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = (  # type: ignore[misc]
        [(0, "-narrow"), (110, "-wide")]
    )
    DEFAULT_CSS = """
    MultiNodeScreen { layout: vertical; }
    MultiNodeScreen .pane {
        border: round $panel-lighten-2; border-title-color: $text; padding: 0 1; background: $surface;
    }
    MultiNodeScreen .pane:focus-within { border: round $accent; }
    MultiNodeScreen #node-head { height: auto; }
    MultiNodeScreen #node-card { text-wrap: wrap; text-overflow: fold; }
    MultiNodeScreen #node-gpus { height: auto; }
    MultiNodeScreen .node-gpu-pane { width: 1fr; height: auto; max-height: 12; }
    MultiNodeScreen #node-log-pane { height: 1fr; min-height: 5; }
    MultiNodeScreen #node-filter-bar { height: auto; display: none; }
    MultiNodeScreen #node-filter-bar.-open { display: block; }
    MultiNodeScreen.-narrow .pane { border: none; border-top: solid $panel-lighten-2; padding: 0; }
    MultiNodeScreen.-narrow .pane:focus-within { border: none; border-top: heavy $accent; }
    MultiNodeScreen.-narrow .node-gpu-pane { max-height: 3; }
    """

    def __init__(self, home: Home, node_id: str, monitor: Any) -> None:
        super().__init__()
        self.home = home
        self.node_id = node_id
        self.monitor = monitor  # sessions.server.nodes_monitor.NodesMonitor (the dashboard's)
        self.record: Any = None
        self.detail: NodesDetail | None = None
        self.shown_log = MERGED  # which log the pane shows: a node rank, or MERGED
        self.problem: str | None = None
        self._feeds: dict[str, Any] = {}  # path -> app.feed.LogFeed
        self._log_polling = False

    # -- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Vertical(id="node-head", classes="pane"):
            yield NodesCard(id="node-card", node_lines=False)
            yield NodeArrivals(id="node-arrivals")
        yield Horizontal(id="node-gpus")
        with LogPane(id="node-log-pane", classes="pane"):
            yield LogView(id="node-log")
            with Horizontal(id="node-filter-bar"):
                yield InOrderInput(placeholder="filter: text or /regex/ (n1 : one node's lines)  Enter · Esc",
                                   id="node-filter-input")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#node-head").border_title = f"Multi-node {self.node_id}"
        log_view = self.query_one(LogView)
        log_view.placeholder = "reading the nodes' logs…"
        log_view.node_prefixed = True
        log_view.focus()
        self.run_worker(self._open, name="nodes-open", group="nodes-open", thread=True, exit_on_error=False)
        self.set_interval(REFRESH_S, self._tick, name="nodes-view-refresh")

    def _open(self) -> None:
        """The record, the links (ssh -G runs for each host) and this view's threads: off the UI thread."""
        from sessions.server.nodes import NodesError, load_record

        try:
            record = load_record(self.home, self.node_id)
            detail = NodesDetail(self.home, record, self.monitor.resolver_factory()).start()
        except (NodesError, Exception) as exc:  # noqa: BLE001 - a bad hosts.toml, a damaged record: said here
            self.app.call_from_thread(self._failed, str(exc))
            return
        self.app.call_from_thread(self._opened, record, detail)

    def _failed(self, problem: str) -> None:
        self.problem = problem
        self.query_one(LogView).show_file(None, f"cannot open {self.node_id}: {problem}")
        self.notify(problem, title="multi-node view", severity="error", timeout=15)

    def _opened(self, record: Any, detail: NodesDetail) -> None:
        if not self.is_attached:  # closed while it opened
            detail.close()
            return
        self.record, self.detail = record, detail
        row = self.query_one("#node-gpus")
        for entry in record.nodes:
            pane = VerticalScroll(GpuPanel(id=f"node-gpu-{entry.rank}"), id=f"node-gpu-pane-{entry.rank}",
                                  classes="pane node-gpu-pane")
            row.mount(pane)
        self._show_log(MERGED)
        self._tick()

    def on_unmount(self) -> None:
        if self.detail is not None:
            detail, self.detail = self.detail, None
            # Its streams end (their ssh children, by Popen) in a thread: the UI never waits on a hung host.
            import threading

            threading.Thread(target=detail.close, name="nodes-view-close", daemon=True).start()
        for feed in self._feeds.values():
            feed.close()

    def on_resize(self) -> None:
        # Narrow terminals: the footer's room goes to the view's keys (ctrl+p stays bound), as on the dashboard.
        footer = self.query_one(Footer)
        wide = self.size.width >= 110
        if footer.show_command_palette != wide:
            footer.show_command_palette = wide
            footer.refresh(recompose=True)

    # -- drawing --------------------------------------------------------------------------------------------

    def view(self) -> Any:
        """This server's latest `NodesView` from the monitor (None before it has listed the record)."""
        return next((v for v in self.monitor.views() if v.node_id == self.node_id), None) \
            if self.monitor is not None else None

    def _tick(self) -> None:
        view = self.view()
        detail = self.detail
        logs = detail.logs() if detail is not None else ()
        if view is not None:
            self.query_one(NodesCard).update_nodes((view,))
            self.query_one(NodeArrivals).update_arrivals(view, logs)
            self.query_one("#node-head").border_title = f"Multi-node {self.node_id} · {view.status.state}"
        if detail is None:
            return
        for gpus in detail.gpus():
            found = self.query(f"#node-gpu-{gpus.rank}")
            if not found:  # still mounting: drawn at the next tick
                continue
            panel = found.first(GpuPanel)
            if gpus.gpus is not None:
                panel.update_snapshot(gpus.gpus, gpus.owners)
            self.query_one(f"#node-gpu-pane-{gpus.rank}").border_title = gpu_title(gpus)
        self._update_log_title()
        if not self._log_polling:
            self._log_polling = True
            log_view = self.query_one(LogView)
            path = log_view.path
            if path is not None:
                self.run_worker(partial(self._poll_log, path, log_view.log_filter), name="nodes-log",
                                group="nodes-log", thread=True, exit_on_error=False)
            else:
                self._log_polling = False

    def _feed(self, path: str) -> Any:
        from app.feed import LogFeed

        feed = self._feeds.get(path)
        if feed is None:
            from pathlib import Path

            feed = self._feeds[path] = LogFeed(Path(path))
        return feed

    def _poll_log(self, path: str, log_filter: LogFilter | None) -> None:
        chunk = None
        try:
            chunk = self._feed(path).poll(log_filter)
        except Exception:  # noqa: BLE001, S110 - the next tick polls again; a poll must always call back
            pass
        finally:  # or `_log_polling` stays set and the pane never reads its log again
            self.app.call_from_thread(self._log_polled, chunk)

    def _log_polled(self, chunk: Any) -> None:
        self._log_polling = False
        if not self.is_attached:  # closed while the poll ran
            return
        log_view = self.query_one(LogView)
        if chunk is not None:
            log_view.apply_chunk(chunk)
            if log_view.needs_scan:
                self._set_filter(log_view.log_filter, reset=False)
        self._update_log_title()

    def _hosts(self) -> dict[int, str]:
        return {e.rank: e.host for e in self.record.nodes} if self.record is not None else {}

    def _update_log_title(self) -> None:
        log_view = self.query_one(LogView)
        logs = self.detail.logs() if self.detail is not None else ()
        parts = [log_title(self.shown_log, logs, self._hosts())]
        state = log_view.title_text().removeprefix("4 Log")
        pane = self.query_one("#node-log-pane")
        pane.border_title = "".join(parts) + state
        pane.border_subtitle = "n/p node · m merged" + (
            "" if log_view.follow and log_view.log_filter is None else f" · {log_view.position_text()}")

    # -- the log switch ---------------------------------------------------------------------------------------

    def _show_log(self, which: int) -> None:
        if self.detail is None:
            return
        self.shown_log = which
        log_view = self.query_one(LogView)
        log_view.node_prefixed = which == MERGED
        log_view.show_file(str(self.detail.log_path(which)))
        self._set_filter(log_view.log_filter, reset=False)
        self._update_log_title()

    def _order(self) -> list[int]:
        return [*(e.rank for e in self.record.nodes), MERGED] if self.record is not None else [MERGED]

    def action_next_log(self, step: int = 1) -> None:
        order = self._order()
        at = order.index(self.shown_log) if self.shown_log in order else 0
        self._show_log(order[(at + step) % len(order)])

    def action_merged_log(self) -> None:
        self._show_log(MERGED)

    # -- the log's keys (as on the dashboard) -------------------------------------------------------------------

    def action_wrap(self) -> None:
        log_view = self.query_one(LogView)
        log_view.wrap = not log_view.wrap
        self._update_log_title()

    def action_timestamps(self) -> None:
        log_view = self.query_one(LogView)
        log_view.show_timestamps = not log_view.show_timestamps
        self._update_log_title()

    def action_fullscreen(self) -> None:
        if self.maximized is not None:
            self.minimize()
            return
        log_view = self.query_one(LogView)
        self.maximize(log_view)
        log_view.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "filter" and isinstance(self.focused, Input))

    def action_filter(self) -> None:
        field = self.query_one("#node-filter-input", Input)
        current = self.query_one(LogView).log_filter
        field.value = current.text if current else ""
        bar = self.query_one("#node-filter-bar")
        bar.add_class("-open")
        # Shown now, not at the next style pass: set_focus skips a hidden widget, and keys typed in the same
        # burst as "/" ("/Init parallel" over tmux) then went to the log's keys (n, p switched the log).
        bar.display = True
        self.set_focus(field, scroll_visible=False)

    @on(Input.Submitted, "#node-filter-input")
    def _filter_submitted(self) -> None:
        try:
            log_filter = LogFilter.parse(self.query_one("#node-filter-input", Input).value, None)
        except ValueError as exc:
            self.notify(str(exc), title="filter", severity="error")
            return
        self._set_filter(log_filter)
        self._close_filter_bar()

    def _close_filter_bar(self) -> None:
        bar = self.query_one("#node-filter-bar")
        bar.remove_class("-open")
        bar.display = False
        self.query_one(LogView).focus()

    def _set_filter(self, log_filter: LogFilter | None, reset: bool = True) -> None:
        log_view = self.query_one(LogView)
        if reset:
            log_view.set_filter(log_filter)
        log_view.needs_scan = False
        active = log_view.log_filter
        if active is not None and log_view.path is not None:
            self.run_worker(partial(self._scan, log_view.path, active), name="nodes-log-scan",
                            group="nodes-log-scan", thread=True, exclusive=True, exit_on_error=False)
        self._update_log_title()

    def _scan(self, path: str, log_filter: LogFilter) -> None:
        worker = get_current_worker()
        matches, scanned = self._feed(path).scan(log_filter, lambda: worker.is_cancelled)
        if not worker.is_cancelled:
            self.app.call_from_thread(self.query_one(LogView).set_filter_matches, path, log_filter, matches,
                                      scanned, True)

    @on(LogView.NeedLines)
    def _need_lines(self, event: LogView.NeedLines) -> None:
        self.run_worker(partial(self._read_lines, event.path, event.line_numbers), name="nodes-log-read",
                        group="nodes-log-read", thread=True, exit_on_error=False)

    def _read_lines(self, path: str, numbers: tuple[int, ...]) -> None:
        lines = self._feed(path).read(numbers)
        self.app.call_from_thread(self.query_one(LogView).add_lines, path, lines)

    @on(LogView.StateChanged)
    def _log_state_changed(self) -> None:
        self._update_log_title()

    def action_back(self) -> None:
        """Esc: the filter bar, then a filter, then full-screen, then back to the dashboard."""
        if self.query_one("#node-filter-bar").has_class("-open"):
            self._close_filter_bar()
        elif self.query_one(LogView).log_filter is not None:
            self._set_filter(None)
        elif self.maximized is not None:
            self.minimize()
        else:
            self.app.pop_screen()

    # -- stop and diagnose ----------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        ask_stop(self, self.home, self.node_id, self.monitor, self.view())

    def action_diagnose(self) -> None:
        self.app.push_screen(NodesDiagnoseScreen(self.home, self.node_id, self.monitor))


def ask_stop(screen: Any, home: Home, node_id: str, monitor: Any, view: Any) -> None:
    """`s` on a multi-node server (its view, or its card on the dashboard): y/N naming it and its nodes,
    then ``nodes stop`` semantics in a thread (node 0 first, then the workers, every node's GPUs checked)."""
    if view is not None and view.status.state == "stopped":
        screen.notify(f"{node_id} is stopped already.", severity="warning")
        return
    hosts = [f"node {v.rank} ({v.host})" for v in view.nodes] if view is not None else []
    detail = ("Node 0 first (the workers wait for its shutdown), then " + ", ".join(hosts[1:]) +
              f"; SIGKILL after {STOP_GRACE_S:.0f} s per node; then every node's GPUs are checked free."
              if hosts else "Node 0 first, then the workers; then every node's GPUs are checked free.")
    profile = f" ({view.profile})" if view is not None else ""

    def stop() -> None:
        from sessions.server.nodes import NodesError, load_record
        from sessions.server.nodes_status import stop_nodes

        try:
            record = load_record(home, node_id)
            stop_nodes(record, monitor.resolver_factory(), home, STOP_GRACE_S)
        except (NodesError, Exception) as exc:  # noqa: BLE001 - what is left is named, per node
            screen.app.call_from_thread(screen.notify, str(exc), title="stop incomplete", severity="error",
                                        timeout=20)
            return
        screen.app.call_from_thread(screen.notify, f"{node_id} stopped: every node's GPUs are free.",
                                    title="stopped", timeout=8)

    def answered(yes: bool | None) -> None:
        if yes:
            screen.notify(f"Stopping {node_id}: node 0 first…", timeout=4)
            screen.run_worker(stop, name="nodes-stop", group="nodes-action", thread=True, exit_on_error=False)

    screen.app.push_screen(ConfirmModal(f"Stop {node_id}{profile} on {len(hosts) or 'all'} nodes?", detail),
                           answered)


class NodesDiagnoseScreen(Screen):
    """`d` on a multi-node server: every node's ``diagnose --json`` (py-spy of its ranks) gathered with the
    status across nodes and its hints (`sessions.server.nodes_report.diagnose_nodes`), as text; Esc back,
    ``r`` again."""

    BINDINGS: ClassVar[list[BindingType]] = [("escape", "app.pop_screen", "Back"), ("r", "again", "Again")]
    DEFAULT_CSS = """
    NodesDiagnoseScreen #nodes-diagnosis-scroll { border: round $panel-lighten-2; padding: 0 1; }
    """

    def __init__(self, home: Home, node_id: str, monitor: Any) -> None:
        super().__init__()
        self.home, self.node_id, self.monitor = home, node_id, monitor
        self.report: dict[str, Any] | None = None
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="nodes-diagnosis-scroll"):
            yield Static(f"Diagnosing {self.node_id} on every node (py-spy of each rank there)…",
                         id="nodes-diagnosis", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#nodes-diagnosis-scroll").border_title = f"Diagnosis {self.node_id}"
        self.action_again()

    def action_again(self) -> None:
        self.run_worker(self._diagnose, name="nodes-diagnose", group="nodes-diagnose", thread=True,
                        exclusive=True, exit_on_error=False)

    def _diagnose(self) -> None:
        from sessions.server.nodes import load_record
        from sessions.server.nodes_report import diagnose_nodes

        try:
            report = diagnose_nodes(load_record(self.home, self.node_id), self.monitor.resolver_factory())
        except Exception as exc:  # noqa: BLE001 - said on the screen
            self.app.call_from_thread(self._show, None, f"diagnosis failed: {exc}")
            return
        self.app.call_from_thread(self._show, report, None)

    def _show(self, report: dict[str, Any] | None, error: str | None) -> None:
        self.report, self.error = report, error
        self.query_one("#nodes-diagnosis", Static).update(error or (report or {}).get("text", ""))
