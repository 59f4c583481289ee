"""Never drops a key: bursts (every key queued at once, as a paste or SSH type-ahead delivers them) into
every input (editor fields, the log filter, the job form, the command palette) land in order; the paging
guard of every list; code-driven highlights do not echo as choices; saves keep the TOML file's comments."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from textual import events
from textual.app import App, ComposeResult
from textual.command import CommandInput, CommandList
from textual.screen import Screen
from textual.widgets import Input, OptionList, Static

from app.screens.jobs import JobsScreen
from app.screens.profile_editor import ProfileEditorScreen, ProfileSaved
from app.tui import Eagle3App, exit_message, write_crash_file
from app.typeahead import TypeAheadApp
from sessions.gpus import EmulatedSource
from sessions.profiles import load_profile, save_profile
from tests._tui_support import burst, first_poll, key_event, run, wait_until
from widgets.inputs import InOrderInput
from widgets.lists import PageSafeOptionList, ProfileList


def _app(home):
    return Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)


class _OneInput(App):
    def compose(self) -> ComposeResult:
        yield InOrderInput("/old/model/path", id="f")


def test_a_burst_of_editing_keys_lands_in_order_in_an_in_order_input():
    async def scenario() -> None:
        app = _OneInput()
        async with app.run_test() as pilot:
            await burst(pilot, "end", *["backspace"] * 80, *"/new/path", "home", "delete", "x", "end", "left",
                        "backspace", "Z")
            assert app.query_one("#f", Input).value == "xnew/paZh"

    run(scenario)


def test_editor_saves_exactly_what_a_burst_typed(home, make_emulator_profile, make_model_dir):
    make_emulator_profile("emu", tp=2, mem_fraction_static=0.85)
    new_model = make_model_dir("pasted-model")
    saved: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24), message_hook=saved.append) as pilot:
            await first_poll(pilot, app)
            await pilot.press("e")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen.last_check,
                             "the editor")
            editor = app.screen
            old_path = editor.query_one("#model_path", Input).value
            # Enough backspaces to empty the field whatever the temp path's length (xdist adds popen-gwN/).
            await burst(pilot, "end", *["backspace"] * (len(old_path) + 8), *str(new_model))
            assert editor.query_one("#model_path", Input).value == str(new_model)
            editor.query_one("#mem_fraction_static", Input).focus()
            await burst(pilot, "end", *["backspace"] * 4, *"0.77", "ctrl+s")
            await wait_until(pilot, lambda: any(isinstance(m, ProfileSaved) for m in saved), "the save")

    run(scenario)
    profile = load_profile("emu", home)
    assert profile.server.model_path == str(new_model)
    assert profile.server.mem_fraction_static == 0.77


def test_editor_refuses_to_save_a_profile_that_does_not_validate_and_says_why(home, make_emulator_profile):
    original = make_emulator_profile("emu", tp=2)
    before = original.path.read_text()
    notes: list[str] = []

    async def scenario() -> None:
        app = _app(home)
        app.notify = lambda message, **kw: notes.append(str(message))  # type: ignore[method-assign]
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await pilot.press("e")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen.last_check,
                             "the editor")
            await burst(pilot, "end", *["backspace"] * 200, "ctrl+s")
            await wait_until(pilot, lambda: any("does not validate" in n for n in notes), "the refusal")

    run(scenario)
    assert original.path.read_text() == before
    assert any("server.model_path" in n for n in notes)


def test_filter_job_form_and_palette_inputs_keep_every_key_of_a_burst(home, make_emulator_profile):
    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await pilot.press("slash")  # opens the filter bar and focuses its input
            await burst(pilot, *"/Load", *["backspace"] * 4, *"Capture", "home", "delete", "left")
            assert app.screen.query_one("#filter-input", Input).value == "Capture"
            await pilot.press("escape", "x", "n")
            await burst(pilot, "end", *["backspace"] * 60, *"/tmp/jobs/a.toml", "left",
                        "left", "backspace", "X")
            assert isinstance(app.screen_stack[-2], JobsScreen)
            assert app.screen.query_one("#spec-path", Input).value == "/tmp/jobs/a.tXml"
            await pilot.press("escape", "escape", "ctrl+p")
            await burst(pilot, *"launcx", "backspace", "h", "home", "delete")
            assert app.screen.query_one(CommandInput).value == "aunch"

    run(scenario)


class _Lists(App):
    CSS = "#squeezed { height: 0; }"

    def compose(self) -> ComposeResult:
        yield PageSafeOptionList(*[f"option {i}" for i in range(40)], id="squeezed")
        yield ProfileList(id="profiles")


def test_paging_a_list_with_no_height_keeps_the_highlight_and_raises_nothing():
    async def scenario() -> None:
        app = _Lists()
        async with app.run_test() as pilot:
            squeezed = app.query_one("#squeezed", OptionList)
            squeezed.highlighted = 3
            await pilot.pause()
            assert squeezed.scrollable_content_region.height == 0
            squeezed.action_page_down()
            squeezed.action_page_up()
            assert squeezed.highlighted == 3
            squeezed.set_options(["a", "b"])  # refilled, not laid out again yet
            squeezed.highlighted = 1
            squeezed.action_page_up()
            assert squeezed.highlighted == 1

    run(scenario)


def test_highlights_set_from_code_are_not_posted_as_the_users_choice():
    from widgets.lists import ProfileEntry

    posted: list = []

    async def scenario() -> None:
        app = _Lists()
        async with app.run_test(message_hook=posted.append) as pilot:
            profiles = app.query_one(ProfileList)
            profiles.update_entries((ProfileEntry("a"), ProfileEntry("b"), ProfileEntry("c")), prefer="b")
            profiles.select_id("c")
            await pilot.pause()
            assert profiles.highlighted_id == "c"
            assert not [m for m in posted if isinstance(m, ProfileList.OptionHighlighted)
                        and m.option_list is profiles]
            profiles.focus()
            await pilot.press("up")  # the user's own move is a choice
            await pilot.pause()
            mine = {id(m): m for m in posted if isinstance(m, ProfileList.OptionHighlighted)
                    and m.option_list is profiles}  # one message, seen by each node it bubbles through
            assert [m.option.id for m in mine.values()] == ["b"]

    run(scenario)


def test_saving_keeps_the_comments_and_layout_of_the_toml_file(home, make_emulator_profile):
    profile = make_emulator_profile("emu", tp=2)
    text = profile.path.read_text()
    commented = "# why this profile exists\n" + text.replace("[server]", "[server]\n# tp 2: two ranks", 1)
    profile.path.write_text(commented)
    save_profile(load_profile("emu", home).with_changes(server={"tp_size": 4}))
    after = profile.path.read_text()
    assert after.startswith("# why this profile exists\n") and "# tp 2: two ranks" in after
    kept = [line for line in after.splitlines() if line.strip()]
    wanted = [line for line in commented.replace("tp_size = 2", "tp_size = 4").splitlines() if line.strip()]
    assert [line for line in kept if line in wanted] == wanted  # every line of the file, in its order
    assert load_profile("emu", home).server.tp_size == 4


def test_an_unexpected_error_leaves_a_crash_file_and_the_exit_message_names_it(home):
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        path = write_crash_file(home, exc)
    assert path is not None and path.parent == home.state_root / "crashes"
    assert "RuntimeError: boom" in path.read_text() and (path.stat().st_mode & 0o777) == 0o600
    app = _app(home)
    app.crash_file = path
    assert str(path) in (exit_message(app) or "")


def test_an_error_escaping_a_handler_is_written_to_the_crash_file(home, make_emulator_profile):
    make_emulator_profile("emu", tp=2)

    app = _app(home)

    async def inner() -> None:
        async with app.run_test() as pilot:
            await first_poll(pilot, app)
            app.call_later(lambda: 1 / 0)
            await pilot.pause()

    try:
        asyncio.run(inner())
    except ZeroDivisionError:
        pass  # run_test re-raises what escaped; the point is what was left behind
    assert app.crash_file is not None and "ZeroDivisionError" in app.crash_file.read_text()


def test_two_answers_in_one_burst_close_only_the_question(home, make_emulator_profile):
    """Enter, Enter (or y, y) typed ahead both reach a modal before it is popped: only the first answers, and
    the screen below stays (the second dismiss used to raise InvalidStateError and pop the dashboard too)."""
    from app.screens.jobs import SpecPathModal
    from widgets.confirm_modal import ConfirmModal

    make_emulator_profile("emu", tp=2)
    answers: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            dashboard = app.screen
            for modal, keys in ((ConfirmModal("Really?"), ("y", "y", "n")),
                                (SpecPathModal("/a/job.toml"), ("enter", "enter")),
                                (ConfirmModal("Again?"), ("enter", "enter", "escape"))):
                app.push_screen(modal, answers.append)
                await wait_until(pilot, lambda m=modal: app.screen is m, f"{type(modal).__name__} is open")
                await burst(pilot, *keys)
                await wait_until(pilot, lambda: app.screen is dashboard, "back on the dashboard")
                assert app.is_running and app.crash_file is None
            assert answers == [True, "/a/job.toml", False]
            assert len(app.screen_stack) == 2  # Textual's default screen and the dashboard, nothing popped

    run(scenario)


def test_slash_then_text_in_one_burst_lands_in_the_filter(home, make_emulator_profile):
    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await burst(pilot, *"/Load")
            assert app.screen.query_one("#filter-input", Input).value == "Load"

    run(scenario)


def test_a_key_whose_action_defers_its_focus_does_not_take_the_next_keys(home, make_emulator_profile):
    """4 focuses the log pane through Widget.focus(), which queues the change on the App; "/ abc" typed
    right after opened the filter, "a" landed, then the queued focus moved to the log and "b" opened the
    bench screen (found by an adversarial tester in tmux)."""
    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await burst(pilot, "4", "slash", "a", "b", "c")
            assert app.screen is app.dashboard, app.screen
            assert app.dashboard.query_one("#filter-input", Input).value == "abc"

    run(scenario)


def test_a_slash_typed_into_the_open_filter_is_a_character(home, make_emulator_profile):
    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await burst(pilot, *"/", *"/Load weight/")
            assert app.screen.query_one("#filter-input", Input).value == "/Load weight/"

    run(scenario)


# -- type-ahead across screens: keys typed right after a key that opens (or closes) a screen land on it -------


def _recording_app(home, notes: list[str]):
    app = _app(home)
    original = app.notify

    def notify(message, *args, **kwargs):
        notes.append(str(message))
        return original(message, *args, **kwargs)

    app.notify = notify  # type: ignore[method-assign]
    return app


def test_ctrl_p_then_a_word_in_one_burst_lands_in_the_palette_and_presses_nothing_below(
        home, make_emulator_profile):
    """ "launch" typed right after ctrl+p used to reach the dashboard first: its l pressed launch."""
    from app.palette import SafeCommandPalette

    make_emulator_profile("emu", tp=2)
    notes: list[str] = []

    async def scenario() -> None:
        app = _recording_app(home, notes)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await burst(pilot, "ctrl+p", *"launch")
            assert isinstance(app.screen, SafeCommandPalette)
            assert app.screen.query_one(CommandInput).value == "launch"
            assert not [n for n in notes if n.startswith("Launching")], notes
            assert not list(home.sessions_dir.iterdir()) if home.sessions_dir.exists() else True

    run(scenario)


def test_a_palette_search_that_starts_as_the_palette_closes_does_not_kill_the_app(home, make_emulator_profile):
    """A key typed into the palette starts its search worker; when Esc in the same burst has already
    removed the list, Textual's search raised NoMatches and the app exited (found by the fuzz test)."""
    from app.palette import SafeCommandPalette

    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await pilot.press("ctrl+p")
            palette = await wait_until(pilot, lambda: isinstance(app.screen, SafeCommandPalette) and app.screen,
                                       "the palette", 10)
            await palette.query_one(CommandList).remove()  # as the palette's dismissal does
            await palette._gather_commands("stop").wait()
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is app.dashboard, "back on the dashboard", 10)
            assert app.is_running

    run(scenario)


