"""The real app driven with Pilot against emulator sessions: launch -> ready -> stop, restart with the flag
diff, filter, resize to 80x24, reattach on start, and quitting never stops a server.

Waits poll the app's own state (`wait_until`); nothing sleeps a fixed time to decide a result.
"""

from __future__ import annotations

import psutil
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
from tests._tui_support import first_poll, run, screen_text, wait_until
from widgets.confirm_modal import ConfirmModal
from widgets.log_view import LogView


def _app(home) -> Eagle3App:
    # Emulated GPUs: this machine has no NVML, and the panel must show the session's ranks.
    return Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)


def _messages_of(messages, kind):
    return [m for m in messages if isinstance(m, kind)]


def _status(app):
    snapshot = app.dashboard.last_snapshot
    return snapshot.status if snapshot is not None else None


def _state_is(app, state):
    status = _status(app)
    return status is not None and status.state == state and status


def test_launch_reaches_ready_then_stop_asks_and_stops_every_process(home, make_emulator_profile, launched):
    make_emulator_profile("emu", tp=2)
    messages: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(140, 45), message_hook=messages.append) as pilot:
            await first_poll(pilot, app)
            assert app.dashboard.selected_profile == "emu"
            await pilot.press("l")
            launched_msg = await wait_until(
                pilot, lambda: _messages_of(messages, SessionLaunched), "launched"
            )
            session = launched.track(launched_msg[0].session_id)
            status = await wait_until(pilot, lambda: _state_is(app, "ready"), "the session is ready")
            launched.remember(session)
            assert status.session_id == session.session_id and status.port_listening and status.ready
            text = screen_text(app)
            assert "READY" in text and "/ready 200" in text
            assert "TP0" in text and "TP1" in text  # ranks, and the GPU panel maps their memory
            assert app.dashboard.query_one(LogView).total_lines > 0
            pids = {r.pid for r in status.ranks} | {status.pid}
            # stop: asks first; No keeps it running
            await pilot.press("s")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the stop question")
            await pilot.press("n")
            await pilot.pause()
            assert session.is_alive()
            await pilot.press("s")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the stop question")
            await pilot.press("y")
            stopped = await wait_until(pilot, lambda: _messages_of(messages, SessionStopped), "stopped", 60)
            assert stopped[0].stopped, stopped[0].message
            await wait_until(pilot, lambda: _state_is(app, "stopped"), "the dashboard shows it stopped")
            assert not any(
                psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids
            )

    run(scenario)


def test_restart_shows_the_flag_diff_and_no_keeps_the_session(home, make_emulator_profile, launched):
    profile = make_emulator_profile("emu", tp=2)
    session = launched.launch(profile)  # started outside the TUI: the TUI reattaches to it
    messages: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(140, 45), message_hook=messages.append) as pilot:
            await first_poll(pilot, app)
            await wait_until(pilot, lambda: _state_is(app, "ready"), "the reattached session is ready")
            assert app.dashboard.selected_session == session.session_id
            launched.remember(session)
            # the user edits the profile on disk, then restarts
            save_profile(load_profile("emu", home).with_changes(server={"mem_fraction_static": 0.7}))
            await pilot.press("r")
            proposed = await wait_until(pilot, lambda: _messages_of(messages, RestartProposed), "the diff")
            assert any("--mem-fraction-static" in line for line in proposed[0].diff), proposed[0].diff
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the restart question")
            assert "--mem-fraction-static" in screen_text(app)
            await pilot.press("n")
            await pilot.pause()
            assert not _messages_of(messages, SessionLaunched)
            assert session.is_alive()
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the restart question")
            await pilot.press("y")
            relaunched = await wait_until(
                pilot, lambda: _messages_of(messages, SessionLaunched), "relaunch", 60
            )
            new = launched.track(relaunched[0].session_id)
            assert new.session_id != session.session_id
            assert not session.is_alive()
            try:
                await wait_until(
                    pilot,
                    lambda: _state_is(app, "ready") and app.dashboard.selected_session == new.session_id,
                    "the new session is ready and shown",
                )
            except AssertionError as exc:
                st = new.status(probe_http=False)
                raise AssertionError(
                    f"{exc}; selected={app.dashboard.selected_session} new={new.session_id} "
                    f"new state={st.state} phase={st.phase}\n{screen_text(app)}"
                ) from None
            assert (
                "--mem-fraction-static" in " ".join(new.profile.to_toml().split())
                or new.profile.server.mem_fraction_static == 0.7
            )

    run(scenario)


