"""The dashboard's "Other hosts" pane over real sshd hosts (tests/_ssh_support.py): a lost host is shown
as unreachable while the dashboard keeps polling and answering keys, and it comes back when sshd does."""
from __future__ import annotations

import asyncio
import re

import psutil

from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from tests._tui_support import first_poll, screen_text, wait_until
from tests.conftest import get_free_port
from tests.test_hosts import cli, emulator_profile


def test_lost_host_shown_unreachable_without_blocking_then_back(ssh_hosts, home, cli_env, emulator_model_dir,
                                                                free_port, tmp_path) -> None:
    from tests.conftest import LaunchedSessions

    remote_home = ssh_hosts.homes["h2"]
    (remote_home.profiles_dir / "emu.toml").write_text(emulator_profile("emu", emulator_model_dir, free_port))
    remote = LaunchedSessions(remote_home)
    far_home = ssh_hosts.homes["h3"]
    far = LaunchedSessions(far_home)
    (home.profiles_dir / "far.toml").write_text(emulator_profile("far", emulator_model_dir, get_free_port(), host="h3"))
    try:
        launched = cli(["launch", "emu", "--host", "h2", "--wait-ready", "--timeout", "120"], cli_env)
        assert launched.returncode == 0, launched.stderr
        session_id = launched.stdout.split()[0]
        session = remote.track(session_id)
        pid, create_time = session.state_record["pid"], session.state_record["create_time"]

        def hosts_pane(app: Eagle3App) -> str:
            return app.dashboard.query_one("#hosts").shown.plain if app.dashboard else ""

        def answering(app: Eagle3App, name: str) -> bool:  # "slow" when a loaded machine answers late
            return re.search(rf"^{name} (connected|slow \()", hosts_pane(app), re.MULTILINE) is not None

        async def scenario() -> None:
            app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
            async with app.run_test(size=(200, 50)) as pilot:
                await first_poll(pilot, app)
                await wait_until(pilot, lambda: answering(app, "h2") and session_id in hosts_pane(app)
                                 and answering(app, "h3"), "both hosts connected, h2's session shown")
                assert "ready" in hosts_pane(app)
                text = screen_text(app)
                assert "Other hosts · 2" in text and session_id in text

                # l on a profile whose host is h3 launches it there, and h3's block shows it
                await pilot.press("1")
                await pilot.press("l")
                await wait_until(pilot, lambda: (list(far_home.sessions_dir.iterdir())
                                                 and " far far-" in hosts_pane(app)), "far launched on h3 and shown")
                far.track(next(far_home.sessions_dir.iterdir()).name)
                assert not list(home.sessions_dir.iterdir())  # nothing of it here
                (tmp_path / "hosts-connected.txt").write_text(text)

                ssh_hosts.servers["h2"].stop()
                await wait_until(pilot, lambda: "h2 unreachable: " in hosts_pane(app), "h2 shown unreachable")
                assert "unreachable: Connection refused" in hosts_pane(app)
                assert answering(app, "h3")
                assert f"{session_id}" in hosts_pane(app) and "sessions as of" in hosts_pane(app)
                # the UI thread is free: polls go on and keys are answered while h2 does not answer
                polls = app.dashboard.poll_count
                await pilot.press("3")
                await wait_until(pilot, lambda: app.focused is not None and app.focused.id == "gpu-pane",
                                 "key 3 focused the GPU pane")
                await wait_until(pilot, lambda: app.dashboard.poll_count >= polls + 3, "three more polls")
                assert "1 not answering" in screen_text(app)
                (tmp_path / "hosts-lost.txt").write_text(screen_text(app))

                ssh_hosts.servers["h2"].start()
                app.host_monitor.poll_now()
                await wait_until(pilot, lambda: answering(app, "h2"), "h2 connected again")
                await wait_until(pilot, lambda: "sessions as of" not in hosts_pane(app), "fresh sessions of h2")
                assert session_id in hosts_pane(app) and "ready" in hosts_pane(app)
            assert app.host_monitor is not None

        asyncio.run(scenario())
        assert psutil.Process(pid).create_time() == create_time  # the server there never noticed
    finally:
        far.cleanup()
        remote.cleanup()