def test_e_then_a_new_path_and_ctrl_s_in_one_burst_edit_and_save_the_profile(
        home, make_emulator_profile, make_model_dir):
    """The editor builds its form after loading the profile; the keys typed meanwhile wait for its first
    field (model path) instead of going to the dashboard (where a path's letters are its keys)."""
    profile = make_emulator_profile("emu", tp=2)
    new_model = make_model_dir("typed-ahead-model")
    saved: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24), message_hook=saved.append) as pilot:
            await first_poll(pilot, app)
            await burst(pilot, "e", "end", *["backspace"] * (len(profile.server.model_path) + 8),
                        *str(new_model), "ctrl+s")
            assert isinstance(app.screen, ProfileEditorScreen)
            assert app.screen.query_one("#model_path", Input).value == str(new_model)
            await wait_until(pilot, lambda: any(isinstance(m, ProfileSaved) for m in saved), "the save")

    run(scenario)
    assert load_profile("emu", home).server.model_path == str(new_model)


def test_x_n_then_a_spec_path_in_one_burst_lands_in_the_new_job_form(home, make_emulator_profile):
    from app.screens.jobs import SpecPathModal

    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await burst(pilot, "x", "n", "end", *["backspace"] * 60, *"/tmp/jobs/last.toml", "left",
                        "backspace", "X")
            assert isinstance(app.screen, SpecPathModal) and isinstance(app.screen_stack[-2], JobsScreen)
            assert app.screen.query_one("#spec-path", Input).value == "/tmp/jobs/last.toXl"
            dashboard = app.screen_stack[1]
            # Esc closes the form, Esc the jobs screen; a key meant for a screen that a later key closes
            # (the palette's "s") stays there; x then opens the jobs screen again from the dashboard.
            await burst(pilot, "escape", "escape", "ctrl+p", "s", "escape", "x")
            assert isinstance(app.screen, JobsScreen) and app.screen_stack[-2] is dashboard
            assert len(app.screen_stack) == 3

    run(scenario)


