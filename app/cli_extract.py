"""`eagle3-tui extract run|status|pause|resume|cancel|verify`: extraction jobs from the shell (DESIGN §6).

`extract run JOB.toml` prints only the job id on stdout (the job runs detached); `extract status JOB
--json` prints one JSON object (without JOB: an array of every job).  Human text goes to stderr.
It also owns the job subcommands that `regenerate` shares (`add_job_commands`, `start_job`,
`print_job_status`, `job_action`).  Only argparse is imported here; the engine is imported inside the
handlers (`--help` stays fast).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

_CONTRACT_FIELDS = ("job_id", "pid", "state", "total", "done", "failed_lines", "tokens", "bytes",
                    "samples_per_s", "output_dir")


def register(subparsers: Any) -> None:
    extract = subparsers.add_parser("extract", help="extraction jobs: dataset → server → SpecForge files",
                                    description="Extraction jobs write SpecForge-format EAGLE-3 training data.")
    sub = extract.add_subparsers(dest="extract_command", metavar="ACTION", required=True)
    actions = add_job_commands(
        sub, spec_help="the job spec (TOML with a [job] table, or a pipeline: [regenerate] then [extract])",
        status_help="progress of one job or pipeline (or of all jobs)",
        every_job="every job", run=_run, status=_status, actions=(
            ("pause", "stop sending new requests (the process stays)", _pause),
            ("resume", "continue a paused job, or restart a stopped one from its manifest", _resume),
            ("cancel", "stop the job after the requests in flight", _cancel),
        ))
    actions["resume"].add_argument(
        "--accept-server", action="store_true",
        help="continue against the server that answers now although its identity (model, weights, capture "
             "layers, chat template, SGLang version) changed; the change is recorded in job.json and the "
             "output's dataset.json")
    allow_partial = ("start although the storage estimate does not fit the free space (the job writes what fits "
                     "and pauses when the disk is full); without it such a job fails before its first request, "
                     "naming what it needs, what is free and where")
    actions["run"].add_argument("--allow-partial", action="store_true", help=allow_partial)
    actions["run"].add_argument(
        "--servers", metavar="A,B,...",
        help="run the job over these servers (session ids, a replicas group id, or http://HOST:PORT URLs, "
             "comma-separated) instead of the spec's server_url/session/servers: one shared queue of samples, "
             "each server with its own window of requests")
    actions["resume"].add_argument("--allow-partial", action="store_true", help=allow_partial)
    from app.cli_hosts import add_host_option

    # A server across nodes writes its captures on node 0's host (sessions.extraction.nodes): its job runs
    # there, and is followed there, with --host NODE0.
    for name in ("run", "status", "pause", "resume", "cancel"):
        add_host_option(actions[name])

    verify = sub.add_parser("verify", help="check every file of an output dir")
    verify.add_argument("output_dir")
    verify.add_argument("--against-http", type=int, default=0, metavar="N",
                        help="re-request N samples with return_hidden_states and compare the aux rows")
    verify.add_argument("--server-url", help="server for --against-http (default: the one in dataset.json)")
    verify.add_argument("--lm-head-check", action="store_true",
                        help="top-1 of hidden_state @ lm_head^T vs the next token on assistant positions")
    verify.add_argument("--model-path", help="model dir for --lm-head-check (default: dataset.json's)")
    verify.add_argument("--min-top1", type=float, default=0.5,
                        help="--lm-head-check fails below this agreement (default 0.5)")
    verify.add_argument("--json", action="store_true", help="machine-readable report")
    verify.set_defaults(func=_verify)
    add_host_option(verify)


# The job subcommands below are the same for both kinds of job (`extract`, `regenerate`), since both are
# `sessions.extraction.job`'s jobs: each kind passes its own handlers, words and formatting.
Handler = Callable[[argparse.Namespace], int]


def add_job_commands(sub: Any, spec_help: str, status_help: str, every_job: str, run: Handler, status: Handler,
                     actions: Sequence[tuple[str, str, Handler]]) -> dict[str, argparse.ArgumentParser]:
    """Add ``run SPEC``, ``status [JOB] [--json]`` and one ``NAME JOB`` parser per action to ``sub``; the
    run, status and action parsers by name, for a kind's own flags."""
    run_parser = sub.add_parser("run", help="start a job detached; prints its job id")
    run_parser.add_argument("spec", help=spec_help)
    run_parser.set_defaults(func=run)
    status_parser = sub.add_parser("status", help=status_help)
    status_parser.add_argument("job", nargs="?", help=f"job id (default: {every_job})")
    status_parser.add_argument("--json", action="store_true", help="machine-readable output")
    status_parser.set_defaults(func=status)
    parsers = {"run": run_parser, "status": status_parser}
    for name, helptext, func in actions:
        action = sub.add_parser(name, help=helptext)
        action.add_argument("job", help="job id")
        action.set_defaults(func=func)
        parsers[name] = action
    return parsers


