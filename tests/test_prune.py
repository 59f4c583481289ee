"""`eagle3-tui prune`: ended sessions' folders go, a running one never does, the baselines' good starts stay.

Real emulator sessions: one good start that is then stopped (the profile's baseline), a crashed start, a
stopped hang, and one that still runs.
"""
from __future__ import annotations

import json
import os

import pytest
from test_server import run_cli, wait_for_state

from sessions.server import ServerSession
from sessions.server.prune import baseline_session_ids, parse_duration, plan_prune


@pytest.fixture
def four_sessions(launched, make_emulator_profile, home):
    good = launched.launch(make_emulator_profile("good", tp=1))
    wait_for_state(good, {"ready"})
    assert good.stop(grace_s=5).stopped
    crash = launched.launch(make_emulator_profile("crash", tp=1, fault="scheduler-exception"))
    wait_for_state(crash, {"crashed"})
    hang = launched.launch(make_emulator_profile("hang", tp=1, fault="hang-after-weights"))
    assert hang.stop(grace_s=2).stopped
    running = launched.launch(make_emulator_profile("live", tp=1, fault="hang-after-weights"))
    wait_for_state(running, {"starting"})
    launched.remember(running)
    return good, crash, hang, running


def test_prune_removes_ended_sessions_keeps_the_baseline_and_never_a_running_one(four_sessions, home, cli_env):
    good, crash, hang, running = four_sessions
    assert baseline_session_ids(home) == {good.session_id}
    result = run_cli("prune", "--yes", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert sorted(report["removed"]) == sorted([crash.session_id, hang.session_id])
    assert [k["session_id"] for k in report["kept"]] == [good.session_id]
    assert "baseline" in report["kept"][0]["why"]
    assert report["running"] == [running.session_id]
    assert not crash.session_dir.exists() and not hang.session_dir.exists()
    assert good.session_dir.is_dir() and running.session_dir.is_dir() and running.is_alive()

    again = run_cli("prune", "--yes", "--include-baselines", "--json", env=cli_env)
    assert json.loads(again.stdout)["removed"] == [good.session_id]
    assert running.session_dir.is_dir() and running.is_alive()  # still: it runs
    assert ServerSession.load(running.session_id, home).status().state == "starting"


def test_prune_never_removes_a_running_server_even_with_a_damaged_record(four_sessions, home):
    *_ended, running = four_sessions
    (running.session_dir / "state.json").write_text("{ not json")  # the record lies; the marker does not
    plan = plan_prune(home, include_baselines=True)
    assert running.session_id in plan.running
    assert running.session_id not in [i.session_id for i in plan.items]


def test_keep_older_than_dry_run_and_the_questions(four_sessions, home, cli_env):
    _good, crash, hang, _running = four_sessions
    plan = plan_prune(home, keep=1)  # one ended session per profile stays: here every profile has one
    assert plan.to_remove == []
    plan = plan_prune(home, older_than_s=3600)  # all ended moments ago
    assert plan.to_remove == []
    dry = run_cli("prune", "--dry-run", "--json", env=cli_env)
    assert dry.returncode == 0 and sorted(json.loads(dry.stdout)["would_remove"]) == sorted(
        [crash.session_id, hang.session_id])
    assert crash.session_dir.is_dir() and hang.session_dir.is_dir()  # nothing removed
    refused = run_cli("prune", env=cli_env)  # stdin is not a terminal and no --yes
    assert refused.returncode == 2 and "--yes" in refused.stderr and crash.session_dir.is_dir()
    bad = run_cli("prune", "--older-than", "soon", env=cli_env)
    assert bad.returncode == 2 and "--older-than" in bad.stderr and "'soon'" in bad.stderr
    assert run_cli("prune", "--keep", "-1", env=cli_env).returncode == 2


def test_durations():
    assert parse_duration("90s") == 90 and parse_duration("30m") == 1800 and parse_duration("12h") == 43200
    assert parse_duration("7d") == parse_duration("7") == 7 * 86400 and parse_duration("2w") == 14 * 86400
    for text in ("", "-1d", "1y", "d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(text)


def test_a_symlinked_folder_is_never_followed(home, tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "state.json").write_text(json.dumps({"profile": "x", "outcome": "stopped"}))
    os.symlink(target, home.sessions_dir / "x-20260101-000000-abcd")
    plan = plan_prune(home, include_baselines=True)
    assert plan.to_remove == [] and target.is_dir()


def test_P_on_the_dashboard_lists_then_prunes_and_leaves_the_running_one(four_sessions, home):
    from app.tui import Eagle3App
    from sessions.gpus import EmulatedSource
    from tests._tui_support import first_poll, run, wait_until
    from widgets.confirm_modal import ConfirmModal

    good, crash, hang, running = four_sessions
    seen: dict[str, str] = {}

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(100, 30)) as pilot:
            await first_poll(pilot, app)
            await pilot.press("2", "P")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the prune question")
            seen["question"], seen["detail"] = app.screen.question, app.screen.detail
            await pilot.press("y")
            await wait_until(pilot, lambda: not crash.session_dir.exists() and not hang.session_dir.exists(),
                             "the ended folders removed")

    run(scenario)
    assert seen["question"] == "Remove 2 ended session folder(s)?"
    assert f"keep   {good.session_id}: a baseline's good start" in seen["detail"]
    assert f"running, never pruned: {running.session_id}" in seen["detail"]
    assert good.session_dir.is_dir() and running.session_dir.is_dir() and running.is_alive()

