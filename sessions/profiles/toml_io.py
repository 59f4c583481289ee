"""Profiles on disk: locate, list, load (strict: every problem at once) and save (comments kept, via tomlkit)."""
from __future__ import annotations

import errno
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.home import Home, atomic_write_text, ensure_private_dir, resolve_home
from sessions.profiles.fields import _toml_type, field_problems
from sessions.profiles.model import (
    _KINDS,
    _PROFILE_NAME,
    _SECTION_TYPES,
    SECTIONS,
    TOP_KEYS,
    LaunchProfile,
    Problem,
    ProfileError,
    _normalize,
)
from sessions.profiles.toml_lines import _did_you_mean, _line_of, toml_key_lines

# --- locating and loading --------------------------------------------------------------------------------


def profile_path(name_or_path: str | Path, home: Home | None = None) -> Path:
    """A name resolves to ``<profiles_dir>/<name>.toml``; anything that looks like a path is used as is."""
    if isinstance(name_or_path, Path):
        return name_or_path
    text = str(name_or_path)
    if os.sep in text or "/" in text or text.endswith(".toml") or text.startswith((".", "~")):
        return Path(text).expanduser()
    return (home or resolve_home()).profiles_dir / f"{text}.toml"


def list_profiles(home: Home | None = None) -> list[str]:
    """The profile names in ``<profiles_dir>``, sorted (editor temp files and hidden files skipped)."""
    folder = (home or resolve_home()).profiles_dir
    from sessions import safe_files

    if not safe_files.folder_exists(folder, "profiles folder"):  # a file in the way: say so, never "no profiles"
        return []
    return sorted(p.stem for p in folder.glob("*.toml") if not p.name.startswith(".") and p.is_file())


def load_profile(name_or_path: str | Path, home: Home | None = None) -> LaunchProfile:
    """Load and check a profile; raises `ProfileError` listing every problem of the file."""
    path = profile_path(name_or_path, home)
    try:
        text = safe_files.read_text(path, safe_files.PROFILE)  # a FIFO, /dev/zero, over 1 MiB: refused at once
    except safe_files.FileRefused as exc:  # a special file or a folder: named by what it is
        where = "toml" if exc.kind == "not UTF-8" else "profile"
        raise ProfileError([Problem(where, str(exc).replace(f"profile {path}: ", ""))], path) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise ProfileError([Problem("profile", f"cannot read {path}: {exc.strerror or exc}")], path) from None
        message = f"no profile file {path}"
        if exc.errno == errno.ENOENT and path.parent.is_dir() and not isinstance(name_or_path, Path):
            known = [p.stem for p in sorted(path.parent.glob("*.toml"))]
            message += f" (profiles there: {', '.join(known)})" if known else ""
        raise ProfileError([Problem("profile", message)], path) from None
    return parse_profile(text, name=path.stem, path=path)


def parse_profile(text: str, name: str = "profile", path: Path | None = None) -> LaunchProfile:
    """A profile from TOML text (see `load_profile`)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message, line = _toml_error(exc)
        raise ProfileError([Problem("toml", message, line)], path or name) from None
    except RecursionError:
        raise ProfileError([Problem("toml", "arrays or tables nested too deeply to read")], path or name) from None
    try:
        lines = toml_key_lines(text)
    except RecursionError:
        lines = {}
    problems: list[Problem] = []
    explicit: set[str] = set()
    sections: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _SECTION_TYPES and key not in TOP_KEYS:
            kind = "table" if isinstance(value, dict) else "key"
            problems.append(
                Problem(key, f"unknown {kind}" + _did_you_mean(key, SECTIONS), _line_of(lines, key))
            )
    for section, cls in _SECTION_TYPES.items():
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            problems.append(Problem(section, f"must be a table ([{section}]), not {_toml_type(raw)}",
                                    _line_of(lines, section)))
            raw = {}
        known = _KINDS[section]
        values: dict[str, Any] = {}
        for key, value in raw.items():
            dotted = f"{section}.{key}"
            if key not in known:
                problems.append(Problem(dotted, "unknown key" + _did_you_mean(key, known), _line_of(lines, dotted)))
                continue
            values[key] = _normalize(section, key, value)
            explicit.add(dotted)
        sections[section] = cls(**values)
    profile = LaunchProfile(
        name=name,
        path=path,
        host=data.get("host"),
        explicit_keys=frozenset(explicit),
        key_lines=lines,
        **sections,
    )
    problems += field_problems(profile)
    if any(p.is_error for p in problems):
        raise ProfileError(problems, path or name, profile=profile)
    return profile


def save_profile(profile: LaunchProfile, path: str | Path | None = None, home: Home | None = None) -> Path:
    """Write ``profile`` atomically with mode 0600; returns the path.  Refuses a profile with field errors
    (it would not load back)."""
    errors = [p for p in field_problems(profile) if p.is_error]
    if errors:
        raise ProfileError(errors, profile.name)
    if path is not None:
        target = Path(path).expanduser()
    elif profile.path is not None:
        target = profile.path
    else:
        if not _PROFILE_NAME.match(profile.name):
            raise ProfileError([Problem("name", f"{profile.name!r} is not a usable file name")])
        target = (home or resolve_home()).ensure().profiles_dir / f"{profile.name}.toml"
    if not target.parent.exists():
        ensure_private_dir(target.parent)
    atomic_write_text(target, _profile_text(profile, target), mode=0o600)
    return target


def _profile_text(profile: LaunchProfile, target: Path) -> str:
    """The file's new text: its old text with the changed values edited in (comments and layout kept),
    or a new file when there is none or it is not TOML."""
    from sessions.profile_toml import updated_toml

    try:
        original = safe_files.read_text(target, safe_files.PROFILE)
    except OSError:
        return profile.to_toml()
    edited = updated_toml(original, profile.to_doc(), tuple(SECTIONS), TOP_KEYS)
    if edited is None:
        return profile.to_toml()
    try:  # the edit must describe exactly this profile; otherwise write it anew
        if _doc_equal(tomllib.loads(edited), profile.to_doc()):
            return edited
    except tomllib.TOMLDecodeError:
        pass
    return profile.to_toml()


def _doc_equal(loaded: dict[str, Any], doc: dict[str, Any]) -> bool:
    return {k: v for k, v in loaded.items() if v} == {k: v for k, v in doc.items() if v}


def _toml_error(exc: tomllib.TOMLDecodeError) -> tuple[str, int | None]:
    """tomllib puts the place in the message: ``Invalid value (at line 3, column 8)``."""
    text = str(exc)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)\s*$", text)
    if m:
        return f"TOML syntax: {text[: m.start()]} (column {m.group(2)})", int(m.group(1))
    m = re.search(r"\s*\(at end of document\)\s*$", text)
    if m:
        return f"TOML syntax: {text[: m.start()]} at the end of the file", None
    return f"TOML syntax: {text}", getattr(exc, "lineno", None)


