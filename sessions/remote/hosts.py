"""`<config>/hosts.toml`: the other hosts the panel reaches over SSH.

One table per host::

    [hosts.gpu2]
    ssh = "gpu2"                          # a ~/.ssh/config alias, or user@host:port
    eagle3_tui = "/opt/venv/bin/eagle3-tui"  # the CLI there (default: eagle3-tui on its PATH)
    env = { EAGLE3_TUI_HOME = "/scratch/me/e3" }  # set in our CLI's environment there (never argv)
    ssh_config = "~/.ssh/config.lab"      # optional: an ssh_config file (`ssh -F`)

Bad input is an error naming the file, the line and what is wrong, as the profile loader does.  The name
``local`` is reserved for this machine.

A host's ``env`` never travels on a command line (``ps`` shows every process's argv to every user of a
host, and the local ``ssh`` process's argv holds the remote command): the remote command is
``<eagle3_tui> --env-stdin ARGV`` and the variables go first on its stdin, as one JSON line (`env_line`),
before whatever else the command reads there (a profile's TOML).  Our CLI there reads that line
(`read_env_line`), sets the variables in its own environment (so in every server it starts) and names them
in ``EAGLE3_TUI_HOST_ENV``, so a launch there records their secret values for redaction (`host_env_of`).
"""
from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.home import Home

LOCAL = "local"  # the host name of this machine; never a table of hosts.toml
HOSTS_FILE = "hosts.toml"
DEFAULT_CLI = "eagle3-tui"
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# user@host, host, user@host:port, host:port, [v6]:port; no spaces, no leading "-" (it would be an option)
_SSH_TARGET = re.compile(r"^(?!-)[^\s@]+@?[^\s@]*$")
_KEYS = ("ssh", "eagle3_tui", "env", "ssh_config")
ENV_STDIN_FLAG = "--env-stdin"  # our CLI's option: the first line of stdin is the host's env (JSON)
HOST_ENV_NAMES = "EAGLE3_TUI_HOST_ENV"  # set there: the names that line set, comma separated
_ENV_LINE_MAX = 1 << 20


@dataclass(frozen=True)
class Host:
    """One other host: how to reach it and where our CLI is there."""

    name: str
    ssh: str  # a ~/.ssh/config alias or user@host[:port]
    eagle3_tui: str = DEFAULT_CLI
    env: Mapping[str, str] = field(default_factory=dict)
    ssh_config: str | None = None  # an ssh_config file for `ssh -F` (None: the user's own)

    def destination(self) -> tuple[str, int | None]:
        """``ssh``'s destination and port: ``user@host:2222`` -> (``user@host``, 2222); an alias as is."""
        target = self.ssh
        if target.startswith("[") and "]:" in target:  # [::1]:22
            host, _, port = target[1:].partition("]:")
            return host, int(port)
        head, sep, port = target.rpartition(":")
        if sep and port.isdigit() and ":" not in head:
            return head, int(port)
        return target, None

    def remote_argv(self, argv: list[str]) -> list[str]:
        """The command run there: ``<eagle3_tui> [--env-stdin] ARGV``; the env's values are never in it."""
        return [self.eagle3_tui, *([ENV_STDIN_FLAG] if self.env else []), *argv]

    def stdin_text(self, input: str | None) -> str | None:
        """What the command there gets on stdin: the env line first (with ``--env-stdin``), then ``input``."""
        if not self.env:
            return input
        return env_line(self.env) + (input or "")


def env_line(env: Mapping[str, str]) -> str:
    """The one line ``--env-stdin`` reads: ``{"env": {...}}`` and a newline (JSON escapes any newline in a
    value, so the line ends where the env ends)."""
    return json.dumps({"env": dict(env)}, separators=(",", ":")) + "\n"


class EnvLineError(ValueError):
    """The ``--env-stdin`` line is missing or malformed; the message says what is wrong."""


