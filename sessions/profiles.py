"""Launch profiles (DESIGN §1b, contract): `LaunchProfile` <-> TOML, validation, and the argv/env it launches.

A profile is a TOML file with ``[server]`` (+ ``[server.env]``), ``[capture]``, ``[watch]`` and ``[emulator]``.
Loading is strict: an unknown key, a wrong type or an out-of-range value is a `Problem` naming the key and
its line, and every problem is reported at once.  `validate_profile` adds what depends on this machine:
the model dir, the port, the visible GPUs, and what the installed SGLang accepts (read statically by
`sessions.sglang_source`, never imported).  `build_command` turns a profile into the exact argv and env
changes; the emulator launcher gets the same SGLang flags, so both go through one launch path.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import errno
import functools
import json
import math
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.home import Home, atomic_write_text, ensure_private_dir, resolve_home
from sessions.redaction import REDACTED, is_secret_name, redact_argv, redact_text, secret_values

LAUNCHERS = ("sglang", "emulator")
FAULT_IDS = (
    "none",
    "hang-after-weights",
    "rank-missing",
    "hang-in-graph-capture",
    "oom-kv-cache",
    "address-in-use",
    "crash-while-serving",
    "slow-weights",
    "scheduler-exception",
)
SGLANG_MODULE = "sglang.launch_server"
EMULATOR_MODULE = "sessions.emulator"
DEFAULT_PORT = 30000
SECTIONS = ("server", "capture", "watch", "emulator")

# Flags that a profile field produces: passing them again in extra_args would silently override the field
# (argparse keeps the last value), and our probes would then watch the wrong port or rank count.
_FIELD_FLAGS = {
    "--model-path": "server.model_path",
    "--model": "server.model_path",
    "--tp-size": "server.tp_size",
    "--tensor-parallel-size": "server.tp_size",
    "--host": "server.host",
    "--port": "server.port",
    "--attention-backend": "server.attention_backend",
    "--mem-fraction-static": "server.mem_fraction_static",
    "--chunked-prefill-size": "server.chunked_prefill_size",
    "--disable-radix-cache": "server.radix_cache",
    "--disable-cuda-graph": "server.cuda_graph",
}
_EMULATOR_FLAGS = {
    "--time-scale": "emulator.time_scale",
    "--emulate-fault": "emulator.fault",
    "--emulate-gpu-memory-gb": "emulator.gpu_memory_gb",
    "--emulate-gpus": "emulator.gpus",
    "--emulate-decode-tokens-per-s": "emulator.decode_tokens_per_s",
    "--emulate-spec-accept-length": "emulator.spec_accept_length",
    "--emulate-spec-draft-cost": "emulator.spec_draft_cost",
    "--emulate-spec-verify-cost": "emulator.spec_verify_cost",
}
_PER_PHASE_GRAPH_FLAGS = ("--disable-decode-cuda-graph", "--disable-prefill-cuda-graph")
# argparse's test for a negative number that is a value, not an option (Lib/argparse.py).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# --- problems --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile: the field (``server.port``, ``server.extra_args[2]``), what is
    wrong, the TOML line when known, and whether it stops a launch (``error``) or not (``warning``)."""

    field: str
    message: str
    line: int | None = None
    severity: str = "error"  # "error" | "warning"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.field}: {self.message}{where}"


class ProfileError(Exception):
    """A profile that cannot be loaded or used; ``.problems`` lists every reason.

    ``.profile`` is what could be read despite the problems (None for a TOML syntax error or a missing
    file), so that `validate_profile` can still report the machine-dependent problems of a broken file.
    """

    def __init__(
        self, problems: list[Problem], source: str | Path | None = None, profile: LaunchProfile | None = None
    ) -> None:
        self.problems = list(problems)
        self.profile = profile
        self.source = str(source) if source is not None else None
        head = f"invalid profile {self.source}" if self.source else "invalid profile"
        super().__init__("\n".join([head + ":"] + [f"  {p}" for p in self.problems]))


# --- the profile -----------------------------------------------------------------------------------------


def _default_python() -> str:
    return sys.executable


@dataclass(frozen=True)
class ServerSection:
    launcher: str = "sglang"
    python: str = field(default_factory=_default_python)
    model_path: str = ""
    tp_size: int = 1
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    attention_backend: str | None = None
    cuda_graph: bool = True
    mem_fraction_static: float | None = None
    radix_cache: bool = True
    chunked_prefill_size: int | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureSection:
    enabled: bool = False
    layers: tuple[int, ...] | None = None  # physical capture points; None = SGLang's default
    dir: str | None = None
    rid_prefix: str = "eagle3-"


@dataclass(frozen=True)
class WatchSection:
    stall_after_s: float = 300.0


@dataclass(frozen=True)
class EmulatorSection:
    time_scale: float = 0.05
    fault: str = "none"
    gpu_memory_gb: float | None = None  # real GPU memory each emulated rank holds (needs torch + a GPU)
    gpus: int = 8  # emulated GPU count
    decode_tokens_per_s: float = 90.0  # single-stream decode rate (a batch-1 step lasts 1/this seconds)
    # Speculative decoding (EAGLE3 with a draft): mean accepted tokens per verify step, the bonus token
    # included (1 .. num-draft-tokens); one draft forward's cost as a fraction of a decode step (default:
    # from the draft's config); a verify step's cost in decode steps (>= 1).
    spec_accept_length: float | None = None
    spec_draft_cost: float | None = None
    spec_verify_cost: float | None = None


_SECTION_TYPES: dict[str, type] = {
    "server": ServerSection,
    "capture": CaptureSection,
    "watch": WatchSection,
    "emulator": EmulatorSection,
}

# Expected TOML type of each key.  "float" accepts integers too; lists are arrays of one type.
_KINDS: dict[str, dict[str, str]] = {
    "server": {
        "launcher": "str",
        "python": "str",
        "model_path": "str",
        "tp_size": "int",
        "host": "str",
        "port": "int",
        "attention_backend": "str",
        "cuda_graph": "bool",
        "mem_fraction_static": "float",
        "radix_cache": "bool",
        "chunked_prefill_size": "int",
        "extra_args": "list[str]",
        "env": "table[str]",
    },
    "capture": {"enabled": "bool", "layers": "list[int]", "dir": "str", "rid_prefix": "str"},
    "watch": {"stall_after_s": "float"},
    "emulator": {"time_scale": "float", "fault": "str", "gpu_memory_gb": "float", "gpus": "int",
                 "decode_tokens_per_s": "float", "spec_accept_length": "float", "spec_draft_cost": "float",
                 "spec_verify_cost": "float"},
}
# Keys that `to_toml` always writes (the rest only when set, changed from the default, or explicit).
_ALWAYS_WRITTEN = {
    "server": ("launcher", "python", "model_path", "tp_size", "host", "port", "cuda_graph"),
    "capture": ("enabled",),
    "watch": ("stall_after_s",),
    "emulator": ("time_scale", "fault"),
}


