"""Waiting for a session to get ready, for scripts: the wait ends at the first answer, good or bad.

`wait_until_ready` polls `status()` and returns a `WaitResult` as soon as the session is ready, stalled,
crashed (or ended on its own), stopped, or the timeout passed.  A stall ends the wait at once: a launch
script must not hang on exactly the failure it should catch (issue 21 item 5).  The CLI turns each
outcome into its own exit code (`app.cli_server`).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessions.server.model import SessionStatus

# The outcomes, in the order the CLI documents their exit codes.
READY, STALLED, CRASHED, STOPPED, TIMEOUT = "ready", "stalled", "crashed", "stopped", "timeout"
WAIT_OUTCOMES = (READY, STALLED, CRASHED, STOPPED, TIMEOUT)
POLL_S = 0.2


@dataclass(frozen=True)
class WaitResult:
    """How a wait ended, and the status that ended it."""

    outcome: str  # one of WAIT_OUTCOMES
    status: SessionStatus
    waited_s: float
    report_path: Any = None  # the stall's diagnosis report, when one was saved

    def message(self) -> str:
        st = self.status
        sid = st.session_id
        if self.outcome == READY:
            port = f" on {st.host}:{st.port}" if st.port else ""
            return f"{sid} is ready{port} after {self.waited_s:.1f}s"
        if self.outcome == STALLED:
            limit = st.stall_limit_s
            silent = f"log silent {st.silent_for_s:.0f}s" + (f" (limit {limit:g}s)" if limit else "")
            where = f"; diagnosis saved to {self.report_path}" if self.report_path else ""
            return (
                f"{sid} stalled in {st.phase}: {silent}; the server still runs "
                f"(eagle3-tui diagnose {sid}; eagle3-tui stop {sid}){where}"
            )
        if self.outcome == CRASHED:
            how = "crashed" if st.state == "crashed" else f"{st.state} (the server ended on its own)"
            line = st.summary.error_line
            error = f": line {line}: {st.summary.error}" if line and st.summary.error else (
                f": {st.summary.error}" if st.summary.error else ""
            )
            return f"{sid} {how} in {st.phase}{error}"
        if self.outcome == STOPPED:
            return f"{sid} was stopped (in {st.phase}) before it got ready"
        return (
            f"{sid} not ready after {self.waited_s:.0f}s: {st.state} in {st.phase}, "
            f"{'still running' if st.alive else 'not running'}"
        )


def outcome_of(status: SessionStatus) -> str | None:
    """The wait's outcome for this status, or None while the start goes on."""
    if status.state == "ready":
        return READY
    if status.state == "stalled":
        return STALLED
    if status.state == "stopped":
        return STOPPED
    if status.state in ("crashed", "exited"):
        return CRASHED
    return None


def wait_until_ready(
    session: Any,
    timeout_s: float | None = None,
    *,
    on_status: Callable[[SessionStatus], None] | None = None,
    on_stall: Callable[[Any, SessionStatus], Any] | None = None,
    poll_s: float = POLL_S,
) -> WaitResult:
    """Poll ``session.status()`` until it is ready, stalled, crashed/exited, stopped, or ``timeout_s``
    passed (None: no timeout).  ``on_status`` sees every reading (the CLI prints phase changes);
    ``on_stall(session, status)`` runs once when a stall ends the wait and may return a report path."""
    t0 = time.monotonic()
    deadline = None if timeout_s is None else t0 + timeout_s
    while True:
        status = session.status()
        if on_status is not None:
            on_status(status)
        outcome = outcome_of(status)
        if outcome is not None:
            report = on_stall(session, status) if outcome == STALLED and on_stall is not None else None
            return WaitResult(outcome, status, time.monotonic() - t0, report)
        if deadline is not None and time.monotonic() >= deadline:
            return WaitResult(TIMEOUT, status, time.monotonic() - t0)
        time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))
