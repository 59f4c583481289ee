"""`eagle3-tui diagnose SESSION [--json] [--bundle PATH] [--no-stacks] [--baseline SESSION2]` (DESIGN §4).

The human report goes to stdout by default (it is the result); ``--json`` prints the diagnosis object
instead.  ``--bundle PATH`` also writes the redacted tar.gz and names it on stderr.  Only argparse is
imported here; the engine is imported inside the handler (fast `--help`).
"""
from __future__ import annotations

import argparse
import sys

from app.cli_hosts import add_host_option


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="why is this server not ready? phase, silence, stacks of every rank, baseline, hints",
        description="Collect the phase, how long the log has been silent, the last lines, the process tree, "
        "the port and /ready, GPU memory, py-spy stacks of every rank, the comparison with a baseline (the "
        "last good start of the same profile, else the last good start of any profile with the same model "
        "config, TP/PP/DP and SGLang version), and hints ranked by what changed since it. Secrets are redacted.",
    )
    p.add_argument("session", metavar="SESSION", help="a session id or unique prefix, or a group id (g-...: every member)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as one JSON object")
    p.add_argument("--bundle", metavar="PATH", help="also write a redacted tar.gz bundle to PATH (file or folder)")
    p.add_argument("--no-stacks", action="store_true", help="do not run py-spy on the ranks")
    p.add_argument(
        "--baseline", metavar="SESSION2",
        help="compare with this good start (a session id or unique prefix, any profile) instead of the one "
        "picked automatically",
    )
    p.add_argument(
        "--stack-timeout", type=float, default=10.0, metavar="S", help="seconds per py-spy dump (10)"
    )
    add_host_option(p)
    p.set_defaults(func=_diagnose)


def _diagnose(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.diagnosis import diagnose, format_report, write_bundle
    from sessions.server import SessionError, find_group, find_session

    if args.bundle:
        target = Path(args.bundle)
        folder = target if target.is_dir() else target.parent
        if not folder.is_dir():
            raise CliError(f"--bundle {args.bundle}: folder {folder} does not exist", EXIT_BAD_INPUT)
    if args.stack_timeout <= 0:
        raise CliError(f"--stack-timeout must be > 0 seconds, got {args.stack_timeout:g}", EXIT_BAD_INPUT)
    try:
        members = find_group(args.session)
        targets = members if members is not None else [find_session(args.session)]
    except SessionError as exc:
        raise CliError(str(exc), exc.code) from None
    if len(targets) > 1 and args.bundle and not Path(args.bundle).is_dir():
        raise CliError(f"--bundle {args.bundle}: a group of {len(targets)} needs a folder (one bundle a member)",
                       EXIT_BAD_INPUT)
    from sessions.baseline import BaselineError
    from sessions.redaction import Redactor

    docs = []
    for session in targets:  # a group: one diagnosis a member, in member order
        try:
            result = diagnose(session, with_stacks=not args.no_stacks, stack_timeout_s=args.stack_timeout,
                              baseline=args.baseline)
        except BaselineError as exc:
            raise CliError(str(exc), EXIT_BAD_INPUT) from None
        except Exception as exc:  # noqa: BLE001 - say what failed, with the session, never a traceback
            raise CliError(f"diagnose {session.session_id} failed: {type(exc).__name__}: {exc}") from None
        redactor = Redactor.for_session(session)  # a second pass by value over the finished output
        if args.json:
            docs.append(redactor.json(result.to_json()))
        else:
            if len(targets) > 1:
                info = session.group
                sys.stdout.write(f"=== replica {info.index if info else '?'}: {session.session_id} ===\n")
            sys.stdout.write(redactor.text(format_report(result)))
        sys.stdout.flush()
        if args.bundle:
            try:
                path = write_bundle(result, session, args.bundle)
            except OSError as exc:
                raise CliError(f"--bundle {args.bundle}: cannot write the bundle: {exc.strerror or exc}") from None
            print(f"bundle written: {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(docs if len(targets) > 1 else docs[0], indent=2, sort_keys=True))
    return 0