def job_error(exc: Exception) -> Exception:
    """A `JobError` as the `CliError` of its own message and exit code."""
    from app.cli import CliError

    return CliError(str(exc), getattr(exc, "code", 1))


def start_job(start: Callable[[str], str], spec_path: str, command: str) -> int:
    """``start(spec_path)``; print the job id on stdout and how to follow it (``eagle3-tui COMMAND status``)
    on stderr."""
    from sessions.extraction.job import JobError

    try:
        job_id = start(spec_path)
    except JobError as exc:
        raise job_error(exc) from None
    print(job_id)
    print(f"started job {job_id}; follow it with: eagle3-tui {command} status {job_id}", file=sys.stderr)
    return 0


def print_job_status(args: argparse.Namespace, load: Callable[[], list[Any]], to_json: Callable[[Any], Any],
                     human: Callable[[Any], str], kind: str) -> int:
    """``status [JOB] [--json]``: the jobs ``load`` returns (one when JOB was given) as JSON (an object for
    JOB, else an array) or as ``human`` text; "no KIND jobs" on stderr when there are none."""
    from sessions.extraction.job import JobError

    try:
        jobs = load()
    except JobError as exc:
        raise job_error(exc) from None
    if args.json:
        payload: Any = to_json(jobs[0]) if args.job else [to_json(p) for p in jobs]
        print(json.dumps(payload, indent=2))
    elif not jobs:
        print(f"no {kind} jobs", file=sys.stderr)
    else:
        for p in jobs:
            print(human(p))
    return 0