def test_a_question_opened_by_a_burst_is_answered_by_the_next_key_of_the_burst(home, make_emulator_profile):
    """e, a character, Esc (unsaved: "Discard?"), then y or n in one burst: the answer goes to the question,
    not to the editor or the dashboard behind it."""
    from widgets.confirm_modal import ConfirmModal

    profile = make_emulator_profile("emu", tp=2)
    before = profile.path.read_text()

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            dashboard = app.screen
            await burst(pilot, "e", "Z", "escape", "n")  # no: stay in the editor, the Z still typed
            assert isinstance(app.screen, ProfileEditorScreen)
            # The field's text is selected on focus, so Z replaced it, as it does when typed slowly.
            assert app.screen.query_one("#model_path", Input).value == "Z"
            await burst(pilot, "escape", "y")  # yes: discard, back on the dashboard
            assert app.screen is dashboard and not any(isinstance(s, ConfirmModal) for s in app.screen_stack)
            await burst(pilot, "e", "Z", "escape", "y", "e")  # and the e after the answer opens it again
            assert isinstance(app.screen, ProfileEditorScreen) and app.screen_stack[-2] is dashboard
            assert app.screen.query_one("#model_path", Input).value == profile.server.model_path

    run(scenario)
    assert profile.path.read_text() == before


