"""The real app driven with Pilot against emulator sessions: launch -> ready -> stop, restart with the flag
diff, filter, resize to 80x24, reattach on start, and quitting never stops a server.

Every test runs its scenario through the `drive` fixture: one `Eagle3App` on emulated GPUs under
`run_test`, past its first dashboard poll, with every message it posts recorded.  Waits poll the app's
own state and messages (`wait_until`); nothing sleeps a fixed time to decide a result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
import pytest
from textual.widgets import Input

from app.screens.dashboard import (
    ActionFailed,
    FilterApplied,
    RestartProposed,
    SessionLaunched,
    SessionStopped,
)
from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from sessions.profiles import load_profile, save_profile
from tests._tui_support import first_poll, screen_text, wait_until
from widgets.confirm_modal import ConfirmModal
from widgets.log_view import LogView


class Driven:
    """The app under Pilot and the messages it posted, with the waits the scenarios share."""

    def __init__(self, app: Eagle3App, pilot: Any, messages: list) -> None:
        self.app = app
        self.pilot = pilot
        self.messages = messages

    def posted(self, kind: type) -> list:
        return [m for m in self.messages if isinstance(m, kind)]

    async def until(self, condition: Callable[[], Any], what: str, limit_s: float = 120.0) -> Any:
        return await wait_until(self.pilot, condition, what, limit_s)

    async def message(self, kind: type, what: str, limit_s: float = 120.0) -> list:
        """Wait until the app has posted a ``kind`` message; returns all of them so far."""
        return await self.until(lambda: self.posted(kind), what, limit_s)

    async def shown_state(self, state: str, what: str) -> Any:
        """Wait until the dashboard shows a session in ``state``; returns that `SessionStatus`."""
        return await self.until(lambda: _state_is(self.app, state), what)

    async def question(self, what: str) -> None:
        await self.until(lambda: isinstance(self.app.screen, ConfirmModal), what)


Scenario = Callable[[Driven], Awaitable[None]]


@pytest.fixture
def drive(home) -> Callable[..., Eagle3App]:
    """``drive(scenario, size)`` runs ``await scenario(driven)`` on a fresh app; returns the app once closed."""

    def drive_(scenario: Scenario, size: tuple[int, int] = (140, 45)) -> Eagle3App:
        async def main() -> Eagle3App:
            # Emulated GPUs: this machine has no NVML, and the panel must show the session's ranks.
            app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
            messages: list = []
            async with app.run_test(size=size, message_hook=messages.append) as pilot:
                await first_poll(pilot, app)
                await scenario(Driven(app, pilot, messages))
            return app

        return asyncio.run(main())

    return drive_


def _status(app):
    snapshot = app.dashboard.last_snapshot
    return snapshot.status if snapshot is not None else None


def _state_is(app, state):
    status = _status(app)
    return status is not None and status.state == state and status


def _shows(app, session_id: str, state: str):
    """The dashboard has drawn ``session_id`` as the selected session, in ``state``; returns its status.

    Checks the drawn snapshot's own session id: ``selected_session`` changes as soon as the app selects
    a session, while ``last_snapshot`` may still be the previous session's (drawn before the selection)."""
    dashboard = app.dashboard
    snapshot = dashboard.last_snapshot
    status = snapshot.status if snapshot is not None else None
    return (
        status is not None
        and snapshot.selected == status.session_id == session_id == dashboard.selected_session
        and status.state == state
        and status
    )


def _shown(app) -> str:
    """What the dashboard shows now, for a failure message."""
    status = _status(app)
    drawn = f"{status.session_id} ({status.state})" if status is not None else "no session"
    return f"drawn {drawn}, selected {app.dashboard.selected_session}"


def test_launch_reaches_ready_then_stop_asks_and_stops_every_process(make_emulator_profile, launched, drive):
    make_emulator_profile("emu", tp=2)

    async def scenario(ui: Driven) -> None:
        app, pilot = ui.app, ui.pilot
        assert app.dashboard.selected_profile == "emu"
        await pilot.press("l")
        launched_msg = await ui.message(SessionLaunched, "launched")
        session = launched.track(launched_msg[0].session_id)
        status = await ui.shown_state("ready", "the session is ready")
        launched.remember(session)
        assert status.session_id == session.session_id and status.port_listening and status.ready
        text = screen_text(app)
        assert "READY" in text and "/ready 200" in text
        assert "TP0" in text and "TP1" in text  # ranks, and the GPU panel maps their memory
        assert app.dashboard.query_one(LogView).total_lines > 0
        pids = {r.pid for r in status.ranks} | {status.pid}
        # stop: asks first; No keeps it running
        await pilot.press("s")
        await ui.question("the stop question")
        await pilot.press("n")
        await pilot.pause()
        assert session.is_alive()
        await pilot.press("s")
        await ui.question("the stop question")
        await pilot.press("y")
        stopped = await ui.message(SessionStopped, "stopped", 60)
        assert stopped[0].stopped, stopped[0].message
        await ui.shown_state("stopped", "the dashboard shows it stopped")
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids)

    drive(scenario)


