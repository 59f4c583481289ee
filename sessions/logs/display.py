"""What is shown of a log line: its text (or its raw form, for a pipe), redacted once, here.

Secrets are redacted by shape and by name (`sessions.redaction.redact_text`) and by value: the exact
values a session was launched with (its secret env and the values of secret flags).  Every place that
shows log text (the log pane, ``logs``) goes through `shown`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sessions.logs.lines import LogLine
from sessions.redaction import redact_text


def printed(line: LogLine) -> str:
    """What ``eagle3-tui logs`` prints of a line: the line as written (colours kept, like ``tail``), except
    a line a progress bar redrew with ``\r``: that is one line per bar in its last state, the text the
    TUI's log pane shows (`sessions.logs.lines.clean`), never every frame of it."""
    return line.text if "\r" in line.raw else line.raw


def shown(line: LogLine | str, secrets: Sequence[str] = (), *, raw: bool = False) -> str:
    """``line`` as it may be shown: its cleaned text (``raw``: as written) with secrets redacted."""
    text = line if isinstance(line, str) else (line.raw if raw else line.text)
    return redact_text(text, secrets)
