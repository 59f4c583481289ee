"""Messages the dashboard posts; tests and other components listen for them."""

from __future__ import annotations

from textual.message import Message

from sessions.logs import LogFilter


class SessionLaunched(Message):
    def __init__(self, session_id: str, profile: str) -> None:
        super().__init__()
        self.session_id = session_id
        self.profile = profile


class SessionStopped(Message):
    def __init__(self, session_id: str, stopped: bool, message: str) -> None:
        super().__init__()
        self.session_id = session_id
        self.stopped = stopped
        self.message = message


class RestartProposed(Message):
    def __init__(self, session_id: str, diff: tuple[str, ...]) -> None:
        super().__init__()
        self.session_id = session_id
        self.diff = diff


class ActionFailed(Message):
    def __init__(self, what: str, message: str) -> None:
        super().__init__()
        self.what = what
        self.message = message


class FilterApplied(Message):
    def __init__(self, log_filter: LogFilter, matches: int) -> None:
        super().__init__()
        self.log_filter = log_filter
        self.matches = matches


class CaptureToggled(Message):
    def __init__(self, profile: str, enabled: bool) -> None:
        super().__init__()
        self.profile = profile
        self.enabled = enabled
