"""`eagle3-tui profile command | validate | list | new`: launch profiles from the command line (DESIGN §1b).

`command` prints the exact shell-quoted command with its env changes (secrets redacted); `validate`
prints every problem as ``field: message`` and exits 2 when any is an error; `list` prints profile names;
`new` writes a commented template.  Only argparse is imported here; the engine is imported in handlers.
"""
from __future__ import annotations

import argparse
import sys

_PROFILE_HELP = "a profile name (<config>/profiles/NAME.toml) or a path to a .toml file"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="launch profiles: show the command, validate, list, create",
        description="Work with launch profiles (TOML files in <config>/profiles/).",
    )
    sub = parser.add_subparsers(dest="profile_command", metavar="ACTION", required=True)

    p = sub.add_parser(
        "command",
        help="print the exact command and env changes a launch would run (secrets redacted)",
        description="Print the environment changes (KEY=value lines) and the shell-quoted command that "
        "`eagle3-tui launch PROFILE` would run.  Secrets are shown as ***.",
    )
    p.add_argument("profile", metavar="PROFILE", help=_PROFILE_HELP)
    p.set_defaults(func=_command)

    p = sub.add_parser(
        "validate",
        help="check a profile on this machine; exit 2 when anything would stop a launch",
        description="Check types and ranges, the model folder, the port, the visible GPUs, and what the "
        "installed SGLang accepts (read from its source, not imported).  Prints one line per problem; "
        "exits 2 when there is an error, 0 when there are only warnings or nothing.",
    )
    p.add_argument("profile", metavar="PROFILE", help=_PROFILE_HELP)
    p.add_argument("--no-port-check", action="store_true", help="do not check whether the port is free")
    p.add_argument("--json", action="store_true", help="print the problems as a JSON array on stdout")
    p.set_defaults(func=_validate)

    p = sub.add_parser("list", help="print the profile names, one per line")
    p.add_argument("--long", "-l", action="store_true", help="also print launcher, TP, port and model")
    p.set_defaults(func=_list)

    p = sub.add_parser(
        "new",
        help="write a commented profile template to <config>/profiles/NAME.toml",
        description="Write a commented template; edit it, then run `eagle3-tui profile validate NAME`.",
    )
    p.add_argument("name", metavar="NAME", help="letters, digits, '.', '_' and '-'")
    p.add_argument("--emulator", action="store_true", help="use the SGLang emulator (no GPU needed)")
    p.add_argument("--model", metavar="PATH", help="the model folder (the one holding config.json)")
    p.add_argument("--python", metavar="PATH",
                   help="the interpreter that has SGLang (e.g. /opt/sglang/.venv/bin/python); default: this one")
    p.add_argument("--force", action="store_true", help="overwrite an existing profile of that name")
    p.set_defaults(func=_new)


# --- handlers --------------------------------------------------------------------------------------------


def _load(ref: str):
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.profiles import ProfileError, load_profile

    try:
        return load_profile(ref)
    except ProfileError as exc:
        raise CliError(_problems_text(ref, exc.problems), EXIT_BAD_INPUT) from None


def _problems_text(ref: str, problems) -> str:
    lines = [f"profile {ref!r} is invalid:"]
    lines += [f"  {p.severity}: {p}" for p in problems]
    return "\n".join(lines)


def _command(args: argparse.Namespace) -> int:
    from sessions.profiles import build_command

    profile = _load(args.profile)
    print(build_command(profile).shell_text(redacted=True))
    return 0


def _validate(args: argparse.Namespace) -> int:
    import json

    from app.cli import EXIT_BAD_INPUT, EXIT_OK
    from sessions.home import resolve_home
    from sessions.profiles import ProfileError, load_profile, validate_profile
    from sessions.server.port_check import port_problems

    def checked(profile) -> list:
        # The port check knows this home's sessions: the profile's own running server holding its port
        # is "this profile's running session" (a warning, as in the editor), not "in use by pid … (python3)".
        found = validate_profile(profile, check_port=False)
        return found + (port_problems(profile, resolve_home(), "eagle3-tui restart") if not args.no_port_check else [])

    try:
        profile = load_profile(args.profile)
        problems = checked(profile)
    except ProfileError as exc:
        problems = list(exc.problems)
        if exc.profile is not None:  # report what this machine says about the readable rest too
            more = checked(exc.profile)
            problems += [p for p in more if p not in problems]
    errors = [p for p in problems if p.is_error]
    if args.json:
        print(json.dumps([
            {"field": p.field, "message": p.message, "line": p.line, "severity": p.severity} for p in problems
        ], indent=2))
    else:
        for p in problems:
            print(f"{p.severity}: {p}")
    warnings = len(problems) - len(errors)
    if errors:
        print(f"profile {args.profile!r}: {len(errors)} error(s), {warnings} warning(s)", file=sys.stderr)
        return EXIT_BAD_INPUT
    note = f" ({warnings} warning(s))" if warnings else ""
    print(f"profile {args.profile!r} is valid{note}", file=sys.stderr)
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    from sessions.home import resolve_home
    from sessions.profiles import ProfileError, list_profiles, load_profile

    home = resolve_home()
    for name in list_profiles(home):
        if not args.long:
            print(name)
            continue
        try:
            profile = load_profile(name, home)
        except ProfileError as exc:
            print(f"{name}\tinvalid: {exc.problems[0]}" if exc.problems else f"{name}\tinvalid")
            continue
        s = profile.server
        print(f"{name}\t{s.launcher}\tTP{s.tp_size}\t{s.host}:{s.port}\t{s.model_path}")
    return 0


