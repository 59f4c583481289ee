"""One line numbering (1-based) for a session's log: the number `status --json` gives a line (its error line,
its line count) is the number the TUI's log view shows for that line (`sessions.logs.LogFile`).

The two read the file apart today: the status tracker through the checkpoint (`sessions.server.log_checkpoint`:
the head, the middle counted unread, the tail), the view through `LogFile`'s block index.  So the log here is
past `SKIP_ABOVE_BYTES` (the middle is counted, not parsed), and holds what the two could count differently:
CRLF line ends, tqdm bars joined by ``\\r``, bytes that are not UTF-8, a line longer than the view shows whole,
and a last line with no newline yet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sessions.logs import LogFile
from sessions.server import log_checkpoint
from tests.test_log_checkpoint import DECODE, READY_HEAD, _session

REPO = Path(__file__).resolve().parent.parent
EXCEPTION = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"


def _log() -> bytes:
    head = READY_HEAD.encode()
    bar = b"[2026-01-01 10:00:06 TP0] Capturing batches (bs=8):  50%|#####     | 4/8\r" \
          b"[2026-01-01 10:00:06 TP0] Capturing batches (bs=8): 100%|##########| 8/8\n"
    middle = bytearray()
    minute = 0
    while len(middle) < log_checkpoint.SKIP_ABOVE_BYTES + (1 << 20):
        middle += DECODE.format(m=minute % 60, r=minute % 7).encode()
        if minute % 1000 == 3:
            middle += b"[2026-01-01 11:00:00 TP1] odd bytes \xff\xfe and a CRLF end\r\n"
        if minute == 5000:
            middle += b"[2026-01-01 11:00:00 TP0] " + b"x" * (80 << 10) + b"\n"  # cut to head ... tail in the view
        minute += 1
    crash = ("[2026-01-08 10:00:00 TP1] Traceback (most recent call last):\n"
             "[2026-01-08 10:00:00 TP1]   File \"/sglang/srt/managers/scheduler.py\", line 3, in event_loop_normal\n"
             f"[2026-01-08 10:00:00 TP1] {EXCEPTION}\n").encode()
    return head + bar + bytes(middle) + crash + b"[2026-01-08 10:00:01] a last line, not ended yet"


def test_status_json_and_the_log_view_give_a_line_the_same_number(home, cli_env):
    data = _log()
    session = _session(home, "p-20260101-100000-0042", "")
    session.log_path.write_bytes(data)
    done = subprocess.run([sys.executable, "-m", "app", "status", session.session_id, "--json"], capture_output=True,
                          text=True, check=False, env=cli_env, cwd=REPO, timeout=300)
    assert done.returncode in (0, 1), done.stderr  # 1: the session crashed (the status exit code says so)
    doc = json.loads(done.stdout)
    doc = doc[0] if isinstance(doc, list) else doc
    grep_n = data.split(b"\n").index(f"[2026-01-08 10:00:00 TP1] {EXCEPTION}".encode()) + 1
    assert doc["error_line"] == grep_n
    assert doc["line_count"] == data.count(b"\n") + 1  # the last line counts before its newline comes

    with LogFile.open(session.log_path, follow_from="end") as log:  # as the dashboard's log pane opens it (app.feed)
        log.build_index(background=False)
        shown = log.line(doc["error_line"])
        assert shown is not None and shown.number == doc["error_line"] and shown.text.endswith(EXCEPTION)
        assert log.line_count == doc["line_count"]
        tail = log.tail_lines(3)
        assert [line.number for line in tail] == [grep_n - 2, grep_n - 1, grep_n]