def read_env_line(fd: int = 0) -> dict[str, str]:
    """Read the env line from ``fd`` one byte at a time (nothing after the newline is consumed: a profile's
    TOML that follows is still there for the command) and check it."""
    raw = bytearray()
    while True:
        byte = os.read(fd, 1)
        if not byte:
            raise EnvLineError(f"{ENV_STDIN_FLAG}: stdin ended before the environment line"
                               + (f" ({len(raw)} bytes, no newline)" if raw else ""))
        if byte == b"\n":
            break
        raw += byte
        if len(raw) > _ENV_LINE_MAX:
            raise EnvLineError(f"{ENV_STDIN_FLAG}: the environment line is over {_ENV_LINE_MAX} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EnvLineError(f"{ENV_STDIN_FLAG}: the environment line is not JSON ({exc})") from None
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        raise EnvLineError(f'{ENV_STDIN_FLAG}: the environment line must be {{"env": {{NAME: VALUE}}}}')
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise EnvLineError(f"{ENV_STDIN_FLAG}: {name!r} is not a variable name")
        if not isinstance(value, str) or "\0" in value:
            raise EnvLineError(f"{ENV_STDIN_FLAG}: the value of {name} must be a string without NUL")
    return env


def host_env_of(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables an ``--env-stdin`` line set in this process (by the names it recorded)."""
    names = [n for n in environ.get(HOST_ENV_NAMES, "").split(",") if n]
    return {n: environ[n] for n in names if n in environ}


class HostsError(Exception):
    """hosts.toml cannot be used; the message names the file, the line and each problem."""

    def __init__(self, path: Path, problems: list[tuple[str, int | None]]) -> None:
        self.path = path
        self.problems = problems
        lines = [f"  {what}" + (f" (line {line})" if line else "") for what, line in problems]
        super().__init__("\n".join([f"invalid hosts file {path}:", *lines]))


def hosts_path(home: Home) -> Path:
    return home.config_root / HOSTS_FILE


def load_hosts(home: Home) -> dict[str, Host]:
    """The hosts of ``<config>/hosts.toml`` by name ({} when there is no such file); `HostsError` lists
    every problem of a bad file at once."""
    path = hosts_path(home)
    try:
        text = safe_files.read_text(path, safe_files.PROFILE)  # a FIFO or a huge file: refused at once
    except FileNotFoundError:
        return {}
    except safe_files.FileRefused as exc:
        raise HostsError(path, [(str(exc), None)]) from None
    except OSError as exc:
        raise HostsError(path, [(f"cannot read: {exc.strerror or exc}", None)]) from None
    return parse_hosts(text, path)


def parse_hosts(text: str, path: Path) -> dict[str, Host]:
    from sessions.profiles.toml_lines import toml_key_lines

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)\s*$", str(exc))
        if m:
            raise HostsError(path, [(f"TOML syntax: {str(exc)[: m.start()]} (column {m.group(2)})",
                                     int(m.group(1)))]) from None
        raise HostsError(path, [(f"TOML syntax: {exc}", None)]) from None
    try:
        lines = toml_key_lines(text)
    except RecursionError:
        lines = {}
    problems: list[tuple[str, int | None]] = []

    def line(key: str) -> int | None:
        return lines.get(key)

    for key in data:
        if key != "hosts":
            problems.append((f"{key}: unknown key (hosts go in [hosts.NAME] tables)", line(key)))
    table = data.get("hosts", {})
    if not isinstance(table, dict):
        problems.append(("hosts: must be a table of [hosts.NAME] tables", line("hosts")))
        table = {}
    hosts: dict[str, Host] = {}
    for name, raw in table.items():
        where = f"hosts.{name}"
        if name == LOCAL:
            problems.append((f"{where}: the name {LOCAL!r} is reserved for this machine", line(where)))
            continue
        if not _HOST_NAME.match(name):
            problems.append((f"{where}: a host name is letters, digits, '.', '_' or '-' (64 at most)", line(where)))
            continue
        if not isinstance(raw, dict):
            problems.append((f"{where}: must be a table ([{where}])", line(where)))
            continue
        found = _host_problems(where, raw, line)
        problems += found
        if not found:
            hosts[name] = Host(
                name=name, ssh=raw["ssh"], eagle3_tui=raw.get("eagle3_tui", DEFAULT_CLI),
                env=dict(raw.get("env", {})), ssh_config=raw.get("ssh_config"),
            )
    if problems:
        raise HostsError(path, problems)
    return hosts


def _host_problems(where: str, raw: dict[str, Any], line: Any) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for key in raw:
        if key not in _KEYS:
            out.append((f"{where}.{key}: unknown key (keys: {', '.join(_KEYS)})", line(f"{where}.{key}")))
    ssh = raw.get("ssh")
    if ssh is None:
        out.append((f"{where}.ssh: missing (a ~/.ssh/config alias or user@host:port)", line(where)))
    elif not isinstance(ssh, str) or not _SSH_TARGET.match(ssh):
        out.append((f"{where}.ssh: must be a ~/.ssh/config alias or user@host:port, not {ssh!r}",
                    line(f"{where}.ssh")))
    for key in ("eagle3_tui", "ssh_config"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip() or "\0" in value):
            out.append((f"{where}.{key}: must be a non-empty string, not {value!r}", line(f"{where}.{key}")))
    env = raw.get("env", {})
    if not isinstance(env, dict):
        out.append((f"{where}.env: must be a table of strings", line(f"{where}.env")))
    else:
        for k, v in env.items():
            if not _ENV_NAME.match(k):
                out.append((f"{where}.env.{k}: not a variable name", line(f"{where}.env.{k}")))
            elif not isinstance(v, str) or "\0" in v:
                out.append((f"{where}.env.{k}: must be a string", line(f"{where}.env.{k}")))
    return out