def _new(args: argparse.Namespace) -> int:
    import os
    import re

    from app.cli import EXIT_BAD_INPUT, EXIT_FAILED, CliError
    from sessions.home import atomic_write_text, resolve_home
    from sessions.profiles.model import PROFILE_NAME_MAX

    name = args.name.removesuffix(".toml")
    if len(name) > PROFILE_NAME_MAX:
        raise CliError(f"profile name {name[:40]!r}…: {len(name)} characters, at most {PROFILE_NAME_MAX}", EXIT_BAD_INPUT)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise CliError(f"profile name {args.name!r}: use letters, digits, '.', '_' and '-' (no '/')", EXIT_BAD_INPUT)
    home = resolve_home().ensure()
    path = home.profiles_dir / f"{name}.toml"
    if path.exists() and not args.force:
        raise CliError(f"profile {name!r} already exists: {path} (eagle3-tui profile new {name} --force overwrites it)", EXIT_FAILED)
    model = os.path.abspath(os.path.expanduser(args.model)) if args.model else "/path/to/model"
    python = os.path.abspath(os.path.expanduser(args.python)) if args.python else None
    atomic_write_text(path, profile_template(name, model, emulator=args.emulator, python=python), mode=0o600)
    print(path)
    print(f"wrote {path}; edit it, then run: eagle3-tui profile validate {name}", file=sys.stderr)
    return 0


def profile_template(name: str, model_path: str, emulator: bool = False, python: str | None = None) -> str:
    """A commented profile that loads as it is (DESIGN §1b keys, defaults filled in)."""
    import json
    import sys as _sys

    launcher = "emulator" if emulator else "sglang"
    python_note = (
        "the Python running eagle3-tui (the emulator is part of it)"
        if emulator
        else "the Python that has SGLang (its own venv); extraction jobs on this server run under it too"
    )
    emulator_note = "" if emulator else "  # read only when launcher = \"emulator\""
    return f"""\
# eagle3-tui launch profile {name!r}.  Check it with: eagle3-tui profile validate {name}
# Show the exact command it runs with:          eagle3-tui profile command {name}

[server]
launcher = "{launcher}"  # "sglang", or "emulator" (an SGLang stand-in for demos and tests)
python = {json.dumps(python or _sys.executable)}  # {python_note}
model_path = {json.dumps(model_path)}  # the model folder, holding config.json
tp_size = {8 if emulator else 1}  # tensor parallel size = GPUs used
host = "127.0.0.1"  # loopback only; 0.0.0.0 would expose the server to the network
port = 30000
# attention_backend = "fa3"  # checked against the installed SGLang's choices; leave out for auto
cuda_graph = true  # false -> --disable-cuda-graph (or the per-phase flags where SGLang has them)
# mem_fraction_static = 0.85  # between 0 and 1; leave out for SGLang's automatic value
# radix_cache = false  # false -> --disable-radix-cache (capture turns it off by itself)
# chunked_prefill_size = 8192  # -1 turns chunked prefill off
extra_args = []  # more sglang.launch_server flags, e.g. ["--trust-remote-code"]

[server.env]  # added to the server's environment; values may hold secrets (shown as ***)
# NCCL_ALGO = "Ring"

[capture]
enabled = false  # EAGLE-3 hidden-state capture (eagle3-tui capture check first)
# layers = [2, 30, 58]  # physical capture points; leave out for SGLang's default [2, L//2, L-3]
# dir = "/dev/shm/eagle3-capture"
rid_prefix = "eagle3-"  # only requests whose rid starts with this are dumped

[watch]
stall_after_s = 300  # no log output for this long during startup counts as a stall

[emulator]{emulator_note}
time_scale = 0.05  # 1.0 = SGLang's real timings
fault = "none"  # none, hang-after-weights, rank-missing, hang-in-graph-capture, oom-kv-cache,
                # address-in-use, crash-while-serving, slow-weights, scheduler-exception
# gpu_memory_gb = 2.0  # real GPU memory each rank holds (needs torch and a GPU)
# gpus = 8  # emulated GPU count
"""


def received_profile(name: str | None, command: str = "launch"):
    """``launch -`` / ``node-check -``: the profile TOML on stdin (another host's panel, or a multi-node
    launch, sends it) as ``NAME``; kept as ``<state>/received-profiles/NAME.toml`` so that the session's
    profile path (restart) is a real file."""
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.home import atomic_write_text, ensure_private_dir, resolve_home
    from sessions.profiles import load_profile, parse_profile
    from sessions.profiles.model import is_profile_name

    if name is None or not is_profile_name(name):
        raise CliError(f"{command} -: --name NAME must give the profile a usable name "
                       f"(letters, digits, '.', '_', '-'), got {name!r}", EXIT_BAD_INPUT)
    text = sys.stdin.read(1024 * 1024 + 1)
    if len(text) > 1024 * 1024:
        raise CliError(f"{command} -: the profile on stdin is over 1 MiB", EXIT_BAD_INPUT)
    parse_profile(text, name=name)  # refuse a bad profile before anything is written
    folder = ensure_private_dir(resolve_home().state_root / "received-profiles")
    path = folder / f"{name}.toml"
    atomic_write_text(path, text)
    return load_profile(path)
