"""Secrets for another host never travel on a command line (issue 26): a real sshd "host" (tests/_ssh_support.py)
whose hosts.toml ``env`` holds a token, and a profile for it whose ``[server.env]`` holds another.  ``ps`` shows
every process's argv to every user of a machine, so while the remote launch and a remote ``logs -f`` run, every
process's ``/proc/PID/cmdline`` is read (the local ssh client, the sshd session, the shell and our CLI there, the
server it started: here they are all on this machine) and neither value may be in any of them.  The values
still reach the server's environment, and everything shown of the session hides them.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path
from typing import Self

from tests._extract_support import wait_for
from tests._ssh_support import REPO_ROOT
from tests.test_hosts import cli, emulator_profile

PY = sys.executable


def all_cmdlines() -> dict[int, bytes]:
    """Every process's argv as the kernel keeps it (what ``ps`` prints), by pid."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    found[int(entry.name)] = f.read()
            except OSError:  # it ended meanwhile
                continue
    return found


class CmdlineWatch:
    """Reads every process's cmdline again and again in a thread; ``hits``: pid -> argv holding a value."""

    def __init__(self, values: list[str]) -> None:
        self.values = [v.encode() for v in values]
        self.hits: dict[int, str] = {}
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def scan(self) -> None:
        for pid, argv in all_cmdlines().items():
            if any(v in argv for v in self.values):
                self.hits[pid] = argv.replace(b"\0", b" ").decode(errors="replace")[:400]
        self.scans += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scan()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def write_hosts_with_env(ssh_hosts, extra_env: dict[str, str]) -> None:
    """hosts.toml as tests/_ssh_support.py writes it, h2's env carrying ``extra_env`` as well."""
    lines = []
    for name in ssh_hosts.servers:
        env = {"EAGLE3_TUI_HOME": str(ssh_hosts.homes[name].config_root.parent), "PYTHONPATH": str(REPO_ROOT)}
        if name == "h2":
            env |= extra_env
        table = ", ".join(f'{k} = "{v}"' for k, v in env.items())
        lines += [f"[hosts.{name}]", f'ssh = "{name}"', f'eagle3_tui = "{ssh_hosts.cli}"',
                  f'ssh_config = "{ssh_hosts.ssh_config}"', f"env = {{ {table} }}", ""]
    (ssh_hosts.home.config_root / "hosts.toml").write_text("\n".join(lines))


def test_host_and_profile_env_never_appear_in_any_process_cmdline(ssh_hosts, home, cli_env, emulator_model_dir,
                                                                 free_port) -> None:
    from tests.conftest import LaunchedSessions

    host_token = "hf_" + secrets.token_hex(16)  # hosts.toml env: a credential by name and by shape
    profile_key = "k3y-" + secrets.token_hex(12)  # the profile's [server.env]: a secret by its name
    write_hosts_with_env(ssh_hosts, {"HF_TOKEN": host_token})
    profile = emulator_profile("sec", emulator_model_dir, free_port, host="h2") + \
        f'[server.env]\nWANDB_API_KEY = "{profile_key}"\n'
    (home.profiles_dir / "sec.toml").write_text(profile)
    remote_home = ssh_hosts.homes["h2"]
    remote = LaunchedSessions(remote_home)
    follower = None
    try:
        with CmdlineWatch([host_token, profile_key]) as watch:
            launched = cli(["launch", "sec", "--wait-ready", "--timeout", "120"], cli_env)
            assert launched.returncode == 0, launched.stderr
            session_id = launched.stdout.split()[0]
            session = remote.track(session_id)
            # A long-lived remote command: `logs -f` over ssh keeps the ssh client (and our CLI there) alive.
            follower = subprocess.Popen([PY, "-m", "app", "logs", session_id, "-f", "--host", "h2"],
                                        env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
            assert follower.stdout is not None
            first = follower.stdout.readline()  # it answers: ssh, sshd's session and the CLI there are up
            assert first, follower.stderr.read() if follower.stderr else "no output"
            ssh_pids = [pid for pid, argv in all_cmdlines().items()
                        if argv.startswith(b"ssh\0") and b"logs" in argv and session_id.encode() in argv]
            assert ssh_pids, "the remote logs -f runs through an ssh client"
            before = watch.scans
            wait_for(lambda: watch.scans >= before + 3, "three more scans of every cmdline", 60)
        assert watch.scans > 3
        assert watch.hits == {}, f"secret values in process command lines: {watch.hits}"

        # The values did reach the server there: its own environment (owner-only /proc/PID/environ).
        pid = session.state_record["pid"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"HF_TOKEN={host_token}".encode() in environ
        assert f"WANDB_API_KEY={profile_key}".encode() in environ
        # ... and every view of the session hides them: the session knows both values by value.
        known = json.loads((remote_home.sessions_dir / session_id / "secrets.json").read_text())
        assert host_token in json.dumps(known) and profile_key in json.dumps(known)
        shown = [cli(["status", session_id, "--json", "--host", "h2"], cli_env),
                 cli(["diagnose", session_id, "--json", "--no-stacks", "--host", "h2"], cli_env),
                 cli(["logs", session_id, "--host", "h2"], cli_env),
                 cli(["profile", "command", "sec"], cli_env)]
        for result in shown:
            assert result.returncode == 0, result.args
            assert host_token not in result.stdout + result.stderr and profile_key not in result.stdout + result.stderr
        command = (remote_home.sessions_dir / session_id / "command.json").read_text()
        assert profile_key not in command and "WANDB_API_KEY" in command
    finally:
        if follower is not None:
            follower.terminate()
            try:
                follower.wait(timeout=20)
            except subprocess.TimeoutExpired:
                follower.kill()
                follower.wait()
        remote.cleanup()