@dataclass(frozen=True)
class LaunchProfile:
    """A launch profile.  ``path`` is where it was loaded from (None when built in memory).

    ``explicit_keys`` holds the dotted keys the TOML (or `with_changes`) set on purpose, so that a rule can
    tell ``radix_cache = true`` written by the user from the default (DESIGN §5 refuses the former with
    capture).  ``key_lines`` maps dotted keys to TOML lines for messages.  Neither takes part in equality.
    """

    name: str
    server: ServerSection = field(default_factory=ServerSection)
    capture: CaptureSection = field(default_factory=CaptureSection)
    watch: WatchSection = field(default_factory=WatchSection)
    emulator: EmulatorSection = field(default_factory=EmulatorSection)
    path: Path | None = field(default=None, compare=False)
    explicit_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    key_lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def is_explicit(self, dotted_key: str) -> bool:
        return dotted_key in self.explicit_keys

    def line_of(self, dotted_key: str) -> int | None:
        return _line_of(self.key_lines, dotted_key)

    def to_toml(self) -> str:
        """The profile as TOML (loads back to an equal profile).  Comments of the source are not kept."""
        import tomli_w

        doc: dict[str, Any] = {}
        for section in SECTIONS:
            if section == "emulator" and self.server.launcher != "emulator" and not self._touched(section):
                continue
            values = self._section_doc(section)
            if values:
                doc[section] = values
        header = f"# eagle3-tui launch profile '{self.name}'\n"
        return header + tomli_w.dumps(doc)

    def _touched(self, section: str) -> bool:
        current, default = getattr(self, section), _SECTION_TYPES[section]()
        return any(
            getattr(current, f.name) != getattr(default, f.name) or f"{section}.{f.name}" in self.explicit_keys
            for f in dataclasses.fields(current)
        )

    def _section_doc(self, section: str) -> dict[str, Any]:
        current, default = getattr(self, section), _SECTION_TYPES[section]()
        out: dict[str, Any] = {}
        for f in dataclasses.fields(current):
            value = getattr(current, f.name)
            if value is None:
                continue
            wanted = (
                f.name in _ALWAYS_WRITTEN[section]
                or f"{section}.{f.name}" in self.explicit_keys
                or value != getattr(default, f.name)
            )
            if not wanted:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, dict):
                if not value and f"{section}.{f.name}" not in self.explicit_keys:
                    continue
                value = dict(value)
            out[f.name] = value
        return out

    def with_changes(self, **section_updates: Any) -> LaunchProfile:
        """A copy with some values changed: ``p.with_changes(server={"port": 30001}, emulator={...})``.

        A section may also be given as a whole section object; ``name=`` and ``path=`` change those.
        Changed keys become explicit.  Unknown sections or keys raise `ProfileError`; values are not
        checked here (`validate_profile` does that).
        """
        replacements: dict[str, Any] = {}
        explicit = set(self.explicit_keys)
        problems: list[Problem] = []
        for key, update in section_updates.items():
            if key in ("name", "path"):
                replacements[key] = Path(update) if key == "path" and update is not None else update
                continue
            if key not in _SECTION_TYPES:
                problems.append(Problem(key, f"unknown section (sections: {', '.join(SECTIONS)})"))
                continue
            current = getattr(self, key)
            if isinstance(update, _SECTION_TYPES[key]):
                new = update
            elif isinstance(update, Mapping):
                names = {f.name for f in dataclasses.fields(current)}
                unknown = [k for k in update if k not in names]
                for k in unknown:
                    problems.append(Problem(f"{key}.{k}", "unknown key" + _did_you_mean(k, names)))
                if unknown:
                    continue
                new = dataclasses.replace(current, **{k: _normalize(key, k, v) for k, v in update.items()})
            else:
                problems.append(Problem(key, f"must be a mapping of keys to values, not {type(update).__name__}"))
                continue
            for f in dataclasses.fields(new):
                if getattr(new, f.name) != getattr(current, f.name):
                    explicit.add(f"{key}.{f.name}")
            replacements[key] = new
        if problems:
            raise ProfileError(problems)
        return dataclasses.replace(self, explicit_keys=frozenset(explicit), **replacements)


def _normalize(section: str, key: str, value: Any) -> Any:
    """Lists become tuples, ints in float fields become floats, tables are copied (only when well typed)."""
    kind = _KINDS[section].get(key)
    if kind and kind.startswith("list[") and isinstance(value, list):
        return tuple(value)
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "table[str]" and isinstance(value, Mapping):
        return dict(value)
    return value


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
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.toml") if not p.name.startswith(".") and p.is_file())


def load_profile(name_or_path: str | Path, home: Home | None = None) -> LaunchProfile:
    """Load and check a profile; raises `ProfileError` listing every problem of the file."""
    path = profile_path(name_or_path, home)
    try:
        from sessions.safe_files import SpecialFileError, check_regular

        check_regular(path, "profile")
    except SpecialFileError as exc:
        raise ProfileError([Problem("profile", exc.strerror or str(exc))], path) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise ProfileError([Problem("profile", f"cannot read {path}: {exc.strerror or exc}")], path) from None
    if not path.is_file():
        if not path.exists() and path.parent.is_dir() and not isinstance(name_or_path, Path):
            known = [p.stem for p in sorted(path.parent.glob("*.toml"))]
            hint = f" (profiles there: {', '.join(known)})" if known else ""
            message = f"no profile file {path}{hint}"
        elif path.exists():
            message = f"{path} is not a file"
        else:
            message = f"no profile file {path}"
        raise ProfileError([Problem("profile", message)], path)
    try:
        from sessions.safe_files import read_regular_text

        text = read_regular_text(path, "profile")
    except UnicodeDecodeError as exc:
        raise ProfileError([Problem("toml", f"not UTF-8 text ({exc.reason} at byte {exc.start})")], path) from None
    except OSError as exc:
        raise ProfileError([Problem("profile", f"cannot read {path}: {exc.strerror or exc}")], path) from None
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
        if key not in _SECTION_TYPES:
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
    atomic_write_text(target, profile.to_toml(), mode=0o600)
    return target


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


