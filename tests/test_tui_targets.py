"""Keys act on what is in view (issue 21 #4): every dashboard action's target is the object under the cursor
of the pane that has focus, every y/N question names it (session id, profile, port), a new session or job
gets the cursor, and reattaching restores the selection.  Keys go in bursts, as type-ahead over SSH sends
them (`s y` typed as one packet may stop only the server named on screen); the servers are real emulator
sessions."""

from __future__ import annotations

from pathlib import Path

import pytest
from _extract_support import chat_rows, make_tokenizer_dir, stop_job, wait_for, write_dataset, write_spec

from app.screens.bench import BenchScreen
from app.screens.diagnose import DiagnoseScreen
from app.screens.jobs import JobsScreen, SpecPathModal
from app.screens.profile_editor import ProfileEditorScreen
from app.selection import SELECTION_FILE
from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from tests._tui_support import burst, first_poll, run, wait_until
from widgets.confirm_modal import ConfirmModal
from widgets.lists import ProfileList, SessionList


def _app(home) -> Eagle3App:
    return Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)


@pytest.fixture
def two_servers(home, make_emulator_profile, launched):
    """alpha and beta run (beta started last, so the dashboard shows it first); gamma has no session."""
    sessions = {}
    for gpu, name in enumerate(("alpha", "beta")):  # each on its own emulated GPU: no GPUs-in-use question
        session = launched.launch(make_emulator_profile(name, tp=1, extra_args=["--base-gpu-id", str(gpu)]))
        wait_for(lambda s=session: s.status(probe_http=False).state == "ready", f"{name} ready", 90)
        launched.remember(session)
        sessions[name] = session
    make_emulator_profile("gamma", tp=1, extra_args=["--base-gpu-id", "2"])
    return sessions


class _Recorder:
    """What the dashboard opens: questions (by text) and the screens it pushes (diagnose and bench are
    recorded, not opened: the point is their target, and they would start py-spy or a bench run)."""

    def __init__(self, app: Eagle3App) -> None:
        self.questions: list[str] = []
        self.opened: list[object] = []
        self.notes: list[str] = []
        push, notify = app.push_screen, app.notify

        def push_screen(screen, *args, **kwargs):
            if isinstance(screen, ConfirmModal):
                self.questions.append(screen.question)
            if isinstance(screen, (DiagnoseScreen, BenchScreen)):
                self.opened.append(screen)
                return None
            if isinstance(screen, ProfileEditorScreen):
                self.opened.append(screen)
            return push(screen, *args, **kwargs)

        def record_note(message, *args, **kwargs):
            self.notes.append(str(message))
            return notify(message, *args, **kwargs)

        app.push_screen = push_screen  # type: ignore[method-assign]
        app.notify = record_note  # type: ignore[method-assign]


def _alive(session) -> bool:
    return session.status(probe_http=False).alive


async def _profiles_cursor(pilot, app, name: str) -> None:
    await burst(pilot, "1", "home")
    profiles = app.dashboard.query_one(ProfileList)
    for _ in range(len(profiles.options)):
        if profiles.highlighted_id == name:
            return
        await burst(pilot, "down")
    raise AssertionError(f"profile {name} not in the list")


def test_s_y_on_a_profile_without_a_server_stops_nothing_and_says_so(home, two_servers):
    """The card shows beta's session; the profile cursor is on gamma, which runs nothing.  `s y` used to
    stop beta (the session pane's cursor), a server that was not under the cursor in view."""
    async def scenario() -> None:
        app = _app(home)
        seen = _Recorder(app)
        async with app.run_test(size=(200, 50)) as pilot:
            await first_poll(pilot, app)
            await burst(pilot, "1", "end")
            assert app.dashboard.query_one(ProfileList).highlighted_id == "gamma"
            await burst(pilot, "s", "y", "r", "y", "b")
            assert seen.questions == [], seen.questions
            assert "Profile gamma has no running session to stop (l launches it)." in seen.notes
            assert "Profile gamma has no running session to restart (l launches it)." in seen.notes
            assert [s.session_id for s in seen.opened if isinstance(s, BenchScreen)] == [None]
            assert any("profile gamma has no running session" in n for n in seen.notes)

    run(scenario)
    assert _alive(two_servers["alpha"]) and _alive(two_servers["beta"])