def test_restart_shows_the_flag_diff_and_no_keeps_the_session(make_emulator_profile, launched, home, drive):
    profile = make_emulator_profile("emu", tp=2)
    session = launched.launch(profile)  # started outside the TUI: the TUI reattaches to it

    async def scenario(ui: Driven) -> None:
        app, pilot = ui.app, ui.pilot
        await ui.shown_state("ready", "the reattached session is ready")
        assert app.dashboard.selected_session == session.session_id
        launched.remember(session)
        # the user edits the profile on disk, then restarts
        save_profile(load_profile("emu", home).with_changes(server={"mem_fraction_static": 0.7}))
        await pilot.press("r")
        proposed = await ui.message(RestartProposed, "the diff")
        assert any("--mem-fraction-static" in line for line in proposed[0].diff), proposed[0].diff
        await ui.question("the restart question")
        assert "--mem-fraction-static" in screen_text(app)
        await pilot.press("n")
        await pilot.pause()
        assert not ui.posted(SessionLaunched)
        assert session.is_alive()
        await pilot.press("r")
        await ui.question("the restart question")
        await pilot.press("y")
        relaunched = await ui.message(SessionLaunched, "relaunch", 60)
        new = launched.track(relaunched[0].session_id)
        assert new.session_id != session.session_id
        assert not session.is_alive()
        # Ready *and drawn*: the snapshot on screen must be the new session's own.  Until the next poll
        # lands, the last snapshot is the old session's (it was ready), so checking `selected_session`
        # alone passed on the old session's status.  If a poll was running when the restart selected the
        # new session, the dashboard draws that poll's (old) session and selects it again: an app race,
        # likelier on a busy machine; this wait then fails and its message shows what is drawn.
        try:
            await ui.until(lambda: _shows(app, new.session_id, "ready"), "the new session is ready and shown")
        except AssertionError as exc:
            st = new.status(probe_http=False)
            raise AssertionError(
                f"{exc}; the dashboard: {_shown(app)}; the new session {new.session_id} is "
                f"{st.state} in {st.phase}\n{screen_text(app)}"
            ) from None
        assert (
            "--mem-fraction-static" in " ".join(new.profile.to_toml().split())
            or new.profile.server.mem_fraction_static == 0.7
        )

    drive(scenario)


def test_filter_by_text_and_rank_shows_only_matching_lines(make_emulator_profile, launched, drive):
    other = launched.launch(make_emulator_profile("other", tp=4))
    profile = make_emulator_profile("emu", tp=2)
    launched.launch(profile)  # the newest: selected first

    async def scenario(ui: Driven) -> None:
        app, pilot = ui.app, ui.pilot
        await ui.shown_state("ready", "ready")
        view = app.dashboard.query_one(LogView)
        await pilot.press("slash")
        field = app.screen.query_one("#filter-input", Input)
        assert field.has_focus
        await pilot.press(*"Load weight end")
        await pilot.press("enter")
        applied = await ui.message(FilterApplied, "filter applied")
        assert applied[-1].matches == 2  # one "Load weight end" per rank at TP2
        await pilot.pause()
        rows = [r for r in view.visible_text().splitlines() if r.strip()]
        assert len(rows) == 2 and all("Load weight end" in r for r in rows)
        assert "filter Load weight end" in app.dashboard.query_one("#log-pane").border_title
        # by rank: only TP1's lines
        from sessions.logs import LogFilter

        app.dashboard.set_log_filter(LogFilter.parse("", rank=1))
        await ui.until(lambda: len(ui.posted(FilterApplied)) >= 2, "rank filter")
        await pilot.pause()
        rows = [r for r in view.visible_text().splitlines() if r.strip()]
        assert rows and all("TP1]" in r for r in rows)
        # another session's log under the same filter: scanned again, its own lines only
        app.dashboard.set_log_filter(LogFilter.parse("Load weight end"))
        app.dashboard.select_session(other.session_id)
        await ui.until(
            lambda: view.path == str(other.log_path) and not view.filter_scanning and view.view_count == 4,
            "the other log filtered (TP4: four ranks)",
        )
        await pilot.pause()
        rows = [r for r in view.visible_text().splitlines() if r.strip()]
        assert len(rows) == 4 and all("Load weight end" in r for r in rows)
        # Esc in the log clears the filter
        view.focus()
        await pilot.press("escape")
        await pilot.pause()
        assert view.log_filter is None and view.view_count == view.total_lines

    drive(scenario)