def _did_you_mean(key: str, choices) -> str:
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


# --- the TOML line scanner -------------------------------------------------------------------------------


def toml_key_lines(text: str) -> dict[str, int]:
    """Dotted key → 1-based line where the TOML text defines it.

    Tables map their own path (``server.env``), keys map ``server.port``, array elements map
    ``server.extra_args[2]`` (the element's own line in a multi-line array).  Meant for text that tomllib
    has accepted; on anything else it returns what it found so far.
    """
    scanner = _TomlLineScanner(text)
    try:
        scanner.document()
    except (IndexError, ValueError):
        pass
    return scanner.lines


class _TomlLineScanner:
    _BARE = re.compile(r"[A-Za-z0-9_-]+")

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1
        self.lines: dict[str, int] = {}
        self.array_tables: dict[str, int] = {}

    # low level
    def _peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def _advance(self, n: int = 1) -> None:
        chunk = self.s[self.i : self.i + n]
        self.line += chunk.count("\n")
        self.i += len(chunk)

    def _skip(self, newlines: bool = False) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self._advance()
            elif c == "#":
                end = self.s.find("\n", self.i)
                self._advance((end if end != -1 else len(self.s)) - self.i)
            else:
                return

    def _record(self, path: str, line: int) -> None:
        self.lines.setdefault(path, line)

    # grammar
    def document(self) -> None:
        prefix = ""
        while True:
            self._skip(newlines=True)
            if self.i >= len(self.s):
                return
            start = self.i
            if self._peek(2) == "[[":
                line = self.line
                self._advance(2)
                base = self._key()
                self._skip()
                self._advance(2)
                index = self.array_tables.get(base, -1) + 1
                self.array_tables[base] = index
                prefix = f"{base}[{index}]"
                self._record(base, line)
                self._record(prefix, line)
            elif self._peek() == "[":
                line = self.line
                self._advance()
                prefix = self._key()
                self._skip()
                self._advance()
                self._record(prefix, line)
            else:
                self._keyval(prefix)
            if self.i == start:  # never loop without progress
                self._advance()

    def _keyval(self, prefix: str) -> None:
        line = self.line
        path = self._key(prefix)
        self._skip()
        if self._peek() != "=":
            raise ValueError("expected '='")
        self._advance()
        self._skip()
        self._record(path, line)
        self._value(path)

    def _key(self, prefix: str = "") -> str:
        parts: list[str] = [prefix] if prefix else []
        while True:
            self._skip()
            c = self._peek()
            if c == '"':
                parts.append(self._basic_string())
            elif c == "'":
                parts.append(self._literal_string())
            else:
                m = self._BARE.match(self.s, self.i)
                if not m:
                    raise ValueError("expected a key")
                parts.append(m.group(0))
                self._advance(len(m.group(0)))
            self._record(".".join(parts), self.line)
            self._skip()
            if self._peek() != ".":
                return ".".join(parts)
            self._advance()

    def _value(self, path: str) -> None:
        if self._peek(3) in ('"""', "'''"):
            quote = self._peek(3)
            self._advance(3)
            while self.i < len(self.s):
                if quote == '"""' and self._peek() == "\\":
                    self._advance(2)
                elif self._peek(3) == quote:
                    self._advance(3)
                    while self._peek() == quote[0]:  # up to two quotes may close the content
                        self._advance()
                    return
                else:
                    self._advance()
            return
        c = self._peek()
        if c == '"':
            self._basic_string()
        elif c == "'":
            self._literal_string()
        elif c == "[":
            self._advance()
            index = 0
            while True:
                self._skip(newlines=True)
                if self._peek() in ("]", ""):
                    self._advance()
                    return
                self._record(f"{path}[{index}]", self.line)
                self._value(f"{path}[{index}]")
                self._skip(newlines=True)
                if self._peek() == ",":
                    self._advance()
                    index += 1
        elif c == "{":
            self._advance()
            while True:
                self._skip()
                if self._peek() in ("}", ""):
                    self._advance()
                    return
                self._keyval(path)
                self._skip()
                if self._peek() == ",":
                    self._advance()
        else:
            m = re.compile(r"[^,\]}\n#]*").match(self.s, self.i)
            self._advance(len(m.group(0)) if m else 1)

    def _basic_string(self) -> str:
        self._advance()
        out = []
        while self.i < len(self.s) and self._peek() != '"':
            if self._peek() == "\\":
                out.append(self.s[self.i : self.i + 2])
                self._advance(2)
            else:
                out.append(self._peek())
                self._advance()
        self._advance()
        return "".join(out)

    def _literal_string(self) -> str:
        end = self.s.index("'", self.i + 1)
        value = self.s[self.i + 1 : end]
        self._advance(end + 1 - self.i)
        return value


def _line_of(lines: Mapping[str, int], dotted: str) -> int | None:
    """The line of ``dotted``, else of the nearest enclosing key (``a.b[2]`` → ``a.b`` → ``a``)."""
    key = dotted
    while key:
        if key in lines:
            return lines[key]
        if key.endswith("]") and "[" in key:
            key = key[: key.rindex("[")]
        elif "." in key:
            key = key[: key.rindex(".")]
        else:
            return None
    return None


# --- field checks (types and ranges) ---------------------------------------------------------------------


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return f"a {type(value).__name__}"


_KIND_TEXT = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "list[str]": "an array of strings",
    "list[int]": "an array of integers",
    "table[str]": "a table of strings",
}


