"""Our own CLI on another host, through a `HostLink`: its version, `status --json`, `gpus --json`.

Nothing new runs there: the remote side is the same headless CLI and its JSON contracts.  `connect`
first compares ``eagle3-tui --version`` on both sides and refuses a host whose version differs (its JSON
could mean something else).  ssh's own failures (exit 255) become `HostUnreachable` with ssh's reason.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any

from sessions.gpus import GpuSnapshot, snapshot_from_json
from sessions.remote import local_version
from sessions.remote.hosts import Host
from sessions.remote.link import HostLink

SSH_FAILED = 255  # ssh's exit status when it could not connect or lost the connection
DEFAULT_TIMEOUT_S = 20.0


class HostError(Exception):
    """A host cannot be used now; ``str()`` says why, for the panel and the CLI."""


class HostUnreachable(HostError):
    """ssh could not reach the host, or the command there did not answer in time."""


class VersionMismatch(HostError):
    def __init__(self, host: str, local: str, remote: str) -> None:
        self.local, self.remote = local, remote
        super().__init__(f"host {host} runs eagle3-tui {remote}, this machine {local}: refusing to use it "
                         f"(install eagle3-tui {local} there, or point hosts.toml's eagle3_tui at it)")


def launch_argv(name: str, force: bool = False) -> list[str]:
    """The host's ``launch`` for a profile sent on stdin."""
    return ["launch", "-", "--name", name, *(["--force"] if force else [])]


def profile_text_for_host(profile: Any) -> str:
    """The profile's TOML as its host launches it: without ``host`` (there it is that host's own)."""
    import dataclasses

    return str(dataclasses.replace(profile, host=None).to_toml())


def ssh_reason(stderr: str) -> str:
    """ssh's last words (``ssh: connect to host ... port 22: Connection refused``), without the warnings
    it prints on the way (known hosts added)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Warning: Permanently")]
    return lines[-1][:300] if lines else "ssh failed without a message"


@dataclass
class RemoteClient:
    """One host's CLI.  Every call may raise `HostUnreachable`; `connect` may raise `VersionMismatch`."""

    host: Host
    link: HostLink
    timeout_s: float = DEFAULT_TIMEOUT_S

    def call(self, argv: list[str], timeout_s: float | None = None, input: str | None = None
             ) -> subprocess.CompletedProcess[str]:
        """Run ``eagle3-tui ARGV`` there; any exit status of our CLI comes back, ssh's failures raise."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            result = self.link.run(argv, limit, input=input)
        except subprocess.TimeoutExpired:
            raise HostUnreachable(f"no answer from {self.host.name} within {limit:g} s") from None
        except OSError as exc:  # no ssh binary
            raise HostUnreachable(f"cannot run ssh: {exc.strerror or exc}") from None
        if result.returncode == SSH_FAILED:
            raise HostUnreachable(ssh_reason(result.stderr))
        if result.returncode in (126, 127):  # env/the shell: no such command, or not executable
            raise HostUnreachable(f"{self.host.eagle3_tui} not found on {self.host.name}: "
                                  f"{ssh_reason(result.stderr)}")
        return result

    def connect(self) -> str:
        """Check the version there; returns it (`VersionMismatch` when it is not ours)."""
        result = self.call(["--version"])
        words = result.stdout.split()
        remote = words[-1] if result.returncode == 0 and len(words) == 2 and words[0] == "eagle3-tui" else None
        if remote is None and "unrecognized arguments: --env-stdin" in result.stderr:
            raise HostError(f"{self.host.eagle3_tui} on {self.host.name} is an eagle3-tui older than this "
                            f"machine's {local_version()} (it has no --env-stdin, which hosts.toml's env needs)")
        if remote is None:
            said = (result.stdout.strip() or ssh_reason(result.stderr))[:200]
            raise HostError(f"{self.host.eagle3_tui} on {self.host.name} is not eagle3-tui "
                            f"(--version said {said!r})")
        local = local_version()
        if remote != local:
            raise VersionMismatch(self.host.name, local, remote)
        return remote

    def json_call(self, argv: list[str], timeout_s: float | None = None) -> Any:
        result = self.call(argv, timeout_s)
        if result.returncode != 0:
            raise HostError(f"{self.host.name}: eagle3-tui {' '.join(argv)} failed (exit {result.returncode}): "
                            f"{ssh_reason(result.stderr)}")
        try:
            return json.loads(result.stdout)
        except json.JSONDecodeError as exc:
            raise HostError(f"{self.host.name}: eagle3-tui {' '.join(argv)} printed no JSON ({exc})") from None

    def status(self, live: bool = False) -> list[dict[str, Any]]:
        rows = self.json_call(["status", "--json", *(["--live"] if live else [])])
        if not isinstance(rows, list):
            raise HostError(f"{self.host.name}: status --json printed no array")
        return [r for r in rows if isinstance(r, dict)]

    def launch_profile(self, profile: Any, force: bool = False, timeout_s: float = 180.0) -> list[str]:
        """Launch ``profile`` there (its TOML, less ``host``, on the stdin of ``launch - --name NAME``);
        the new session ids.  `HostError` with what the host's CLI said when it refused."""
        argv = launch_argv(profile.name, force=force)
        result = self.call(argv, timeout_s, input=profile_text_for_host(profile))
        if result.returncode != 0:
            said = "\n".join(result.stderr.strip().splitlines()[-12:]) or f"exit {result.returncode}"
            raise HostError(f"launch of {profile.name} on {self.host.name} refused (exit {result.returncode}):\n{said}")
        return result.stdout.split()

    def gpus(self) -> GpuSnapshot:
        try:
            return snapshot_from_json(self.json_call(["gpus", "--json"]))
        except ValueError as exc:
            raise HostError(f"{self.host.name}: gpus --json: {exc}") from None
