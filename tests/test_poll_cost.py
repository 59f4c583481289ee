"""A watcher polls a ready server every second: each poll does only what can have changed.

The "server" is this test process (a real pid and create_time) with a real listening socket on its port,
and a log that says it is ready.  Counted, not timed: state.json is read once per status, the port is
connected to once per recheck window between HTTP probes, and the stall limit of a start that is over is
computed once.
"""
from __future__ import annotations

import socket
import time

import psutil
import pytest

from sessions.home import atomic_write_json, ensure_private_dir
from sessions.server import ServerSession
from sessions.server import record as record_module
from sessions.server import status as status_module

READY_LOG = (
    "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m', tp_size=1)\n"
    "[2026-01-01 10:00:05] Load weight end. elapsed=5.0 s, type=LlamaForCausalLM, avail mem=10.0 GB\n"
    "[2026-01-01 10:00:09] The server is fired up and ready to roll!\n"
)


@pytest.fixture
def ready_session(home):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    me = psutil.Process()
    session_id = "p-20260101-100000-00aa"
    session_dir = ensure_private_dir(home.sessions_dir / session_id)
    (session_dir / "server.log").write_text(READY_LOG)
    atomic_write_json(session_dir / "state.json", {
        "version": 1, "session_id": session_id, "profile": "p", "pid": me.pid, "create_time": me.create_time(),
        "pgid": me.pid, "host": "127.0.0.1", "port": listener.getsockname()[1], "started_at": time.time() - 60,
        "stall_after_s": 300, "phase_entered_at": {"launching": time.time() - 60}, "descendants": [],
        "start_outcome": "ready",
    })
    try:
        yield ServerSession.load(session_id, home)
    finally:
        listener.close()


def _counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_poll_of_a_ready_server_reads_state_once_and_connects_once_per_recheck(ready_session, monkeypatch):
    first = ready_session.status(probe_http=False)
    assert first.state == "ready" and first.port_listening
    reads = _counting(monkeypatch, record_module, "read_state")
    connects = _counting(monkeypatch, status_module.probes, "port_listening")
    limits = _counting(monkeypatch, status_module, "last_good")
    polls = 5
    for _ in range(polls):
        status = ready_session.status(probe_http=False)
        assert status.state == "ready" and status.port_listening
    assert len(reads) == polls  # one state.json read per status (it was three)
    assert connects == []  # within PORT_RECHECK_S of the first look: the answer stands
    assert limits == []  # the start is over: its stall limit was computed once, by the first status
    ready_session.status(probe_http=True)  # the feed's HTTP recheck connects again
    assert len(connects) == 1


def test_a_ready_server_whose_port_closed_is_seen_after_the_recheck_window(ready_session, monkeypatch):
    assert ready_session.status(probe_http=False).port_listening
    monkeypatch.setattr(status_module, "PORT_RECHECK_S", 0.0)
    monkeypatch.setattr(status_module.probes, "port_listening", lambda host, port, timeout_s=0.5: False)
    assert not ready_session.status(probe_http=False).port_listening


def test_a_poll_of_a_starting_server_reads_state_once(home, monkeypatch):
    """While a server starts, its stall limit is computed at every status; it took the profile's name from
    a second read of state.json (``profile_name``) instead of the record the status had read."""
    me = psutil.Process()
    session_id = "p-20260101-100000-00ab"
    session_dir = ensure_private_dir(home.sessions_dir / session_id)
    (session_dir / "server.log").write_text(READY_LOG.split("\n")[0] + "\n")  # no ready line: still starting
    (session_dir / "profile.toml").write_text('[server]\nlauncher = "emulator"\nmodel_path = "/m"\n')
    atomic_write_json(session_dir / "state.json", {
        "version": 1, "session_id": session_id, "profile": "p", "pid": me.pid, "create_time": me.create_time(),
        "pgid": me.pid, "host": "127.0.0.1", "port": 1, "started_at": time.time() - 60, "stall_after_s": 300,
        "phase_entered_at": {"launching": time.time() - 60}, "descendants": []})
    session = ServerSession.load(session_id, home)
    assert session.status(probe_http=False).state not in ("ready", "crashed", "exited")
    reads = _counting(monkeypatch, record_module, "read_state")
    limits = _counting(monkeypatch, status_module, "last_good")
    polls = 3
    for _ in range(polls):
        session.status(probe_http=False)
    assert len(limits) == polls  # the start is not over: the limit is computed each time
    assert len(reads) == polls  # one state.json read per status (it was two)
