"""Esc on the bench screen while its bench runs: what the bench's thread reports after the screen closed is
dropped, not drawn on the closed screen.  Before, its next progress note found none of the screen's widgets
(NoMatches), `call_from_thread` raised that in the thread, the failure note raised it again, the worker
failed, and the app ended with it (tests/test_tui_fuzz.py, seed 1: ``b``, then Esc).

The screen, its thread worker and the app are real; only the bench's requests are replaced, by a bench that
reports its first progress, waits until the test has closed the screen, reports again and then fails (as a
server that goes away mid-bench does), so that its reports come after the close every time."""

from __future__ import annotations

import threading
from typing import Any

from app.screens.bench import BenchScreen
from app.tui import Eagle3App
from sessions.bench import session_bench
from sessions.gpus import EmulatedSource
from tests._tui_support import first_poll, run, wait_until


def test_escape_while_a_bench_runs_drops_its_later_reports_and_keeps_the_app(home, monkeypatch):
    closed = threading.Event()
    reports: list[str] = []  # the bench thread's calls into the app, once each has returned (or raised)

    def bench_after_the_close(session: Any, options: Any, progress: Any, **_kwargs: Any) -> dict[str, Any]:
        progress(1, 0, 2)
        assert closed.wait(60)
        progress(1, 1, 2)
        raise ConnectionError("the server went away mid-bench")

    monkeypatch.setattr(session_bench, "bench_session", bench_after_the_close)
    monkeypatch.setattr("sessions.server.ServerSession.load", lambda session_id, home: session_id)

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        told = app.call_from_thread

        def call_from_thread(callback: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return told(callback, *args, **kwargs)
            finally:
                reports.append(getattr(callback, "__name__", repr(callback)))

        app.call_from_thread = call_from_thread  # type: ignore[method-assign]
        async with app.run_test(size=(120, 40)) as pilot:
            await first_poll(pilot, app)
            screen = BenchScreen(home, "p-20260101-100000-0001")
            await app.push_screen(screen)
            status = screen.query_one("#run-status")
            await wait_until(pilot, lambda: "0/2 requests" in str(status.render()), "the first progress note")
            await pilot.press("escape")
            assert not isinstance(app.screen, BenchScreen)
            closed.set()
            # two progress notes and the failure note, all after the close
            await wait_until(pilot, lambda: len(reports) >= 3 or not app.is_running, "the bench's last report")
            await pilot.pause()
            assert app.is_running and app.return_code is None
        assert app.crash_file is None

    run(scenario)
