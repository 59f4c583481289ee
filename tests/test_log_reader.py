"""One reader per session log (issue 23): the status tracker and the TUI's log view read a session's log
through one `sessions.logs.LogFile`, so a poll reads each new byte once, and line N is one line everywhere.

The bytes are counted by the reader's own `ReadStats` (every read goes through it), not by mocking the file
system.  Real files, a real emulator session for the TUI's poll, the real `logs` command in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.feed import DashboardFeed, PollRequest
from sessions.diagnosis.collect import diagnose
from sessions.gpus import EmulatedSource
from sessions.server import ServerSession
from sessions.server import log_checkpoint as lc
from sessions.server.waiting import wait_until_ready
from tests.test_log_checkpoint import DECODE, READY_HEAD, _session

REPO = Path(__file__).resolve().parent.parent
ERROR = "[2026-01-08 10:00:00 TP1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
CRASH = ("[2026-01-08 10:00:00 TP1] Traceback (most recent call last):\n"
         "[2026-01-08 10:00:00 TP1]   File \"/sglang/srt/managers/scheduler.py\", line 3, in event_loop_normal\n"
         f"{ERROR}\n")  # a scheduler crash while serving: its error line is the exception's


def _content_bytes(log) -> int:
    """Bytes the reader read for content (lines, windows, counts), not its one-byte truncation checks."""
    return log.stats.bytes_read - log.stats.by_purpose.get("probe", 0)


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_one_tui_poll_reads_each_new_byte_of_a_ready_sessions_log_once(launched, make_emulator_profile, home):
    session = launched.launch(make_emulator_profile("one", tp=1))
    assert wait_until_ready(session, 120).status.state == "ready"
    feed = DashboardFeed(home, EmulatedSource(home))
    request = PollRequest(session.session_id, None)
    first = feed.poll(request)
    assert first.status is not None and first.status.state == "ready" and first.log is not None
    tui_session = feed.session(session.session_id)
    log = tui_session.session_log()
    assert log is not None and log.has_view  # the view reads the reader the status polls
    for round_ in range(3):
        _append(session.log_path, "".join(DECODE.format(m=m, r=round_) for m in range(200)))
        offset_before, read_before = log.read_offset, _content_bytes(log)
        purposes = dict(log.stats.by_purpose)
        polls_before = log.stats.polls
        snap = feed.poll(request)
        gained = log.read_offset - offset_before
        assert gained >= 200 * len(DECODE.format(m=0, r=0))
        # every new byte was read once, by one poll of the reader: the tracker and the view share it
        assert _content_bytes(log) - read_before == gained, (sorted(purposes.items()), sorted(log.stats.by_purpose.items()))
        assert log.stats.polls - polls_before == 1
        assert snap.log is not None and DECODE.format(m=199, r=round_).rstrip() in [text for _, text in snap.log.lines]
        assert snap.status is not None
        assert snap.status.summary.line_count == session.log_path.read_bytes().count(b"\n")


def _grep_n(path: Path, text: str) -> int:
    return path.read_bytes().split(b"\n").index(text.encode()) + 1


def _logs_output(cli_env, session_id: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "app", "logs", session_id], capture_output=True, text=True,
                          check=False, env=cli_env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")


def _agree(feed: DashboardFeed, session: ServerSession, cli_env) -> None:
    """The error's line number is the same in `status`, diagnosis, the TUI's log view and `logs`."""
    snap = feed.poll(PollRequest(session.session_id, None))
    assert snap.status is not None and snap.status.alive and snap.log is not None
    n = _grep_n(session.log_path, ERROR)
    assert snap.status.summary.error_line == n
    view = feed.log_feed(str(session.log_path))
    assert view.read([n - 1]) == {n - 1: ERROR}  # the view numbers from 0: its line n - 1 is line n
    assert diagnose(ServerSession.load(session.session_id, session.home), with_stacks=False).error_line == n
    assert _logs_output(cli_env, session.session_id)[n - 1] == ERROR


def test_line_n_is_one_line_in_status_diagnosis_the_log_view_and_logs_after_appends_truncation_rotation(
    launched, make_emulator_profile, home, cli_env
):
    session = launched.launch(make_emulator_profile("two", tp=1))
    assert wait_until_ready(session, 120).status.state == "ready"
    feed = DashboardFeed(home, EmulatedSource(home))
    feed.poll(PollRequest(session.session_id, None))  # the view opens the session's reader at the end
    _append(session.log_path, "".join(DECODE.format(m=m, r=1) for m in range(50)) + CRASH)
    _agree(feed, session, cli_env)
    _append(session.log_path, "".join(DECODE.format(m=m, r=2) for m in range(30)))
    _agree(feed, session, cli_env)

    # truncated and written again, shorter (the server writes with O_APPEND): the error is on another line
    with open(session.log_path, "r+") as f:
        f.truncate(0)
    _append(session.log_path, READY_HEAD + DECODE.format(m=1, r=1) + CRASH)
    _agree(feed, session, cli_env)

    # rotated: another file takes the path
    os.replace(session.log_path, session.log_path.with_suffix(".1"))
    session.log_path.write_text(READY_HEAD + "".join(DECODE.format(m=m, r=3) for m in range(7)) + CRASH)
    _agree(feed, session, cli_env)


def test_a_checkpoint_resumed_at_an_offset_continues_the_numbering_and_reads_from_there(home):
    head = READY_HEAD + "".join(DECODE.format(m=m % 60, r=m % 7) for m in range(4000))  # > the serving tail
    session = _session(home, "p-20260101-100000-0078", head)
    session.status(probe_http=False)  # a first process reads it all and saves its checkpoint
    saved = lc.load(session.session_dir, session.session_log(), len(head))  # (checked against the file)
    assert saved is not None and saved.offset == len(head)
    more = "".join(DECODE.format(m=m, r=4) for m in range(20)) + CRASH
    _append(session.log_path, more)

    again = ServerSession.load(session.session_id, home)  # another process: resumes from the offset
    log = again.session_log()
    assert log is not None
    log.attach_view()  # (viewed: the reader of this ended session stays open, its stats with it)
    status = again.status(probe_http=False)
    assert status.summary.error_line == _grep_n(session.log_path, ERROR)
    assert status.summary.line_count == session.log_path.read_bytes().count(b"\n")
    # the bytes after the checkpoint, read once, plus the fixed windows (its fingerprint, the serving tail)
    assert log.stats.by_purpose.get("catch-up", 0) + log.stats.by_purpose.get("poll", 0) == len(more)
    assert log.stats.by_purpose["fingerprint"] == lc.FINGERPRINT_BYTES
    assert log.stats.by_purpose["serving-tail"] <= lc.TAIL_BYTES + 1024
    line = log.line(status.summary.error_line)
    assert line is not None and line.text == ERROR
