"""Key bindings: every binding has a unique id, and `[keys]` in config.toml remaps them (or says why not)."""

from __future__ import annotations

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