class _SlowForm(Screen):
    """A screen whose input exists only after a while (as the editor's form after its profile loaded)."""

    BINDINGS: ClassVar = [("escape", "app.pop_screen", "Back")]

    def __init__(self, never_ready: bool = False) -> None:
        super().__init__()
        self.never_ready = never_ready
        self.shown = False

    def compose(self) -> ComposeResult:
        yield Static("loading…")

    def on_mount(self) -> None:
        self.set_timer(0.05, self._show)

    async def _show(self) -> None:
        field = InOrderInput(id="late")
        await self.mount(field)
        self.set_focus(field)
        self.shown = True

    def ready_for_keys(self) -> bool:
        return self.shown and not self.never_ready


class _TypeAheadApp(TypeAheadApp[None]):
    BINDINGS: ClassVar = [("ctrl+o", "open", "Open")]  # not priority: it bubbles up from the focused input first

    def __init__(self, never_ready: bool = False) -> None:
        super().__init__()
        self.never_ready = never_ready

    def compose(self) -> ComposeResult:
        yield InOrderInput(id="below")

    def action_open(self) -> None:
        self.push_screen(_SlowForm(self.never_ready))


def test_keys_and_a_paste_after_a_key_that_opens_a_screen_wait_for_its_late_input():
    async def scenario() -> None:
        app = _TypeAheadApp()
        async with app.run_test() as pilot:
            for event in (key_event("ctrl+o"), key_event("a"), events.Paste("/pasted"), key_event("b")):
                event.set_sender(app)
                app._driver.send_message(event)
            await wait_until(pilot, lambda: isinstance(app.screen, _SlowForm) and not app.typeahead.busy,
                             "the form took the keys")
            assert app.screen.query_one("#late", Input).value == "a/pastedb"
            assert app.query_one("#below", Input).value == ""
            await burst(pilot, "escape", "ctrl+o", "c")  # closed, opened again: c in the new one
            assert app.screen.query_one("#late", Input).value == "c"

    run(scenario)


