"""The profile editor, driven through the real app: live validation next to the field, the command
preview, secrets masked, Save and Save as, and the unsaved-changes question."""

from __future__ import annotations

from textual.widgets import Input, Static, Switch

from app.screens.profile_editor import ProfileChecked, ProfileEditorScreen, ProfileSaved
from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from sessions.profiles import load_profile
from tests._tui_support import first_poll, run, screen_text, wait_until
from widgets.env_table import EnvTable


def _open_editor(home, messages):
    app = Eagle3App(home, gpu_source=EmulatedSource(home))

    async def open_it(pilot):
        await first_poll(pilot, app)
        await pilot.press("e")
        await wait_until(
            pilot,
            lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen.last_check,
            "the editor validated the loaded profile",
        )
        return app.screen

    return app, open_it


def test_live_validation_shows_the_problem_next_to_its_field_and_the_preview_follows(
    home, make_emulator_profile
):
    make_emulator_profile("emu", tp=2, env={"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123"})
    messages: list = []

    async def scenario() -> None:
        app, open_it = _open_editor(home, messages)
        async with app.run_test(size=(120, 50), message_hook=messages.append) as pilot:
            editor = await open_it(pilot)
            first = editor.last_check
            assert "--tp-size 2" in first.preview
            assert "hf_abc" not in first.preview and "HF_TOKEN='***'" in first.preview  # secret redacted
            assert "hf_abc" not in screen_text(app)  # ... and masked in the env table
            # a bad value: the message appears under the field, the preview keeps the last good command
            field = editor.query_one("#mem_fraction_static", Input)
            field.value = "1.5"
            await wait_until(
                pilot,
                lambda: editor.last_check.by_widget.get("mem_fraction_static"),
                "the mem fraction problem",
            )
            await pilot.pause()
            problem = editor.query_one("#problem-mem_fraction_static", Static)
            assert problem.has_class("-shown") and "1.5" in str(problem.render())
            assert editor.dirty
            # a good value clears it, and the preview shows the new flag
            field.value = "0.8"
            await wait_until(
                pilot,
                lambda: "--mem-fraction-static 0.8" in editor.last_check.preview,
                "the preview shows the new mem fraction",
            )
            assert not editor.last_check.by_widget.get("mem_fraction_static")
            assert not editor.query_one("#problem-mem_fraction_static", Static).has_class("-shown")
            # a value that does not parse is named with its field
            editor.query_one("#tp_size", Input).value = "eight"
            await wait_until(pilot, lambda: editor.last_check.by_widget.get("tp_size"), "a TP size problem")
            assert "server.tp_size" in editor.last_check.by_widget["tp_size"][0][1]
        assert any(isinstance(m, ProfileChecked) for m in messages)

    run(scenario)


def test_save_writes_the_profile_and_save_as_writes_a_new_one(home, make_emulator_profile):
    original = make_emulator_profile("emu", tp=2)
    messages: list = []

    async def scenario() -> None:
        app, open_it = _open_editor(home, messages)
        async with app.run_test(size=(120, 50), message_hook=messages.append) as pilot:
            editor = await open_it(pilot)
            editor.query_one("#tp_size", Input).value = "4"
            editor.query_one("#radix_cache", Switch).value = False
            await wait_until(pilot, lambda: "--disable-radix-cache" in editor.last_check.preview, "preview")
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: any(isinstance(m, ProfileSaved) for m in messages), "saved")
            saved = load_profile("emu", home)
            assert saved.server.tp_size == 4 and saved.server.radix_cache is False
            assert saved.server.port == original.server.port
            assert not editor.dirty
            await pilot.press("f2")
            await pilot.pause()
            name_input = app.screen.query_one("#new-name", Input)
            name_input.value = "emu-tp4"
            await pilot.press("enter")
            await wait_until(
                pilot,
                lambda: any(isinstance(m, ProfileSaved) and m.name == "emu-tp4" for m in messages),
                "saved as emu-tp4",
            )
            assert load_profile("emu-tp4", home).server.tp_size == 4
            assert (home.profiles_dir / "emu.toml").exists()

    run(scenario)


def test_env_rows_are_added_and_secret_values_stay_masked(home, make_emulator_profile):
    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app, open_it = _open_editor(home, [])
        async with app.run_test(size=(120, 50)) as pilot:
            editor = await open_it(pilot)
            table = editor.query_one(EnvTable)
            await pilot.press("ctrl+n")
            await pilot.pause()
            app.screen.query_one("#env-name", Input).value = "MY_API_KEY"
            app.screen.query_one("#env-value", Input).value = "s3cr3t-value-xyz"
            await pilot.press("enter")
            await wait_until(pilot, lambda: "MY_API_KEY" in table.env, "the env row")
            assert table.env["MY_API_KEY"] == "s3cr3t-value-xyz"
            await wait_until(pilot, lambda: "MY_API_KEY" in editor.last_check.preview, "preview with env")
            assert "s3cr3t" not in screen_text(app) and "s3cr3t" not in editor.last_check.preview
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: not editor.dirty, "saved")
            assert load_profile("emu", home).server.env["MY_API_KEY"] == "s3cr3t-value-xyz"

    run(scenario)


def test_leaving_with_unsaved_changes_asks_and_no_keeps_the_editor(home, make_emulator_profile):
    make_emulator_profile("emu", tp=2)

    async def scenario() -> None:
        app, open_it = _open_editor(home, [])
        async with app.run_test(size=(100, 40)) as pilot:
            editor = await open_it(pilot)
            editor.query_one("#port", Input).value = "31999"
            await wait_until(pilot, lambda: editor.dirty, "the form is modified")
            editor.query_one("#port", Input).blur()
            await pilot.press("escape")
            await pilot.pause()
            assert "Discard" in screen_text(app)
            await pilot.press("n")
            await pilot.pause()
            assert app.screen is editor
            await pilot.press("escape")
            await pilot.pause()
            await pilot.press("y")
            await wait_until(pilot, lambda: app.screen is app.dashboard, "back on the dashboard")
            assert load_profile("emu", home).server.port != 31999  # nothing was saved

    run(scenario)


def test_switches_say_on_or_off_in_words_and_follow_a_flip(home, make_emulator_profile):
    make_emulator_profile("emu", tp=2, radix_cache=False)
    messages: list = []

    async def scenario() -> None:
        app, open_it = _open_editor(home, messages)
        async with app.run_test(size=(80, 24), message_hook=messages.append) as pilot:
            editor = await open_it(pilot)
            switch = editor.query_one("#cuda_graph", Switch)
            switch.scroll_visible(animate=False)
            await pilot.pause()
            text = screen_text(app)
            for words in ("CUDA graph: on", "radix cache: off", "capture: off"):
                assert words in text, words
            switch.focus()
            await pilot.press("space")  # the user's flip, by key
            await wait_until(pilot, lambda: "CUDA graph: off" in screen_text(app), "the label follows")
            assert switch.value is False and "radix cache: off" in screen_text(app)
            await pilot.press("space")
            await wait_until(pilot, lambda: "CUDA graph: on" in screen_text(app), "and back")
            await pilot.resize_terminal(60, 20)  # too narrow for one row: one switch per row, all readable
            await wait_until(pilot, lambda: editor.has_class("-tight"), "the tight layout")
            await pilot.pause()
            for widget_id in ("cuda_graph", "radix_cache", "capture_enabled"):
                label = editor.query_one(f"#label-{widget_id}")
                assert label.region.right <= 60 and label.region.width >= len(str(label.render())), widget_id

    run(scenario)
