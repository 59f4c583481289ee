"""A compare started from the TUI's bench screen (`c`) stops the servers it launched when the user leaves
mid-compare: `q` (the app waits for those stops, then exits) or `escape` (the screen closes and the compare
ends behind it).  The CLI does this on its signals (test_bench_signals); the TUI's compare runs in a thread
worker that no signal reaches, and before this its cleanup died on its first progress note to the closed
app, so both launched servers kept running.  Real emulator sessions, real processes."""

from __future__ import annotations

import psutil
import pytest
from test_bench_compare import _profiles, llama  # noqa: F401 - llama is a fixture

from app.screens.bench import BenchScreen
from app.tui import Eagle3App
from sessions.bench.session_bench import BenchOptions
from tests._tui_support import run, wait_until


def _alive(identity: tuple[int, float]) -> bool:
    pid, create_time = identity
    try:
        process = psutil.Process(pid)
        return process.create_time() == pytest.approx(create_time, abs=0.01) \
            and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("leave", ["q", "escape"])
def test_leaving_the_tui_mid_compare_stops_what_the_compare_launched(leave, make_emulator_profile, llama,  # noqa: F811
                                                                       home, launched, monkeypatch):
    from sessions.server import list_sessions

    _profiles(make_emulator_profile, llama, 2.0)
    # long requests (400 tokens at 100 tok/s): the user leaves while a run is in flight
    monkeypatch.setattr(BenchScreen, "default_options", BenchOptions(input_len=8, output_len=400, num_prompts=2,
                                                                     concurrency=(1,)))
    monkeypatch.setattr(BenchScreen, "rounds", 2)
    servers: list[tuple[int, float]] = []

    async def scenario() -> None:
        app = Eagle3App(home, refresh_s=0.5, watch_tty=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.dashboard is not None, "the dashboard")
            screen = BenchScreen(home)
            await app.push_screen(screen)
            screen.start_compare("plain", "eagle")
            status = screen.query_one("#run-status")
            await wait_until(pilot, lambda: "round 1/2: benchmarking A" in str(status.render()),
                             "the compare benchmarks A", 240)
            for session in list_sessions(home):
                launched.track(session)
                identity = session.main_identity()
                assert identity is not None
                servers.append(identity)
            assert len(servers) == 1  # plain and eagle share GPU 0: one up at a time, A first
            await pilot.press(leave)
            if leave == "escape":
                assert not isinstance(app.screen, BenchScreen)
            if leave == "q":  # q waits for the stops, then quits
                await wait_until(pilot, lambda: app.return_code is not None, "the app exits", 120)
            else:
                await wait_until(pilot, lambda: all(s.status(probe_http=False).state == "stopped"
                                                    for s in list_sessions(home)), "the launched server stops", 120)

    run(scenario)
    for session in list_sessions(home):
        assert session.status(probe_http=False).state == "stopped", session.session_id
    assert servers and not any(_alive(s) for s in servers), "a server the compare launched outlived the TUI"