def test_a_screen_that_never_says_ready_still_gets_the_keys_after_the_settle_limit(monkeypatch):
    from app import typeahead

    monkeypatch.setattr(typeahead, "SETTLE_LIMIT_S", 0.3)

    async def scenario() -> None:
        app = _TypeAheadApp(never_ready=True)
        async with app.run_test() as pilot:
            await burst(pilot, "ctrl+o", "x", "y")
            await wait_until(pilot, lambda: isinstance(app.screen, _SlowForm) and app.screen.shown
                             and app.screen.query_one("#late", Input).value == "xy", "the keys after the limit")
            assert not app.typeahead.busy

    run(scenario)


def test_c_then_y_in_one_burst_answers_the_capture_question(home, make_emulator_profile):
    """c asks only after a worker built both launch commands: the y typed right after it waits for that
    question (the worker may end in one, `KEYS_WAIT_FOR_WORKERS`) instead of reaching the dashboard first."""
    from app.screens.dashboard import CaptureToggled
    from widgets.confirm_modal import ConfirmModal

    make_emulator_profile("emu", tp=2)
    posted: list = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24), message_hook=posted.append) as pilot:
            await first_poll(pilot, app)
            dashboard = app.screen
            await burst(pilot, "c", "y")
            await wait_until(pilot, lambda: any(isinstance(m, CaptureToggled) for m in posted), "toggled")
            assert app.screen is dashboard and not any(isinstance(s, ConfirmModal) for s in app.screen_stack)

    run(scenario)
    assert load_profile("emu", home).capture.enabled


def test_l_then_y_in_one_burst_answers_the_gpus_in_use_question(home, make_emulator_profile, launched,
                                                                tp4_holding_gpus_0_to_3):
    """l on a profile whose GPUs another session holds asks y/N once the launch worker found them: the y
    typed right after l waits for that question and launches anyway (a real second emulator session)."""
    from widgets.confirm_modal import ChoiceModal, ConfirmModal

    holder = tp4_holding_gpus_0_to_3
    make_emulator_profile("big", tp=8)
    questions: list[str] = []

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await pilot.press("1", "home")
            await wait_until(pilot, lambda: app.dashboard.selected_profile == "big", "big selected")
            original = app.push_screen

            def push_screen(screen, *args, **kwargs):
                if isinstance(screen, (ConfirmModal, ChoiceModal)):
                    questions.append(screen.question)
                return original(screen, *args, **kwargs)

            app.push_screen = push_screen  # type: ignore[method-assign]
            await burst(pilot, "l", "y")
            await wait_until(pilot, lambda: [p for p in home.sessions_dir.iterdir() if p.name.startswith("big-")],
                             "the forced launch of big")
            assert not isinstance(app.screen, (ConfirmModal, ChoiceModal))

    try:
        run(scenario)
    finally:
        for folder in home.sessions_dir.iterdir():
            if folder.name.startswith("big-"):
                launched.track(folder.name)
    assert questions == [f"Launch big on GPUs in use by {holder.session_id}?"]


# -- alt+key is Esc, then the key: Esc and a key in one packet (issue 21 #6) -----------------------------------


