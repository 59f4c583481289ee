"""Layout and selection truths a user checks at a glance.

* At 200x50 the profile and session lists get the width their names need: every demo profile line and a
  long session id are shown whole (at 80x24 and 60x20 the lists share the width and may cut them).
* After the TUI restarts with a running session (reattach), the profile cursor is on that session's
  profile, and `l`, `e` and `c` act on it: a real emulator session launched by the engine, then a fresh
  app opened on the home.
"""

from __future__ import annotations

import pytest

from app.screens.dashboard import ActionFailed
from app.screens.profile_editor import ProfileEditorScreen
from app.tui import Eagle3App
from sessions.demo import ensure_demo_home
from sessions.gpus import EmulatedSource
from sessions.home import resolve_home
from sessions.profiles import list_profiles
from tests._tui_support import first_poll, run, screen_text, wait_until
from widgets.confirm_modal import ConfirmModal
from widgets.lists import ProfileList, SessionList

LONG_NAME = "kimi-k25-tp8-capture-layers-2-30-58-fp8kv"  # 41 characters, as teams name their runs


def _line_texts(widget: ProfileList | SessionList) -> list[str]:
    return [option.prompt.plain for option in widget.options]


@pytest.mark.parametrize("size", [(200, 50), (80, 24), (60, 20)])
def test_demo_profile_lines_are_shown_whole_when_there_is_room(home, seed_demo_models, size):
    seed_demo_models()  # the tiny model written once per worker (conftest), not once per test
    demo_home = ensure_demo_home(resolve_home(demo=True))

    async def scenario() -> None:
        app = Eagle3App(demo_home, demo=True, refresh_s=0.2)
        async with app.run_test(size=size) as pilot:
            await first_poll(pilot, app)
            profiles = app.dashboard.query_one(ProfileList)
            lines = _line_texts(profiles)
            assert len(lines) == len(list_profiles(demo_home)) >= 4
            longest = max(list_profiles(demo_home), key=len)
            text = screen_text(app)
            if size == (200, 50):
                for line in lines:  # name, TP, launcher, port, capture: all of it
                    assert line.strip() in text, line
                assert profiles.content_region.width >= profiles.needed_width
            else:  # the halves of a narrow screen: cut with an ellipsis, never wrapped, every pane there
                assert longest[:10] in text
                for title in ("1 Profiles", "2 Sessions", "3 GPUs", "4 Log"):
                    assert title in text, title

    run(scenario)


def test_a_long_session_id_is_shown_whole_at_200x50_and_fits_at_80x24(make_emulator_profile, launched, home):
    profile = make_emulator_profile(LONG_NAME, tp=1)
    session = launched.launch(profile)
    assert len(session.session_id) > 60

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(200, 50)) as pilot:
            await first_poll(pilot, app)
            await wait_until(pilot, lambda: session.session_id in screen_text(app), "the whole session id")
            text = screen_text(app)
            assert f" {session.session_id} :{profile.server.port}" in text  # the list's line, not the card's
            assert f"{LONG_NAME}  TP1 emu :{profile.server.port}" in text
            lists = app.dashboard.query_one("#lists")
            assert 44 < lists.size.width <= 0.45 * 200
            await pilot.resize_terminal(80, 24)
            sessions = app.dashboard.query_one(SessionList)
            await wait_until(pilot, lambda: not sessions.full_ids and session.session_id not in
                             _line_texts(sessions)[0], "the narrow session line (profile and id suffix)", 20)
            assert session.session_id.rsplit("-", 1)[-1] in _line_texts(sessions)[0]
            assert app.dashboard.query_one("#lists").size.width == 80  # the halves again, no fixed width
            await pilot.resize_terminal(60, 20)
            await pilot.pause()
            assert "2 Sessions" in screen_text(app)
            await pilot.resize_terminal(200, 50)
            await wait_until(pilot, lambda: session.session_id in screen_text(app), "the whole id again")

    run(scenario)


def test_after_a_restart_the_profile_cursor_is_on_the_reattached_sessions_profile(
    make_emulator_profile, launched, home
):
    make_emulator_profile("aaa-first", tp=1)  # listed first: where the cursor would sit by default
    running = make_emulator_profile("zzz-running", tp=1)
    session = launched.launch(running)  # by the engine, as a TUI before this one (or the CLI) did
    messages: list = []

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
            await first_poll(pilot, app)
            dash = app.dashboard
            await wait_until(pilot, lambda: dash.selected_session == session.session_id, "the reattach")
            await pilot.pause()
            profiles = dash.query_one(ProfileList)
            assert profiles.options[0].id == "aaa-first"
            assert profiles.highlighted_id == "zzz-running"
            assert dash.selected_profile == "zzz-running"
            assert dash.query_one(SessionList).highlighted_id == session.session_id

            await pilot.press("l")  # one server per profile: refused, naming the running session
            failed = await wait_until(pilot, lambda: [m for m in messages if isinstance(m, ActionFailed)],
                                      "the launch refusal")
            assert "zzz-running" in failed[0].what and session.session_id in failed[0].message

            await pilot.press("e")
            editor = await wait_until(pilot, lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen,
                                      "the editor")
            assert editor.profile_name == "zzz-running"
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is dash, "back on the dashboard")

            await pilot.press("c")
            modal = await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal) and app.screen,
                                     "the capture question")
            assert modal.question == "Turn capture on for zzz-running?"
            assert session.session_id in modal.detail  # it keeps running until restarted
            await pilot.press("n")
            await wait_until(pilot, lambda: app.screen is dash, "the question closed")

    run(scenario)
