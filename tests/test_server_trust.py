"""Records that tell the truth, with real processes, ports and signals (issue: trust in daily use).

* A stop the user asked for records ``stopped``, also when a poll sees the main process gone before the
  stop has finished (the TP8 race), in state.json and in the history.
* One server per profile: a second launch is refused naming the running session, and launches started
  at the same moment by separate processes start exactly one server (the state dir's launch lock).
* Ready only when the process on the port is the session's own; a foreign listener is named.
* Write first, then start: a launcher that dies before writing the pid leaves a server that `status`
  lists and `stop` stops; so does a deleted session folder or a damaged state.json.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _extract_support import wait_for

from sessions import probes
from sessions.history import load_history
from sessions.server import AlreadyRunning, ServerSession, list_sessions

DEADLINE_S = 90.0


def wait_state(session: ServerSession, states: set[str], deadline_s: float = DEADLINE_S):
    found = {}

    def reached() -> bool:
        found["status"] = session.status()
        return found["status"].state in states

    wait_for(reached, f"{session.session_id} in {states}", deadline_s, interval_s=0.1)
    return found["status"]


def run_cli(*args: str, env: dict[str, str], timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], check=False, env=env, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )


def hang_profile(make_emulator_profile, name: str = "hang8", tp: int = 8):
    # Hangs after weights, as the demo's kimi-k25-hang-after-weights does; stall after 1 s of silence.
    return make_emulator_profile(name, tp=tp, fault="hang-after-weights", watch={"stall_after_s": 1})


def wait_weights_done(session: ServerSession, tp: int) -> None:
    """Until every rank logged its weights (the hang has begun)."""
    wait_for(
        lambda: len(session.status(probe_http=False).summary.ranks_loaded) >= tp,
        "every rank logged Load weight end", DEADLINE_S, interval_s=0.1,
    )


# --- 1. a requested stop is a stop ----------------------------------------------------------------------


def test_a_poll_that_sees_the_main_gone_mid_stop_records_stopped(launched, make_emulator_profile, home,
                                                                monkeypatch):
    """The race behind "stopped ... in 0.9s", then "crashed": a second reader of the same session (the
    TUI's poll, another CLI) looks after SIGTERM killed the main process and before stop() has finished.
    Here that poll runs exactly there, inside stop()'s first wait, on its own ServerSession object."""
    from sessions.server import session as lifecycle

    session = launched.launch(hang_profile(make_emulator_profile))
    wait_weights_done(session, 8)
    launched.remember(session)
    poller = ServerSession.load(session.session_id, home)
    seen: list[str] = []
    real_wait = lifecycle._wait_gone

    def wait_then_poll(alive, timeout_s, reap):
        real_wait(alive, timeout_s, reap)
        seen.append(poller.status().state)  # the main is gone now; the stop has not recorded anything

    monkeypatch.setattr(lifecycle, "_wait_gone", wait_then_poll)
    report = session.stop(grace_s=10)
    assert report.stopped, report
    assert "crashed" not in seen and seen[0] == "stopped", seen
    rec = session.state_record
    assert (rec["outcome"], rec["start_outcome"]) == ("stopped", "stopped"), rec
    assert rec["stop_requested_at"] <= rec["stopped_at"]
    assert [r.outcome for r in load_history(home, "hang8")] == ["stopped"]
    assert session.status().state == poller.status().state == "stopped"


def test_stops_of_stalled_tp8_sessions_under_a_busy_poller_record_stopped(launched, make_emulator_profile,
                                                                          home):
    """Three stalled TP8 starts stopped while another thread polls as fast as it can (the TUI's feed)."""
    profile = hang_profile(make_emulator_profile)
    for attempt in range(3):
        session = launched.launch(profile)
        wait_state(session, {"stalled"})
        launched.remember(session)
        poller = ServerSession.load(session.session_id, home)
        states: list[str] = []
        done = threading.Event()

        def poll(reader: ServerSession = poller, out: list[str] = states, done: threading.Event = done) -> None:
            while not done.is_set():
                out.append(reader.status(probe_http=False).state)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            report = session.stop(grace_s=10)
        finally:
            done.set()
            thread.join(timeout=30)
        assert report.stopped, report
        assert "crashed" not in states, (attempt, states[-20:])
        rec = session.state_record
        assert (rec["outcome"], rec["start_outcome"]) == ("stopped", "stopped"), (attempt, rec)
        assert session.status().state == "stopped"
    assert [r.outcome for r in load_history(home, "hang8")] == ["stopped"] * 3


# --- 2. one server per profile ---------------------------------------------------------------------------


def test_a_second_launch_of_a_running_profile_is_refused_naming_the_session(launched, make_emulator_profile,
                                                                            home, cli_env):
    profile = hang_profile(make_emulator_profile, "once", tp=2)
    first = launched.launch(profile)
    with pytest.raises(AlreadyRunning) as refused:
        ServerSession.launch(profile, home)
    assert refused.value.session_id == first.session_id
    assert f"already running as {first.session_id}" in str(refused.value)
    result = run_cli("launch", "once", env=cli_env)
    assert result.returncode == 1 and result.stdout == ""
    assert f"profile 'once' is already running as {first.session_id}" in result.stderr
    assert [s.session_id for s in list_sessions(home)] == [first.session_id]
    first.stop(grace_s=5)
    again = launched.launch(profile)  # once it is stopped, the profile launches again
    assert again.session_id != first.session_id


def test_simultaneous_launches_from_separate_processes_start_exactly_one(launched, make_emulator_profile,
                                                                        home, cli_env):
    hang_profile(make_emulator_profile, "race", tp=2)
    procs = [
        subprocess.Popen([sys.executable, "-m", "app", "launch", "race"], env=cli_env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        for _ in range(4)
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    for _rc, out, _err in results:
        if out.strip():
            launched.track(out.strip())
    winners = [r for r in results if r[0] == 0]
    assert len(winners) == 1, results
    winner_id = winners[0][1].strip()
    for rc, out, err in results:
        if rc != 0:
            assert rc == 1 and out == "" and f"already running as {winner_id}" in err, (rc, err)
    assert [s.session_id for s in list_sessions(home)] == [winner_id]


# --- 3. ready only on our own port -------------------------------------------------------------------------


FOREIGN_SERVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"model_path": "someone-else"}'
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("listening", flush=True)
srv.serve_forever()
"""


def test_a_foreign_server_on_the_port_is_named_and_never_counts_as_ready(launched, make_emulator_profile, home):
    profile = make_emulator_profile("foreign", tp=2, time_scale=0.02)
    session = launched.launch(profile)
    port = profile.server.port
    foreign = subprocess.Popen([sys.executable, "-c", FOREIGN_SERVER, str(port)], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert foreign.stdout.readline().strip() == "listening"
        seen = []

        def ended() -> bool:
            status = session.status()
            seen.append(status)
            return not status.alive

        wait_for(ended, "the emulator gave up on the taken port", DEADLINE_S, interval_s=0.1)
        while_alive = [s for s in seen if s.alive]
        assert while_alive and all(s.state != "ready" and s.ready is not True for s in while_alive)
        named = [s for s in while_alive if s.problem]
        assert named, [s.to_json() for s in while_alive[-3:]]
        assert f"by pid {foreign.pid}" in named[-1].problem and "not this session's server" in named[-1].problem
        assert session.state_record.get("start_outcome") != "ready"
        assert all(r.outcome != "ready" for r in load_history(home, "foreign"))
    finally:
        foreign.kill()
        foreign.wait()


def test_listener_owner_tells_our_socket_from_a_foreign_one(free_port):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port))
        sock.listen()
        assert probes.listener_owner(free_port, "127.0.0.1", [os.getpid()]).ours is True
        other = probes.listener_owner(free_port, "127.0.0.1", [1])
        assert other.ours is False and f"by pid {os.getpid()}" in other.text


# --- 4. write first, then start; servers found by their marker -------------------------------------------


LAUNCHER_DIES = r"""
import os, sys
import sessions.server.session as lifecycle
from sessions.profiles import load_profile
def die(session, pid):
    print(session.session_id, pid, flush=True)
    os._exit(9)  # killed between starting the server and writing its pid
lifecycle._record_pid = die
lifecycle.ServerSession.launch(load_profile(sys.argv[1]))
"""


def test_a_launcher_killed_before_writing_the_pid_leaves_a_listed_stoppable_server(launched,
                                                                                    make_emulator_profile,
                                                                                    home, cli_env):
    hang_profile(make_emulator_profile, "orphan", tp=2)
    died = subprocess.run([sys.executable, "-c", LAUNCHER_DIES, "orphan"], env=cli_env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert died.returncode == 9, died.stderr
    session_id, pid = died.stdout.split()
    session = launched.track(session_id)
    rec = json.loads((session.session_dir / "state.json").read_text())
    assert rec["launch_state"] == "launching" and rec["pid"] is None  # written before the server started
    assert probes.process_alive(int(pid), probes.psutil.Process(int(pid)).create_time())

    listed = json.loads(run_cli("status", "--json", env=cli_env).stdout)
    row = next(r for r in listed if r["session_id"] == session_id)
    assert row["pid"] == int(pid) and row["alive"] is True
    assert "found pid" in row["problem"] and "session marker" in row["problem"]
    assert session.state_record["pid"] == int(pid)  # adopted into the sound record
    again = run_cli("launch", "orphan", env=cli_env)
    assert again.returncode == 1 and f"already running as {session_id}" in again.stderr
    stopped = run_cli("stop", session_id, "--grace", "5", env=cli_env)
    assert stopped.returncode == 0, stopped.stderr
    assert not session.is_alive() and session.state_record["outcome"] == "stopped"


@pytest.mark.parametrize("damage", ["delete-folder", "json-list", "delete-state"])
def test_a_running_server_whose_record_is_damaged_or_gone_is_listed_and_stoppable(
    damage, launched, make_emulator_profile, home, cli_env
):
    session = launched.launch(hang_profile(make_emulator_profile, "damaged", tp=2))
    wait_weights_done(session, 2)
    launched.remember(session)
    rec = session.state_record
    main = (rec["pid"], rec["create_time"])
    if damage == "delete-folder":
        shutil.rmtree(session.session_dir)
    elif damage == "json-list":
        (session.session_dir / "state.json").write_text("[1, 2, 3]\n")
    else:
        (session.session_dir / "state.json").unlink()

    result = run_cli("status", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert session.session_id in result.stdout and "(!)" in result.stdout
    # its problem line; a stall report's line may come first (the hang profile stalls once the limit passes)
    problem_lines = [line for line in result.stderr.splitlines()
                     if line.startswith(session.session_id) and " stalled: " not in line]
    expected = {"delete-folder": "is gone", "json-list": "holds an array", "delete-state": "missing"}[damage]
    assert any(expected in line for line in problem_lines), result.stderr
    row = next(r for r in json.loads(run_cli("status", "--json", env=cli_env).stdout)
               if r["session_id"] == session.session_id)
    assert row["pid"] == main[0] and row["alive"] is True

    stopped = run_cli("stop", session.session_id, "--grace", "5", env=cli_env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not probes.process_alive(*main)
    if damage == "json-list":  # the damaged bytes are kept; the rewritten record says what happened
        assert (session.session_dir / "state.json.damaged").read_text() == "[1, 2, 3]\n"
        assert session.state_record["outcome"] == "stopped"


def test_the_server_carries_its_session_marker(launched, make_emulator_profile, home):
    session = launched.launch(make_emulator_profile("marker", tp=1))
    rec = session.state_record
    env = probes.psutil.Process(rec["pid"]).environ()
    assert env["EAGLE3_TUI_SESSION"] == session.session_id
    assert env["EAGLE3_TUI_SESSIONS_DIR"] == str(home.sessions_dir)
    session.stop(grace_s=5)


def test_sigkill_of_the_cli_launch_never_loses_the_server(launched, make_emulator_profile, home, cli_env):
    """Whenever the launcher dies, the state dir knows every server it started (here: SIGKILL right
    after the server process appears, before or after the pid is written)."""
    hang_profile(make_emulator_profile, "kill9", tp=1)
    proc = subprocess.Popen([sys.executable, "-m", "app", "launch", "kill9"], env=cli_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)

    def server_started() -> bool:
        return bool(list(home.sessions_dir.glob("kill9-*/server.log")))

    wait_for(server_started, "the session folder", 60, interval_s=0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    sessions = list_sessions(home)
    assert len(sessions) == 1 and (sessions[0].session_dir / "state.json").is_file()
    launched.track(sessions[0].session_id)
    from sessions.server import find_marked_servers

    marked = find_marked_servers(home)  # every server of this home that runs, found by its marker
    assert set(marked) <= {s.session_id for s in sessions if s.is_alive()}
    report = sessions[0].stop(grace_s=5)
    assert report.stopped, report


def test_module_marker_scan_ignores_other_homes(tmp_path: Path, home):
    from sessions.home import Home
    from sessions.server import find_marked_servers

    other = Home(tmp_path / "other" / "config", tmp_path / "other" / "state").ensure()
    assert find_marked_servers(other) == {}
