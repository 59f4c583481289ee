"""Key bindings: every binding has a unique id, and `[keys]` in config.toml remaps them (or says why not)."""

from __future__ import annotations

import re

from app.keymap import ALL_KEYS, DASHBOARD_KEYS, effective_keys, load_keymap

CONTRACT_KEYS = {  # issue 4's key table: binding id -> the default key
    "dashboard.launch": "l",
    "dashboard.restart": "r",
    "dashboard.stop": "s",
    "dashboard.edit": "e",
    "dashboard.filter": "slash",
    "dashboard.fullscreen": "f",
    "dashboard.wrap": "w",
    "dashboard.timestamps": "t",
    "dashboard.focus_profiles": "1",
    "dashboard.focus_sessions": "2",
    "dashboard.focus_gpus": "3",
    "dashboard.focus_log": "4",
    "dashboard.diagnose": "d",
    "dashboard.capture": "c",
    "dashboard.jobs": "x",
    "app.help": "question_mark",
    "app.command_palette": "ctrl+p",
}


def test_every_binding_has_a_unique_id_and_the_contract_keys():
    ids = [spec.id for spec in ALL_KEYS]
    assert len(ids) == len(set(ids))
    defaults = {spec.id: spec.keys.split(",") for spec in ALL_KEYS}
    for binding_id, key in CONTRACT_KEYS.items():
        assert key in defaults[binding_id], binding_id
    assert set(defaults["app.quit"]) >= {"q", "ctrl+q"}
    assert all(b.id for b in (spec.binding() for spec in DASHBOARD_KEYS))


def test_keys_section_remaps_by_binding_id(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[keys]\n"dashboard.stop" = "S"\n"dashboard.launch" = "l, ctrl+l"\n')
    keymap, problems = load_keymap(config)
    assert problems == []
    assert keymap == {"dashboard.stop": "S", "dashboard.launch": "l,ctrl+l"}
    assert effective_keys(keymap)["dashboard.stop"] == "S"
    assert effective_keys(keymap)["dashboard.restart"] == "r"


def test_bad_entries_are_reported_with_file_line_and_reason_and_the_rest_applies(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        '[keys]\n"dashboard.stp" = "S"\n"dashboard.wrap" = ""\n"dashboard.edit" = "E"\n'
        '"dashboard.jobs" = "ctrl+ x"\n'
    )
    keymap, problems = load_keymap(config)
    assert keymap == {"dashboard.edit": "E"}
    text = [str(p) for p in problems]
    assert any("dashboard.stp" in t and f"{config}:2" in t and "unknown binding id" in t for t in text)
    assert any("dashboard.wrap" in t and ":3" in t for t in text)
    assert any("dashboard.jobs" in t and "not a key name" in t for t in text)


def test_broken_toml_and_missing_file(tmp_path):
    assert load_keymap(tmp_path / "absent.toml") == ({}, [])
    config = tmp_path / "config.toml"
    config.write_text("[keys\n")
    keymap, problems = load_keymap(config)
    assert keymap == {} and len(problems) == 1
    assert "not valid TOML" in str(problems[0]) and problems[0].line == 1


def test_the_running_app_uses_the_remapped_keys_and_reports_bad_ones(home):
    from app.tui import Eagle3App
    from sessions.gpus import EmulatedSource
    from tests._tui_support import first_poll, run

    home.config_file.write_text('[keys]\n"dashboard.stop" = "S"\n"dashboard.nope" = "z"\n')

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home))
        async with app.run_test(size=(100, 30)) as pilot:
            await first_poll(pilot, app)
            keys = {key: active.binding.action for key, active in app.screen.active_bindings.items()}
            assert keys.get("S") == "stop" and keys.get("s") != "stop"
            assert keys.get("r") == "restart"  # the others keep their defaults
            assert any("dashboard.nope" in problem for problem in app.keymap_problems)

    run(scenario)


def _palette_rows(app) -> list[str]:
    from textual.command import CommandList

    found = app.screen.query_one(CommandList)
    return [str(found.get_option_at_index(i).prompt) for i in range(found.option_count)]


def test_the_palette_finds_bench_and_extract_and_palette_and_help_show_remapped_keys(home, make_emulator_profile):
    """The palette's entries and the help screen come from the key bindings: "bench" and "extract" find their
    actions (they found nothing), a key remapped in [keys] is shown as remapped, and the palette's entry runs
    the binding's action (Bench opens the bench screen)."""
    from _tui_support import burst, first_poll, run, screen_text, wait_until

    from app.palette import SafeCommandPalette
    from app.screens.bench import BenchScreen
    from app.screens.help import HelpScreen
    from app.tui import Eagle3App
    from sessions.gpus import EmulatedSource

    make_emulator_profile("emu", tp=2)
    home.config_file.write_text('[keys]\n"dashboard.stop" = "S"\n"dashboard.bench" = "B,ctrl+b"\n')

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await first_poll(pilot, app)
            found: dict[str, list[str]] = {}
            for word in ("bench", "extract", "stop"):
                await burst(pilot, "ctrl+p", *word)
                await wait_until(pilot, lambda: isinstance(app.screen, SafeCommandPalette) and _palette_rows(app),
                                 f"palette hits for {word}")
                found[word] = _palette_rows(app)
                await burst(pilot, "escape")
            assert any(r.startswith("Bench session") and "(B ctrl+b)" in r for r in found["bench"]), found
            assert any(r.startswith("Jobs: extraction jobs") and "(x)" in r for r in found["extract"]), found
            assert any(r.startswith("Stop session") and "(S)" in r for r in found["stop"]), found
            await burst(pilot, "ctrl+p", *"bench session", "enter")
            await wait_until(pilot, lambda: isinstance(app.screen, BenchScreen), "the bench screen from the palette")
            await burst(pilot, "escape", "question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
            text = screen_text(app)
            stop_row = next(line for line in text.splitlines() if "Stop the selected session" in line)
            bench_row = next(line for line in text.splitlines() if "Benchmark the selected" in line)
            assert re.search(r"\sS\s+Stop the selected session", stop_row) and "dashboard.stop" in stop_row, stop_row
            assert re.search(r"\sB ctrl\+b\s+Benchmark the selected", bench_row), bench_row

    run(scenario)
