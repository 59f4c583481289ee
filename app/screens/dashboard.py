"""The dashboard: profiles, sessions, the selected session's state and timeline, GPUs and the log.

Refresh loop (dolphie's): a one-shot timer starts a thread worker that runs `DashboardFeed.poll`; when
it succeeds the UI thread draws the snapshot and re-arms the timer.  Polls therefore never pile up (a
slow NVML or a slow disk stretches the period instead), and while a modal or another screen is on top
the timer re-arms without polling.  Actions (launch, stop, restart) run in their own thread workers and
ask for an immediate poll when done.  Nothing here blocks the UI thread.

The screen composes three mixins, one concern each: `Targeting` (app/screens/dashboard_targets.py: what a
key acts on, the selection and its persistence), `TargetActions` (dashboard_actions.py: stop, restart,
capture, edit, diagnose, bench, jobs and their questions) and `LaunchActions` (dashboard_launch.py: launch
and prune).  This module keeps the layout, the refresh loop with the snapshot's drawing and its toasts, and
the panes' and the log's keys.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, Select
from textual.worker import Worker, WorkerState, get_current_worker

from app.feed import DashboardFeed, DashboardSnapshot, PollRequest
from app.keymap import DASHBOARD_KEYS, KEYS_BY_ID, bindings
from app.screens.dashboard_actions import TargetActions
from app.screens.dashboard_launch import LaunchActions
from app.screens.dashboard_messages import (  # re-exported (see __all__)
    ActionFailed,
    CaptureToggled,
    FilterApplied,
    RestartProposed,
    SessionLaunched,
    SessionStopped,
)
from app.screens.dashboard_targets import Targeting
from app.selection import Selection
from app.stall_reports import StallReports
from sessions.logs import MAIN_RANK, LogFilter
from sessions.phases import error_headline
from widgets.action_line import ActionLine
from widgets.gpu_panel import GpuPanel
from widgets.group_card import GroupCard
from widgets.host_panel import HostPanel
from widgets.inputs import InOrderInput
from widgets.lists import PageSafeSelect, ProfileList, SessionList
from widgets.log_view import LogPane, LogView
from widgets.nodes_card import NodesCard
from widgets.phase_timeline import PhaseTimeline
from widgets.serving_line import ServingLine
from widgets.state_line import StateLine

# The messages are re-exported: listeners (tests, other components) import them from here too.
__all__ = [
    "ActionFailed",
    "CaptureToggled",
    "DashboardScreen",
    "FilterApplied",
    "RestartProposed",
    "SessionLaunched",
    "SessionStopped",
]

REFRESH_S = 1.0
TALL_AT = 32  # rows: below, the capture panel is cut to two scrollable lines (the log pane keeps 5)
FOOTER_LAST = ("dashboard.filter", "dashboard.fullscreen")  # shown last in the footer (see BINDINGS)
WIDE_AT = 110  # columns: from here on the lists sit left of the session pane (HORIZONTAL_BREAKPOINTS)
LISTS_MIN_WIDTH = 44
LISTS_MAX_SHARE = 0.45  # the left column grows to its longest name, up to this share of the screen
LISTS_CHROME = 6  # the pane's border and padding (4) and a vertical scrollbar (2)
# state -> (toast, severity, seconds shown) when a session enters it
_TRANSITION_TOASTS: dict[str, tuple[str, Any, float]] = {
    "ready": ("{} is ready.", "information", 6),
    "stalled": ("{} has logged nothing for a while: press d to see why.", "warning", 15),
    "crashed": ("{} crashed: the log pane shows the error; d diagnoses.", "error", 15),
}


class DashboardScreen(Targeting, TargetActions, LaunchActions, Screen):
    """The main screen (see module docstring for the refresh loop)."""

    # Help and Quit first in the footer: app bindings would come after the screen's own, and an 80-column
    # footer cuts the last ones off.
    # Then the keys that act on profiles and sessions; the log's own (/ and f) last, so an 80-column footer
    # cuts those off first (it hid x and b).
    BINDINGS: ClassVar[list[BindingType]] = [
        dataclasses.replace(KEYS_BY_ID["app.help"].binding(), action="app.help"),
        dataclasses.replace(KEYS_BY_ID["app.quit"].binding(), action="app.quit"),
        *bindings(tuple(s for s in DASHBOARD_KEYS if s.id not in FOOTER_LAST)),
        *bindings(tuple(s for s in DASHBOARD_KEYS if s.id in FOOTER_LAST)),
    ]
    # Textual annotates this "ClassVar[...] | None", which mypy reads as an instance variable.
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = (  # type: ignore[misc]
        [(0, "-narrow"), (WIDE_AT, "-wide")]
    )
    # Short terminals (80x24): the capture panel gets two scrollable lines, so the log keeps its rows.
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = (  # type: ignore[misc]
        [(0, "-short"), (TALL_AT, "-tall")]
    )
    DEFAULT_CSS = """
    DashboardScreen { layout: vertical; }
    DashboardScreen .pane {
        border: round $panel-lighten-2; border-title-color: $text; padding: 0 1; background: $surface;
    }
    DashboardScreen .pane:focus-within { border: round $accent; }
    DashboardScreen #top { height: auto; }
    DashboardScreen #lists { height: auto; }
    DashboardScreen ProfileList, DashboardScreen SessionList {
        height: auto; max-height: 8; background: $surface; text-wrap: nowrap; text-overflow: ellipsis;
    }
    DashboardScreen #profiles-pane, DashboardScreen #sessions-pane { height: auto; }
    DashboardScreen #status-pane { height: auto; }
    DashboardScreen #capture-slot { height: auto; display: none; border-top: dashed $panel-lighten-2; }
    DashboardScreen #gpu-pane { height: auto; max-height: 12; }
    DashboardScreen #hosts-pane { height: auto; max-height: 10; display: none; }
    DashboardScreen #nodes-pane { height: auto; max-height: 12; display: none; }
    DashboardScreen #log-pane { height: 1fr; min-height: 5; }
    DashboardScreen #filter-bar { height: auto; display: none; }
    DashboardScreen #filter-bar.-open { display: block; }
    DashboardScreen #filter-input { width: 1fr; }
    DashboardScreen #filter-rank { width: 20; }

    DashboardScreen.-wide #top { layout: horizontal; }
    DashboardScreen.-wide #lists { layout: vertical; width: 44; }  /* then `_fit_lists` */
    DashboardScreen.-wide #status-pane { width: 1fr; min-height: 7; }
    DashboardScreen.-wide ProfileList, DashboardScreen.-wide SessionList { max-height: 10; }

    DashboardScreen.-narrow #top { layout: vertical; }
    DashboardScreen.-narrow #lists { layout: horizontal; }
    DashboardScreen.-narrow #profiles-pane, DashboardScreen.-narrow #sessions-pane { width: 1fr; }
    DashboardScreen.-narrow ProfileList, DashboardScreen.-narrow SessionList { max-height: 3; }
    DashboardScreen.-narrow .pane { border: none; border-top: solid $panel-lighten-2; padding: 0; }
    DashboardScreen.-narrow .pane:focus-within { border: none; border-top: heavy $accent; }
    DashboardScreen.-narrow #gpu-pane { max-height: 5; }
    DashboardScreen.-narrow #hosts-pane { max-height: 4; }
    DashboardScreen.-narrow #nodes-pane { max-height: 5; }

    DashboardScreen.-short #capture-slot { max-height: 3; overflow-y: auto; }
    DashboardScreen.-short #log-pane { min-height: 6; }
    """

    def __init__(
        self,
        feed: DashboardFeed,
        demo: bool = False,
        refresh_s: float = REFRESH_S,
        initial_profile: str | None = None,
        initial: Selection | None = None,
    ) -> None:
        super().__init__()
        self.feed = feed
        self.demo = demo
        self.refresh_s = refresh_s
        kept = initial or Selection()  # what the last TUI had selected (`app.selection`), restored
        self.selected_session: str | None = kept.session
        self.selected_profile: str | None = kept.profile or initial_profile
        self._initial_pane = kept.pane
        self.saved_selection = kept
        self.last_snapshot: DashboardSnapshot | None = None
        self.poll_count = 0
        self._timer: Timer | None = None
        self._poll_worker: Worker | None = None
        self._poll_again = False
        self._polled_for: str | None = None  # the selected session the running poll was asked about
        self._seen_problems: set[str] = set()
        self._last_states: dict[str, str] | None = None
        self._stall_reports = StallReports(self, feed.home)
        self._titles: dict[str, tuple[str, str | None]] = {}
        # The session the last drawn snapshot showed; a restored one counts as shown, so its profile does not
        # take the profile cursor from the restored profile.
        self._rendered_session: str | None = kept.session

    # -- layout -------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Container(id="top"):
            with Container(id="lists"):
                with Vertical(id="profiles-pane", classes="pane"):
                    yield ProfileList(id="profiles")
                with Vertical(id="sessions-pane", classes="pane"):
                    yield SessionList(id="sessions")
            with Vertical(id="status-pane", classes="pane"):
                yield StateLine(id="state")
                yield GroupCard(id="group")
                yield ActionLine(id="action-line")
                yield PhaseTimeline(id="timeline")
                yield ServingLine(id="serving")
                yield Container(id="capture-slot")
        with VerticalScroll(id="gpu-pane", classes="pane"):
            yield GpuPanel(id="gpus")
        with VerticalScroll(id="hosts-pane", classes="pane"):  # shown while hosts.toml names hosts
            yield HostPanel(id="hosts")
        with VerticalScroll(id="nodes-pane", classes="pane"):  # shown while a multi-node session is known
            yield NodesCard(id="nodes")
        with LogPane(id="log-pane", classes="pane"):
            yield LogView(id="log")
            with Horizontal(id="filter-bar"):
                yield InOrderInput(
                    placeholder="filter: text or /regex/  (Enter applies, Esc cancels)", id="filter-input"
                )
                yield PageSafeSelect([("main process", str(MAIN_RANK))], prompt="all ranks", id="filter-rank")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#profiles-pane").border_title = "1 Profiles" + (" · demo" if self.demo else "")
        self.query_one("#sessions-pane").border_title = "2 Sessions"
        self.query_one("#status-pane").border_title = "Session"
        self.query_one("#gpu-pane").border_title = "3 GPUs"
        self.query_one("#hosts-pane").border_title = "Other hosts"
        self.query_one("#nodes-pane").border_title = "Multi-node"
        self._update_log_title()
        self.query_one("#gpu-pane").can_focus = True
        self.query_one(ProfileList).focus()
        if self._initial_pane is not None:
            self.action_focus_pane(self._initial_pane)
        self._schedule_poll(0)

    def on_resize(self) -> None:
        # Narrow terminals: the footer's room goes to the contract keys (ctrl+p stays bound, and in help).
        footer = self.query_one(Footer)
        wide = self.size.width >= WIDE_AT
        if footer.show_command_palette != wide:
            footer.show_command_palette = wide
            footer.refresh(recompose=True)
        self._fit_lists()

    def _fit_lists(self) -> None:
        """Wide terminals: size the left column to the longest profile or session line (whole session ids),
        capped to a share of the screen so the session pane keeps its room.  Narrow ones: the CSS's halves."""
        wide = self.size.width >= WIDE_AT
        lists = self.query_one("#lists")
        sessions = self.query_one(SessionList)
        if sessions.full_ids != wide:
            sessions.full_ids = wide
            if self.last_snapshot is not None:
                sessions.update_entries(self.last_snapshot.sessions, prefer=self.selected_session)
        if not wide:
            if lists.styles.width is not None:
                lists.styles.width = None
            return
        need = max(self.query_one(ProfileList).needed_width, sessions.needed_width) + LISTS_CHROME
        width = max(LISTS_MIN_WIDTH, min(need, int(self.size.width * LISTS_MAX_SHARE)))
        if lists.styles.width is None or lists.styles.width.value != width:
            lists.styles.width = width

    # -- the refresh loop ---------------------------------------------------------------------------------

    def _schedule_poll(self, delay_s: float) -> None:
        if self._timer is not None:
            self._timer.stop()
        # Textual timers divide by their delay: "now" is the next tick.
        self._timer = self.set_timer(max(delay_s, 0.01), self._poll_tick, name="dashboard-poll")

    def _poll_tick(self) -> None:
        self._timer = None
        if not self.is_active:  # a modal or another screen is on top: don't poll, look again later
            self._schedule_poll(self.refresh_s)
            return
        log_view = self.query_one(LogView)
        self._polled_for = self.selected_session
        request = PollRequest(
            self.selected_session, log_view.log_filter, selected_profile=self.selected_profile
        )
        self._poll_worker = self.run_worker(
            partial(self.feed.poll, request), name="poll", group="poll", thread=True, exit_on_error=False
        )

    def poll_now(self) -> None:
        """Poll as soon as possible (after an action); never two polls at once."""
        if self._poll_worker is not None and self._poll_worker.state in (
            WorkerState.PENDING,
            WorkerState.RUNNING,
        ):
            self._poll_again = True
            return
        self._schedule_poll(0)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if worker.name != "poll" or worker is not self._poll_worker:
            return
        if event.state == WorkerState.SUCCESS:
            self._poll_worker = None
            snapshot = worker.result
            assert isinstance(snapshot, DashboardSnapshot)  # what the "poll" worker returns on success
            if self.selected_session == self._polled_for:
                self._render_snapshot(snapshot)
            else:
                # Another session was selected while this poll ran (a launch, a restart, a click): the
                # snapshot answers for the one shown before, and drawing it would select that one again.
                self._poll_again = True
        elif event.state == WorkerState.ERROR:
            self._poll_worker = None
            self._notify_problem(f"refresh failed: {worker.error}")
        else:
            return
        again, self._poll_again = self._poll_again, False
        self._schedule_poll(0 if again else self.refresh_s)

    def _render_snapshot(self, snapshot: DashboardSnapshot) -> None:
        self.last_snapshot = snapshot
        self.poll_count += 1
        profiles = self.query_one(ProfileList)
        if snapshot.selected != self._rendered_session:
            # A session newly shown (attach, launch, restart, a pick in pane 2): the profile cursor goes to
            # its profile, so l, e and c act on the profile the session card shows.
            self._rendered_session = snapshot.selected
            shown = next((s for s in snapshot.sessions if s.session_id == snapshot.selected), None)
            if shown is not None and any(p.name == shown.profile for p in snapshot.profiles):
                self.selected_profile = shown.profile
        profiles.update_entries(snapshot.profiles, prefer=self.selected_profile)
        if self.selected_profile is None and profiles.highlighted_id:
            self.selected_profile = profiles.highlighted_id
        sessions = self.query_one(SessionList)
        sessions.update_entries(snapshot.sessions, prefer=snapshot.selected)
        self.selected_session = snapshot.selected
        self._fit_lists()
        status = snapshot.status
        self.query_one(StateLine).update_status(status)
        self.query_one(GroupCard).update_group(snapshot.group)
        self.query_one(PhaseTimeline).update_status(status)
        self.query_one(ServingLine).update_status(status)
        status_pane = self.query_one("#status-pane")
        title = f"Session {status.session_id} · {status.profile}" if status is not None else "Session"
        self._set_title(status_pane, title)
        self._render_capture(snapshot)
        gpus = self.query_one(GpuPanel)
        gpus.update_snapshot(snapshot.gpu, snapshot.owners)
        self._set_title(self.query_one("#gpu-pane"), f"3 {gpus.title()}" + (" · this host" if snapshot.hosts else ""))
        self._render_hosts(snapshot)
        self._render_nodes(snapshot)
        log_view = self.query_one(LogView)
        if status is None:
            log_view.show_file(None, "No session yet: select a profile (pane 1) and press l to launch it.")
        else:
            log_view.show_file(str(status.log_path))
            if snapshot.log is not None:
                log_view.apply_chunk(snapshot.log)
            if log_view.needs_scan:  # another session's log, or a rotated one, under an active filter
                self.set_log_filter(log_view.log_filter, reset=False)
        self._update_log_title()
        self.keep_selection()
        for problem in snapshot.problems:
            self._notify_problem(problem)
        self._notify_transitions(snapshot)

    def _render_hosts(self, snapshot: DashboardSnapshot) -> None:
        """The other hosts' sessions and GPUs, as their monitor last heard them (it never blocks a poll)."""
        pane = self.query_one("#hosts-pane")
        pane.display = bool(snapshot.hosts)
        if snapshot.hosts:
            self.query_one(HostPanel).update_hosts(snapshot.hosts)
            lost = sum(1 for h in snapshot.hosts if h.state in ("reconnecting", "unreachable", "refused"))
            self._set_title(pane, f"Other hosts · {len(snapshot.hosts)}" + (f" · {lost} not answering" if lost else ""))

    def _render_nodes(self, snapshot: DashboardSnapshot) -> None:
        """Each server across nodes as one card, a line per node (its monitor's threads ask the nodes)."""
        pane = self.query_one("#nodes-pane")
        pane.display = bool(snapshot.nodes)
        if snapshot.nodes:
            self.query_one(NodesCard).update_nodes(snapshot.nodes)
            live = sum(1 for v in snapshot.nodes if v.status.state != "stopped")
            self._set_title(pane, f"Multi-node · {live} live" + (f" of {len(snapshot.nodes)}" if live != len(snapshot.nodes) else ""))

    def _notify_transitions(self, snapshot: DashboardSnapshot) -> None:
        """A toast when a session becomes ready, stalls or crashes (the user may be looking elsewhere)."""
        self._stall_reports.seen(snapshot.sessions)  # each stall saves its report once (app/stall_reports.py)
        states = {s.session_id: s.state for s in snapshot.sessions}
        previous, self._last_states = self._last_states, states
        if previous is None:
            return  # the first poll: what was already so is not news
        for session_id, state in states.items():
            before = previous.get(session_id)
            if before == state or before is None and state not in ("stalled", "crashed"):
                continue
            if state in _TRANSITION_TOASTS:
                text, severity, timeout = _TRANSITION_TOASTS[state]
                message = text.format(session_id)
                status = snapshot.status
                if state == "crashed" and status is not None and status.session_id == session_id:
                    error = error_headline(status.summary) if status.summary is not None else None
                    if error:  # the exception and its rank, not a traceback header
                        message += f"\n{error[:200]}"
                self.notify(message, title=state, severity=severity, timeout=timeout)

    def _render_capture(self, snapshot: DashboardSnapshot) -> None:
        """The capture engineer's CapturePanel, under the timeline, while the profile captures."""
        slot = self.query_one("#capture-slot")
        if snapshot.capture is None:
            slot.display = False
            return
        from widgets.capture_panel import CapturePanel

        panels = slot.query(CapturePanel)
        panel = panels.first() if panels else None
        if panel is None:
            panel = CapturePanel(id="capture")
            slot.mount(panel)
        status = snapshot.status
        layers = state = None
        if status is not None and status.profile == snapshot.capture_profile:
            layers, state = status.summary.capture_layers, status.state
        panel.update_status(snapshot.capture, layers, server_state=state)
        slot.display = True

    def _notify_problem(self, problem: str) -> None:
        if problem not in self._seen_problems:  # once each: a poll every second must not flood toasts
            self._seen_problems.add(problem)
            self.notify(problem, title="eagle3-tui", severity="warning", timeout=8)

    # -- selection (what it means: `Targeting`; Textual dispatches @on handlers only from the screen class) --

    @on(ProfileList.OptionHighlighted, "#profiles")
    def _profile_highlighted(self, event: ProfileList.OptionHighlighted) -> None:
        self.follow_profile(event.option.id)

    @on(SessionList.OptionHighlighted, "#sessions")
    def _session_highlighted(self, event: SessionList.OptionHighlighted) -> None:
        if event.option.id is not None and event.option.id != self.selected_session:
            self.select_session(event.option.id)

    def action_refresh(self) -> None:
        self.poll_now()

    # -- actions: panes and the log -------------------------------------------------------------------------

    def action_focus_pane(self, number: int) -> None:
        if number == 5 and not self.query_one("#nodes-pane").display:
            self.notify("No multi-node server yet (a profile with server.nnodes > 1 launches one).",
                        severity="warning")
            return
        target = {1: "#profiles", 2: "#sessions", 3: "#gpu-pane", 4: "#log", 5: "#nodes"}.get(number)
        if target:
            self.query_one(target).focus()

    @on(NodesCard.Opened)
    def _open_nodes(self, event: NodesCard.Opened) -> None:
        """Enter on a Multi-node card: that server's view (a GPU panel and a log per node, the merged log)."""
        from app.screens.nodes import MultiNodeScreen

        self.app.push_screen(MultiNodeScreen(self.feed.home, event.node_id, self.feed.nodes))

    def action_fullscreen(self) -> None:
        if self.maximized is not None:
            self.minimize()
            return
        log_view = self.query_one(LogView)
        self.maximize(log_view)
        log_view.focus()

    def action_wrap(self) -> None:
        log_view = self.query_one(LogView)
        log_view.wrap = not log_view.wrap
        self._update_log_title()

    def action_timestamps(self) -> None:
        log_view = self.query_one(LogView)
        log_view.show_timestamps = not log_view.show_timestamps
        self._update_log_title()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # "/" is a priority binding (see keymap): in a focused input it is a character, not the filter key.
        return not (action == "filter" and isinstance(self.focused, Input))

    def action_filter(self) -> None:
        bar = self.query_one("#filter-bar")
        log_view = self.query_one(LogView)
        current = log_view.log_filter
        field = self.query_one("#filter-input", Input)
        field.value = current.text if current else ""
        rank_select = self.query_one("#filter-rank", Select)
        expected = self._ranks_expected()
        status = self.selected_status()
        name = status.summary.rank_name if status is not None else (lambda r: f"TP{r}")
        options = [("main process", str(MAIN_RANK))] + [(name(r), str(r)) for r in range(expected)]
        rank_select.set_options(options)
        if current is not None and current.rank is not None:
            rank_select.value = str(current.rank)
        bar.add_class("-open")
        self.set_focus(field, scroll_visible=False)  # now (focus() defers): keys queued behind "/" go here

    def _ranks_expected(self) -> int:
        status = self.selected_status()
        return (status.rank_count if status is not None else None) or 8  # before any rank logged: TP8

    @on(Input.Submitted, "#filter-input")
    def _filter_submitted(self) -> None:
        self._apply_filter()

    @on(Select.Changed, "#filter-rank")
    def _filter_rank_changed(self) -> None:
        if self.query_one("#filter-bar").has_class("-open"):
            self._apply_filter(close=False)

    def _apply_filter(self, close: bool = True) -> None:
        text = self.query_one("#filter-input", Input).value
        value = self.query_one("#filter-rank", Select).value
        rank = int(value) if isinstance(value, str) else None  # options are str(rank); else Select.NULL
        try:
            log_filter = LogFilter.parse(text, rank)
        except ValueError as exc:
            self.notify(str(exc), title="filter", severity="error")
            return
        self.set_log_filter(log_filter)
        if close:
            self._close_filter_bar()

    def set_log_filter(self, log_filter: LogFilter | None, reset: bool = True) -> None:
        """Filter the log (None or an empty filter clears it) and scan the file for the matches."""
        log_view = self.query_one(LogView)
        if reset:
            log_view.set_filter(log_filter)
        log_view.needs_scan = False
        self._update_log_title()
        active = log_view.log_filter
        if active is not None and log_view.path is not None:
            self.run_worker(
                partial(self._scan, log_view.path, active),
                name="log-scan",
                group="log-scan",
                thread=True,
                exclusive=True,
                exit_on_error=False,
            )

    def _scan(self, path: str, log_filter: LogFilter) -> None:
        worker = get_current_worker()
        matches, scanned = self.feed.log_feed(path).scan(log_filter, lambda: worker.is_cancelled)
        if not worker.is_cancelled:
            self.app.call_from_thread(self._scanned, path, log_filter, matches, scanned)

    def _scanned(self, path: str, log_filter: LogFilter, matches: list[int], scanned: int) -> None:
        self.query_one(LogView).set_filter_matches(path, log_filter, matches, scanned, done=True)
        self._update_log_title()
        self.post_message(FilterApplied(log_filter, len(matches)))

    def _close_filter_bar(self) -> None:
        self.query_one("#filter-bar").remove_class("-open")
        self.query_one(LogView).focus()

    def on_key(self, event: Any) -> None:
        if event.key == "escape" and self.query_one("#filter-bar").has_class("-open"):
            event.stop()
            event.prevent_default()
            self._close_filter_bar()

    @on(LogView.NeedLines)
    def _need_lines(self, event: LogView.NeedLines) -> None:
        self.run_worker(
            partial(self._read_lines, event.path, event.line_numbers),
            name="log-read",
            group="log-read",
            thread=True,
            exit_on_error=False,
        )

    def _read_lines(self, path: str, numbers: tuple[int, ...]) -> None:
        lines = self.feed.log_feed(path).read(numbers)
        self.app.call_from_thread(self.query_one(LogView).add_lines, path, lines)

    @on(LogView.StateChanged)
    def _log_state_changed(self) -> None:
        self._update_log_title()

    def _update_log_title(self) -> None:
        log_view = self.query_one(LogView)
        self._set_title(self.query_one("#log-pane"), log_view.title_text(),
                        "" if log_view.follow and log_view.log_filter is None else log_view.position_text())

    def _set_title(self, pane: Any, title: str, subtitle: str | None = None) -> None:
        """Set a pane's border texts only when they change: each set repaints the whole pane."""
        key = pane.id or str(id(pane))
        if self._titles.get(key) == (title, subtitle):
            return
        self._titles[key] = (title, subtitle)
        pane.border_title = title
        if subtitle is not None:
            pane.border_subtitle = subtitle