def _scalar_ok(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def _type_problems(dotted: str, value: Any, kind: str, lines: Mapping[str, int]) -> list[Problem]:
    """Problems with the TOML type of one value (None means "not set" and is fine)."""
    if value is None:
        return []
    if kind in ("str", "int", "float", "bool"):
        if _scalar_ok(value, kind):
            return []
        return [Problem(dotted, f"must be {_KIND_TEXT[kind]}, not {_toml_type(value)}", _line_of(lines, dotted))]
    if kind.startswith("list["):
        if not isinstance(value, (list, tuple)):
            return [Problem(dotted, f"must be {_KIND_TEXT[kind]}, not {_toml_type(value)}", _line_of(lines, dotted))]
        elem = kind[5:-1]
        return [
            Problem(f"{dotted}[{i}]", f"must be {_KIND_TEXT[elem]}, not {_toml_type(v)}",
                    _line_of(lines, f"{dotted}[{i}]"))
            for i, v in enumerate(value)
            if not _scalar_ok(v, elem)
        ]
    if kind == "table[str]":
        if not isinstance(value, Mapping):
            return [Problem(dotted, f"must be a table, not {_toml_type(value)}", _line_of(lines, dotted))]
        out = []
        for k, v in value.items():
            key_path = f"{dotted}.{k}"
            if not isinstance(v, str):
                out.append(Problem(key_path, f"must be a string, not {_toml_type(v)} (quote it: {k} = \"{v}\")",
                                   _line_of(lines, key_path)))
        return out
    return []


def field_problems(profile: LaunchProfile) -> list[Problem]:
    """Types and ranges of every value: what a profile must satisfy on any machine."""
    lines = profile.key_lines
    problems: list[Problem] = []
    bad: set[str] = set()
    for section in SECTIONS:
        obj = getattr(profile, section)
        for key, kind in _KINDS[section].items():
            found = _type_problems(f"{section}.{key}", getattr(obj, key), kind, lines)
            if found:
                bad.add(f"{section}.{key}")
                problems += found

    def check(dotted: str, ok: Callable[[], bool], message: str, severity: str = "error") -> None:
        # ``ok`` runs only for a well-typed field: a range check never sees a string ("0.85" < 1.0).
        if dotted in bad or any(dotted.startswith((f + "[", f + ".")) for f in bad):
            return
        try:
            passed = ok()
        except (TypeError, ValueError, OverflowError):
            passed = False
        if not passed:
            problems.append(Problem(dotted, message, _line_of(lines, dotted), severity))

    problems += _text_problems(profile, bad)

    s, c, w, e = profile.server, profile.capture, profile.watch, profile.emulator
    check("server.launcher", lambda: s.launcher in LAUNCHERS,
          f"must be one of {', '.join(repr(x) for x in LAUNCHERS)}, not {s.launcher!r}")
    check("server.python", lambda: bool(str(s.python).strip()), "must name a Python interpreter")
    check("server.tp_size", lambda: isinstance(s.tp_size, int) and s.tp_size >= 1, f"must be at least 1, not {s.tp_size}")
    check("server.host", lambda: bool(str(s.host).strip()) and str(s.host).isascii()
          and str(s.host).isprintable() and not any(ch.isspace() for ch in str(s.host)),
          f"must be a host name or address, not {s.host!r}")
    check("server.port", lambda: isinstance(s.port, int) and 1 <= s.port <= 65535,
          f"must be between 1 and 65535, not {s.port}")
    if s.attention_backend is not None:
        check("server.attention_backend", lambda: bool(str(s.attention_backend).strip()),
              "must name a backend (leave it out for SGLang's automatic choice)")
    if s.mem_fraction_static is not None:
        check("server.mem_fraction_static",
              lambda: math.isfinite(s.mem_fraction_static) and 0.0 < s.mem_fraction_static < 1.0,
              f"must be between 0 and 1 (exclusive), not {s.mem_fraction_static}")
    if s.chunked_prefill_size is not None:
        check("server.chunked_prefill_size", lambda: s.chunked_prefill_size == -1 or s.chunked_prefill_size > 0,
              f"must be -1 (no chunking) or a positive token count, not {s.chunked_prefill_size}")
    if "server.extra_args" not in bad:
        for i, arg in enumerate(s.extra_args):
            check(f"server.extra_args[{i}]", lambda arg=arg: bool(arg), "is an empty argument")
    if "server.env" not in bad:
        for name in s.env:
            check(f"server.env.{name}", lambda name=name: bool(_ENV_NAME.match(name)),
                  f"{name!r} is not a valid environment variable name")
    if c.layers is not None and "capture.layers" not in bad:
        seen: set[int] = set()
        for i, layer in enumerate(c.layers):
            check(f"capture.layers[{i}]", lambda layer=layer: layer >= 0, f"must be a layer index >= 0, not {layer}")
            check(f"capture.layers[{i}]", lambda layer=layer: layer not in seen, f"layer {layer} is listed twice")
            seen.add(layer)
    if c.dir is not None:
        check("capture.dir", lambda: bool(str(c.dir).strip()), "must be a folder path (leave it out for the default)")
    check("capture.rid_prefix", lambda: bool(c.rid_prefix),
          "must not be empty: it selects which requests are dumped")
    check("watch.stall_after_s", lambda: _positive(w.stall_after_s), f"must be a number of seconds > 0, not {w.stall_after_s}")
    check("emulator.time_scale", lambda: _positive(e.time_scale), f"must be > 0, not {e.time_scale}")
    check("emulator.fault", lambda: e.fault in FAULT_IDS,
          f"unknown fault {e.fault!r}; known: {', '.join(FAULT_IDS)}")
    if e.gpu_memory_gb is not None:
        check("emulator.gpu_memory_gb", lambda: _positive(e.gpu_memory_gb), f"must be > 0, not {e.gpu_memory_gb}")
    check("emulator.gpus", lambda: isinstance(e.gpus, int) and e.gpus >= 1, f"must be at least 1, not {e.gpus}")
    if e.spec_accept_length is not None:
        tokens = _num_draft_tokens(s.extra_args) if isinstance(s.extra_args, (list, tuple)) else None
        check("emulator.spec_accept_length", lambda: e.spec_accept_length >= 1 and (tokens is None
              or e.spec_accept_length <= tokens),
              f"must be between 1 and the number of draft tokens ({tokens if tokens else 'num-draft-tokens'}), "
              f"not {e.spec_accept_length}: it counts the accepted drafts plus the bonus token of each step")
    if e.spec_draft_cost is not None:
        check("emulator.spec_draft_cost", lambda: 0 < e.spec_draft_cost <= 1,
              f"must be a fraction of a decode step in (0, 1], not {e.spec_draft_cost}")
    if e.spec_verify_cost is not None:
        check("emulator.spec_verify_cost", lambda: e.spec_verify_cost >= 1,
              f"must be at least 1 (a verify step costs at least a decode step), not {e.spec_verify_cost}")
    check("emulator.decode_tokens_per_s", lambda: _positive(e.decode_tokens_per_s),
          f"must be a rate in tokens per second > 0, not {e.decode_tokens_per_s}")
    if s.launcher == "emulator" and "emulator.gpus" not in bad and "server.tp_size" not in bad:
        check("server.tp_size", lambda: s.tp_size <= e.gpus,
              f"TP {s.tp_size} needs {_gpus(s.tp_size)} but the emulator has {e.gpus} (emulator.gpus)")
    return problems


def _num_draft_tokens(extra_args: tuple[str, ...] | list[str]) -> int | None:
    """Tokens per verify step that SGLang will use for these flags (topk 1: steps + 1), None if unknown."""

    def value(flag: str) -> int | None:
        found = None
        for i, token in enumerate(extra_args):
            text = extra_args[i + 1] if token == flag and i + 1 < len(extra_args) else (
                token[len(flag) + 1:] if token.startswith(flag + "=") else None)
            if text is not None:
                try:
                    found = int(text)
                except ValueError:
                    found = None
        return found

    steps, topk = value("--speculative-num-steps"), value("--speculative-eagle-topk")
    if steps is not None and topk == 1:
        return steps + 1
    return value("--speculative-num-draft-tokens")


# C0/C1 control characters and DEL; a NUL can never reach exec, a path or the environment.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 255


def _text_problems(profile: LaunchProfile, bad: set[str]) -> list[Problem]:
    """NULs and control characters in any text field, and overlong paths, named by field (before anything
    hands the value to the OS, which would raise ``embedded null byte`` or ``File name too long``)."""
    lines = profile.key_lines
    problems: list[Problem] = []

    def visit(dotted: str, value: str, allow_newline: bool = False, path: bool = False) -> None:
        if dotted in bad:
            return
        if "\x00" in value:
            problems.append(Problem(dotted, f"holds a NUL character at position {value.index(chr(0))}",
                                    _line_of(lines, dotted)))
            bad.add(dotted)
            return
        found = _CONTROL.search(value if not allow_newline else value.replace("\n", "").replace("\t", ""))
        if found:
            problems.append(Problem(dotted, f"holds the control character {found.group(0)!r}",
                                    _line_of(lines, dotted)))
            bad.add(dotted)
            return
        if path and (len(value) > MAX_PATH_CHARS or any(len(part) > MAX_NAME_CHARS for part in value.split("/"))):
            problems.append(Problem(dotted, f"is too long for a path ({len(value)} characters; the OS allows "
                                    f"{MAX_PATH_CHARS}, {MAX_NAME_CHARS} per name)", _line_of(lines, dotted)))
            bad.add(dotted)

    for section in SECTIONS:
        obj = getattr(profile, section)
        for key, kind in _KINDS[section].items():
            dotted, value = f"{section}.{key}", getattr(obj, key)
            if dotted in bad or value is None:
                continue
            is_path = key in ("model_path", "python", "dir", "tokenizer_path")
            if kind == "str" and isinstance(value, str):
                visit(dotted, value, path=is_path)
            elif kind == "list[str]" and isinstance(value, (list, tuple)):
                for n, item in enumerate(value):
                    if isinstance(item, str):
                        visit(f"{dotted}[{n}]", item)
            elif kind == "table[str]" and isinstance(value, Mapping):
                for name, item in value.items():
                    visit(f"{dotted}.{name}", str(name))
                    if isinstance(item, str):
                        visit(f"{dotted}.{name}", item, allow_newline=True)  # a secret may hold a newline
    return problems


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


# --- the model's config.json -----------------------------------------------------------------------------


class ModelConfigError(ValueError):
    """config.json is missing, unreadable or not a JSON object."""


@dataclass(frozen=True)
class ModelShape:
    """What eagle3-tui needs from a model's config.json.  Multimodal wrappers such as Kimi-K2.5
    (``KimiK25ForConditionalGeneration``) keep the text model's keys under ``text_config``: those are
    read from there, while ``architecture`` and ``model_type`` stay the wrapper's own."""

    architecture: str | None
    num_hidden_layers: int | None
    hidden_size: int | None
    model_type: str | None
    text_model_type: str | None = None
    text_config_nested: bool = False


def read_model_config(model_path: str | Path) -> ModelShape:
    """Read ``<model_path>/config.json`` (both flat and ``text_config``-nested shapes)."""
    from sessions.safe_files import SpecialFileError, read_regular_text

    path = Path(model_path).expanduser() / "config.json"
    try:
        raw = json.loads(read_regular_text(path, "model config"))  # a FIFO or /dev/zero: refused at once
    except FileNotFoundError:
        raise ModelConfigError(f"{path} does not exist") from None
    except SpecialFileError as exc:
        raise ModelConfigError(exc.strerror) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise ModelConfigError(f"{path} is nested too deeply to read") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{path} must hold a JSON object")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}

    def pick(key: str, kind: type) -> Any:
        for source in (raw, text):
            value = source.get(key)
            if isinstance(value, kind) and not isinstance(value, bool):
                return value
        return None

    archs = raw.get("architectures") or text.get("architectures") or []
    architecture = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    return ModelShape(
        architecture=architecture,
        num_hidden_layers=pick("num_hidden_layers", int),
        hidden_size=pick("hidden_size", int),
        model_type=raw.get("model_type") if isinstance(raw.get("model_type"), str) else None,
        text_model_type=text.get("model_type") if isinstance(text.get("model_type"), str) else None,
        text_config_nested=bool(text) and not isinstance(raw.get("num_hidden_layers"), int),
    )


# --- argv and env ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchCommand:
    """What a launch runs: ``argv`` and the variables added to (or changed in) the inherited environment."""

    argv: list[str]
    env_changes: dict[str, str]

    def shell_text(self, redacted: bool = True) -> str:
        """``KEY=value`` lines for the env changes, then the ``shlex.join``-ed command.  With ``redacted``,
        secret env values (by name or by shape) and secret flag values are replaced by ``***``, also where
        a secret value reappears elsewhere in the command."""
        known = secret_values(self.env_changes) if redacted else []
        lines = []
        for name, value in self.env_changes.items():
            if redacted:
                value = REDACTED if (is_secret_name(name) and value) else redact_text(value, known)
            lines.append(f"{name}={shlex.quote(value)}")
        argv = [redact_text(a, known) for a in redact_argv(self.argv)] if redacted else list(self.argv)
        lines.append(shlex.join(argv))
        return "\n".join(lines)


class _Lookup:
    """Sentinel: find the profile's SGLang when it matters."""


LOOKUP = _Lookup()


def build_command(profile: LaunchProfile, *, sglang: Any = LOOKUP) -> LaunchCommand:
    """The argv and env changes for ``profile``.

    ``sglang``: the `SglangSource` to consult for version-dependent spellings (per-phase CUDA graph
    flags); by default it is looked up in the profile's Python only when needed (``cuda_graph = false``),
    which runs that Python once (cached briefly) - call this off a UI thread.
    """
    s = profile.server
    module = EMULATOR_MODULE if s.launcher == "emulator" else SGLANG_MODULE
    argv = [
        os.path.expanduser(s.python),
        "-m",
        module,
        "--model-path",
        os.path.expanduser(s.model_path),
        "--tp-size",
        str(s.tp_size),
        "--host",
        s.host,
        "--port",
        str(s.port),
    ]
    if s.attention_backend:
        argv += ["--attention-backend", s.attention_backend]
    if not s.cuda_graph:
        argv += _cuda_graph_off_flags(profile, sglang)
    if s.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", _number(s.mem_fraction_static)]
    if not s.radix_cache:
        argv.append("--disable-radix-cache")
    if s.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(s.chunked_prefill_size)]
    argv += list(s.extra_args)
    env = dict(s.env)
    capture_argv, capture_env = _capture_additions(profile)
    argv += [a for a in capture_argv if not (a in _BARE_FLAGS_SET_BY_FIELDS and a in argv)]
    for name, value in capture_env.items():
        if name == "PYTHONPATH" and env.get(name):
            value = os.pathsep.join([value, env[name]])  # the plugin dir first; the user's entries kept
        env[name] = value
    if s.launcher == "emulator":
        e = profile.emulator
        argv += ["--time-scale", _number(e.time_scale), "--emulate-fault", e.fault]
        if e.gpu_memory_gb is not None:
            argv += ["--emulate-gpu-memory-gb", _number(e.gpu_memory_gb)]
        if e.gpus != EmulatorSection().gpus or profile.is_explicit("emulator.gpus"):
            argv += ["--emulate-gpus", str(e.gpus)]
        if e.decode_tokens_per_s != EmulatorSection().decode_tokens_per_s or profile.is_explicit(
            "emulator.decode_tokens_per_s"
        ):
            argv += ["--emulate-decode-tokens-per-s", _number(e.decode_tokens_per_s)]
        for flag, spec_value in (("--emulate-spec-accept-length", e.spec_accept_length),
                                 ("--emulate-spec-draft-cost", e.spec_draft_cost),
                                 ("--emulate-spec-verify-cost", e.spec_verify_cost)):
            if spec_value is not None:
                argv += [flag, _number(spec_value)]
    return LaunchCommand(argv=argv, env_changes=env)


