"""`eagle3-tui hosts`, `gpus --json`, and `--host NAME`: the commands that reach other hosts over SSH.

`--host NAME` on status, launch, stop, logs and diagnose runs the same command with our CLI on that host
(`sessions.remote`): this command's words without ``--host NAME`` go there, its stdout and stderr come
back as they are printed, and its exit status is ours.  A profile with ``host = "NAME"`` is sent to that
host on stdin (``launch - --name NAME``), so the profile edited here is the one that starts there; the
machine checks (model path, GPUs, port) run there.  Only argparse is imported at top level.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

from app.cli_options import add_json_option, command

SLOW_S = 3.0  # `hosts`: an answer slower than this is shown as slow
HOSTS_TIMEOUT_S = 15.0


def add_host_option(parser: argparse.ArgumentParser) -> None:
    """``--host NAME``; `app.cli.main` hands such a command to ``args.forward_to_host`` (as it calls
    ``args.func``), so the dispatcher needs no import of this module."""
    parser.add_argument(
        "--host", default=None, metavar="NAME",
        help="run this command on host NAME of <config>/hosts.toml, over SSH ('local': this machine)",
    )
    parser.set_defaults(forward_to_host=forward_words)


def forward_words(name: str, words: Sequence[str]) -> int:
    """This command line (less ``--host NAME``) run on host NAME."""
    return forward(name, without_host_option(words))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command(
        subparsers,
        "hosts",
        _hosts,
        help="list the hosts of <config>/hosts.toml: reachable, slow or unreachable, and their version",
        description="Reach every host of <config>/hosts.toml with ssh (BatchMode: never a prompt), run "
        "eagle3-tui --version there and compare it with this one.  Exit status: 0 every host is usable, "
        "1 one is unreachable or runs another version, 2 a bad hosts.toml.",
    )
    add_json_option(p, "print one JSON array of host objects")
    p.add_argument("--timeout", type=float, default=HOSTS_TIMEOUT_S, metavar="S",
                   help=f"give each host S seconds ({HOSTS_TIMEOUT_S:g})")

    p = command(
        subparsers,
        "gpus",
        _gpus,
        help="show this machine's GPUs (NVML, else emulated GPUs); --json for other hosts' panels",
        description="One GPU reading: index, name, memory, utilisation and the processes on each GPU.",
    )
    add_json_option(p, "print the reading as one JSON object")
    add_host_option(p)


# --- handlers ---------------------------------------------------------------------------------------------


def _hosts(args: argparse.Namespace) -> int:
    import json
    from concurrent.futures import ThreadPoolExecutor

    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.home import resolve_home
    from sessions.remote import local_version
    from sessions.remote.hosts import HostsError, hosts_path, load_hosts

    home = resolve_home()
    try:
        hosts = load_hosts(home)
    except HostsError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    if not hosts:
        print(f"no hosts: {hosts_path(home)} names none (README: Other hosts)", file=sys.stderr)
        if args.json:
            print("[]")
        return 0
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        rows = list(pool.map(lambda h: _probe(h, home, args.timeout), hosts.values()))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'HOST':<16} {'SSH':<28} {'STATE':<12} {'VERSION':<10} ANSWER")
        for row in rows:
            answer = f"{row['seconds']:.2f} s" if row["seconds"] is not None else "-"
            print(f"{row['name']:<16} {row['ssh']:<28} {row['state']:<12} {row['version'] or '-':<10} {answer}")
        print(f"this machine: eagle3-tui {local_version()}", file=sys.stderr)
        for row in rows:
            if row["reason"]:
                print(f"{row['name']}: {row['reason']}", file=sys.stderr)
    return 0 if all(r["state"] in ("reachable", "slow") for r in rows) else 1


def _probe(host: Any, home: Any, timeout_s: float) -> dict[str, Any]:
    import time

    from sessions.remote.client import HostError, HostUnreachable, RemoteClient, VersionMismatch
    from sessions.remote.link import SshLink

    started = time.monotonic()
    row: dict[str, Any] = {"name": host.name, "ssh": host.ssh, "version": None, "reason": None, "seconds": None}
    try:
        row["version"] = RemoteClient(host, SshLink(host, home), timeout_s).connect()
        row["seconds"] = time.monotonic() - started
        row["state"] = "slow" if row["seconds"] > SLOW_S else "reachable"
    except VersionMismatch as exc:
        row.update(state="refused", version=exc.remote, reason=str(exc))
    except HostUnreachable as exc:
        row.update(state="unreachable", reason=str(exc))
    except HostError as exc:
        row.update(state="refused", reason=str(exc))
    return row


def _gpus(args: argparse.Namespace) -> int:
    import json

    from sessions.gpus import default_gpu_source, first_reading, snapshot_to_json
    from sessions.home import resolve_home

    home = resolve_home()
    source = default_gpu_source(home, demo=home.demo)
    try:
        snapshot = first_reading(source)
    finally:
        source.close()
    if args.json:
        print(json.dumps(snapshot_to_json(snapshot), indent=2))
        return 0
    if snapshot.message:
        print(snapshot.message, file=sys.stderr)
    for s in snapshot.samples:
        used = f"{s.memory_used_bytes / 2**30:.1f}" if s.memory_used_bytes is not None else "n/a"
        total = f"{s.memory_total_bytes / 2**30:.1f}" if s.memory_total_bytes is not None else "n/a"
        util = f"{s.utilization_percent:.0f}%" if s.utilization_percent is not None else "n/a"
        print(f"GPU {s.index} {s.name or '?'}: {used}/{total} GiB, {util}, {len(s.processes)} process(es)")
    return 0


# --- forwarding ----------------------------------------------------------------------------------------------


def without_host_option(argv: Sequence[str]) -> list[str]:
    """``argv`` less ``--host NAME`` / ``--host=NAME`` (the rest goes to the other host as it is)."""
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word == "--":
            out.append(word)
            continue
        if word == "--host":
            skip = True
            continue
        if word.startswith("--host="):
            continue
        out.append(word)
    return out


def connected_client(name: str) -> Any:
    """A `RemoteClient` of host NAME whose version was checked; `CliError` otherwise."""
    from app.cli import EXIT_BAD_INPUT, EXIT_FAILED, CliError
    from sessions.home import resolve_home
    from sessions.remote.client import HostError, RemoteClient
    from sessions.remote.hosts import HostsError, hosts_path, load_hosts
    from sessions.remote.link import SshLink

    home = resolve_home()
    try:
        hosts = load_hosts(home)
    except HostsError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    host = hosts.get(name)
    if host is None:
        known = ", ".join(sorted(hosts)) or "none"
        raise CliError(f"no host {name!r} in {hosts_path(home)} (hosts there: {known})", EXIT_BAD_INPUT)
    client = RemoteClient(host, SshLink(host, home))
    try:
        client.connect()
    except HostError as exc:
        raise CliError(f"host {name}: {exc}", EXIT_FAILED) from None
    return client


def forward(name: str, argv: list[str], input: str | None = None) -> int:
    """Run ``eagle3-tui ARGV`` on host NAME, relaying its output as it comes; its exit status."""
    import signal

    from app.cli import EXIT_FAILED, CliError
    from sessions.remote.client import SSH_FAILED, ssh_reason

    client = connected_client(name)
    proc = client.link.popen(argv, input=input)
    tail: list[str] = []
    relays = [threading.Thread(target=_relay, args=(proc.stdout, sys.stdout, None), daemon=True),
              threading.Thread(target=_relay, args=(proc.stderr, sys.stderr, tail), daemon=True)]
    for relay in relays:
        relay.start()
    # ssh runs in its own session (no terminal of ours reaches it): whatever ends this command ends it too,
    # so the command there sees its channel close; SIGTERM and SIGHUP become KeyboardInterrupt here.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for relay in relays:
        relay.join(timeout=5)
    if code == SSH_FAILED:
        raise CliError(f"host {name}: {ssh_reason(''.join(tail))}", EXIT_FAILED)
    return code


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _relay(source: IO[str] | None, target: IO[str], keep: list[str] | None) -> None:
    if source is None:
        return
    for line in source:
        target.write(line)
        target.flush()
        if keep is not None:
            keep.append(line)
            del keep[:-20]


def launch_on_host(profile: Any, args: argparse.Namespace) -> int:
    """Launch a profile whose ``host`` names another host: its TOML (without ``host``) goes on stdin."""
    from sessions.remote.client import launch_argv, profile_text_for_host

    argv = launch_argv(profile.name, force=args.force)
    if args.wait_ready:
        argv.append("--wait-ready")
    for flag, value in (("--timeout", args.timeout), ("--lock-timeout", args.lock_timeout),
                        ("--replicas", args.replicas)):
        if value is not None:
            argv += [flag, str(value)]
    print(f"launching {profile.name} on host {profile.host}", file=sys.stderr)
    return forward(profile.host, argv, input=profile_text_for_host(profile))