@pytest.mark.parametrize("pane", ["profiles", "sessions"])
def test_s_y_stops_exactly_the_server_under_the_cursor_of_the_focused_pane(home, two_servers, pane):
    alpha, beta = two_servers["alpha"], two_servers["beta"]

    async def scenario() -> None:
        app = _app(home)
        seen = _Recorder(app)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            assert app.dashboard.selected_session == beta.session_id  # the newest live one is shown
            if pane == "profiles":
                await burst(pilot, "2", "home", "1", "home")  # alpha is the first profile
            else:
                await burst(pilot, "2", "home", "down")  # newest first: beta, then alpha
            await burst(pilot, "s", "y")
            assert seen.questions == [f"Stop {alpha.session_id} (profile alpha, port {alpha.profile.server.port})?"]
            await wait_until(pilot, lambda: not _alive(alpha), "alpha stopped")
            assert _alive(beta)

    run(scenario)


@pytest.mark.parametrize("pane", ["profiles", "sessions", "log"])
def test_every_action_key_acts_on_the_focused_panes_cursor_and_names_it(home, two_servers, pane):
    """r, d, b, e and c, typed in one burst each, act on alpha's session or profile: the one under the cursor
    of the focused pane (log pane: the session its card and log show)."""
    alpha = two_servers["alpha"]
    named = f"{alpha.session_id} (profile alpha, port {alpha.profile.server.port})"

    async def scenario() -> None:
        app = _app(home)
        seen = _Recorder(app)
        async with app.run_test(size=(200, 50)) as pilot:
            await first_poll(pilot, app)
            if pane == "profiles":
                await _profiles_cursor(pilot, app, "alpha")
            else:
                await burst(pilot, "2", "home", "down")
                if pane == "log":
                    await wait_until(pilot, lambda: app.dashboard.selected_status() is not None
                                     and app.dashboard.selected_status().session_id == alpha.session_id,
                                     "alpha's card shown")
                    await burst(pilot, "4")
            await burst(pilot, "r")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the restart question")
            await burst(pilot, "n", "d", "b", "c")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the capture question")
            await burst(pilot, "n", "e")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfileEditorScreen), "the editor")
            assert seen.questions == [f"Restart {named}?", "Turn capture on for alpha?"]
            assert [s.session_id for s in seen.opened if isinstance(s, DiagnoseScreen)] == [alpha.session_id]
            assert [s.session_id for s in seen.opened if isinstance(s, BenchScreen)] == [alpha.session_id]
            assert [s.profile_name for s in seen.opened if isinstance(s, ProfileEditorScreen)] == ["alpha"]

    run(scenario)
    assert _alive(two_servers["alpha"]) and _alive(two_servers["beta"])


def test_a_new_session_gets_the_cursor_and_the_next_s_y_stops_it(home, two_servers, launched):
    async def scenario() -> None:
        app = _app(home)
        seen = _Recorder(app)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await _profiles_cursor(pilot, app, "gamma")
            await burst(pilot, "l")
            sessions = app.dashboard.query_one(SessionList)
            new_id = await wait_until(pilot, lambda: next((s.session_id for s in app.dashboard.last_snapshot.sessions
                                                           if s.profile == "gamma"), None), "gamma's session")
            launched.track(new_id)
            await wait_until(pilot, lambda: sessions.highlighted_id == new_id
                             and app.dashboard.selected_session == new_id, "the new session under the cursor")
            await burst(pilot, "2", "s", "y")
            assert seen.questions[-1].startswith(f"Stop {new_id} (profile gamma")
            await wait_until(pilot, lambda: any(n.startswith(f"Stopping {new_id}") for n in seen.notes),
                             "gamma's session stopping")

    run(scenario)
    assert _alive(two_servers["alpha"]) and _alive(two_servers["beta"])


