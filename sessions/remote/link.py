"""How a command reaches a host: `SshLink` (the user's own OpenSSH client) or `LocalLink` (this machine).

Both run an argv of our own CLI (``[\"status\", \"--json\"]``) and hand back a `CompletedProcess`; neither
ever uses a shell here.  `SshLink` builds ``ssh [options] -- DEST 'eagle3-tui --env-stdin ARGV'`` where the
remote command is `shlex.join` of the argv (ssh always hands its command to the remote user's shell, so
the words are quoted for that shell), and the host's env goes first on the command's stdin
(`sessions.remote.hosts.env_line`): never in an argv, where ``ps`` would show it on either host.

Never a prompt: ``BatchMode=yes`` (no password, passphrase or host-key question), ``-T`` (no tty) and
stdin from /dev/null (or the text we send), so a host that wants something typed fails at once with
ssh's reason instead of waiting.  One connection per host is shared (``ControlMaster=auto``,
``ControlPersist``), its socket in a 0700 folder under the state dir; a socket path may have 108 bytes
at most, so a long state dir falls back to a short private folder under /tmp.
"""
from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Protocol

from sessions.home import Home, ensure_private_dir
from sessions.remote.hosts import Host

SSH = "ssh"
CONNECT_TIMEOUT_S = 5
SERVER_ALIVE_INTERVAL_S = 5
SERVER_ALIVE_COUNT = 2  # a dead peer is noticed after about 10 s, not TCP's minutes
CONTROL_PERSIST_S = 120
# sun_path is 108 bytes; ssh adds ".XXXXXXXXXXXXXXXX" (17) to the path while it sets the master up, and %C
# is 40 hex digits: the folder may have 108 - 1 - 40 - 17 - 1 = 49 bytes.
_SOCKET_DIR_MAX = 49


class HostLink(Protocol):
    """Runs our CLI's argv on one host."""

    def run(self, argv: list[str], timeout_s: float, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run and wait (at most ``timeout_s``: `subprocess.TimeoutExpired`); ``input`` goes to its stdin."""
        ...

    def popen(self, argv: list[str], input: str | None = None) -> subprocess.Popen[str]:
        """Start it with stdout and stderr piped (``logs -f``): the caller reads and ends it; ``input``
        goes to its stdin (else /dev/null)."""
        ...

    def close(self) -> None: ...


class LocalLink:
    """This machine: the argv runs with this Python's ``-m app`` (the same code and version)."""

    def __init__(self, env: dict[str, str] | None = None, cli: list[str] | None = None) -> None:
        self.env = env or {}
        self.cli = cli or [sys.executable, "-m", "app"]

    def _environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def run(self, argv: list[str], timeout_s: float, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.cli, *argv], input=input, stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout_s, env=self._environ(), check=False,
        )

    def popen(self, argv: list[str], input: str | None = None) -> subprocess.Popen[str]:
        return _started([*self.cli, *argv], input, env=self._environ())

    def close(self) -> None:
        pass


def _started(argv: list[str], input: str | None, **kwargs: Any) -> subprocess.Popen[str]:
    """A child with stdout/stderr piped and ``input`` written to its stdin by a thread (a large text must
    not block the caller on a full pipe), or stdin from /dev/null."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, **kwargs,
    )
    if input is not None and proc.stdin is not None:
        stdin = proc.stdin

        def feed() -> None:
            try:
                stdin.write(input)
                stdin.close()
            except OSError:  # it ended before reading everything: its exit status says why
                pass

        threading.Thread(target=feed, daemon=True).start()
    return proc


def control_dir(home: Home) -> Path:
    """The 0700 folder of the shared-connection sockets: ``<state>/ssh``, or ``/tmp/e3t-ssh-<uid>`` when
    that path is too long for a socket."""
    preferred = home.state_root / "ssh"
    if len(os.fsencode(preferred)) <= _SOCKET_DIR_MAX:
        return ensure_private_dir(preferred)
    short = Path(f"/tmp/e3t-ssh-{os.getuid()}")
    try:
        short.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(short)  # another user's folder or a symlink planted there: refuse, never share sockets
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{short} is not a private folder of this user: refusing to keep ssh sockets there")
    return short


class SshLink:
    """A host reached with the ``ssh`` binary (never a library, never a stored password)."""

    def __init__(self, host: Host, home: Home, ssh: str = SSH) -> None:
        self.host = host
        self.home = home
        self.ssh = ssh
        self._control = control_dir(home) / "%C"

    def ssh_argv(self, argv: list[str], *, master_check: str | None = None) -> list[str]:
        dest, port = self.host.destination()
        options = [
            "-o", "BatchMode=yes",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self._control}",
            "-o", f"ControlPersist={CONTROL_PERSIST_S}",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", f"ServerAliveInterval={SERVER_ALIVE_INTERVAL_S}",
            "-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT}",
            "-T",  # no tty: nothing there can ask a question
        ]
        if self.host.ssh_config:
            options = ["-F", os.path.expanduser(self.host.ssh_config), *options]
        if port is not None:
            options += ["-p", str(port)]
        if master_check is not None:  # `-O exit` / `-O check` talk to the master only
            return [self.ssh, *options, "-O", master_check, "--", dest]
        return [self.ssh, *options, "--", dest, shlex.join(self.host.remote_argv(argv))]

    def address(self, timeout_s: float = 10.0) -> str:
        """The host name ssh connects to: ``ssh -G`` (the configuration ssh would use, nothing is
        contacted) resolves an ~/.ssh/config alias to its ``HostName``; the other machines of a multi-node
        server reach this host there.  The destination's host part when ssh cannot say."""
        dest, _port = self.host.destination()
        fallback = dest.rpartition("@")[2]
        argv = [self.ssh, *(["-F", os.path.expanduser(self.host.ssh_config)] if self.host.ssh_config else []),
                "-G", "--", dest]
        try:
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return fallback
        for line in result.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key.lower() == "hostname" and value.strip():
                return value.strip()
        return fallback

    def run(self, argv: list[str], timeout_s: float, input: str | None = None) -> subprocess.CompletedProcess[str]:
        # The master that ssh forks for ControlPersist keeps no pipe of ours open (it detaches its stdio),
        # so the wait ends with the command.
        input = self.host.stdin_text(input)
        return subprocess.run(
            self.ssh_argv(argv), input=input, stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout_s, check=False, start_new_session=True,
        )

    def popen(self, argv: list[str], input: str | None = None) -> subprocess.Popen[str]:
        return _started(self.ssh_argv(argv), self.host.stdin_text(input), start_new_session=True)

    def close(self) -> None:
        """End the shared connection (its master exits); a host already gone is fine."""
        try:
            subprocess.run(self.ssh_argv([], master_check="exit"), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
