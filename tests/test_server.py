"""Server sessions with real processes: the emulator launched detached, probed, stopped, restarted.

Every test stops what it started (the ``launched`` fixture stops and then SIGKILLs by pid at teardown).
Waits poll real state with a generous deadline that only guards against hanging; nothing asserts speed.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _extract_support import wait_for

from sessions import probes
from sessions.redaction import redact_text
from sessions.server import LaunchError, ServerSession, classify_state, list_sessions

DEADLINE_S = 90.0  # only a guard against a hang; the emulator at time_scale 0.003 is ready in seconds


def wait_for_state(session: ServerSession, states: set[str], deadline_s: float = DEADLINE_S):
    """Poll ``status()`` until its state is one of ``states``; fail with the last status otherwise."""
    end = time.monotonic() + deadline_s
    status = session.status()
    while status.state not in states:
        if time.monotonic() > end:
            tail = session.log_path.read_text(errors="replace")[-2000:] if session.log_path.exists() else ""
            pytest.fail(f"{session.session_id} never reached {states}: {status.to_json()}\nlog tail:\n{tail}")
        time.sleep(0.1)
        status = session.status()
    return status


def wait_until(predicate, deadline_s: float = DEADLINE_S, what: str = "condition"):
    return wait_for(predicate, what, deadline_s, interval_s=0.05)


def identities(status) -> set[tuple[int, float]]:
    return {(status.pid, status.create_time)} | {(p.pid, p.create_time) for p in status.processes}


def survivors(idents: set[tuple[int, float]]) -> list[int]:
    return sorted(pid for pid, ct in idents if probes.process_alive(pid, ct))


def _probe_lines(session: ServerSession) -> int:
    text = session.log_path.read_text(errors="replace")
    return text.count("GET /ready ") + text.count("GET /model_info ")


def _universal_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def run_cli(*args: str, env: dict[str, str], timeout: float = 120.0, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        **kwargs,
    )


# --- pure rules -------------------------------------------------------------------------------------------


def test_classify_state_follows_the_design_table():
    def state(**facts):
        base = {"alive": True, "stopped": False, "fatal_error": False, "ready": False, "ever_ready": False,
                "stalled": False}
        return classify_state(**(base | facts))

    assert state() == "starting"
    assert state(stalled=True) == "stalled"
    assert state(ready=True, ever_ready=True) == "ready"
    assert state(fatal_error=True) == "crashed"  # an error is a crash even while the process lingers
    assert state(alive=False) == "crashed"  # gone before ready
    assert state(alive=False, ever_ready=True) == "exited"
    assert state(alive=False, fatal_error=True, ever_ready=True) == "crashed"
    assert state(alive=False, stopped=True, ever_ready=True) == "stopped"
    assert state(alive=False, stopped=True, fatal_error=True) == "stopped"


# --- the lifecycle ----------------------------------------------------------------------------------------


def test_tp4_session_gets_ready_and_stop_leaves_nothing(launched, make_emulator_profile, home):
    profile = make_emulator_profile("tp4", tp=4)
    session = launched.launch(profile)

    rec = session.state_record
    assert rec["pid"] and rec["create_time"] and rec["pgid"] == rec["pid"]
    assert (session.session_dir.stat().st_mode & 0o777) == 0o700
    assert (session.log_path.stat().st_mode & 0o777) == 0o600
    assert re.fullmatch(r"tp4-\d{8}-\d{6}-[0-9a-f]{4}", session.session_id)
    command = json.loads((session.session_dir / "command.json").read_text())
    assert command["env_changes"]["EAGLE3_TUI_SESSION"] == session.session_id
    assert "sessions.emulator" in command["argv"]

    status = wait_for_state(session, {"ready", "crashed", "exited"})
    assert status.state == "ready", status.to_json()
    launched.remember(session)
    schedulers = sorted(r.rank for r in status.ranks if r.role == "scheduler")
    assert schedulers == [0, 1, 2, 3]
    assert [r.title for r in status.ranks if r.role == "detokenizer"] == ["sglang::detokenizer"]
    assert status.port_listening and status.ready is True
    assert isinstance(status.model_info, dict)
    assert status.phase == "ready"
    entered = status.phase_entered_at
    assert set(entered) >= {"launching", "ready"}
    assert entered["launching"] <= entered["ready"]

    # The emulator publishes which rank holds which GPU (emulated_gpus.json, about once a second).
    wait_until(
        lambda: all(r.gpu_index is not None for r in session.status().ranks if r.role == "scheduler"),
        what="emulated GPU numbers for every rank",
    )
    assert {r.rank: r.gpu_index for r in session.status().ranks if r.role == "scheduler"} == {
        0: 0, 1: 1, 2: 2, 3: 3
    }

    # Watching a ready server does not write into its log: no more /ready, /model_info fetched once.
    probes_before = _probe_lines(session)
    for _ in range(3):
        assert ServerSession.load(session.session_id, home).status().model_info == status.model_info
        session.status()
    assert _probe_lines(session) == probes_before

    idents = identities(status)
    report = session.stop(grace_s=20.0)
    assert report.stopped, report
    assert report.port_free and report.survivors == ()
    assert report.signals_sent and report.signals_sent[0] == f"SIGTERM to {status.pid}"
    assert survivors(idents) == []
    assert probes.port_free("127.0.0.1", profile.server.port)

    after = session.status()
    assert after.state == "stopped" and not after.alive and after.ranks == ()
    rec = session.state_record
    assert rec["outcome"] == "stopped" and rec["stopped_at"] >= rec["started_at"]
    assert rec["start_outcome"] == "ready"
    # The finished start went into the profile's history: the next start's baseline.
    from sessions.history import last_good

    assert last_good(home, "tp4").session_id == session.session_id


def test_cli_launch_then_reattach_and_stop_from_other_processes(launched, make_emulator_profile, cli_env):
    make_emulator_profile("cli-emu", tp=2)
    launch = run_cli("launch", "cli-emu", env=cli_env)
    assert launch.returncode == 0, launch.stderr
    session_id = launch.stdout.strip()
    assert launch.stdout == session_id + "\n"  # only the id on stdout
    assert re.fullmatch(r"cli-emu-\d{8}-\d{6}-[0-9a-f]{4}", session_id)
    session = launched.track(session_id)

    status = wait_for_state(session, {"ready", "crashed", "exited"})
    assert status.state == "ready", status.to_json()
    launched.remember(session)
    idents = identities(status)

    listed = run_cli("status", session_id[:-3], "--json", env=cli_env)  # a unique prefix works
    assert listed.returncode == 0, listed.stderr
    [obj] = json.loads(listed.stdout)
    assert obj["session_id"] == session_id and obj["state"] == "ready" and obj["pid"] == status.pid

    stop = run_cli("stop", session_id, "--grace", "20", env=cli_env)
    assert stop.returncode == 0, stop.stderr
    assert f"stopped {session_id}" in stop.stderr
    assert survivors(idents) == []
    assert probes.port_free("127.0.0.1", status.port)
    assert ServerSession.load(session_id).status().state == "stopped"


def test_status_json_has_the_contract_fields(launched, make_emulator_profile, cli_env):
    session = launched.launch(make_emulator_profile("json-emu", tp=2))
    wait_for_state(session, {"ready", "crashed", "exited"})
    launched.remember(session)
    result = run_cli("status", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    objects = json.loads(result.stdout)
    assert isinstance(objects, list) and [o["session_id"] for o in objects] == [session.session_id]
    obj = objects[0]
    for key in ("session_id", "profile", "pid", "state", "phase", "port", "ranks", "log_path", "started_at"):
        assert key in obj, key
    assert obj["profile"] == "json-emu" and obj["state"] == "ready" and obj["phase"] == "ready"
    assert isinstance(obj["pid"], int) and obj["port"] == session.state_record["port"]
    assert Path(obj["log_path"]) == session.log_path and isinstance(obj["started_at"], float)
    ranks = obj["ranks"]
    assert {r["rank"] for r in ranks if r["title"].startswith("sglang::scheduler")} == {0, 1}
    for rank in ranks:
        assert set(rank) >= {"pid", "title", "rank", "status"}
    # The table form names the session too, on stdout.
    table = run_cli("status", env=cli_env)
    assert table.returncode == 0 and session.session_id in table.stdout and "ready" in table.stdout
    missing = run_cli("status", "no-such-session", "--json", env=cli_env)
    assert missing.returncode == 2
    assert "no session 'no-such-session' in " in missing.stderr and missing.stdout == ""


def test_sigkill_of_the_main_process_takes_its_ranks_down(launched, make_emulator_profile):
    session = launched.launch(make_emulator_profile("kill-emu", tp=4))
    status = wait_for_state(session, {"ready", "crashed", "exited"})
    assert status.state == "ready"
    launched.remember(session)
    rank_idents = {(r.pid, r.create_time) for r in status.ranks}
    assert len(rank_idents) == 5  # four schedulers and the detokenizer

    os.kill(status.pid, signal.SIGKILL)
    wait_until(lambda: not survivors(rank_idents), what="the ranks to die with their parent (PDEATHSIG)")
    after = wait_for_state(session, {"crashed", "exited"})
    assert not after.alive and after.ranks == ()
    assert session.state_record["outcome"] == after.state
    assert list_sessions(include_ended=False) == []


def test_a_port_in_use_is_refused_before_anything_starts(make_emulator_profile, home, cli_env):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        profile = make_emulator_profile("busy", port=port)
        with pytest.raises(LaunchError) as caught:
            ServerSession.launch(profile, home)
        problems = {p.field: p.message for p in caught.value.problems}
        assert problems["server.port"].startswith(f"port {port} on 127.0.0.1 is in use by pid {os.getpid()} (")
        assert caught.value.code == 2
        assert list(home.sessions_dir.iterdir()) == []  # nothing spawned, nothing written

        result = run_cli("launch", "busy", env=cli_env)
        assert result.returncode == 2 and result.stdout == ""
        where = rf"server\.port(?: \(line \d+\))?: port {port} on 127\.0\.0\.1 is in use by pid {os.getpid()} \("
        assert re.search(where, result.stderr), result.stderr
        assert list(home.sessions_dir.iterdir()) == []
    finally:
        holder.close()


def test_restart_launches_the_edited_profile_and_shows_the_flag_diff(
    launched, make_emulator_profile, cli_env, tmp_path
):
    first = make_emulator_profile("restart-emu", tp=2)
    session = launched.launch(first)
    old = wait_for_state(session, {"ready", "crashed", "exited"})
    assert old.state == "ready"
    launched.remember(session)
    # Edit the profile file: a new flag, an env var and a secret that must not be shown.
    make_emulator_profile(
        "restart-emu", tp=2, port=first.server.port, mem_fraction_static=0.7,
        env={"NCCL_ALGO": "Ring", "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz123456"},
    )
    result = run_cli("restart", session.session_id, "--yes", "--grace", "20", env=cli_env)
    assert result.returncode == 0, result.stderr
    new_id = result.stdout.strip()
    assert result.stdout == new_id + "\n" and new_id != session.session_id
    new = launched.track(new_id)
    assert "+ --mem-fraction-static 0.7" in result.stderr
    assert "+ env NCCL_ALGO=Ring" in result.stderr
    assert "+ env HF_TOKEN=***" in result.stderr
    assert "hf_abcdefghijklmnop" not in result.stderr

    assert survivors(identities(old)) == []
    assert session.status().state == "stopped"
    status = wait_for_state(new, {"ready", "crashed", "exited"})
    assert status.state == "ready" and status.pid != old.pid
    launched.remember(new)
    assert new.profile.server.mem_fraction_static == 0.7
    assert new.state_record["restarted_from"] == session.session_id

    refused = run_cli("restart", new_id, env=cli_env)  # not a terminal and no --yes: nothing happens
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert new.status().state == "ready"

    # A profile edited into a broken one is refused while the running server is left alone.
    make_emulator_profile("restart-emu", tp=2, port=first.server.port, model_path=str(tmp_path / "gone"))
    broken = run_cli("restart", new_id, "--yes", env=cli_env)
    assert broken.returncode == 2 and broken.stdout == ""
    assert "server.model_path" in broken.stderr, broken.stderr
    assert new.status().state == "ready"


def test_the_server_survives_the_launching_cli_and_its_sighup(launched, make_emulator_profile, cli_env):
    make_emulator_profile("hup-emu", tp=2, time_scale=0.01)
    cli = subprocess.Popen(
        [sys.executable, "-m", "app", "launch", "hup-emu", "--wait-ready"],
        env=cli_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own group, as a terminal would give it
    )
    try:
        session_id = cli.stdout.readline().strip()
        session = launched.track(session_id)
        os.killpg(cli.pid, signal.SIGHUP)  # the terminal hangs up on the CLI's whole group
        assert cli.wait(timeout=30) == -signal.SIGHUP
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    status = wait_for_state(session, {"ready", "crashed", "exited"})
    assert status.state == "ready" and status.alive
    launched.remember(session)


def test_wait_ready_fails_when_the_server_crashes(launched, make_emulator_profile, cli_env):
    make_emulator_profile("crash-emu", tp=2, fault="scheduler-exception")
    result = run_cli("launch", "crash-emu", "--wait-ready", "--timeout", "60", env=cli_env)
    session = launched.track(result.stdout.strip())
    assert result.returncode == 4, result.stderr  # crashed (tests/test_wait.py has every outcome's code)
    assert "crashed" in result.stderr
    status = session.status()
    assert status.state == "crashed"
    assert status.summary.error is not None
    # `status --json .error` is the exception that raised it, with its rank (issue 21), never the header
    from sessions.emulator.faults import Fault, failing_rank

    out = status.to_json()
    assert "Traceback (most recent call last)" not in out["error"] and "Error" in out["error"].split(":")[0]
    assert out["error_rank"] == failing_rank(Fault("scheduler-exception"), 2)
    assert session.state_record["start_outcome"] == "crashed"


def test_a_silent_start_is_stalled_and_stops_cleanly(launched, make_emulator_profile):
    profile = make_emulator_profile("hang-emu", tp=2, fault="hang-after-weights", watch={"stall_after_s": 1})
    session = launched.launch(profile)
    status = wait_for_state(session, {"stalled", "crashed", "ready", "exited"})
    assert status.state == "stalled", status.to_json()
    assert status.silent_for_s > 1 and not status.port_listening
    launched.remember(session)
    idents = identities(status)
    report = session.stop(grace_s=0.0)  # no grace: SIGKILL follows at once
    assert report.stopped and survivors(idents) == []
    assert session.status().state == "stopped"


def test_logs_prints_tails_and_follows_until_the_server_ends(launched, make_emulator_profile, cli_env):
    session = launched.launch(make_emulator_profile("logs-emu", tp=2, time_scale=0.01))
    follower = subprocess.Popen(
        [sys.executable, "-m", "app", "logs", session.session_id, "-f"],
        env=cli_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    ready_seen = threading.Event()

    def read() -> None:
        for line in follower.stdout:
            seen.append(line)
            if "The server is fired up and ready to roll!" in line:
                ready_seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready_seen.wait(DEADLINE_S), "".join(seen)[-2000:]
        launched.remember(session)
        session.stop(grace_s=20.0)
        assert follower.wait(timeout=30) == 0  # -f ends once the server is gone and the log is drained
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    reader.join(5)
    # What `logs` prints: every line as written, except a tqdm bar (redrawn with \r) as one line in its
    # last state, read through the same log core, redacted.
    from sessions.logs import LogFile, printed

    with LogFile(session.log_path, follow_from="start") as log:
        shown_lines: list[str] = []
        while True:
            result = log.poll()
            shown_lines += [redact_text(printed(line)) + "\n" for line in result.lines]
            if not result.more:
                break
    assert b"\r" in session.log_path.read_bytes()  # the bars were drawn with \r
    assert "".join(seen) == "".join(shown_lines)
    assert not any(line.count("Completed |") > 1 for line in seen)  # never every frame of a bar

    tail = run_cli("logs", session.session_id[:-2], "-n", "3", env=cli_env)
    assert tail.returncode == 0 and tail.stdout == "".join(shown_lines[-3:])


def test_logs_follow_exits_0_on_ctrl_c(launched, make_emulator_profile, cli_env):
    session = launched.launch(make_emulator_profile("sigint-emu", tp=1))
    wait_for_state(session, {"ready", "crashed", "exited"})
    launched.remember(session)
    follower = subprocess.Popen(
        [sys.executable, "-m", "app", "logs", session.session_id, "-f"],
        env=cli_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout.readline()  # it is following
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert session.status().state == "ready"  # Ctrl-C on the log viewer never touches the server