def job_action(args: argparse.Namespace, act: Callable[[str], Any], said: str) -> int:
    """Run ``act(args.job)`` and say on stderr what happened.

    ``said`` is formatted with ``job`` (the id typed) and ``progress`` (what ``act`` returned)."""
    from sessions.extraction.job import JobError

    try:
        progress = act(args.job)
    except JobError as exc:
        raise job_error(exc) from None
    print(said.format(job=args.job, progress=progress), file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    from app.cli import CliError
    from sessions.regeneration.pipeline import run_any_job
    from sessions.regeneration.pipeline_spec import is_pipeline_spec_file
    from sessions.regeneration.spec import is_regeneration_spec_file

    if args.servers is None:
        return start_job(lambda spec_path: run_any_job(spec_path, allow_partial=args.allow_partial), args.spec,
                         "extract")
    servers = tuple(s.strip() for s in args.servers.split(",") if s.strip())
    if not servers:
        raise CliError(f"--servers {args.servers!r}: name at least one server (comma-separated)", 2)
    if is_regeneration_spec_file(args.spec) or is_pipeline_spec_file(args.spec):
        kind = "a pipeline" if is_pipeline_spec_file(args.spec) else "a regeneration"
        raise CliError(f"--servers is for extraction jobs; {args.spec} is {kind} spec (name its servers "
                       "in the spec)", 2)
    from sessions.extraction.job import run_job

    return start_job(lambda spec_path: run_job(spec_path, allow_partial=args.allow_partial, servers=servers),
                     args.spec, "extract")


def _format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _human(p: Any) -> str:
    pct = f"{100 * p.fraction:5.1f}%" if p.total else "  -  "
    eta = f", ETA {p.eta_s:.0f} s" if p.eta_s else ""
    line = (f"{p.job_id}  {p.state:<11} {pct}  {p.done}/{p.total} samples, {p.failed_lines} errors, "
            f"{p.tokens} tokens, {_format_bytes(p.bytes)}, {p.samples_per_s:.1f} samples/s, "
            f"{p.tokens_per_s:.0f} tok/s, {p.gb_per_s:.3f} GB/s{eta}")
    if p.estimated_output_bytes:
        line += f"\n    storage: {_format_bytes(p.bytes)} written of ~{_format_bytes(p.estimated_output_bytes)} estimated"
        for fs in (p.storage or {}).get("filesystems", []):
            where = ", ".join(f"{r} {f}" for r, f in zip(fs.get("roles", []), fs.get("folders", [])))
            line += (f"\n      {where}: needs {_format_bytes(fs.get('needed_bytes', 0))}, "
                     f"{_format_bytes(fs.get('free_bytes', 0))} free{'' if fs.get('fits') else ' (does not fit)'}")
    from sessions.extraction.progress import server_row_text

    for row in p.servers if p.servers and len(p.servers) > 1 else []:  # several servers: one line each;
        # a one-server job's row says what its own line says
        line += f"\n    {server_row_text(row)}"
    if p.reason:
        line += f"\n    {p.reason}"
    if p.python:
        line += f"\n    python: {p.python}"
    return line


def _status_json(p: Any) -> dict[str, Any]:
    data = p.to_json()
    return {**{k: data[k] for k in _CONTRACT_FIELDS}, **data}


# A pipeline (a [regenerate] + [extract] spec) answers to its own id in `extract` and `regenerate` alike:
# status shows both stages, resume continues the stage that stopped, pause and cancel act on the running one.
def pipeline_or(job_id: str, load_job: Callable[[str], Any]) -> Any:
    """The pipeline ``job_id`` (`sessions.regeneration.pipeline.PipelineProgress`), or ``load_job(job_id)``."""
    from sessions.regeneration.pipeline import is_pipeline, pipeline_status

    return pipeline_status(job_id) if is_pipeline(job_id) else load_job(job_id)


def stage_or_job(job_id: str) -> str:
    """The running stage's job id for a pipeline id, else ``job_id`` itself."""
    from sessions.regeneration.pipeline import is_pipeline, stage_job_id

    return stage_job_id(job_id) if is_pipeline(job_id) else job_id


def is_pipeline_progress(p: Any) -> bool:
    return getattr(p, "mode", None) == "pipeline"


def regeneration_human(p: Any) -> str:
    """A regeneration job in two or three lines (`regenerate status`, and a pipeline's first stage)."""
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


def pipeline_human(p: Any) -> str:
    """A pipeline in a few lines: its state, then each stage as its own kind's status prints it."""
    lines = [f"{p.job_id}  {p.state:<11} pipeline {p.name}, stage {p.stage}"]
    for label, stage, show in (("regenerate", p.regenerate, regeneration_human), ("extract", p.extract, _human)):
        text = show(stage) if stage is not None else "not started"
        lines.append(f"  {label}: " + text.replace("\n", "\n  "))
    if p.reason and p.extract is None and (p.regenerate is None or p.regenerate.state == "done"):
        lines.append(f"    {p.reason}")
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    from sessions.extraction.job import all_jobs, job_status

    return print_job_status(
        args, lambda: [pipeline_or(args.job, job_status)] if args.job else all_jobs(),
        lambda p: p.to_json() if is_pipeline_progress(p) else _status_json(p),
        lambda p: pipeline_human(p) if is_pipeline_progress(p) else _human(p), "extraction")


def _pause(args: argparse.Namespace) -> int:
    from sessions.extraction.job import pause_job

    return job_action(args, lambda job: pause_job(stage_or_job(job)), "job {job} pauses after the requests in flight")


def _resume(args: argparse.Namespace) -> int:
    from sessions.extraction.job import resume_job
    from sessions.regeneration.pipeline import is_pipeline, resume_pipeline

    accepted = " and accepts the server that answers now (recorded in job.json and dataset.json)" \
        if args.accept_server else ""
    return job_action(args, lambda job: resume_pipeline(job) if is_pipeline(job) else
                      resume_job(job, accept_server=args.accept_server, allow_partial=args.allow_partial),
                      "job {job} resumed (pid {progress.pid})" + accepted)


def _cancel(args: argparse.Namespace) -> int:
    from sessions.extraction.job import cancel_job

    return job_action(args, lambda job: cancel_job(stage_or_job(job)), "job {job} is {progress.state}")


def _verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app.cli import CliError
    from sessions.extraction.verify import verify_output

    out = Path(args.output_dir)
    if not out.is_dir():
        raise CliError(f"{out} is not a folder", 2)
    # adv22: --against-http -5 compared nothing and said OK; --min-top1 nan failed every check unsaid.
    if args.against_http < 0:
        raise CliError(f"--against-http must be 0 or more samples, got {args.against_http}", 2)
    if not 0.0 <= args.min_top1 <= 1.0:  # NaN fails this too
        raise CliError(f"--min-top1 must be a fraction in [0, 1], got {args.min_top1}", 2)
    report = verify_output(out, against_http=args.against_http, server_url=args.server_url,
                           lm_head_check=args.lm_head_check,
                           model_path=Path(args.model_path) if args.model_path else None,
                           min_top1=args.min_top1, log=lambda m: print(m, file=sys.stderr))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.summary())
    return 0 if report.ok else 1