async def terminal_burst(pilot, data: str) -> None:
    """Send ``data`` as one packet read from the terminal: parsed by Textual's xterm parser (which turns Esc
    followed by a letter into alt+letter, as it must for a real alt+letter), all queued at once."""
    from textual import constants
    from textual._xterm_parser import XTermParser

    app = pilot.app
    parser = XTermParser()
    events_read = list(parser.feed(data))
    # The parser's own rule: an Esc sequence that does not go on is known only once its delay has passed
    # (the driver then ticks the parser); this is that delay, not a wait for the app.
    await asyncio.sleep(constants.ESCAPE_DELAY * 2)
    for event in events_read + list(parser.tick()):
        event.set_sender(app)
        app._driver.send_message(event)
    await pilot.pause()
    await wait_until(pilot, lambda: not app.typeahead.busy, f"the app handled the packet {data!r}")
    await pilot.pause()


def test_the_terminals_esc_and_a_character_in_one_packet_is_always_alt_key():
    """Textual's parser lost the Esc of Esc+/ (a bare slash) and turned Esc+1 into a macOS "¡"; the TUI's
    parser reports each as alt+key, and keeps the sequences that are not Esc+character."""
    import time as clock

    from textual import constants

    from app.terminal_input import AltKeyParser

    def keys(data: str) -> list[tuple[str, str | None]]:
        parser = AltKeyParser()
        found = list(parser.feed(data))
        clock.sleep(constants.ESCAPE_DELAY * 2)  # a lone Esc is known only once nothing follows it in time
        return [(e.key, e.character) for e in found + list(parser.tick())]

    assert keys("\x1br") == [("alt+r", "r")]
    assert keys("\x1bR") == [("alt+shift+r", "R")]
    assert keys("\x1b/") == [("alt+slash", "/")]
    assert keys("\x1b1") == [("alt+1", "1")]
    assert keys("\x13\x1bx") == [("ctrl+s", "\x13"), ("alt+x", "x")]
    assert keys("\x1b[A") == [("up", None)]  # CSI: still the arrow
    assert keys("\x1bOP") == [("f1", None)]  # SS3: still F1
    assert keys("\x1bb") == [("ctrl+left", None)]  # macOS option+left, as Textual maps it
    assert keys("\x1b") == [("escape", "\x1b")]


def test_e_then_a_fault_ctrl_s_and_esc_r_in_one_packet_saves_closes_and_presses_r(home, make_emulator_profile):
    """`e … ctrl+s Esc r` in one packet left the editor open with the fault field reading
    "hang-after-weightsr": the Esc and the r arrived as one alt+r, and the field typed its r."""
    make_emulator_profile("emu", tp=2)
    notes: list[str] = []
    saved: list = []

    async def scenario() -> None:
        app = _recording_app(home, notes)
        async with app.run_test(size=(80, 24), message_hook=saved.append) as pilot:
            await first_poll(pilot, app)
            dashboard = app.screen
            await pilot.press("e")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen.last_check,
                             "the editor")
            editor = app.screen
            field = editor.query_one("#fault", Input)
            field.focus()
            await pilot.pause()
            await terminal_burst(pilot, "\x05" + "\x7f" * 30 + "hang-after-weights" + "\x13\x1br")
            await wait_until(pilot, lambda: any(isinstance(m, ProfileSaved) for m in saved), "the save")
            assert field.value == "hang-after-weights"
            assert app.screen is dashboard  # Esc closed the saved editor
            assert "Profile emu has no running session to restart (l launches it)." in notes  # r, on the dashboard

    run(scenario)
    assert load_profile("emu", home).emulator.fault == "hang-after-weights"


def test_esc_and_a_key_in_one_packet_close_the_log_filter_and_press_the_key(home, make_emulator_profile):
    from app.screens.jobs import JobsScreen as Jobs

    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await terminal_burst(pilot, "/Load\x1bx")
            assert app.dashboard.query_one("#filter-input", Input).value == "Load"
            assert not app.dashboard.query_one("#filter-bar").has_class("-open")
            assert isinstance(app.screen, Jobs)  # the x after Esc opened the jobs screen

    run(scenario)


def test_an_alt_key_that_a_binding_uses_stays_that_binding(home, make_emulator_profile):
    from app.screens.jobs import JobsScreen as Jobs

    make_emulator_profile("emu", tp=2)
    home.config_file.write_text('[keys]\n"dashboard.jobs" = "alt+j"\n')

    async def scenario() -> None:
        app = _app(home)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await terminal_burst(pilot, "\x1bj")
            assert isinstance(app.screen, Jobs)

    run(scenario)
