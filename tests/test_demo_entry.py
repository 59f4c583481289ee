"""`--demo` works from any entry point: every subcommand creates the demo home on first use, as the TUI does.

Each test starts from an empty EAGLE3_TUI_HOME and runs the real CLI in a child process, so nothing that an
earlier test (or the TUI) created can make the command work.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from sessions.demo import DEMO_PROFILES, HEALTHY_PROFILE


def _cli(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", "--demo", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


@pytest.fixture
def fresh_env(tmp_path, cli_env) -> dict[str, str]:
    """The CLI's environment with an EAGLE3_TUI_HOME that does not exist yet."""
    env = dict(cli_env, EAGLE3_TUI_HOME=str(tmp_path / "never-opened"))
    env.pop("EAGLE3_TUI_DEMO", None)
    return env


def test_profile_list_on_a_fresh_home_lists_the_demo_profiles(fresh_env):
    done = _cli(["profile", "list"], fresh_env)
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split()
    for name in DEMO_PROFILES:
        assert name in listed


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["profile", "command", HEALTHY_PROFILE],
                                  ["profile", "validate", HEALTHY_PROFILE], ["extract", "status", "--json"]])
def test_any_subcommand_first_creates_the_demo_home(fresh_env, tmp_path, args):
    done = _cli(args, fresh_env)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    profiles = sorted(p.stem for p in (tmp_path / "never-opened").rglob("profiles/*.toml"))
    assert set(DEMO_PROFILES) <= set(profiles)
    if args == ["status", "--json"]:
        assert json.loads(done.stdout) == []


def test_launch_on_a_fresh_demo_home_starts_the_demo_server(fresh_env):
    done = _cli(["launch", HEALTHY_PROFILE], fresh_env)
    assert done.returncode == 0, done.stderr
    session_id = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"{HEALTHY_PROFILE}-[\w-]+", session_id), done.stdout
    try:
        status = json.loads(_cli(["status", "--json"], fresh_env).stdout)
        assert [s["session_id"] for s in status] == [session_id]
        assert status[0]["alive"] is True
    finally:
        stopped = _cli(["stop", session_id], fresh_env)
    assert stopped.returncode == 0, stopped.stderr


def test_the_first_start_says_what_it_builds_and_a_second_start_says_nothing(fresh_env):
    """Issue 21: the first `--demo` showed a blank terminal for seconds while it wrote the tiny model."""
    first = _cli(["profile", "list"], fresh_env)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    assert lines[0].startswith("eagle3-tui: first start: writing the demo's tiny model"), first.stderr
    assert re.fullmatch(r"eagle3-tui: demo home ready in \d+\.\d s: .*", lines[-1]), first.stderr
    assert "eagle3-tui:" not in first.stdout  # the command's own output stays clean
    again = _cli(["profile", "list"], fresh_env)
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_the_tui_says_what_it_builds_before_it_takes_the_screen(fresh_env, tmp_path):
    """The first `eagle3-tui --demo` on a terminal: the progress line comes before the TUI's first frame."""
    import os
    import pty
    import select
    import signal

    pid, fd = pty.fork()
    if pid == 0:  # the child: the real TUI on a real terminal
        os.execvpe(sys.executable, [sys.executable, "-m", "app", "--demo"], dict(fresh_env, TERM="xterm-256color"))
    seen = b""
    try:
        while b"\x1b[?1049h" not in seen:  # the TUI switches to the alternate screen: its first frame
            ready, _, _ = select.select([fd], [], [], 120)
            assert ready, f"no output from the TUI: {seen!r}"
            chunk = os.read(fd, 65536)
            assert chunk, f"the TUI ended: {seen!r}"
            seen += chunk
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
        os.close(fd)
    before = seen.split(b"\x1b[?1049h")[0].decode(errors="replace")
    assert "eagle3-tui: first start: writing the demo's tiny model" in before, before
    assert "eagle3-tui: demo home ready in" in before, before