def test_resizing_to_80x24_keeps_every_pane_on_screen(make_emulator_profile, launched, drive):
    profile = make_emulator_profile("emu", tp=8)
    launched.launch(profile)

    async def scenario(ui: Driven) -> None:
        app, pilot = ui.app, ui.pilot
        await ui.shown_state("ready", "ready")
        assert app.screen.has_class("-wide")
        await pilot.resize_terminal(80, 24)
        await ui.until(lambda: app.screen.has_class("-narrow"), "the narrow layout")
        await pilot.pause()
        screen_region = app.screen.region
        for pane in ("#profiles-pane", "#sessions-pane", "#status-pane", "#gpu-pane", "#log-pane"):
            region = app.screen.query_one(pane).region
            assert region.height > 0 and screen_region.contains_region(region), pane
        text = screen_text(app)
        assert "READY" in text and "? Help" in text and "q Quit" in text
        assert max(len(line) for line in text.splitlines()) <= 80
        for number in ("1", "2", "3", "4"):  # every pane can take the focus
            await pilot.press(number)
            await pilot.pause()
        assert isinstance(app.focused, LogView)

    drive(scenario, size=(200, 50))


def test_quitting_never_stops_a_server(make_emulator_profile, launched, drive):
    profile = make_emulator_profile("emu", tp=2)
    session = launched.launch(profile)

    async def scenario(ui: Driven) -> None:
        await ui.shown_state("ready", "ready")
        launched.remember(session)
        await ui.pilot.press("q")
        await ui.pilot.pause()

    app = drive(scenario, size=(120, 40))
    assert app.return_code == 0
    status = session.status(probe_http=True)
    assert status.alive and status.state == "ready"


def test_a_refused_launch_names_the_field(make_emulator_profile, launched, drive):
    make_emulator_profile("emu", tp=2, model_path="/does/not/exist")

    async def scenario(ui: Driven) -> None:
        await ui.pilot.press("l")
        failed = await ui.message(ActionFailed, "the refusal")
        assert "server.model_path" in failed[0].message
        assert not ui.posted(SessionLaunched)

    drive(scenario, size=(120, 40))


def test_capture_key_toggles_the_profile_and_shows_the_capture_panel(make_emulator_profile, home, drive):
    from app.screens.dashboard import CaptureToggled

    make_emulator_profile("emu", tp=2)

    async def scenario(ui: Driven) -> None:
        app, pilot = ui.app, ui.pilot
        assert not app.dashboard.query_one("#capture-slot").display
        await pilot.press("c")
        await ui.question("the capture question")
        await pilot.press("y")
        toggled = await ui.message(CaptureToggled, "toggled on")
        assert toggled[0].enabled and load_profile("emu", home).capture.enabled
        await ui.until(lambda: app.dashboard.query_one("#capture-slot").display, "the panel")
        await pilot.pause()
        assert "CAPTURE ON" in screen_text(app)
        await pilot.press("c")
        await ui.question("the capture question again")
        await pilot.press("y")
        await ui.until(lambda: any(not m.enabled for m in ui.posted(CaptureToggled)), "toggled off")
        assert not load_profile("emu", home).capture.enabled
        await ui.until(lambda: not app.dashboard.query_one("#capture-slot").display, "no panel")

    drive(scenario)


COMMENTED_PROFILE = """\
# The team's emulator profile: keep these notes.
[server]
launcher = "emulator"   # no GPU in CI
python = {python!r}
model_path = {model!r}
tp_size = 2
host = "127.0.0.1"
port = {port}
radix_cache = true      # set on purpose; capture must drop it

# watch settings
[watch]
stall_after_s = 300

[emulator]
time_scale = 0.003
fault = "none"
"""


