"""The dashboard's actions on the targeted session or profile, each with its question: `s` (stop, y/N),
`r` (restart: the flag diff, y/N), `c` (capture on/off: what changes in the launch command, y/N), `e`
(the profile editor), `d` (diagnose), `b` (bench), `j` (jobs), and how a failed action is reported
(`report_failure`: a toast and an `ActionFailed` message).

A mixin of `DashboardScreen` (kept apart so the screen module stays readable): it acts on what
`Targeting.target_session` and `Targeting.target_profile` name, and uses the screen's ``feed``,
``last_snapshot`` and ``poll_now``.  Every stop, restart, flag diff and profile write runs in a thread
worker; the UI thread only asks and draws.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from app.feed import DashboardFeed, DashboardSnapshot
from app.screens.dashboard_messages import (
    ActionFailed,
    CaptureToggled,
    RestartProposed,
    SessionLaunched,
    SessionStopped,
)
from widgets.confirm_modal import ConfirmModal
from widgets.lists import ProfileList, SessionEntry

STOP_GRACE_S = 30.0


class TargetActions:
    """Stop, restart, capture, edit, diagnose, bench and jobs for `DashboardScreen` (see the module docstring)."""

    feed: DashboardFeed
    last_snapshot: DashboardSnapshot | None
    app: Any  # Screen's app and focused (annotations only: a value here would shadow them)
    focused: Any

    if TYPE_CHECKING:  # provided by Screen, Targeting and DashboardScreen; never defined here (they would shadow them)
        def query_one(self, *args: Any, **kwargs: Any) -> Any: ...
        def notify(self, *args: Any, **kwargs: Any) -> Any: ...
        def run_worker(self, *args: Any, **kwargs: Any) -> Any: ...
        def post_message(self, message: Any) -> bool: ...
        def poll_now(self) -> None: ...
        def target_session(self, verb: str, live_only: bool = True, quiet: bool = False) -> SessionEntry | None: ...
        def target_profile(self) -> str | None: ...
        def select_session(self, session_id: str | None) -> None: ...
        def select_profile(self, name: str) -> None: ...
        def selected_status(self) -> Any: ...

    def report_failure(self, what: str, exc: BaseException) -> None:
        """A failed action (this mixin's or `LaunchActions`'): an error toast naming the fields a profile
        error lists, and an `ActionFailed` message."""
        problems = getattr(exc, "problems", None)
        if problems:
            lines = [
                f"{p.field}{f' (line {p.line})' if getattr(p, 'line', None) else ''}: {p.message}"
                for p in problems
            ]
            message = "\n".join(lines)
        else:
            message = str(exc)
        self.notify(message, title=what, severity="error", timeout=15)
        self.post_message(ActionFailed(what, message))

    def run_action_worker(self, name: str, work: Callable[..., None], *args: Any) -> None:
        """How every dashboard action runs (this mixin's and `LaunchActions`'): ``work(*args)`` in a thread
        worker of the ``action`` group, off the UI thread; ``work`` reports its own failures
        (`report_failure`), so a worker error never ends the app."""
        self.run_worker(partial(work, *args), name=name, group="action", thread=True, exit_on_error=False)

    def ask_then_run(self, question: str, detail: str, name: str, work: Callable[..., None], *args: Any,
                     notice: str | None = None) -> None:
        """Ask ``question`` (y/N, ``detail`` below it); on yes, say ``notice`` (when given) and
        `run_action_worker`."""

        def answered(yes: bool | None) -> None:
            if yes:
                if notice:
                    self.notify(notice, timeout=3)
                self.run_action_worker(name, work, *args)

        self.app.push_screen(ConfirmModal(question, detail), answered)

    # -- stop and restart ----------------------------------------------------------------------------------

    def _multi_node_in_view(self) -> Any:
        """The multi-node server under the Multi-node pane's cursor when that pane has focus: s and d act
        on it (as in its view), never on the local session the card above shows."""
        from widgets.nodes_card import NodesCard

        focused = self.focused
        if isinstance(focused, NodesCard) and focused.selected_id is not None:
            return next((v for v in focused.views if v.node_id == focused.selected_id), None)
        return None

    def action_stop(self) -> None:
        multi = self._multi_node_in_view()
        if multi is not None:
            from app.screens.nodes import ask_stop

            ask_stop(self, self.feed.home, multi.node_id, self.feed.nodes, multi)
            return
        target = self.target_session("stop")
        if target is None:
            return
        if not target.alive:
            self.notify(f"{target.session_id} ({target.names()}) is not running ({target.state}).",
                        severity="warning")
            return
        status = self.selected_status()
        pid = f"pid {status.pid} · " if status is not None and status.session_id == target.session_id else ""
        detail = f"{pid}SIGTERM to the main process; SIGKILL to what is left after {STOP_GRACE_S:.0f} s."
        session_id = target.session_id
        self.ask_then_run(f"Stop {session_id} ({target.names()})?", detail, "stop", self._stop, session_id,
                          notice=f"Stopping {session_id}…")

    def _stop(self, session_id: str) -> None:
        try:
            report = self.feed.session(session_id).stop(grace_s=STOP_GRACE_S)
        except Exception as exc:  # noqa: BLE001
            self.app.call_from_thread(self.report_failure, f"Stop of {session_id} failed", exc)
            return
        self.feed.forget_final(session_id)
        self.app.call_from_thread(self._stopped, session_id, report)

    def _stopped(self, session_id: str, report: Any) -> None:
        self.notify(
            report.message,
            title="stopped" if report.stopped else "stop incomplete",
            severity="information" if report.stopped else "error",
            timeout=8,
        )
        self.post_message(SessionStopped(session_id, bool(report.stopped), report.message))
        self.poll_now()

    def action_restart(self) -> None:
        target = self.target_session("restart")
        if target is None:
            return
        self.run_action_worker("restart-diff", self._restart_diff, target)

    def _restart_diff(self, target: SessionEntry) -> None:
        from sessions.server import flag_diff

        session_id = target.session_id
        try:
            session = self.feed.session(session_id)
            new_profile = session.current_profile()
            diff = flag_diff(session.profile, new_profile)
        except Exception as exc:  # noqa: BLE001
            self.app.call_from_thread(self.report_failure, f"Restart of {session_id} refused", exc)
            return
        self.app.call_from_thread(self._confirm_restart, target, new_profile, diff)

    def _confirm_restart(self, target: SessionEntry, new_profile: Any, diff: list[str]) -> None:
        session_id = target.session_id
        if diff:
            detail = "Flags that change (+ added, - removed, ~ changed):\n" + "\n".join(diff)
        else:
            detail = "No flag changes: the same command runs again."
        self.post_message(RestartProposed(session_id, tuple(diff)))
        self.ask_then_run(f"Restart {session_id} ({target.names()})?", detail, "restart", self._restart, session_id,
                          new_profile, notice=f"Restarting {session_id}…")

    def _restart(self, session_id: str, new_profile: Any) -> None:
        try:
            new = self.feed.session(session_id).restart(new_profile, grace_s=STOP_GRACE_S)
        except Exception as exc:  # noqa: BLE001
            self.app.call_from_thread(self.report_failure, f"Restart of {session_id} failed", exc)
            return
        self.feed.forget_final(session_id)
        self.feed.adopt(new)
        self.app.call_from_thread(self._restarted, session_id, new.session_id)

    def _restarted(self, old_id: str, new_id: str) -> None:
        self.notify(f"{old_id} stopped; relaunched as {new_id}.", title="restarted", timeout=6)
        self.post_message(SessionLaunched(new_id, ""))
        self.select_session(new_id)

    # -- editing and other screens ---------------------------------------------------------------------------

    def action_edit(self) -> None:
        name = self.target_profile()
        if not name:
            self.notify("No profile selected to edit.", severity="warning")
            return
        from app.screens.profile_editor import ProfileEditorScreen

        def closed(saved_as: str | None) -> None:
            if saved_as:
                self.select_profile(saved_as)
            self.poll_now()

        self.app.push_screen(ProfileEditorScreen(name, self.feed.home), closed)

    def action_diagnose(self) -> None:
        from app.screens.diagnose import DiagnoseScreen

        multi = self._multi_node_in_view()
        if multi is not None:
            from app.screens.nodes import NodesDiagnoseScreen

            self.app.push_screen(NodesDiagnoseScreen(self.feed.home, multi.node_id, self.feed.nodes))
            return
        target = self.target_session("diagnose", live_only=False)  # a crashed start is worth diagnosing
        if target is None:
            return
        self.app.push_screen(DiagnoseScreen(target.session_id, home=self.feed.home))

    def action_jobs(self) -> None:
        from app.screens.jobs import JobsScreen

        self.app.push_screen(JobsScreen(home=self.feed.home))

    def action_bench(self) -> None:
        """b: bench the selected session when it is ready; the kept results either way."""
        from app.screens.bench import BenchScreen

        target = self.target_session("bench", quiet=True)
        ready = target is not None and target.state == "ready"
        if target is None:
            where = (f"profile {self.query_one(ProfileList).highlighted_id} has no running session"
                     if isinstance(self.focused, ProfileList) else "no session selected")
            self.notify(f"Nothing to bench ({where}): showing kept bench results only", severity="warning")
        elif not ready:
            self.notify(f"{target.session_id} ({target.names()}) is {target.state}: showing kept bench "
                        "results only", severity="warning")
        self.app.push_screen(BenchScreen(self.feed.home, target.session_id if target and ready else None))

    def action_capture(self) -> None:
        """c: show what toggling capture changes in the launch command, then ask y/N before saving."""
        name = self.target_profile()
        if not name:
            self.notify("No profile selected.", severity="warning")
            return
        self.run_action_worker("capture-preview", self._capture_preview, name)

    def _capture_preview(self, name: str) -> None:
        from sessions.profiles import load_profile
        from sessions.profiles.capture_toggle import toggle_summary, toggled
        from sessions.server import flag_diff

        try:
            profile = load_profile(name, self.feed.home)
            new = toggled(profile)
            lines = toggle_summary(profile, new)
            diff = flag_diff(profile, new)  # builds both launch commands (off the UI thread)
        except Exception as exc:  # noqa: BLE001 - ProfileError names the field
            self.app.call_from_thread(self.report_failure, f"Capture toggle for {name} failed", exc)
            return
        self.app.call_from_thread(self._confirm_capture, name, bool(profile.capture.enabled), lines, diff)

    def _confirm_capture(self, name: str, was_on: bool, lines: list[str], diff: list[str]) -> None:
        flags = "\n".join(diff) if diff else "(none)"
        detail = "\n".join(lines) + "\n\nLaunch command (+ added, - removed, ~ changed):\n" + flags
        live = self._live_session(name)
        if live:
            detail += f"\n\n{live} keeps running as it is until restarted (r)."
        verb = "off" if was_on else "on"
        self.ask_then_run(f"Turn capture {verb} for {name}?", detail, "capture-toggle", self._toggle_capture, name,
                          was_on)

    def _toggle_capture(self, name: str, was_on: bool) -> None:
        from sessions.profiles import load_profile
        from sessions.profiles.capture_toggle import toggle_capture

        try:
            profile = load_profile(name, self.feed.home)
            if bool(profile.capture.enabled) != was_on:  # edited elsewhere since the question: ask again
                raise ValueError(f"{name}'s capture setting changed on disk meanwhile; nothing saved (press c)")
            profile = toggle_capture(profile, self.feed.home)
        except Exception as exc:  # noqa: BLE001 - ProfileError names the field
            self.app.call_from_thread(self.report_failure, f"Capture toggle for {name} failed", exc)
            return
        self.app.call_from_thread(self._capture_toggled, name, bool(profile.capture.enabled))

    def _live_session(self, profile: str) -> str | None:
        """The running session of ``profile`` in the last snapshot, if any."""
        entries = self.last_snapshot.profiles if self.last_snapshot else ()
        return next((p.live_session for p in entries if p.name == profile and p.live_session), None)

    def _capture_toggled(self, name: str, enabled: bool) -> None:
        live = self._live_session(name)
        when = f"restart {live} (r) to apply it" if live else "the next launch uses it"
        self.notify(f"Capture {'on' if enabled else 'off'} for {name}: {when}.", title="capture", timeout=8)
        self.post_message(CaptureToggled(name, enabled))
        self.poll_now()
