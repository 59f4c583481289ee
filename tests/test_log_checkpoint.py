"""A session's log checkpoint: a status resumes where the last one (any process's) stopped reading.

Real files in real session folders: the resumed state equals a full read's at any split of the real
pasted logs; a log truncated, replaced, or rewritten under the offset is read afresh; a damaged, foreign
or special checkpoint file is ignored; a read that skips the middle of a huge log keeps exact line numbers.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions.home import atomic_write_json, ensure_private_dir
from sessions.logs import LogFile
from sessions.phases import StartupTracker
from sessions.server import ServerSession
from sessions.server import log_checkpoint as lc

LOGS = sorted((Path(__file__).parent / "data" / "sglang-logs").glob("*.log"))
READY_HEAD = (
    "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m', tp_size=2)\n"
    "[2026-01-01 10:00:01 TP0] Load weight begin. avail mem=70.00 GB\n"
    "[2026-01-01 10:00:01 TP1] Load weight begin. avail mem=70.00 GB\n"
    "[2026-01-01 10:00:05 TP0] Load weight end. elapsed=5.0 s, type=LlamaForCausalLM, avail mem=10.0 GB\n"
    "[2026-01-01 10:00:05 TP1] Load weight end. elapsed=5.0 s, type=LlamaForCausalLM, avail mem=10.0 GB\n"
    "[2026-01-01 10:00:09] The server is fired up and ready to roll!\n"
)
DECODE = ("[2026-01-01 11:{m:02d}:00 TP0] Decode batch, #running-req: {r}, #token: 900, token usage: 0.05, "
          "cuda graph: True, gen throughput (token/s): 612.00, #queue-req: 0\n")


def _full(data: bytes) -> object:
    tracker = StartupTracker()
    tracker.feed_bytes(data)
    return tracker.summary()


def _read(session_dir: Path, log: Path) -> lc.LogProgress:
    """One process's read through the log's reader: resume from the checkpoint when valid, read to the
    end, save."""
    with LogFile(log, follow_from="start", lines=False) as reader:
        size = reader.size_bytes
        progress = lc.load(session_dir, reader, size) or lc.LogProgress(StartupTracker())
        if not lc.still_valid(progress, reader, size):
            progress = lc.LogProgress(StartupTracker())
        progress.identity = reader.identity
        lc.advance(progress, reader, size)
        progress.offset = size
        progress.fingerprint = lc.fingerprint_at(reader, progress.offset)
        assert lc.save(session_dir, progress)
        return progress


# prefixes a deployment puts before every line (the tracker learns an unknown one: that state is saved too)
WRAPPERS = ("", "2026-04-01T10:00:00.123456789Z stdout F ", "[2026-04-01 10:00:00,123][server.py:88][INFO]: ",
            "> ")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, len(LOGS) - 1), cut=st.floats(0.0, 1.0), second=st.floats(0.0, 1.0),
       wrapper=st.sampled_from(WRAPPERS))
def test_a_resumed_read_equals_a_full_read_at_any_split_of_the_pasted_logs(
    tmp_path_factory, which, cut, second, wrapper
):
    data = b"".join(wrapper.encode() + line for line in LOGS[which].read_bytes().splitlines(keepends=True))
    a = int(len(data) * cut)
    b = a + int((len(data) - a) * second)
    folder = ensure_private_dir(tmp_path_factory.mktemp("cp") / "session")
    log = folder / "server.log"
    log.write_bytes(data[:a])
    _read(folder, log)
    with open(log, "ab") as f:  # the same file grows: a new process resumes at the saved offset
        f.write(data[a:b])
    _read(folder, log)
    with open(log, "ab") as f:
        f.write(data[b:])
    resumed = _read(folder, log)
    assert resumed.offset == len(data)
    assert resumed.tracker.summary() == _full(data)


def test_the_checkpoint_is_private_json_and_names_this_version(tmp_path):
    folder = ensure_private_dir(tmp_path / "s")
    log = folder / "server.log"
    log.write_text(READY_HEAD)
    _read(folder, log)
    path = folder / lc.CHECKPOINT_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["version"] == lc.version_key() and doc["offset"] == len(READY_HEAD)


def _dead_identity() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    create_time = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, create_time


def _session(home, session_id: str, log_text: str) -> ServerSession:
    pid, create_time = _dead_identity()
    session_dir = ensure_private_dir(home.sessions_dir / session_id)
    (session_dir / "server.log").write_text(log_text)
    atomic_write_json(session_dir / "state.json", {
        "version": 1, "session_id": session_id, "profile": "p", "pid": pid, "create_time": create_time,
        "pgid": pid, "host": "127.0.0.1", "port": 1, "started_at": time.time() - 60, "stall_after_s": 300,
        "phase_entered_at": {"launching": time.time() - 60}, "descendants": [],
    })
    return ServerSession.load(session_id, home)


def _status_in_a_new_process(home, session_id: str):
    return ServerSession.load(session_id, home).status(probe_http=False)


def test_a_status_in_another_process_resumes_from_the_saved_offset(home):
    text = READY_HEAD + "".join(DECODE.format(m=m, r=m % 5) for m in range(30))
    session = _session(home, "p-20260101-100000-0001", text)
    first = session.status(probe_http=False)
    checkpoint = session.session_dir / lc.CHECKPOINT_FILE
    assert json.loads(checkpoint.read_text())["offset"] == len(text)
    with open(session.log_path, "a") as f:
        f.write("[2026-01-01 12:00:00 TP1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    again = _status_in_a_new_process(home, session.session_id)
    assert again.summary == _full(session.log_path.read_bytes())
    assert again.summary.line_count == first.summary.line_count + 1
    assert again.serving is not None and again.serving.running_reqs is not None


def test_a_truncated_or_rewritten_log_is_read_from_its_start(home):
    session = _session(home, "p-20260101-100000-0002", READY_HEAD)
    assert session.status(probe_http=False).summary.phase == "ready"
    crash = ("[2026-01-02 09:00:00] server_args=ServerArgs(model_path='/m', tp_size=1)\n"
             "[2026-01-02 09:00:03 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    session.log_path.write_text(crash)  # truncated in place (same inode), shorter than the offset
    truncated = _status_in_a_new_process(home, session.session_id)
    assert truncated.summary == _full(crash.encode())
    # copytruncate then written past the old offset: same inode, longer, but other bytes before the offset
    rewritten = crash * 40
    session.log_path.write_text(rewritten)
    assert _status_in_a_new_process(home, session.session_id).summary == _full(rewritten.encode())


def test_a_rotated_log_is_read_from_its_start(home):
    session = _session(home, "p-20260101-100000-0003", READY_HEAD)
    session.status(probe_http=False)
    new = session.log_path.with_name("server.log.new")
    replacement = READY_HEAD.replace("tp_size=2", "tp_size=1") * 3  # longer, another inode
    new.write_text(replacement)
    os.replace(new, session.log_path)
    assert _status_in_a_new_process(home, session.session_id).summary == _full(replacement.encode())


def test_a_damaged_foreign_or_special_checkpoint_is_ignored(home):
    text = READY_HEAD + DECODE.format(m=1, r=3)
    session = _session(home, "p-20260101-100000-0004", text)
    session.status(probe_http=False)
    checkpoint = session.session_dir / lc.CHECKPOINT_FILE
    good = json.loads(checkpoint.read_text())
    expected = _full(text.encode())
    foreign = dict(good, version="0.0.1/1/0000")
    tampered = dict(good, tracker=dict(good["tracker"], _phase={"enum": "os.system", "v": "ready"}))
    wrong_shape = dict(good, tracker={"_phase": good["tracker"]["_phase"]})
    for damaged in ("{not json", json.dumps(foreign), json.dumps(tampered), json.dumps(wrong_shape),
                    json.dumps(dict(good, offset="many"))):
        checkpoint.write_text(damaged)
        assert _status_in_a_new_process(home, session.session_id).summary == expected
    checkpoint.unlink()
    os.mkfifo(checkpoint)  # a FIFO in its place is refused at once, never waited on
    assert _status_in_a_new_process(home, session.session_id).summary == expected


def test_a_huge_increment_reads_the_head_and_the_tail_with_exact_line_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(lc, "HEAD_BYTES", 4096)
    monkeypatch.setattr(lc, "SKIP_ABOVE_BYTES", 8192)
    monkeypatch.setattr(lc, "TAIL_BYTES", 2048)
    monkeypatch.setattr(lc, "COUNT_BLOCK_BYTES", 1000)
    folder = ensure_private_dir(tmp_path / "s")
    log = folder / "server.log"
    serving = "".join(DECODE.format(m=m % 60, r=m % 7) for m in range(2000))
    crash = "[2026-01-08 10:00:00 TP1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
    log.write_text(READY_HEAD + serving + crash)
    progress = _read(folder, log)
    summary = progress.tracker.summary()
    text = log.read_text()
    assert summary.line_count == text.count("\n")
    assert summary.phase == "ready"  # from the head
    crash_line = text.splitlines().index(crash.rstrip("\n")) + 1  # grep -n's number
    assert [e.line_no for e in summary.errors] == [crash_line]
    assert summary.errors[0].rank == 1