# Valueless flags that both a profile field and capture may emit: emitted once.
_BARE_FLAGS_SET_BY_FIELDS = frozenset({"--disable-radix-cache"})


def _number(value: float) -> str:
    """``0.85`` → ``"0.85"``, ``2.0`` → ``"2"`` (what a person would type)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _cuda_graph_off_flags(profile: LaunchProfile, sglang: Any) -> list[str]:
    # 0.5.23 split CUDA graphs per phase; `--disable-cuda-graph` still works there but is deprecated
    # (sglang/srt/server_args.py:409-416, arg_groups/fields/exec_.py:662-669).  Older SGLang has only it.
    if isinstance(sglang, _Lookup):
        from sessions.sglang_source import find_sglang

        sglang = find_sglang(profile.server.python, env=_server_env(profile))
    if sglang is not None and all(sglang.has_flag(f) for f in _PER_PHASE_GRAPH_FLAGS):
        return list(_PER_PHASE_GRAPH_FLAGS)
    return ["--disable-cuda-graph"]


def _capture_additions(profile: LaunchProfile) -> tuple[list[str], dict[str, str]]:
    """Flags and env from the capture toggle (DESIGN §5), when capture is on."""
    if not profile.capture.enabled:
        return [], {}
    # No fallback: a capture profile that cannot get its flags must not launch as a plain server.
    from sessions.capture.toggle import capture_additions

    argv_extra, env_extra = capture_additions(profile)
    return list(argv_extra), dict(env_extra)


def _server_env(profile: LaunchProfile) -> dict[str, str]:
    """The environment the server will see: ours plus the profile's changes."""
    return {**os.environ, **profile.server.env}


