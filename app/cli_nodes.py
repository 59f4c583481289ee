"""One server across nodes: ``nodes status|stop|diagnose ID`` here, ``node-check`` on each node.

``eagle3-tui launch PROFILE`` of a profile with ``nnodes > 1`` coordinates the nodes (`launch_across_nodes`);
each node then runs ``eagle3-tui launch PROFILE --node-rank R --dist-init-addr A`` (`sessions.server.nodes`).
"""
from __future__ import annotations

import argparse
import json
import sys

from app.cli_options import add_grace_option, add_json_option, command


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command(
        subparsers,
        "node-check",
        _node_check,
        help="this host as node R of a multi-node profile: versions, checks, rendezvous port (JSON)",
        description="Run on each node before a multi-node launch: load PROFILE, build node R's command, "
        "validate it on this machine (model path, GPUs, port), report SGLang/torch/NCCL versions and whether "
        "the rendezvous port is free (node 0) or reachable (other nodes).  Exit 2 when a check fails.  "
        "--free-port ADDR only prints a free TCP port on ADDR.",
    )
    p.add_argument("profile", nargs="?", metavar="PROFILE",
                   help="a profile name, a path, or - (its TOML on stdin, with --name: what a multi-node launch sends)")
    p.add_argument("--name", default=None, metavar="NAME", help="with PROFILE -: the profile's name")
    p.add_argument("--node-rank", type=int, default=0, metavar="R")
    p.add_argument("--dist-init-addr", default=None, metavar="HOST:PORT")
    p.add_argument("--node-address", default="127.0.0.1", metavar="ADDR", help="this node's address")
    p.add_argument("--free-port", default=None, metavar="ADDR", help="print a free port on ADDR and exit")
    p.add_argument("--gate-activate", default=None, metavar="HOST:PORT",
                   help="send POST /gate/activate to SGLang's gated-launch control server at HOST:PORT and exit")
    add_json_option(p, "print the report as JSON (the default is text)")

    p = command(
        subparsers,
        "nodes",
        _nodes,
        help="a server across nodes: status (per-node rank arrival), stop (node 0 first), diagnose",
        description="ID is a multi-node session id (or unique prefix) printed by 'launch' of a profile with "
        "server.nnodes > 1; its record is <state>/nodes/ID.json.",
    )
    p.add_argument("action", choices=("status", "stop", "diagnose", "gate"),
                   help="gate: a gated launch (server.gated_launch = true): wait until every node's ranks are at "
                   "the gate, then open it (exit 3 when it stays closed)")
    p.add_argument("id", metavar="ID")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="gate: wait at most S seconds (default: the profile's watch.stall_after_s, or 300)")
    add_json_option(p, "print JSON on stdout")
    add_grace_option(p, "stop: seconds per node after SIGTERM")


def node_resolver(home):
    """The hosts of hosts.toml as nodes (`sessions.server.nodes.ssh_resolver`); a bad hosts.toml is bad input."""
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.remote.hosts import HostsError
    from sessions.server.nodes import ssh_resolver

    try:
        return ssh_resolver(home)
    except HostsError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None


def launch_across_nodes(profile, home=None, resolver=None) -> int:
    """``launch`` of a profile with nnodes > 1: preflight every node, launch node 0 then the others."""
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.home import resolve_home
    from sessions.server.nodes import NodesError, launch_nodes

    home = home or resolve_home().ensure()
    resolver = resolver or node_resolver(home)
    try:
        record = launch_nodes(home, profile, resolver,
                              progress=lambda text: print(text, file=sys.stderr, flush=True))
    except NodesError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT if "refused before" in str(exc) else 1) from None
    print(record.node_id, flush=True)
    print(f"launched {record.node_id}: {len(record.nodes)} nodes, rendezvous {record.dist_init_addr}",
          file=sys.stderr)
    if record.gate is not None:  # server.gated_launch: open the gate once every node's ranks are at it
        return _open_gate(record, resolver, home, profile.watch.stall_after_s)
    return 0


EXIT_GATE_CLOSED = 3  # as a stalled start: the servers run on, held at the gate (`nodes gate ID` opens it)


def _open_gate(record, resolver, home, timeout_s: float) -> int:
    from app.cli import CliError
    from sessions.server.nodes import NodesError
    from sessions.server.nodes_gate import open_gate

    print(f"gated launch: waiting for every node's ranks at the gate ({record.gate['host']}:{record.gate['port']} "
          f"on node 0, at most {timeout_s:g} s)", file=sys.stderr, flush=True)
    try:
        result = open_gate(record, resolver, home, timeout_s)
    except NodesError as exc:
        raise CliError(str(exc)) from None
    print(result.message, file=sys.stderr)
    if not result.opened:
        print(f"the servers keep running at the gate: 'eagle3-tui nodes gate {record.node_id}' opens it once every "
              f"node is there, 'eagle3-tui nodes stop {record.node_id}' stops them", file=sys.stderr)
    return 0 if result.opened else EXIT_GATE_CLOSED


def _node_check(args: argparse.Namespace) -> int:
    from app.cli import EXIT_BAD_INPUT, CliError
    from app.cli_profile import received_profile
    from sessions.profiles import ProfileError, load_profile
    from sessions.server.nodes import free_port, node_check_report

    if args.free_port:
        print(free_port(args.free_port))
        return 0
    if args.gate_activate:
        from sessions.server.nodes import NodesError
        from sessions.server.nodes_gate import post_activate

        try:
            print(post_activate(args.gate_activate))
        except NodesError as exc:
            raise CliError(str(exc)) from None
        return 0
    if not args.profile or not args.dist_init_addr:
        raise CliError("node-check needs PROFILE and --dist-init-addr HOST:PORT", EXIT_BAD_INPUT)
    try:
        profile = received_profile(args.name, "node-check") if args.profile == "-" else load_profile(args.profile)
    except ProfileError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    report = node_check_report(profile, args.node_rank, args.dist_init_addr, args.node_address)
    if args.json:
        print(json.dumps(report))
    else:
        print("\n".join([f"node {report['node_rank']}: rendezvous {report['rendezvous']}",
                         *(f"{k}: {v}" for k, v in report["versions"].items()), *report["problems"]]))
    return EXIT_BAD_INPUT if report["problems"] else 0


def _nodes(args: argparse.Namespace, resolver=None) -> int:
    from app.cli import CliError
    from sessions.home import resolve_home
    from sessions.server.nodes import NodesError, load_record
    from sessions.server.nodes_status import multi_node_status, stop_nodes

    home = resolve_home().ensure()
    try:
        record = load_record(home, args.id)
        resolver = resolver or node_resolver(home)
        if args.action == "stop":
            reports = stop_nodes(record, resolver, home, args.grace,
                                 progress=lambda text: print(text, file=sys.stderr, flush=True))
            print(json.dumps(reports) if args.json else f"stopped {record.node_id}: every node's GPUs free")
            return 0
        if args.action == "gate":
            from sessions.profiles import ProfileError, load_profile

            timeout = args.timeout
            if timeout is None:
                try:
                    timeout = load_profile(record.profile).watch.stall_after_s
                except ProfileError:
                    timeout = 300.0
            return _open_gate(record, resolver, home, timeout)
        if args.action == "diagnose":
            from sessions.server.nodes_report import diagnose_nodes

            report = diagnose_nodes(record, resolver)
            print(json.dumps(report) if args.json else report["text"])
            return 0
        status = multi_node_status(record, resolver)
    except NodesError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(status.to_json()))
        return 0
    from sessions.server.nodes_report import status_lines

    print("\n".join(status_lines(status)))
    return 0
