"""The diagnosis report a stall saves in its session folder, at most once per stall (issue 21).

Whoever notices a stall first (the TUI's dashboard poll, ``eagle3-tui status``, ``eagle3-tui wait``,
``launch --wait-ready``) calls `save_stall_report`; the others find the stall already claimed.  A stall is
named by where the log went quiet (`sessions.server.status.last_output_offset`: the byte offset after the
server's last output, the same for every reader of the log), so two watchers agree on it and a later stall
(after the log moved again) gets its own report.  The claim is a file created with ``O_CREAT | O_EXCL``:
of two processes, exactly one creates it, and only that one diagnoses and writes.

Files, 0600, in the session folder: ``stall-<offset>.claim`` (who claimed it, when) and
``stall-diagnosis-<offset>.txt`` (the human report, `format_report`), plus ``.json`` (the diagnosis).
"""
from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessions.home import atomic_write_text

REPORT_PREFIX = "stall-diagnosis-"
CLAIM_PREFIX = "stall-"


def stall_key(session: Any) -> int | None:
    """The stall's name: the log offset where the server's output stopped (None: the log is unreadable)."""
    from sessions.server.status import last_output_offset

    return last_output_offset(Path(session.log_path))


def stall_report_path(session: Any, key: int) -> Path:
    """Where the report of the stall named ``key`` is (or will be) saved."""
    return Path(session.session_dir) / f"{REPORT_PREFIX}{key}.txt"


def _claim(path: Path) -> bool:
    """Create ``path`` exclusively; False when another process (or an earlier call) already did."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a planted symlink in its place: not ours to follow or replace
            return False
        raise
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "claimed_at": time.time()}) + "\n")
    return True


def save_stall_report(session: Any, status: Any = None, *,
                      diagnose_fn: Callable[..., Any] | None = None) -> Path | None:
    """Save a diagnosis report of ``session``'s current stall in its folder, once per stall.

    ``status`` is a status the caller just read (read anew when None); nothing is done unless it says
    ``stalled``.  Returns the report's path when this call wrote it, None when the session is not stalled,
    the stall was already claimed (by this or another process), or its log cannot be read.  The diagnosis
    takes seconds (py-spy on every rank): call it from a worker thread, never from a UI thread.  An
    OSError writing the files passes through for the caller to show.
    """
    if status is None:
        status = session.status(probe_http=False)
    if getattr(status, "state", None) != "stalled":
        return None
    key = stall_key(session)
    if key is None:
        return None
    session_dir = Path(session.session_dir)
    report_path = stall_report_path(session, key)
    if not _claim(session_dir / f"{CLAIM_PREFIX}{key}.claim"):
        return None
    from sessions.diagnosis.collect import diagnose
    from sessions.diagnosis.report import format_report
    from sessions.redaction import Redactor

    try:
        result = (diagnose_fn or diagnose)(session)
        redactor = Redactor.for_session(session)  # a second pass by value, as the CLI's output gets
        text = redactor.text(format_report(result))
        doc = json.dumps(redactor.json(result.to_json()), indent=2, sort_keys=True) + "\n"
    except Exception as exc:  # noqa: BLE001 - the claim stands: say in the report what failed, once
        text = f"the diagnosis of this stall failed: {type(exc).__name__}: {exc}\n"
        doc = None
    header = (f"# saved automatically when {getattr(status, 'session_id', '?')} stalled "
              f"({time.strftime('%Y-%m-%d %H:%M:%S')}; the log went quiet at byte {key})\n")
    atomic_write_text(report_path, header + text)
    if doc is not None:
        atomic_write_text(report_path.with_suffix(".json"), doc)
    return report_path