# --- validation ------------------------------------------------------------------------------------------


def validate_profile(
    profile: LaunchProfile, check_port: bool = True, *, nvml_gpu_count: int | None = None
) -> list[Problem]:
    """Every problem that stops ``profile`` from launching here (errors) or deserves a look (warnings).

    ``nvml_gpu_count`` replaces the NVML device count (None: ask NVML; without NVML the check is skipped).
    """
    problems = list(field_problems(profile))
    bad_fields = {p.field for p in problems if p.is_error}

    def usable(*prefixes: str) -> bool:  # machine checks only look at well-formed values
        return not any(f == pre or f.startswith((pre + ".", pre + "[")) for f in bad_fields for pre in prefixes)

    s = profile.server

    def machine(field: str, check: Callable[[], list[Problem]]) -> None:
        # A check of this machine never tracebacks: what it could not look at is a problem of its field.
        try:
            problems.extend(check())
        except Exception as exc:  # noqa: BLE001 - validation answers, it never raises
            problems.append(Problem(field, f"cannot be checked: {type(exc).__name__}: {str(exc)[:200]}"))

    python_ok = False
    if usable("server.python"):
        found: list[Problem] = []
        machine("server.python", lambda: [] if _python_problems(profile, found) else found)
        python_ok = not found and not any(p.field == "server.python" for p in problems)
    if usable("server.model_path"):
        machine("server.model_path", lambda: _model_problems(profile))
    if usable("server.host"):
        machine("server.host", lambda: _host_problems(profile, check_port and usable("server.port")))
    if s.launcher == "sglang" and usable("server.tp_size", "server.env"):
        machine("server.tp_size", lambda: _gpu_problems(profile, nvml_gpu_count))
    if usable("server.extra_args", "server.env", "server.launcher"):
        machine("server.extra_args", lambda: _sglang_problems(profile, python_ok, bad_fields))
    if usable("capture", "server.launcher"):
        machine("capture", lambda: _capture_problems(profile))
    return [_with_line(p, profile) for p in problems]


def _with_line(problem: Problem, profile: LaunchProfile) -> Problem:
    if problem.line is not None or not profile.key_lines:
        return problem
    line = profile.line_of(problem.field)
    return dataclasses.replace(problem, line=line) if line else problem


