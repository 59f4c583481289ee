"""What is shown of a log line: its text (or its raw form, for a pipe), redacted once, here.

Secrets are redacted by shape and by name (`sessions.redaction.redact_text`) and by value: the exact
values a session was launched with (its secret env and the values of secret flags).  Every place that
shows log text (the log pane, ``logs``) goes through `shown`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sessions.logs.lines import LogLine
from sessions.redaction import SECRET_FLAGS, is_secret_name, redact_text, secret_values


def shown(line: LogLine | str, secrets: Sequence[str] = (), *, raw: bool = False) -> str:
    """``line`` as it may be shown: its cleaned text (``raw``: as written) with secrets redacted."""
    text = line if isinstance(line, str) else (line.raw if raw else line.text)
    return redact_text(text, secrets)


def profile_secrets(profile: object) -> list[str]:
    """The secret values a launch profile brings: its secret env values and the values of secret flags
    in its extra args (``--api-key X`` and ``--api-key=X``)."""
    server = getattr(profile, "server", None)
    if server is None:
        return []
    found = list(secret_values(dict(getattr(server, "env", {}) or {})))
    args = list(getattr(server, "extra_args", ()) or ())
    for i, arg in enumerate(args):
        flag, eq, value = str(arg).partition("=")
        if flag in SECRET_FLAGS or (flag.startswith("--") and is_secret_name(flag)):
            if eq:
                found.append(value)
            elif i + 1 < len(args):
                found.append(str(args[i + 1]))
    return [v for v in found if v]