def _commented_profile(home, emulator_model_dir) -> Any:
    import sys

    from tests.conftest import get_free_port

    path = home.profiles_dir / "emu.toml"
    path.write_text(COMMENTED_PROFILE.format(python=sys.executable, model=str(emulator_model_dir),
                                             port=get_free_port()))
    return path


def _modal_text(app: Eagle3App) -> str:
    modal = app.screen
    assert isinstance(modal, ConfirmModal)
    return f"{modal.question}\n{modal.detail}"


@pytest.mark.parametrize("answer", ["n", "escape"])
def test_capture_question_names_the_flags_and_no_changes_nothing(home, emulator_model_dir, drive, answer):
    from app.screens.dashboard import CaptureToggled

    path = _commented_profile(home, emulator_model_dir)
    before = path.read_bytes()

    async def scenario(ui: Driven) -> None:
        app, pilot = ui.app, ui.pilot
        await pilot.press("c")
        await ui.question("the capture question")
        text = _modal_text(app)
        assert "Turn capture on for emu?" in text
        for flag in ("+ --enable-return-aux-hidden-states", "+ --speculative-algorithm EAGLE3",
                     "+ --disable-radix-cache", "+ env EAGLE3_CAPTURE=", "+ env PYTHONPATH="):
            assert flag in text, flag
        assert "radix cache: on -> off" in text
        assert "radix_cache = true is removed" in text
        await ui.until(lambda: "--enable-return-aux-hidden-states" in screen_text(app), "the flags on screen")
        await pilot.press(answer)
        await ui.until(lambda: not isinstance(app.screen, ConfirmModal), "the question closed")
        await pilot.pause()
        assert not ui.posted(CaptureToggled)

    drive(scenario, size=(80, 24))
    assert path.read_bytes() == before


def test_capture_question_yes_toggles_and_keeps_the_comments(home, emulator_model_dir, drive):
    from app.screens.dashboard import CaptureToggled

    path = _commented_profile(home, emulator_model_dir)

    async def scenario(ui: Driven) -> None:
        app, pilot = ui.app, ui.pilot
        await pilot.press("c")
        await ui.question("capture on?")
        await pilot.press("y")
        await ui.message(CaptureToggled, "toggled on")
        text = path.read_text()
        assert load_profile("emu", home).capture.enabled
        for kept in ("# The team's emulator profile: keep these notes.", "# no GPU in CI", "# watch settings"):
            assert kept in text, kept
        assert "radix_cache" not in text  # the explicit true went with the toggle, as the question said
        await pilot.press("c")
        await ui.question("capture off?")
        text_off = _modal_text(app)
        assert "Turn capture off for emu?" in text_off
        assert "- --enable-return-aux-hidden-states" in text_off and "- env EAGLE3_CAPTURE=" in text_off
        await pilot.press("y")
        await ui.until(lambda: any(not m.enabled for m in ui.posted(CaptureToggled)), "toggled off")
        assert not load_profile("emu", home).capture.enabled
        assert "# The team's emulator profile: keep these notes." in path.read_text()

    drive(scenario)


def test_command_palette_launches_a_profile_by_name(make_emulator_profile, launched, drive):
    make_emulator_profile("emu", tp=2)
    make_emulator_profile("other", tp=2)

    async def scenario(ui: Driven) -> None:
        app, pilot = ui.app, ui.pilot
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Launch profile other")
        await ui.until(lambda: "Launch profile other" in screen_text(app), "the palette hit")
        await pilot.press("enter")
        launched_msg = await ui.message(SessionLaunched, "launched")
        session = launched.track(launched_msg[0].session_id)
        assert session.profile.name == "other"

    drive(scenario, size=(120, 40))


def test_editing_a_running_profile_says_its_port_is_its_own_session(make_emulator_profile, launched, drive):
    from app.screens.profile_editor import ProfileEditorScreen

    session = launched.launch(make_emulator_profile("emu", tp=2))

    async def scenario(ui: Driven) -> None:
        app = ui.app
        await ui.shown_state("ready", "ready")
        launched.remember(session)
        await ui.pilot.press("e")
        editor = await ui.until(
            lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen.last_check and app.screen,
            "the editor checked the profile",
        )
        port_problems = editor.last_check.by_widget.get("port", [])
        assert port_problems and all(severity == "warning" for severity, _ in port_problems)
        assert session.session_id in port_problems[0][1]

    drive(scenario, size=(120, 45))
