"""`eagle3-tui regenerate run|status|pause|resume|cancel`: regeneration jobs from the shell.

`regenerate run JOB.toml` prints only the job id on stdout (the job runs detached); `regenerate status JOB
--json` prints one JSON object (without JOB: an array of every regeneration job), with ``stats``: the mean
answer length before and after, the finish reasons, the share of empty answers and one line per server.
The subcommands themselves are `app.cli_extract`'s job commands (one owner for both kinds of job); only
argparse is imported here besides, the engine is imported inside the handlers.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from app.cli_extract import (
    add_job_commands,
    is_pipeline_progress,
    job_action,
    pipeline_human,
    pipeline_or,
    print_job_status,
    regeneration_human,
    stage_or_job,
    start_job,
)


def register(subparsers: Any) -> None:
    regen = subparsers.add_parser(
        "regenerate", help="regeneration jobs: every assistant turn rewritten by the target",
        description="Regeneration jobs replay a ShareGPT/OpenAI dataset's user turns through the server's "
                    "/v1/chat/completions and write SpecForge's <out>.jsonl, <out>_error.jsonl, <out>_skipped.jsonl.")
    sub = regen.add_subparsers(dest="regenerate_command", metavar="ACTION", required=True)
    add_job_commands(
        sub, spec_help='the job spec (TOML [job] table with mode = "regenerate", or a pipeline: [regenerate] '
                       "then [extract])",
        status_help="progress and data statistics of one job (or of all)", every_job="every regeneration job",
        run=_run, status=_status, actions=(
            ("pause", "stop taking new rows (the process stays)", _pause),
            ("resume", "continue a paused job, or restart a stopped one: rows already written are skipped", _resume),
            ("cancel", "stop after the conversations in flight", _cancel),
        ))


def _run(args: argparse.Namespace) -> int:
    from sessions.regeneration.pipeline import run_regen_or_pipeline

    return start_job(run_regen_or_pipeline, args.spec, "regenerate")


def _status(args: argparse.Namespace) -> int:
    from sessions.extraction.job import all_jobs
    from sessions.regeneration.job import regen_status

    return print_job_status(
        args, lambda: [pipeline_or(args.job, regen_status)] if args.job else
        [p for p in all_jobs() if p.mode == "regenerate"],
        lambda p: p.to_json(), lambda p: pipeline_human(p) if is_pipeline_progress(p) else regeneration_human(p), "regeneration")


def _regeneration_only(act: Callable[[str], Any]) -> Callable[[str], Any]:
    """``act`` for a regeneration job; an extraction job's id is refused first (`regen_status` says so)."""
    from sessions.regeneration.job import regen_status

    def checked(job_id: str) -> Any:
        stage = stage_or_job(job_id)  # a pipeline's running stage may be its extraction
        if stage == job_id:
            regen_status(job_id)
        return act(stage)

    return checked


def _pause(args: argparse.Namespace) -> int:
    from sessions.extraction.job import pause_job

    return job_action(args, _regeneration_only(pause_job), "job {job} pauses after the conversations in flight")


def _resume(args: argparse.Namespace) -> int:
    from sessions.regeneration.job import resume_regen_job  # refuses an extraction job itself
    from sessions.regeneration.pipeline import is_pipeline, resume_pipeline

    return job_action(args, lambda job: resume_pipeline(job) if is_pipeline(job) else resume_regen_job(job),
                      "job {job} resumed (pid {progress.pid})")


def _cancel(args: argparse.Namespace) -> int:
    from sessions.extraction.job import cancel_job

    return job_action(args, _regeneration_only(cancel_job), "job {job} is {progress.state}")
