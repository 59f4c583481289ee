"""At 80x24 with a capture profile selected, the log pane keeps a usable height and the footer shows the
main keys (issue 21: the log pane got one line and the footer hid x and b)."""

from __future__ import annotations

from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from tests._tui_support import first_poll, run, screen_text, wait_until
from widgets.log_view import LogView

MIN_LOG_ROWS = 5  # lines of log a user can read at 80x24


def test_at_80x24_a_capture_profile_leaves_the_log_pane_room_and_the_footer_its_main_keys(
        home, make_emulator_profile, launched, tmp_path):
    session = launched.launch(make_emulator_profile("cap", tp=2, capture={"enabled": True,
                                                                          "dir": str(tmp_path / "cap")}))
    launched.remember(session)

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            dashboard = app.dashboard
            await wait_until(pilot, lambda: dashboard.query_one("#capture-slot").display
                             and dashboard.selected_status() is not None, "the capture panel of cap's session")
            await first_poll(pilot, app, dashboard.poll_count + 2)
            log = dashboard.query_one(LogView)
            text = screen_text(app)
            assert log.size.height >= MIN_LOG_ROWS, f"log pane {log.size.height} rows:\n{text}"
            footer = text.splitlines()[-1]
            for key in ("l", "r", "s", "e", "d", "c", "x", "b", "q"):
                assert f"{key} " in footer, f"{key} missing from the footer: {footer!r}\n{text}"

    run(scenario)
