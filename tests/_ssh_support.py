"""Real OpenSSH servers for the hosts tests: `sshd -D -e` children on 127.0.0.2 / 127.0.0.3.

`SshServer` generates its host key in tmp, writes an sshd_config (its own address and a free port, the
authorized keys in tmp, StrictModes and PAM off, password logins off), starts ``sshd -D -e -f cfg`` as
a child in its own session, waits until the port accepts, and stops it by pid: the listener and the
per-connection sshd processes under it (killing only the listener would leave open connections up).
`SshHosts` sets two of them up as hosts "h2" and "h3" of the test's home: an ssh_config with the test's
user key and its own known-hosts file, and a hosts.toml giving each host its own EAGLE3_TUI_HOME.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from sessions.home import Home
from sessions.remote.hosts import Host, load_hosts

SSHD = "/usr/sbin/sshd"
REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port_on(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "eagle3-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return path


class SshServer:
    def __init__(self, folder: Path, address: str, authorized_key: Path, password_auth: bool = False) -> None:
        self.folder = folder
        self.address = address
        self.port = free_port_on(address)
        folder.mkdir(parents=True, exist_ok=True)
        self.host_key = keygen(folder / "host_key")
        self.authorized = folder / "authorized_keys"
        self.authorized.write_text(authorized_key.read_text())
        self.config = folder / "sshd_config"
        self.log = folder / "sshd.log"
        self.password_auth = password_auth
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self) -> None:
        self.config.write_text("\n".join([
            f"ListenAddress {self.address}:{self.port}",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.authorized}",
            f"PidFile {self.folder / 'sshd.pid'}",
            "StrictModes no",
            "UsePAM no",
            f"PasswordAuthentication {'yes' if self.password_auth else 'no'}",
            f"KbdInteractiveAuthentication {'yes' if self.password_auth else 'no'}",
            "PermitRootLogin yes" if self.password_auth else "PermitRootLogin prohibit-password",
            "LogLevel VERBOSE",
            "",
        ]))

    def start(self) -> SshServer:
        if not os.access(SSHD, os.X_OK):
            raise RuntimeError(f"{SSHD} is missing: install Debian's openssh-server (.ci/run does)")
        if os.geteuid() == 0:  # sshd run by root wants its privilege-separation folder (systemd makes it)
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.write_config()
        log = self.log.open("ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while True:  # the event: the port accepts a connection
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd ended at once (exit {self.proc.returncode}): {self.log.read_text()[-2000:]}")
            with socket.socket() as sock:
                sock.settimeout(1)
                if sock.connect_ex((self.address, self.port)) == 0:
                    return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not listen on {self.address}:{self.port}: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def _processes(self) -> list[psutil.Process]:
        """The listener and the per-connection sshd processes under it."""
        assert self.proc is not None
        parent = psutil.Process(self.proc.pid)
        return [parent, *(p for p in parent.children(recursive=True) if _is_sshd(p))]

    def pause(self) -> None:
        """SIGSTOP every sshd of this server: the host hangs (connections stay open, nothing answers)."""
        for p in self._processes():
            p.suspend()

    def resume(self) -> None:
        for p in self._processes():
            p.resume()

    def stop(self) -> None:
        """SIGKILL the listener and every sshd under it (the connections), by pid; reap the child."""
        if self.proc is None:
            return
        victims = []
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(self.proc.pid)
            victims = [p for p in parent.children(recursive=True) if _is_sshd(p)]
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.kill()
        self.proc.wait(timeout=10)
        psutil.wait_procs(victims, timeout=10)
        self.proc = None


def _is_sshd(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.name() == "sshd" or (proc.cmdline()[:1] or [""])[0].startswith("sshd")
    return False


def cli_path(folder: Path) -> Path:
    """The CLI the hosts run: a wrapper of this Python's ``-m app`` (this checkout, this version: ``-m`` finds
    ``app`` in the working directory; hosts.toml's PYTHONPATH reaches it on stdin, ``--env-stdin``)."""
    path = folder / "eagle3-tui"
    path.write_text(f"#!/bin/sh\ncd {REPO_ROOT} || exit 127\nexec {sys.executable} -m app \"$@\"\n")
    path.chmod(0o755)
    return path


class SshHosts:
    """Hosts h2 (127.0.0.2) and h3 (127.0.0.3) of ``home``, each a real sshd with its own home."""

    def __init__(self, tmp: Path, home: Home) -> None:
        self.tmp = tmp
        self.home = home
        tmp.mkdir(parents=True, exist_ok=True)
        self.user_key = keygen(tmp / "user_key")
        self.known_hosts = tmp / "known_hosts"
        self.cli = cli_path(tmp)
        self.servers = {
            "h2": SshServer(tmp / "sshd-h2", "127.0.0.2", Path(f"{self.user_key}.pub")),
            "h3": SshServer(tmp / "sshd-h3", "127.0.0.3", Path(f"{self.user_key}.pub")),
        }
        self.homes = {name: Home(tmp / f"home-{name}" / "config", tmp / f"home-{name}" / "state").ensure()
                      for name in self.servers}
        self.ssh_config = tmp / "ssh_config"
        self.write_ssh_config()
        self.write_hosts()

    def write_ssh_config(self) -> None:
        blocks = []
        for name, server in self.servers.items():
            blocks.append("\n".join([
                f"Host {name}",
                f"  HostName {server.address}",
                f"  Port {server.port}",
                "  User root" if os.geteuid() == 0 else f"  User {os.environ.get('USER', 'nobody')}",
                f"  IdentityFile {self.user_key}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {self.known_hosts}",
                "  StrictHostKeyChecking accept-new",
                "  LogLevel ERROR",
            ]))
        self.ssh_config.write_text("\n".join(blocks) + "\n")

    def write_hosts(self, cli: dict[str, Path] | None = None) -> None:
        lines = []
        for name in self.servers:
            exe = (cli or {}).get(name, self.cli)
            remote_home = self.homes[name].config_root.parent
            lines += [f"[hosts.{name}]", f'ssh = "{name}"', f'eagle3_tui = "{exe}"', f'ssh_config = "{self.ssh_config}"',
                      f'env = {{ EAGLE3_TUI_HOME = "{remote_home}", PYTHONPATH = "{REPO_ROOT}" }}', ""]
        (self.home.config_root / "hosts.toml").write_text("\n".join(lines))

    def host(self, name: str) -> Host:
        return load_hosts(self.home)[name]

    def start(self) -> SshHosts:
        for server in self.servers.values():
            server.start()
        return self

    def stop(self) -> None:
        from sessions.remote.link import SshLink

        for name, server in self.servers.items():
            with contextlib.suppress(Exception):
                SshLink(self.host(name), self.home).close()  # the shared connection's master ends
            server.stop()
