"""`eagle3-tui regenerate run|status|pause|resume|cancel`: regeneration jobs from the shell.

`regenerate run JOB.toml` prints only the job id on stdout (the job runs detached); `regenerate status JOB
--json` prints one JSON object (without JOB: an array of every regeneration job), with ``stats``: the mean
answer length before and after, the finish reasons, the share of empty answers and one line per server.
Only argparse is imported here; the engine is imported inside the handlers.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    regen = subparsers.add_parser(
        "regenerate", help="regeneration jobs: every assistant turn rewritten by the target",
        description="Regeneration jobs replay a ShareGPT/OpenAI dataset's user turns through the server's "
                    "/v1/chat/completions and write SpecForge's <out>.jsonl, <out>_error.jsonl, <out>_skipped.jsonl.")
    sub = regen.add_subparsers(dest="regenerate_command", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="start a job detached; prints its job id")
    run.add_argument("spec", help='the job spec (TOML [job] table with mode = "regenerate")')
    run.set_defaults(func=_run)
    status = sub.add_parser("status", help="progress and data statistics of one job (or of all)")
    status.add_argument("job", nargs="?", help="job id (default: every regeneration job)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)
    for name, helptext, func in (
        ("pause", "stop taking new rows (the process stays)", _pause),
        ("resume", "continue a paused job, or restart a stopped one: rows already written are skipped", _resume),
        ("cancel", "stop after the conversations in flight", _cancel),
    ):
        action = sub.add_parser(name, help=helptext)
        action.add_argument("job", help="job id")
        action.set_defaults(func=func)


def _cli_error(exc: Exception) -> Exception:
    from app.cli import CliError

    return CliError(str(exc), getattr(exc, "code", 1))


def _run(args: argparse.Namespace) -> int:
    from sessions.extraction.job import JobError
    from sessions.regeneration.job import run_regen_job

    try:
        job_id = run_regen_job(args.spec)
    except JobError as exc:
        raise _cli_error(exc) from None
    print(job_id)
    print(f"started job {job_id}; follow it with: eagle3-tui regenerate status {job_id}", file=sys.stderr)
    return 0


def human(p: Any) -> str:
    """One job in two or three lines (also what the jobs screen's detail shows)."""
    pct = f"{100 * p.fraction:5.1f}%" if p.total else "  -  "
    eta = f", ETA {p.eta_s:.0f} s" if p.eta_s else ""
    line = (f"{p.job_id}  {p.state:<11} {pct}  {p.done}/{p.total} rows: {p.ok} success, {p.failed_lines} error, "
            f"{p.skipped} skipped; {p.tokens_per_s:.0f} tok/s{eta}")
    from sessions.regeneration.stats import shape_lines

    for extra in shape_lines(p.stats):
        line += f"\n    {extra}"
    if p.reason:
        line += f"\n    {p.reason}"
    return line


def _status(args: argparse.Namespace) -> int:
    from sessions.extraction.job import JobError, all_jobs
    from sessions.regeneration.job import regen_status

    try:
        jobs = [regen_status(args.job)] if args.job else [p for p in all_jobs() if p.mode == "regenerate"]
    except JobError as exc:
        raise _cli_error(exc) from None
    if args.json:
        payload: Any = jobs[0].to_json() if args.job else [p.to_json() for p in jobs]
        print(json.dumps(payload, indent=2))
    elif not jobs:
        print("no regeneration jobs", file=sys.stderr)
    else:
        for p in jobs:
            print(human(p))
    return 0


def _act(args: argparse.Namespace, act: Any, said: str) -> int:
    from sessions.extraction.job import JobError
    from sessions.regeneration.job import regen_status

    try:
        regen_status(args.job)
        progress = act(args.job)
    except JobError as exc:
        raise _cli_error(exc) from None
    print(said.format(job=args.job, progress=progress), file=sys.stderr)
    return 0


def _pause(args: argparse.Namespace) -> int:
    from sessions.extraction.job import pause_job

    return _act(args, pause_job, "job {job} pauses after the conversations in flight")


def _resume(args: argparse.Namespace) -> int:
    from sessions.regeneration.job import resume_regen_job

    return _act(args, resume_regen_job, "job {job} resumed (pid {progress.pid})")


def _cancel(args: argparse.Namespace) -> int:
    from sessions.extraction.job import cancel_job

    return _act(args, cancel_job, "job {job} is {progress.state}")
