"""Demo mode: the demo home's profiles, its Kimi-K2.5-shaped model dir, and `--demo` driving the real app."""

from __future__ import annotations

import pytest

from app.tui import Eagle3App
from sessions.demo import DEMO_PROFILES, HANG_PROFILE, HEALTHY_PROFILE, ensure_demo_home
from sessions.home import resolve_home
from sessions.profiles import list_profiles, load_profile, read_model_config, save_profile, validate_profile
from tests._tui_support import first_poll, run, screen_text, wait_until


@pytest.fixture
def demo_home(home, seed_demo_models):
    seed_demo_models()  # the tiny model written once per worker (conftest), not once per test
    return ensure_demo_home(resolve_home(demo=True))


def test_demo_home_has_two_emulator_profiles_that_validate(demo_home):
    assert demo_home.demo and str(demo_home.config_root).endswith("demo/config")
    assert set(DEMO_PROFILES) <= set(list_profiles(demo_home))
    healthy, hang = load_profile(HEALTHY_PROFILE, demo_home), load_profile(HANG_PROFILE, demo_home)
    assert healthy.server.launcher == hang.server.launcher == "emulator"
    assert healthy.server.tp_size == 8 and healthy.emulator.fault == "none"
    assert hang.emulator.fault == "hang-after-weights"
    assert healthy.server.port != hang.server.port
    for profile in (healthy, hang):
        assert [p for p in validate_profile(profile, check_port=False) if p.is_error] == []


def test_demo_model_dir_is_kimi_k25_shaped(demo_home):
    shape = read_model_config(load_profile(HEALTHY_PROFILE, demo_home).server.model_path)
    assert shape.architecture == "KimiK25ForConditionalGeneration"
    assert shape.text_config_nested and shape.num_hidden_layers == 61 and shape.hidden_size == 7168


def test_creating_the_demo_home_again_keeps_the_users_edits(demo_home):
    edited = load_profile(HEALTHY_PROFILE, demo_home).with_changes(server={"mem_fraction_static": 0.7})
    save_profile(edited)
    ensure_demo_home(demo_home)
    assert load_profile(HEALTHY_PROFILE, demo_home).server.mem_fraction_static == 0.7


def test_demo_app_selects_the_healthy_profile_first_and_launches_it(demo_home, launched):
    # Faster than the demo's own pace, so the test stays quick; the path is the same.
    for name in DEMO_PROFILES:
        save_profile(load_profile(name, demo_home).with_changes(emulator={"time_scale": 0.004}))
    launched.home = demo_home

    async def scenario() -> None:
        app = Eagle3App(demo_home, demo=True, refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await first_poll(pilot, app)
            assert app.dashboard.selected_profile == HEALTHY_PROFILE
            assert "emulated" in screen_text(app)  # the GPU panel says where its numbers come from
            await pilot.press("l")
            status = await wait_until(
                pilot,
                lambda: (s := app.dashboard.last_snapshot.status) and s.state == "ready" and s,
                "the demo session is ready",
                60,
            )
            launched.track(status.session_id)
            assert (
                status.profile == HEALTHY_PROFILE
                and len([r for r in status.ranks if r.rank is not None]) == 8
            )
            gpu = app.dashboard.last_snapshot.gpu
            assert gpu.source == "emulated" and len(gpu.samples) == 8
            assert any(p.pid in app.dashboard.last_snapshot.owners for s in gpu.samples for p in s.processes)

    run(scenario)


def test_demo_app_shows_why_the_capture_demo_was_skipped_once(demo_home):
    """The note `ensure_demo_home` leaves when torch & co. are missing is shown on mount; without it, nothing."""
    from sessions.demo import _NOTE_FILE, demo_note, demo_root

    assert demo_note(demo_home) is None  # this env has torch: no note, no notification
    note = "Capture demo skipped: torch not installed (the tiny real model needs torch); the Kimi demos work."

    async def scenario(expect: str | None) -> None:
        app = Eagle3App(demo_home, demo=True)
        async with app.run_test(size=(120, 40)) as pilot:
            await first_poll(pilot, app, polls=2)
            shown = [n.message for n in app._notifications]
            assert shown.count(expect) == 1 if expect else expect not in shown and not any(
                "Capture demo skipped" in m for m in shown), shown

    run(lambda: scenario(None))
    (demo_root(demo_home) / _NOTE_FILE).write_text(note + "\n")
    run(lambda: scenario(note))
