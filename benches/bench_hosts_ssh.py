"""What a host round trip costs: our CLI over a real local sshd (127.0.0.2), a fresh connection against the
shared one (ControlMaster), for ``--version``, ``status --json`` and ``gpus --json``, next to the same
commands run here (`LocalLink`).  Starts its own sshd with keys in a temp folder (tests/_ssh_support.py)
and stops it by pid.  Prints numbers only; no assertion (DESIGN §8).

    python benches/bench_hosts_ssh.py            # 5 rounds
    python benches/bench_hosts_ssh.py --rounds 10
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from sessions.home import Home
    from sessions.remote.link import LocalLink, SshLink
    from tests._ssh_support import SshHosts

    with tempfile.TemporaryDirectory(prefix="e3t-bench-") as tmp:
        home = Home(Path(tmp) / "home" / "config", Path(tmp) / "home" / "state").ensure()
        hosts = SshHosts(Path(tmp) / "ssh", home).start()
        try:
            host = hosts.host("h2")
            link = SshLink(host, home)
            local = LocalLink(env=dict(host.env))
            commands = (["--version"], ["status", "--json"], ["gpus", "--json"])
            for argv in commands:
                fresh, shared, here = [], [], []
                for _ in range(args.rounds):
                    link.close()  # no master: this call sets up the connection
                    fresh.append(_timed(link, argv))
                    shared.append(_timed(link, argv))  # over the master the first call left
                    here.append(_timed(local, argv))
                print(f"{' '.join(argv):<14} fresh ssh {_fmt(fresh)}  shared ssh {_fmt(shared)}  here {_fmt(here)}")
            link.close()
        finally:
            hosts.stop()


def _timed(link, argv: list[str]) -> float:
    started = time.monotonic()
    result = link.run(argv, 60)
    if result.returncode != 0:
        raise SystemExit(f"{argv}: exit {result.returncode}: {result.stderr[-300:]}")
    return time.monotonic() - started


def _fmt(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"


if __name__ == "__main__":
    main()
