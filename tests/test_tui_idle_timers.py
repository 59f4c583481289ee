"""An idle dashboard wakes only for what it shows (issue 23: the TUI's own CPU at a 1 s refresh).

Each timer callback wakes the event loop; the action line's 5 Hz spinner ran while no action did, five
wake-ups a second for a hidden line, the idle TUI's largest share of wake-ups.  These tests count the
spinner's callbacks between polls (events, not time): none while idle, some while an action runs, none
again once it has finished.
"""

from __future__ import annotations

from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from tests._tui_support import first_poll, run, wait_until
from widgets.action_line import ActionLine


def test_the_action_spinner_ticks_only_while_an_action_runs(home, monkeypatch):
    ticks: list[int] = []
    tick = ActionLine._tick

    def counted(self: ActionLine) -> None:
        ticks.append(1)
        tick(self)

    monkeypatch.setattr(ActionLine, "_tick", counted)
    seen: dict[str, int] = {}

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(100, 30)) as pilot:
            await first_poll(pilot, app)
            dashboard = app.dashboard
            line = dashboard.query_one(ActionLine)
            polls = dashboard.poll_count
            await wait_until(pilot, lambda: dashboard.poll_count >= polls + 6, "six idle polls")
            seen["idle"] = len(ticks)
            line.start("testing")
            await wait_until(pilot, lambda: len(ticks) >= seen["idle"] + 3, "the spinner moving")
            assert line.display and line.text.startswith(("⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏", "⠋"))
            line.finish()
            await wait_until(pilot, lambda: not line.display, "the line hidden after the action")
            seen["after"] = len(ticks)
            polls = dashboard.poll_count
            await wait_until(pilot, lambda: dashboard.poll_count >= polls + 6, "six polls after the action")
            seen["later"] = len(ticks)

    run(scenario)
    assert seen["idle"] == 0, f"the spinner ticked {seen['idle']} times with no action running"
    assert seen["later"] == seen["after"], f"{seen['later'] - seen['after']} ticks after the action ended"
