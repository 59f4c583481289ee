"""What several CLI areas spell the same way, defined once: a subcommand with its handler (`command`), and
the shared options (`--json`, `--grace` with the one stop grace default).  Only argparse is imported here,
as in every `app/cli_<area>.py` (a fast `--help`)."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

STOP_GRACE_S = 30.0  # `stop`, `restart`, `nodes stop`: seconds after SIGTERM before SIGKILL


def command(subparsers: argparse._SubParsersAction, name: str, handler: Callable[[argparse.Namespace], Any],
            help: str, description: str | None = None) -> argparse.ArgumentParser:
    """Subcommand ``name`` run by ``handler(args)`` (`app.cli.main` calls ``args.func``); ``help`` is its
    line in ``eagle3-tui --help``, ``description`` its own ``--help`` (default: argparse's, the help)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=description)
    parser.set_defaults(func=handler)
    return parser


def add_json_option(parser: argparse.ArgumentParser, help: str = "print JSON on stdout") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def add_grace_option(parser: argparse.ArgumentParser, help: str = "seconds to wait after SIGTERM") -> None:
    parser.add_argument("--grace", type=float, default=STOP_GRACE_S, metavar="S", help=f"{help} ({STOP_GRACE_S:g})")