def _python_problems(profile: LaunchProfile, problems: list[Problem]) -> bool:
    from sessions.sglang_source import resolve_python

    python = profile.server.python
    resolved = resolve_python(python)
    if resolved is None:
        problems.append(Problem("server.python", f"{python} is not an executable Python interpreter"))
        return False
    problem = python_version_problem(resolved)
    if problem is not None:
        problems.append(Problem("server.python", f"{python}: {problem}"))
        return False
    return True


PYTHON_CHECK_TIMEOUT_S = 10.0
MIN_PYTHON = (3, 10)
_PYTHON_PROBE = "import sys; print('eagle3-python', sys.version_info[0], sys.version_info[1])"


@functools.lru_cache(maxsize=32)  # one run per interpreter per process: validation runs on every edit
def python_version_problem(python: str) -> str | None:
    """None when ``python`` runs ``-c`` as a Python >= 3.10 would, else what is wrong (``/bin/sh`` is an
    executable but not a Python)."""
    import subprocess

    try:
        done = subprocess.run([python, "-c", _PYTHON_PROBE], capture_output=True, text=True,
                              timeout=PYTHON_CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return f"did not answer `-c` within {PYTHON_CHECK_TIMEOUT_S:g} s; is it a Python interpreter?"
    except (OSError, ValueError) as exc:
        return f"cannot be run: {getattr(exc, 'strerror', None) or exc}"
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 3 or words[0] != "eagle3-python":
        return "is not a Python interpreter (running it with -c did not print its version)"
    try:
        version = (int(words[1]), int(words[2]))
    except ValueError:
        return "is not a Python interpreter (running it with -c did not print its version)"
    if version < MIN_PYTHON:
        return f"is Python {version[0]}.{version[1]}; SGLang needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer"
    return None


def _model_problems(profile: LaunchProfile) -> list[Problem]:
    raw = profile.server.model_path
    if not raw:
        return [Problem("server.model_path", "is not set: give the model folder (the one with config.json)")]
    path = Path(os.path.expanduser(raw))
    if not path.exists():
        return [Problem("server.model_path", f"model folder {path} does not exist")]
    if not path.is_dir():
        return [Problem("server.model_path", f"{path} is not a folder")]
    if not (path / "config.json").is_file():
        return [Problem("server.model_path", f"{path} has no config.json")]
    try:
        shape = read_model_config(path)
    except ModelConfigError as exc:
        return [Problem("server.model_path", str(exc))]
    if shape.num_hidden_layers is None or shape.hidden_size is None:
        return [Problem("server.model_path",
                        f"{path / 'config.json'} has no num_hidden_layers/hidden_size (nor under text_config)",
                        severity="warning")]
    return []


def _host_problems(profile: LaunchProfile, check_port: bool) -> list[Problem]:
    import errno
    import socket

    s = profile.server
    problems = []
    host = s.host.strip("[]")
    if host in ("0.0.0.0", "::"):
        problems.append(Problem("server.host", f"{s.host} listens on every interface: anyone who can reach this "
                                "machine can use the server (use 127.0.0.1 unless you mean it)", severity="warning"))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind((host, 0))
    except socket.gaierror as exc:
        return problems + [Problem("server.host", f"cannot resolve {s.host!r}: {exc.strerror}")]
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            return problems + [Problem("server.host", f"{s.host} is not an address of this machine")]
        return problems + [Problem("server.host", f"cannot bind {s.host}: {exc.strerror or exc}")]
    finally:
        probe.close()
    if check_port:
        from sessions import probes

        if not probes.port_free(s.host, s.port):
            if s.port < 1024 and os.geteuid() != 0 and not probes.port_listening(s.host, s.port):
                message = f"port {s.port} is below 1024 and needs root"
            else:
                message = probes.describe_port_user(s.host, s.port) + "; pick another port or stop that server"
            problems.append(Problem("server.port", message))
    return problems


def visible_gpu_count(cuda_visible_devices: str | None, device_count: int) -> int:
    """How many GPUs CUDA will show, given ``CUDA_VISIBLE_DEVICES`` and the devices NVML sees.

    CUDA stops reading the list at the first invalid entry; UUIDs (``GPU-…``, ``MIG-…``) count as given.
    """
    if cuda_visible_devices is None:
        return device_count
    count, seen = 0, set()
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if re.fullmatch(r"\d+", entry):
            index = int(entry)
            if index >= device_count or index in seen:
                break
            seen.add(index)
        elif not entry.startswith(("GPU-", "MIG-")):
            break
        count += 1
    return count


def nvml_device_count() -> int | None:
    """The number of GPUs NVML sees, or None when NVML is not available (no driver, no library)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses or OSError without a driver
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _gpu_problems(profile: LaunchProfile, nvml_gpu_count: int | None) -> list[Problem]:
    count = nvml_gpu_count if nvml_gpu_count is not None else nvml_device_count()
    if count is None:
        return []
    cvd = profile.server.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    visible = visible_gpu_count(cvd, count)
    tp = profile.server.tp_size
    if tp <= visible:
        return []
    source = ""
    if cvd is not None:
        where = "server.env" if "CUDA_VISIBLE_DEVICES" in profile.server.env else "the environment"
        source = f", CUDA_VISIBLE_DEVICES={cvd!r} from {where}"
    return [Problem("server.tp_size",
                    f"TP {tp} needs {_gpus(tp)} but only {visible} {'is' if visible == 1 else 'are'} visible "
                    f"(NVML sees {count}{source})")]


def _sglang_problems(profile: LaunchProfile, python_ok: bool, bad_fields: set[str]) -> list[Problem]:
    from sessions.sglang_source import locate_sglang

    s = profile.server
    source = None
    if python_ok:
        location = locate_sglang(s.python, env=_server_env(profile))
        source = location.source
        if source is None and s.launcher == "sglang":
            return _extra_arg_problems(profile, None) + [Problem(
                "server.python", f"SGLang checks skipped (attention backend, extra flags): {location.reason}",
                severity="warning")]
    problems = []
    if source is not None and s.attention_backend and "server.attention_backend" not in bad_fields:
        choices = source.attention_backends()
        if choices is not None and s.attention_backend not in choices:
            problems.append(Problem(
                "server.attention_backend",
                f"{s.attention_backend!r} is not an attention backend of SGLang {source.version or '?'} "
                f"(at {source.root}){_did_you_mean(s.attention_backend, choices)}. "
                f"Choices: {', '.join(choices)}"))
    return problems + _extra_arg_problems(profile, source)


def _extra_arg_problems(profile: LaunchProfile, source: Any) -> list[Problem]:
    """Walk extra_args as SGLang's argparse would (``allow_abbrev=True``), reporting every bad token.

    Without a source (SGLang not found) only the flags that profile fields own are recognised, by their
    exact spelling.
    """
    from sessions.sglang_source import resolve_option

    args = list(profile.server.extra_args)
    flags = source.flags() if source is not None else None
    version = f"SGLang {source.version or '?'}" if source is not None else "SGLang"
    owned = dict(_FIELD_FLAGS)
    if profile.server.launcher == "emulator":
        owned.update(_EMULATOR_FLAGS)
    problems: list[Problem] = []
    i = 0
    while i < len(args):
        arg, where = args[i], f"server.extra_args[{i}]"
        i += 1
        if arg == "--":
            problems.append(Problem(where, "'--' ends the options, but SGLang takes no positional arguments"))
            continue
        if not _looks_like_option(arg):
            if flags is not None:
                problems.append(Problem(where, f"{arg!r} follows no flag that takes a value ({version} would "
                                        "stop with 'unrecognized arguments')"))
            continue
        option, eq, inline = arg.partition("=")
        if flags is None or (option in owned and option not in flags):
            field_name = owned.get(option)
            if field_name is None:
                continue
            values = [inline] if eq else []
            if not eq and field_name not in _SWITCH_FIELDS and i < len(args) and not _looks_like_option(args[i]):
                values.append(args[i])
                i += 1
            problems += _owned_flag_problems(where, option, field_name, values, profile)
            continue
        flag, candidates = resolve_option(arg, flags)
        if flag is None:
            if candidates:
                shown = ", ".join(candidates[:8]) + (f" (+{len(candidates) - 8} more)" if len(candidates) > 8 else "")
                problems.append(Problem(where, f"{option} is ambiguous in {version}: it could be {shown}; "
                                        "spell the flag out"))
            else:
                problems.append(Problem(where, f"{version} has no flag {option}" + _did_you_mean(option, flags)))
            while i < len(args) and not _looks_like_option(args[i]):
                i += 1  # most likely the bad flag's own values: one report is enough
            continue
        info = flags[flag]
        if eq:
            values = [inline]
            if not info.takes_value:
                problems.append(Problem(where, f"{flag} takes no value ({arg!r})"))
        else:
            values = []
            most = 1 if info.nargs in (None, "?") else len(args)
            while info.takes_value and i < len(args) and len(values) < most and not _looks_like_option(args[i]):
                values.append(args[i])
                i += 1
            if info.takes_value and not values and info.nargs in (None, "+"):
                wanted = "a value" if info.nargs is None else "one or more values"
                problems.append(Problem(where, f"{flag} expects {wanted}"))
        if info.takes_value:
            problems += _choice_problems(where, flag, values, info)
        field_name = owned.get(flag) or owned.get(info.canonical)
        if field_name is not None:
            problems += _owned_flag_problems(where, option, field_name, values, profile)
    return problems


def _looks_like_option(arg: str) -> bool:
    return arg.startswith("-") and not _NEGATIVE_NUMBER.match(arg)


# Profile fields that emit a valueless switch (the flag is emitted when the field is false).
_SWITCH_FIELDS = frozenset({"server.radix_cache", "server.cuda_graph"})


def _emitted_value(profile: LaunchProfile, field_name: str) -> str | bool | None:
    """What the command already says for a field's flag: its value, for switches whether the flag is
    emitted, None when the field is unset (the flag is not emitted)."""
    s, e = profile.server, profile.emulator
    if field_name == "server.radix_cache":
        return not s.radix_cache
    if field_name == "server.cuda_graph":
        return not s.cuda_graph
    value = {
        "server.model_path": os.path.expanduser(s.model_path),
        "server.tp_size": s.tp_size,
        "server.host": s.host,
        "server.port": s.port,
        "server.attention_backend": s.attention_backend,
        "server.mem_fraction_static": s.mem_fraction_static,
        "server.chunked_prefill_size": s.chunked_prefill_size,
        "emulator.time_scale": e.time_scale,
        "emulator.fault": e.fault,
        "emulator.gpu_memory_gb": e.gpu_memory_gb,
        "emulator.gpus": e.gpus,
        "emulator.decode_tokens_per_s": e.decode_tokens_per_s,
        "emulator.spec_accept_length": e.spec_accept_length,
        "emulator.spec_draft_cost": e.spec_draft_cost,
        "emulator.spec_verify_cost": e.spec_verify_cost,
    }[field_name]
    if value is None:
        return None
    return _number(value) if isinstance(value, float) else str(value)


def _same_value(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return os.path.expanduser(a) == os.path.expanduser(b)


def _owned_flag_problems(
    where: str, option: str, field_name: str, values: list[str], profile: LaunchProfile
) -> list[Problem]:
    """A flag that a profile field already produces: redundant (warning) or contradicting it (error).

    argparse keeps the last value, so extra_args would silently win over the field while eagle3-tui
    (probes, GPU and rank checks) still goes by the field.
    """
    emitted = _emitted_value(profile, field_name)
    if isinstance(emitted, bool):
        if emitted:
            return [Problem(where, f"{option} repeats {field_name} = false; drop it", severity="warning")]
        return [Problem(where, f"{option} contradicts {field_name} = true; set {field_name} = false instead")]
    if emitted is None:
        return [Problem(where, f"{option} does what {field_name} is for; set {field_name} instead, where it is "
                        "checked", severity="warning")]
    if not values:
        return []
    given = values[0]
    if _same_value(given, emitted):
        return [Problem(where, f"{option} {given} repeats {field_name}; drop it", severity="warning")]
    return [Problem(where, f"{option} {given} conflicts with {field_name} = {emitted}: SGLang would use {given} "
                    f"(the last value wins) while eagle3-tui goes by {emitted}; set {field_name} instead")]


def _choice_problems(where: str, flag: str, values: list[str], info: Any) -> list[Problem]:
    if not info.choices:
        return []
    return [
        Problem(where, f"{value!r} is not a valid choice for {flag} (choices: {', '.join(info.choices)})")
        for value in values
        if value not in info.choices
    ]


def _capture_problems(profile: LaunchProfile) -> list[Problem]:
    from sessions.capture.toggle import capture_problems

    return list(capture_problems(profile))
