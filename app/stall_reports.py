"""The TUI's side of the stall report (issue 21): each stall the dashboard sees saves its diagnosis report
in the session folder, once per stall (`sessions.diagnosis.save_stall_report`), and a toast names it.

The save runs in a thread worker of the screen (py-spy takes seconds).  It is written once per stall
whoever asks, so another watcher (a second TUI, ``eagle3-tui status``/``wait``) asking too is harmless;
the screen asks once per stall it sees, and again when the session stalls anew after moving on.
"""
from __future__ import annotations

from functools import partial
from typing import Any


class StallReports:
    """Asks for the report of each stall seen in the dashboard's snapshots."""

    def __init__(self, screen: Any, home: Any) -> None:
        self.screen = screen
        self.home = home
        self.asked: set[str] = set()  # stalled sessions whose report this screen asked for

    def seen(self, statuses: Any) -> None:
        """Call with each poll's session statuses (UI thread)."""
        stalled = {s.session_id for s in statuses if s.state == "stalled"}
        self.asked &= stalled  # one that moved on may stall again: a new stall, asked for anew
        for session_id in sorted(stalled - self.asked):
            self.asked.add(session_id)
            self.screen.run_worker(partial(self._save, session_id), name="stall-report", group="stall-report",
                                   thread=True, exit_on_error=False)

    def _save(self, session_id: str) -> None:
        from sessions.diagnosis import save_stall_report
        from sessions.server import ServerSession

        app = self.screen.app
        try:  # its own session object: the poll worker reads the feed's one at the same time
            path = save_stall_report(ServerSession.load(session_id, self.home))
        except Exception as exc:  # noqa: BLE001 - shown, the dashboard goes on
            app.call_from_thread(app.notify, f"Stall report of {session_id} not saved: {type(exc).__name__}: "
                                 f"{exc}", title="stalled", severity="error", timeout=10)
            return
        if path is not None:
            app.call_from_thread(app.notify, f"Diagnosis of the stall saved: {path}", title="stalled",
                                 severity="warning", timeout=15)
