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
