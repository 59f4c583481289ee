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


def test_a_change_builds_its_lines_once_and_the_ready_clock_between_polls_builds_none(monkeypatch):
    """A repaint used to build a `TextLines` widget's lines again after `_refresh_for_content` had built
    them to compare (and the layout's height query a third time); the state line's 1 s clock built every
    line each second while its "ready for 3 min" moves once a minute."""
    from dataclasses import replace

    from textual.app import App, ComposeResult

    from tests.test_tui_snapshots import NOW, _gpus, _status
    from widgets.gpu_panel import GpuPanel
    from widgets.state_line import StateLine

    built: list[str] = []
    for cls in (GpuPanel, StateLine):
        original = cls._lines

        def counted(self, width: int, _original=original) -> list:
            built.append(type(self).__name__)
            return _original(self, width)

        monkeypatch.setattr(cls, "_lines", counted)

    class Panels(App):
        def compose(self) -> ComposeResult:
            yield StateLine(id="state")
            yield GpuPanel(id="gpus")

    seen: dict[str, list[str]] = {}

    async def scenario() -> None:
        app = Panels()
        async with app.run_test(size=(120, 30)) as pilot:
            state, gpus = app.query_one(StateLine), app.query_one(GpuPanel)
            state.now = NOW + 125
            ready = replace(_status(state="ready", phase="ready"), phase_entered_at={"ready": NOW})
            state.update_status(ready)
            gpus.update_snapshot(_gpus())
            await pilot.pause()
            await pilot.pause()
            built.clear()
            gpus.update_snapshot(replace(_gpus(), taken_at=NOW + 1))  # a new sample: the sparklines move
            await pilot.pause()
            await pilot.pause()
            seen["change"] = list(built)
            built.clear()
            for second in range(3):  # the clock's ticks within the same minute ("for 2 min")
                state.now = NOW + 126 + second
                state._refresh_for_content()
            await pilot.pause()
            seen["ticks"] = list(built)
            assert "for 2 min" in str(state.render())

    run(scenario)
    assert seen["change"] == ["GpuPanel"], seen
    assert seen["ticks"] == [], seen
