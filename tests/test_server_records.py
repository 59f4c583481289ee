"""Sessions rebuilt from their folders: lookup by prefix, identities that no longer match, log tails.

These folders are written the way `ServerSession.launch` writes them, for processes that are really dead
or really someone else (this test process under another create_time): the cases a reattach meets after
a reboot or a pid reuse.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from sessions.home import atomic_write_json, ensure_private_dir
from sessions.server import ServerSession, SessionNotFound, find_session, list_sessions

READY_LOG = (
    "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m', tp_size=1)\n"
    "[2026-01-01 10:00:05] Load weight end. elapsed=5.0 s, type=DeepseekV3ForCausalLM, avail mem=10.0 GB\n"
    "[2026-01-01 10:00:09] The server is fired up and ready to roll!\n"
)


def write_session(home, session_id: str, pid: int, create_time: float, log_text: str = "", **extra) -> ServerSession:
    session_dir = ensure_private_dir(home.sessions_dir / session_id)
    (session_dir / "server.log").write_text(log_text)
    atomic_write_json(
        session_dir / "state.json",
        {
            "version": 1,
            "session_id": session_id,
            "profile": session_id.rsplit("-", 3)[0],
            "pid": pid,
            "create_time": create_time,
            "pgid": pid,
            "host": "127.0.0.1",
            "port": 1,
            "started_at": time.time() - 60,
            "stall_after_s": 300,
            "phase_entered_at": {"launching": time.time() - 60},
            "descendants": [],
        }
        | extra,
    )
    return ServerSession.load(session_id, home)


def dead_identity() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    create_time = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, create_time


def test_find_session_by_id_or_unique_prefix(home):
    pid, ct = dead_identity()
    a = write_session(home, "alpha-20260101-100000-aaaa", pid, ct)
    write_session(home, "alpha-20260101-100000-bbbb", pid, ct)
    write_session(home, "beta-20260101-100000-cccc", pid, ct)
    assert find_session("alpha-20260101-100000-aaaa", home).session_id == a.session_id
    assert find_session("beta", home).session_id == "beta-20260101-100000-cccc"
    with pytest.raises(SessionNotFound, match=r"session 'alpha' is ambiguous: 2 match"):
        find_session("alpha", home)
    with pytest.raises(SessionNotFound, match=rf"no session 'gamma' in {home.sessions_dir}"):
        find_session("gamma", home)
    with pytest.raises(SessionNotFound):
        ServerSession.load("../alpha-20260101-100000-aaaa", home)
    assert [s.session_id for s in list_sessions(home, include_ended=False)] == []


def test_a_dead_session_reads_as_crashed_or_exited_from_its_log(home):
    pid, ct = dead_identity()
    never_ready = write_session(home, "a-20260101-100000-0001", pid, ct, READY_LOG.rsplit("\n", 2)[0] + "\n")
    served = write_session(home, "b-20260101-100000-0002", pid, ct, READY_LOG)
    status = never_ready.status()
    assert (status.state, status.alive, status.ranks) == ("crashed", False, ())
    assert status.phase == "weights_loaded"
    status = served.status()
    assert (status.state, status.phase) == ("exited", "ready")
    assert served.state_record["outcome"] == "exited"  # recorded once, for the TUI and the history


def test_a_reused_pid_is_not_our_process_and_is_never_signalled(home):
    # This very test process, under another create_time: the pid was reused by someone else.
    me = psutil.Process(os.getpid())
    session = write_session(home, "reused-20260101-100000-0003", me.pid, me.create_time() - 1000.0, READY_LOG)
    assert not session.is_alive()
    status = session.status()
    assert not status.alive and status.state == "exited" and status.ranks == ()
    report = session.stop(grace_s=0.5)
    assert report.signals_sent == () and report.stopped  # we are still here to check
    assert session.state_record.get("stopped_at") is None  # it had ended on its own; we only cleaned up


def test_flag_diff_lists_added_removed_and_changed_flags_with_secrets_hidden(emulator_model_dir):
    from sessions.profiles import LaunchProfile
    from sessions.server import flag_diff

    old = LaunchProfile(name="p").with_changes(
        server={
            "launcher": "emulator",
            "model_path": str(emulator_model_dir),
            "tp_size": 4,
            "extra_args": ("--api-key", "sk-old-secret-value-0000000", "--log-level", "info"),
            "env": {"HF_TOKEN": "hf_oldoldoldoldoldoldoldold", "NCCL_DEBUG": "INFO"},
        }
    )
    assert flag_diff(old, old) == []
    new = old.with_changes(
        server={
            "tp_size": 8,
            "mem_fraction_static": 0.7,
            "extra_args": ("--api-key", "sk-new-secret-value-1111111", "--trust-remote-code"),
            "env": {"HF_TOKEN": "hf_newnewnewnewnewnewnewnew", "NCCL_ALGO": "Ring"},
        }
    )
    diff = flag_diff(old, new)
    assert diff == [
        "~ --api-key *** -> *** (secret changed)",
        "- --log-level info",
        "+ --mem-fraction-static 0.7",
        "~ --tp-size 4 -> 8",
        "+ --trust-remote-code",
        "~ env HF_TOKEN=*** -> *** (secret changed)",
        "+ env NCCL_ALGO=Ring",
        "- env NCCL_DEBUG=INFO",
    ]
    real = new.with_changes(server={"launcher": "sglang"})
    assert flag_diff(new, real)[0].startswith("~ command ")
    assert "sessions.emulator" in flag_diff(new, real)[0] and "sglang.launch_server" in flag_diff(new, real)[0]
    assert "--time-scale" in " ".join(flag_diff(new, real))  # the emulator's own flags go away


def test_silence_ignores_the_access_lines_of_our_own_probes():
    from sessions.server.log_tracking import last_activity_at as _last_activity_at

    probe = b'[2026-01-01 10:00:20] INFO:     127.0.0.1:5 - "GET /ready HTTP/1.1" 503 Service Unavailable\n'
    info = b'[2026-01-01 10:00:21] INFO:     127.0.0.1:6 - "GET /model_info HTTP/1.1" 200 OK\n'
    work = b"[2026-01-01 10:00:09] Start of warmup.\n"
    mtime = time.mktime(time.strptime("2026-01-01 10:00:30", "%Y-%m-%d %H:%M:%S"))
    warmup_at = time.mktime(time.strptime("2026-01-01 10:00:09", "%Y-%m-%d %H:%M:%S"))
    # A whole log read for the first time: the last real line's own timestamp.
    assert _last_activity_at(work + probe + info, mtime, exact=False) == warmup_at
    assert _last_activity_at(probe + work, mtime, exact=False) == mtime
    # New bytes since the last look: real text means "written by mtime", probes alone mean nothing.
    assert _last_activity_at(work + probe, mtime, exact=True) == mtime
    assert _last_activity_at(probe + info, mtime, exact=True) is None
    assert _last_activity_at(b"Loading shards:  50%|#####     | 1/2\r", mtime, exact=False) == mtime
