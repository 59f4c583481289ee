"""A missing part of the product is an error, never a quiet fallback.

Each test takes one module away (``sys.modules[name] = None`` makes importing it raise
ModuleNotFoundError, as a broken install would) and checks that the code that needs it says so, instead of
launching, validating or listing as if the part did not exist.
"""
from __future__ import annotations

import sys

import pytest

from sessions.profiles import build_command, validate_profile


@pytest.fixture
def capture_profile(make_emulator_profile, tmp_path):
    return make_emulator_profile(capture={"enabled": True, "dir": str(tmp_path / "cap")})


def test_a_capture_profile_does_not_launch_without_capture_when_the_toggle_is_missing(
    capture_profile, monkeypatch
):
    argv = build_command(capture_profile).argv
    assert "--enable-return-aux-hidden-states" in argv  # with the part: the capture flags are there
    monkeypatch.setitem(sys.modules, "sessions.profiles.capture_launch", None)
    with pytest.raises(ModuleNotFoundError, match="sessions.profiles.capture_launch"):
        build_command(capture_profile)


def test_capture_rules_are_not_skipped_when_the_toggle_is_missing(capture_profile, monkeypatch):
    assert not [p for p in validate_profile(capture_profile, check_port=False) if p.field == "capture"]
    monkeypatch.setitem(sys.modules, "sessions.profiles.capture_launch", None)
    problems = [p for p in validate_profile(capture_profile, check_port=False) if p.field == "capture"]
    # Validation answers rather than raises: the capture check is an error that stops the launch.
    assert [p.is_error for p in problems] == [True]
    assert "ModuleNotFoundError" in problems[0].message and "sessions.profiles.capture_launch" in problems[0].message


def test_a_profile_without_capture_does_not_need_the_toggle(make_emulator_profile, monkeypatch):
    profile = make_emulator_profile()
    monkeypatch.setitem(sys.modules, "sessions.profiles.capture_launch", None)
    assert "--enable-return-aux-hidden-states" not in build_command(profile).argv


@pytest.mark.parametrize("area", ["app.cli_bench", "app.cli_capture", "app.cli_logs"])
def test_the_cli_does_not_drop_a_command_area_that_fails_to_import(area, monkeypatch):
    from app.cli import build_parser

    build_parser()  # every area is there
    monkeypatch.setitem(sys.modules, area, None)
    with pytest.raises(ModuleNotFoundError, match=area):
        build_parser()
