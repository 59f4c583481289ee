"""`eagle3-tui capture check | status | toggle` and `eagle3-tui demo-model DIR` (DESIGN §5, §7).

`capture check` reads the server venv's SGLang statically and prints ``compatible (...)`` (exit 0),
``compatible with limits (...)`` with what works instead of each missing symbol (exit 0; SGLang 0.5.14 and
0.5.18 have no capture-only mode), or every missing or changed symbol with the file it looked in (exit 1);
no SGLang found is exit 2.
Only argparse is imported here; the engine is imported inside the handlers.
"""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    capture = subparsers.add_parser("capture", help="hidden-state capture: check SGLang, status, toggle")
    sub = capture.add_subparsers(dest="capture_command", metavar="ACTION", required=True)

    p = sub.add_parser(
        "check",
        help="verify (statically, no import) that SGLang has every symbol the capture plugin uses",
        description="Locate SGLang (in --python, default this interpreter, or --sglang-root) and verify with "
        "ast that the plugin's hook target, ForwardBatch fields, get_parallel fields, LogitsProcessorOutput "
        "fields, capture flags and plugin group exist.  Exit 0 compatible, 1 not, 2 SGLang not found.",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--python", metavar="PY", help="the server's Python interpreter (default: this one)")
    where.add_argument("--sglang-root", metavar="DIR", help="the sglang package folder (the one holding srt/)")
    where.add_argument("--profile", metavar="PROFILE", help="use the profile's Python and model")
    p.add_argument("--model-path", metavar="DIR", help="also check the model's architecture for EAGLE-3 capture")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.set_defaults(func=_check)

    p = sub.add_parser("status", help="a profile's capture setup: layers in both conventions, dir, fill")
    p.add_argument("profile", metavar="PROFILE")
    p.add_argument("--json", action="store_true", help="print the status as one JSON object")
    p.set_defaults(func=_status)

    p = sub.add_parser("toggle", help="turn capture on or off in a profile (saved)")
    p.add_argument("profile", metavar="PROFILE")
    p.set_defaults(func=_toggle)

    p = subparsers.add_parser(
        "demo-model",
        help="write a small real model (config, seeded weights, tokenizer, chat template) with no network",
    )
    p.add_argument("dir", metavar="DIR", help="the folder to create (must be empty or missing)")
    p.add_argument("--arch", choices=("llama", "qwen2"), default="llama", help="architecture (llama)")
    p.add_argument("--layers", type=int, default=8, metavar="N", help="decoder layers, >= 8 (8)")
    p.add_argument("--hidden-size", type=int, default=64, metavar="H", help="hidden size (64)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (0)")
    p.add_argument("--force", action="store_true", help="write into a non-empty folder")
    p.set_defaults(func=_demo_model)


def _load(name: str):
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.profiles import ProfileError, load_profile

    try:
        return load_profile(name)
    except ProfileError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None


def _check(args: argparse.Namespace) -> int:
    from app.cli import EXIT_BAD_INPUT, EXIT_FAILED, CliError
    from sessions.capture.compat import check_sglang
    from sessions.sglang_source import locate_sglang

    python, root, model_path = args.python, args.sglang_root, args.model_path
    env = None
    if args.profile:
        import os

        profile = _load(args.profile)
        python = profile.server.python
        model_path = model_path or profile.server.model_path or None
        env = {**os.environ, **profile.server.env}
    location = locate_sglang(python, root, env=env)
    if location.source is None:
        where = f"--sglang-root {root}" if root else f"Python {python or sys.executable}"
        raise CliError(f"SGLang not found ({where}): {location.reason}", EXIT_BAD_INPUT)
    report = check_sglang(location.source.root, model_path=model_path)
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text())
    return 0 if report.ok else EXIT_FAILED


def _status(args: argparse.Namespace) -> int:
    from sessions.profiles.capture_toggle import capture_status

    status = capture_status(_load(args.profile))
    if args.json:
        print(json.dumps(status.to_json(), indent=2))
        return 0
    points = list(status.points) if status.points is not None else "SGLang's default (model unknown)"
    ids = list(status.draft_ids) if status.draft_ids is not None else "n/a"
    print(f"capture: {'on' if status.enabled else 'off'} ({status.profile_name})")
    print(f"  capture points (layers_to_capture): {points}")
    print(f"  draft-config ids:                   {ids}")
    print(f"  dir: {status.dir}  ({status.file_count} files, {status.size_bytes} bytes)")
    if status.fs_fill_percent is not None:
        print(f"  filesystem: {status.fs_fill_percent:.0f}% full")
    print(f"  {status.cuda_graph_note}")
    for message in status.errors:
        print(f"  error: {message}", file=sys.stderr)
    for message in status.warnings:
        print(f"  warning: {message}", file=sys.stderr)
    return 0


def _toggle(args: argparse.Namespace) -> int:
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.profiles import ProfileError
    from sessions.profiles.capture_toggle import capture_problems, toggle_capture

    try:
        profile = toggle_capture(_load(args.profile))
    except ProfileError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    print("on" if profile.capture.enabled else "off")
    for problem in capture_problems(profile):
        print(f"{problem.severity}: {problem}", file=sys.stderr)
    return 0


def _demo_model(args: argparse.Namespace) -> int:
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.demo_model import DemoModelError, write_demo_model

    try:
        path = write_demo_model(args.dir, arch=args.arch, num_layers=args.layers,
                                hidden_size=args.hidden_size, seed=args.seed, overwrite=args.force)
    except DemoModelError as exc:
        raise CliError(f"demo-model {args.dir}: {exc}", EXIT_BAD_INPUT) from None
    print(path)
    return 0
