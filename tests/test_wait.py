"""`eagle3-tui wait SESSION` and `launch --wait-ready`: scripts fail fast, one exit code per outcome.

Real emulator sessions: a hang fault (stalled), a crash fault (crashed), a stop from another process while
waiting (stopped), a start slower than --timeout (timeout), a healthy start (ready).  Each wait must end by
itself; the subprocess timeout is only a guard against the old "polls forever on a stall".
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from test_server import run_cli, wait_for_state

from app.cli_server import WAIT_EXIT_CODES
from sessions.server.waiting import WAIT_OUTCOMES

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_every_outcome_has_its_own_exit_code_listed_in_help_and_readme(cli_env):
    assert set(WAIT_EXIT_CODES) == set(WAIT_OUTCOMES)
    codes = list(WAIT_EXIT_CODES.values())
    assert len(set(codes)) == len(codes), WAIT_EXIT_CODES
    assert not {1, 2} & set(codes) - {WAIT_EXIT_CODES["ready"]}, "1 and 2 keep the CLI's meanings"
    readme = (REPO_ROOT / "README.md").read_text()
    for command in ("wait", "launch"):
        text = " ".join(run_cli(command, "--help", env=cli_env).stdout.split())
        for outcome, code in WAIT_EXIT_CODES.items():
            assert re.search(rf"\b{code} [^,.]*{outcome[:5]}", text), (command, outcome, code, text)
    for outcome, code in WAIT_EXIT_CODES.items():
        assert re.search(rf"`{code}`\s+{outcome[:5]}", readme), (outcome, code)


def test_launch_wait_ready_ends_at_once_on_a_stall_with_exit_3(launched, make_emulator_profile, cli_env):
    make_emulator_profile("hang-wait", tp=2, fault="hang-after-weights", watch={"stall_after_s": 1})
    # The old loop printed "stalled: weights_loaded" and polled forever: the subprocess timeout catches it.
    result = run_cli("launch", "hang-wait", "--wait-ready", env=cli_env, timeout=90)
    session = launched.track(result.stdout.strip())
    assert result.returncode == WAIT_EXIT_CODES["stalled"] == 3, result.stderr
    assert " stalled in " in result.stderr and "still runs" in result.stderr
    assert session.is_alive()  # a stall does not stop the server: the user diagnoses it
    # the stall saved its diagnosis in the session folder, and a second watcher of the same stall adds none
    reports = sorted(session.session_dir.glob("stall-diagnosis-*.txt"))
    assert len(reports) == 1 and f"diagnosis saved to {reports[0]}" in result.stderr, result.stderr
    again = run_cli("wait", session.session_id, env=cli_env, timeout=60)
    assert again.returncode == 3, again.stderr
    # With a 1 s limit a loaded machine may call a pause during loading a stall, and the log moves on after
    # it: a later stall is another stall.  Once the hang holds, one more watcher of it saves nothing new.
    settled = sorted(session.session_dir.glob("stall-diagnosis-*.txt"))
    third = run_cli("wait", session.session_id, env=cli_env, timeout=60)
    assert third.returncode == 3, third.stderr
    assert sorted(session.session_dir.glob("stall-diagnosis-*.txt")) == settled
    assert "diagnosis saved to" not in third.stderr


def test_wait_on_a_crash_exits_4_with_the_error(launched, make_emulator_profile, cli_env):
    make_emulator_profile("crash-wait", tp=2, fault="scheduler-exception")
    launch = run_cli("launch", "crash-wait", env=cli_env)
    session = launched.track(launch.stdout.strip())
    result = run_cli("wait", session.session_id, "--timeout", "90", env=cli_env)
    assert result.returncode == WAIT_EXIT_CODES["crashed"] == 4, result.stderr
    assert "crashed in" in result.stderr and "line " in result.stderr


def test_a_stop_while_waiting_exits_5(launched, make_emulator_profile, cli_env):
    profile = make_emulator_profile("stop-wait", tp=2, fault="hang-after-weights", watch={"stall_after_s": 300})
    session = launched.launch(profile)
    waiter = subprocess.Popen(
        [sys.executable, "-m", "app", "wait", session.session_id],
        env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert waiter.stderr is not None
        assert waiter.stderr.readline().startswith("starting: ")  # the wait is under way
        wait_for_state(session, {"starting"})
        assert session.stop(grace_s=2.0).stopped
        _out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == WAIT_EXIT_CODES["stopped"] == 5, err
    assert "was stopped" in err
    # The card's "stopped HH:MM:SS" comes from the status the poll read, not from the widget reading files.
    stopped = session.status()
    assert stopped.ended_at == session.state_record["stopped_at"]


def test_a_timeout_exits_6_and_leaves_the_server_running(launched, make_emulator_profile, cli_env):
    profile = make_emulator_profile("slow-wait", tp=2, fault="hang-after-weights", watch={"stall_after_s": 300})
    session = launched.launch(profile)
    result = run_cli("wait", session.session_id, "--timeout", "0.5", env=cli_env)
    assert result.returncode == WAIT_EXIT_CODES["timeout"] == 6, result.stderr
    assert "not ready after" in result.stderr and "still running" in result.stderr
    assert session.is_alive()
    bad = run_cli("wait", session.session_id, "--timeout", "-1", env=cli_env)
    assert bad.returncode == 2 and "--timeout" in bad.stderr


def test_wait_on_a_healthy_start_exits_0(launched, make_emulator_profile, cli_env):
    make_emulator_profile("ok-wait", tp=2)
    result = run_cli("launch", "ok-wait", "--wait-ready", "--timeout", "90", env=cli_env)
    session = launched.track(result.stdout.strip())
    assert result.returncode == 0, result.stderr
    assert "is ready on 127.0.0.1:" in result.stderr
    assert run_cli("wait", session.session_id[:-2], env=cli_env).returncode == 0  # a unique prefix works
