"""Launch profiles (docs/DESIGN.md §1b, contract): `LaunchProfile` <-> TOML, validation, and the argv/env it
launches.

A profile is a TOML file with ``[server]`` (+ ``[server.env]``), ``[capture]``, ``[watch]`` and ``[emulator]``.
Loading is strict: an unknown key, a wrong type or an out-of-range value is a `Problem` naming the key and
its line, and every problem is reported at once.  `validate_profile` adds what depends on this machine:
the model dir, the port, the visible GPUs, and what the installed SGLang accepts (read statically by
`sessions.sglang_source`, never imported).  `build_command` turns a profile into the exact argv and env
changes; the emulator launcher gets the same SGLang flags, so both go through one launch path.

The layers, bottom up: `model` (the data and its schema) and `toml_lines`, `model_config`, `fields` (type
and range checks), `toml_io` (load and save); `sessions.capture` builds on those; `command` and
`validation` sit above capture.  This package re-exports the public names; modules below capture import
the submodules they need, never this facade.
"""
from __future__ import annotations

from sessions.model_config import ModelConfigError, ModelShape, read_model_config
from sessions.profiles.command import LOOKUP, LaunchCommand, build_command
from sessions.profiles.fields import field_problems
from sessions.profiles.model import (
    _KINDS,
    DEFAULT_PORT,
    EMULATOR_MODULE,
    FAULT_IDS,
    LAUNCHERS,
    SECTIONS,
    SGLANG_MODULE,
    CaptureSection,
    EmulatorSection,
    LaunchProfile,
    Problem,
    ProfileError,
    ServerSection,
    WatchSection,
)
from sessions.profiles.toml_io import list_profiles, load_profile, parse_profile, profile_path, save_profile
from sessions.profiles.toml_lines import toml_key_lines
from sessions.profiles.validation import (
    nvml_device_count,
    python_version_problem,
    validate_profile,
    visible_gpu_count,
)

__all__ = [
    "DEFAULT_PORT", "EMULATOR_MODULE", "FAULT_IDS", "LAUNCHERS", "LOOKUP", "SECTIONS", "SGLANG_MODULE",
    "_KINDS", "CaptureSection", "EmulatorSection", "LaunchCommand", "LaunchProfile", "ModelConfigError",
    "ModelShape", "Problem", "ProfileError", "ServerSection", "WatchSection", "build_command",
    "field_problems", "list_profiles", "load_profile", "nvml_device_count", "parse_profile", "profile_path",
    "python_version_problem", "read_model_config", "save_profile", "toml_key_lines", "validate_profile",
    "visible_gpu_count",
]
