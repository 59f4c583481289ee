"""The `eagle3-tui` command line: a bare call opens the TUI, subcommands are the headless engine.

Each area of the CLI lives in its own `app/cli_<area>.py` module with a `register(subparsers)` function.
Those modules import only `argparse` at top level, so `eagle3-tui --help` stays fast (DESIGN §8: < 0.3 s);
the engine is imported inside the handlers.  Conventions (DESIGN §1b): results on stdout, everything meant
for people on stderr; exit 0 ok, 1 the action failed, 2 bad input.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

# Area modules, in the order their subcommands appear in --help.
_AREAS = (
    "app.cli_profile",  # profile command|validate|list
    "app.cli_server",  # launch, status, stop, restart, logs
    "app.cli_nodes",  # nodes status|stop|diagnose, node-check (one server across nodes)
    "app.cli_logs",  # inspect-log
    "app.cli_diagnose",  # diagnose
    "app.cli_capture",  # capture check, demo-model
    "app.cli_regenerate",  # regenerate run/status/pause/resume/cancel
    "app.cli_extract",  # extract run/status/resume/cancel/verify
    "app.cli_bench",  # bench SESSION, bench history
    "app.cli_hosts",  # hosts, gpus (and --host NAME on the session commands)
)


class CliError(Exception):
    """An error for people: printed as `eagle3-tui: <message>` with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3-tui",
        description="Control panel for SGLang servers and EAGLE-3 hidden-state extraction. "
        "Without a subcommand, opens the TUI.",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="use the demo home (emulated SGLang, no GPU needed); goes before any subcommand",
    )
    parser.add_argument(
        "--env-stdin",
        action="store_true",
        help="first read environment variables from one JSON line on stdin ({\"env\": {NAME: VALUE}}) and "
        "set them here (how another host's hosts.toml env reaches this CLI without a command line); goes "
        "before any subcommand",
    )
    parser.add_argument("--version", action="version", version=f"eagle3-tui {_version()}",
                        help="print 'eagle3-tui VERSION' and exit (other hosts are checked against it)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _AREAS:  # every area is part of the product: a missing one is an ImportError, not a gap
        importlib.import_module(name).register(sub)
    return parser


def _apply_env_stdin(words: list[str]) -> None:
    """``--env-stdin``: the host's env from stdin's first line into this process (and so every server it
    starts), its names in ``EAGLE3_TUI_HOST_ENV`` for the launch's secrets.  A variable the interpreter reads
    only at start-up (``PYTHON*``) that changes makes this CLI start again with it, as ``env K=V eagle3-tui``
    did: the rest of stdin is still unread for the new process."""
    from sessions.remote.hosts import ENV_STDIN_FLAG, HOST_ENV_NAMES, EnvLineError, read_env_line

    try:
        env = read_env_line(sys.stdin.fileno())
    except EnvLineError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    restart = any(k.startswith("PYTHON") and os.environ.get(k) != v for k, v in env.items())
    os.environ.update(env)
    os.environ[HOST_ENV_NAMES] = ",".join(sorted(env))
    if restart:
        rest = [w for w in words if not (w.startswith("--env") and ENV_STDIN_FLAG.startswith(w))]
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "app", *rest])


def _version() -> str:
    from sessions.remote import local_version

    return local_version()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(words)
    # argparse gives a trailing ``nargs="*"`` positional only the words before the first option, so
    # `bench history --compare PROFILE` would leave PROFILE over: such words go where they belong.
    rest = getattr(args, "rest", None)
    if extra and (not isinstance(rest, list) or any(word.startswith("-") for word in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra and isinstance(rest, list):
        rest.extend(extra)
    if args.demo:
        os.environ["EAGLE3_TUI_DEMO"] = "1"
    try:
        if args.env_stdin:
            _apply_env_stdin(words)
        if args.demo and args.command is not None:
            # Every entry point creates the demo home on first use, as opening the TUI does; otherwise
            # `--demo profile list` on a fresh machine would list nothing.
            from sessions.demo import ensure_demo_home, say_on_stderr
            from sessions.home import resolve_home

            ensure_demo_home(resolve_home(demo=True), progress=say_on_stderr)
        host = getattr(args, "host", None)
        if host is not None and host != "local":  # the same command, run by our CLI on that host
            return int(args.forward_to_host(host, words))
        if args.command is None:
            from app.tui import run_tui

            return run_tui(demo=args.demo)
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"eagle3-tui: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file-system problem no handler below worded (a file where a folder is
        # expected, a name over 255 characters): the path and the problem, never a traceback
        from sessions.safe_files import describe_os_error

        print(f"eagle3-tui: {describe_os_error(exc)}", file=sys.stderr)
        return EXIT_FAILED