@pytest.mark.parametrize("pane", ["profiles", "sessions"])
def test_reattaching_restores_the_selection_and_the_focused_pane(home, two_servers, pane):
    alpha = two_servers["alpha"]

    async def leave() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            if pane == "profiles":
                await _profiles_cursor(pilot, app, "gamma")  # no session: the card stays on beta's
            else:
                await burst(pilot, "2", "home", "down")
            await wait_until(pilot, lambda: (home.state_root / SELECTION_FILE).is_file()
                             and (pane != "sessions" or alpha.session_id in
                                  (home.state_root / SELECTION_FILE).read_text()), "the selection kept")
            await first_poll(pilot, app, app.dashboard.poll_count + 2)

    async def reattach() -> None:
        app = _app(home)
        seen = _Recorder(app)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app, 2)
            dashboard = app.dashboard
            profiles, sessions = dashboard.query_one(ProfileList), dashboard.query_one(SessionList)
            if pane == "profiles":
                assert dashboard.focused is profiles and profiles.highlighted_id == "gamma"
                await burst(pilot, "s")
                assert "Profile gamma has no running session to stop (l launches it)." in seen.notes
            else:
                assert dashboard.focused is sessions and sessions.highlighted_id == alpha.session_id
                assert dashboard.selected_session == alpha.session_id and profiles.highlighted_id == "alpha"
                await burst(pilot, "s")
                port = alpha.profile.server.port
                assert seen.questions == [f"Stop {alpha.session_id} (profile alpha, port {port})?"]

    run(leave)
    assert (home.state_root / SELECTION_FILE).stat().st_mode & 0o777 == 0o600
    run(reattach)


def test_a_job_started_on_the_jobs_screen_gets_the_cursor(home, tmp_path: Path) -> None:
    """An older job is listed (and highlighted); n starts another one, which must get the cursor so that
    r, p and c act on it (r used to answer about the other job)."""
    from sessions.extraction.job import run_job

    capture = tmp_path / "capture"
    capture.mkdir(mode=0o700)
    model = make_tokenizer_dir(tmp_path / "model", "kimi")
    specs = [write_spec(tmp_path / f"job{i}.toml", name=f"job{i}", server_url="http://127.0.0.1:9",
                        dataset=write_dataset(tmp_path / f"data{i}.jsonl", chat_rows(3)),
                        output_dir=tmp_path / f"out{i}", capture_dir=capture, model_path=model)
             for i in (1, 2)]
    jobs = [run_job(specs[0], home)]

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(120, 30)) as pilot:
            await first_poll(pilot, app)
            await burst(pilot, "x")
            screen = await wait_until(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen.jobs
                                      and app.screen, "the jobs screen with the first job")
            assert screen.selected().job_id == jobs[0]
            await burst(pilot, "n")
            await wait_until(pilot, lambda: isinstance(app.screen, SpecPathModal), "the new-job form")
            await burst(pilot, "end", *["backspace"] * 300, *str(specs[1]), "enter")
            await wait_until(pilot, lambda: len(screen.jobs) == 2, "the second job listed", 120)
            jobs.append(next(p.job_id for p in screen.jobs if p.job_id != jobs[0]))
            await wait_until(pilot, lambda: screen.selected() is not None
                             and screen.selected().job_id == jobs[1], "the new job under the cursor")

    try:
        run(scenario)
    finally:
        for job_id in jobs:
            stop_job(job_id, home)


def test_a_profile_saved_as_a_new_name_gets_the_cursor(home, make_emulator_profile):
    make_emulator_profile("emu", tp=1)
    make_emulator_profile("zzz", tp=1)

    async def scenario() -> None:
        app = _app(home)
        seen = _Recorder(app)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await _profiles_cursor(pilot, app, "emu")
            await burst(pilot, "e")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen.last_check,
                             "the editor")
            await burst(pilot, "f2", "enter", "escape")  # save as emu-copy (the name offered), close
            profiles = app.dashboard.query_one(ProfileList)
            await wait_until(pilot, lambda: app.screen is app.dashboard and profiles.highlighted_id == "emu-copy",
                             "the new profile under the cursor")
            await burst(pilot, "e")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfileEditorScreen)
                             and app.screen.profile_name == "emu-copy", "e edits the new profile")
            assert len(seen.opened) == 2  # the editor on emu (renamed by its save as), then on emu-copy

    run(scenario)