def test_filter_by_text_and_rank_shows_only_matching_lines(home, make_emulator_profile, launched):
    other = launched.launch(make_emulator_profile("other", tp=4))
    profile = make_emulator_profile("emu", tp=2)
    launched.launch(profile)  # the newest: selected first
    messages: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(140, 45), message_hook=messages.append) as pilot:
            await first_poll(pilot, app)
            await wait_until(pilot, lambda: _state_is(app, "ready"), "ready")
            view = app.dashboard.query_one(LogView)
            await pilot.press("slash")
            field = app.screen.query_one("#filter-input", Input)
            assert field.has_focus
            await pilot.press(*"Load weight end")
            await pilot.press("enter")
            applied = await wait_until(pilot, lambda: _messages_of(messages, FilterApplied), "filter applied")
            assert applied[-1].matches == 2  # one "Load weight end" per rank at TP2
            await pilot.pause()
            rows = [r for r in view.visible_text().splitlines() if r.strip()]
            assert len(rows) == 2 and all("Load weight end" in r for r in rows)
            assert "filter Load weight end" in app.dashboard.query_one("#log-pane").border_title
            # by rank: only TP1's lines
            from widgets.log_view import LogFilter

            app.dashboard.set_log_filter(LogFilter.parse("", rank=1))
            await wait_until(pilot, lambda: len(_messages_of(messages, FilterApplied)) >= 2, "rank filter")
            await pilot.pause()
            rows = [r for r in view.visible_text().splitlines() if r.strip()]
            assert rows and all("TP1]" in r for r in rows)
            # another session's log under the same filter: scanned again, its own lines only
            app.dashboard.set_log_filter(LogFilter.parse("Load weight end"))
            app.dashboard._select_session(other.session_id)
            await wait_until(
                pilot,
                lambda: (
                    view.path == str(other.log_path) and not view.filter_scanning and view.view_count == 4
                ),
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

    run(scenario)


def test_resizing_to_80x24_keeps_every_pane_on_screen(home, make_emulator_profile, launched):
    profile = make_emulator_profile("emu", tp=8)
    launched.launch(profile)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(200, 50)) as pilot:
            await first_poll(pilot, app)
            await wait_until(pilot, lambda: _state_is(app, "ready"), "ready")
            assert app.screen.has_class("-wide")
            await pilot.resize_terminal(80, 24)
            await wait_until(pilot, lambda: app.screen.has_class("-narrow"), "the narrow layout")
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

    run(scenario)


def test_quitting_never_stops_a_server(home, make_emulator_profile, launched):
    profile = make_emulator_profile("emu", tp=2)
    session = launched.launch(profile)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(120, 40)) as pilot:
            await first_poll(pilot, app)
            await wait_until(pilot, lambda: _state_is(app, "ready"), "ready")
            launched.remember(session)
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code == 0

    run(scenario)
    status = session.status(probe_http=True)
    assert status.alive and status.state == "ready"


def test_a_refused_launch_names_the_field(home, make_emulator_profile, launched):
    make_emulator_profile("emu", tp=2, model_path="/does/not/exist")
    messages: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
            await first_poll(pilot, app)
            await pilot.press("l")
            failed = await wait_until(pilot, lambda: _messages_of(messages, ActionFailed), "the refusal")
            assert "server.model_path" in failed[0].message
            assert not _messages_of(messages, SessionLaunched)

    run(scenario)


def test_capture_key_toggles_the_profile_and_shows_the_capture_panel(home, make_emulator_profile):
    from app.screens.dashboard import CaptureToggled

    make_emulator_profile("emu", tp=2)
    messages: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(140, 45), message_hook=messages.append) as pilot:
            await first_poll(pilot, app)
            assert not app.dashboard.query_one("#capture-slot").display
            await pilot.press("c")
            toggled = await wait_until(pilot, lambda: _messages_of(messages, CaptureToggled), "toggled on")
            assert toggled[0].enabled and load_profile("emu", home).capture.enabled
            await wait_until(pilot, lambda: app.dashboard.query_one("#capture-slot").display, "the panel")
            await pilot.pause()
            assert "CAPTURE ON" in screen_text(app)
            await pilot.press("c")
            await wait_until(
                pilot,
                lambda: any(not m.enabled for m in _messages_of(messages, CaptureToggled)),
                "toggled off",
            )
            assert not load_profile("emu", home).capture.enabled
            await wait_until(pilot, lambda: not app.dashboard.query_one("#capture-slot").display, "no panel")

    run(scenario)


def test_command_palette_launches_a_profile_by_name(home, make_emulator_profile, launched):
    make_emulator_profile("emu", tp=2)
    make_emulator_profile("other", tp=2)
    messages: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
            await first_poll(pilot, app)
            await pilot.press("ctrl+p")
            await pilot.pause()
            await pilot.press(*"Launch profile other")
            await wait_until(pilot, lambda: "Launch profile other" in screen_text(app), "the palette hit")
            await pilot.press("enter")
            launched_msg = await wait_until(
                pilot, lambda: _messages_of(messages, SessionLaunched), "launched"
            )
            session = launched.track(launched_msg[0].session_id)
            assert session.profile.name == "other"

    run(scenario)


def test_editing_a_running_profile_says_its_port_is_its_own_session(home, make_emulator_profile, launched):
    from app.screens.profile_editor import ProfileEditorScreen

    session = launched.launch(make_emulator_profile("emu", tp=2))

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(120, 45)) as pilot:
            await first_poll(pilot, app)
            await wait_until(pilot, lambda: _state_is(app, "ready"), "ready")
            launched.remember(session)
            await pilot.press("e")
            editor = await wait_until(
                pilot,
                lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen.last_check and app.screen,
                "the editor checked the profile",
            )
            port_problems = editor.last_check.by_widget.get("port", [])
            assert port_problems and all(severity == "warning" for severity, _ in port_problems)
            assert session.session_id in port_problems[0][1]

    run(scenario)
