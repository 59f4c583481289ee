"""Pipelines: a regeneration job, then an extraction job on its output, started from one spec.

A pipeline is a folder in the jobs dir, next to its two stage jobs, which are ordinary jobs (their own
ids, processes, progress files, pause/resume/cancel; `extract verify` reads the extraction's output):

    <jobs>/<pipeline id>/job.json       {"job_id", "mode": "pipeline", "created_at", "spec_source", ...}
    <jobs>/<pipeline id>/pipeline.json  {"regenerate": <job id>, "extract": <job id> | null, "reason"}
    <jobs>/<pipeline id>/extract.toml   the extraction stage's spec (dataset = the regeneration's output)

The pipeline has no process of its own.  The regeneration process hands over when it ends ``done``
(`hand_over`: it creates and spawns the extraction job and records its id), so nothing waits between
the stages.  Resume continues whichever stage stopped; a regeneration that finished while nothing
started the extraction (killed in between) gets its extraction started by the resume.  The extraction
stage is checked when the pipeline is created (its session, interpreter, capture dir and output dir), so
a bad second stage fails before hours of regeneration, not after.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.extraction.job import (
    JOB_FILE,
    JobError,
    capture_dir_problem,
    check_job_python,
    job_dir,
    job_python,
    job_status,
    load_spec_for_job,
    new_job_id,
    resolve_spec,
    resume_job,
    run_job,
    spawn,
    write_spec_copy,
)
from sessions.extraction.progress import JobProgress, process_alive
from sessions.extraction.spec import check_paths
from sessions.home import Home, atomic_write_json, ensure_private_dir, read_json, resolve_home
from sessions.regeneration.handover import EXTRACT_SPEC_FILE, PIPELINE_FILE, start_extract_stage
from sessions.regeneration.pipeline_spec import PipelineSpec, is_pipeline_spec_file, load_pipeline_spec

MODE = "pipeline"


@dataclass(frozen=True)
class PipelineProgress:
    """A pipeline as its two stages' progress files say: ``state`` and ``stage`` are the running stage's
    (``extract`` once it has started), the stages are None until they exist."""

    job_id: str
    name: str
    state: str
    stage: str
    job_dir: str
    regenerate: JobProgress | None
    extract: JobProgress | None
    reason: str | None = None
    started_at: float | None = None
    mode: str = MODE

    @property
    def current(self) -> JobProgress | None:
        return self.extract or self.regenerate

    @property
    def done(self) -> int:
        return self.current.done if self.current else 0

    @property
    def total(self) -> int:
        return self.current.total if self.current else 0

    @property
    def last_progress_at(self) -> float | None:
        return self.current.last_progress_at if self.current else None

    @property
    def pid(self) -> int | None:
        return self.current.pid if self.current else None

    @property
    def is_live(self) -> bool:
        return self.state in ("starting", "running", "paused")

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "mode": MODE, "name": self.name, "state": self.state, "stage": self.stage,
                "reason": self.reason, "started_at": self.started_at, "job_dir": self.job_dir,
                "stages": {"regenerate": self.regenerate.to_json() if self.regenerate else None,
                           "extract": self.extract.to_json() if self.extract else None}}


def is_pipeline(job_id: str, home: Home | None = None) -> bool:
    try:
        return (job_dir(job_id, home) / PIPELINE_FILE).is_file()
    except JobError:
        return False


def _check_extract_stage(spec: PipelineSpec, where: str, home: Home) -> None:
    """What can be checked of the extraction stage before its dataset exists."""
    extract = spec.extract
    problems = [p for p in check_paths(extract) if p.field != "job.dataset"]
    if problems:
        raise JobError(f"{where}: " + "; ".join(str(p).replace("job.", "extract.", 1) for p in problems), code=2)
    try:
        resolved = resolve_spec(extract, home)
        check_job_python(job_python(resolved))
    except JobError as exc:
        raise JobError(f"{where}: [extract] {exc}", code=exc.code) from None
    problem = capture_dir_problem(resolved.capture_dir)
    if problem:
        raise JobError(f"{where}: [extract] {problem}", code=2)
    out = extract.output_dir
    if out.is_dir() and any(out.iterdir()):
        raise JobError(f"{where}: extract.output_dir {out} is not empty; delete it or set another output_dir",
                       code=1)


def create_pipeline(spec_path: Path | str, home: Home | None = None) -> tuple[str, Path, str]:
    """Check both stages, make the pipeline folder and the regeneration job (no process yet); returns
    (pipeline id, pipeline dir, regeneration job id)."""
    from sessions.regeneration.job import create_regen_job_from

    home = (home or resolve_home()).ensure()
    spec = load_spec_for_job(spec_path, load_pipeline_spec)
    _check_extract_stage(spec, str(spec_path), home)
    pipeline_id = new_job_id(f"{spec.name}-pipeline")
    regen_id, _regen_path, _ = create_regen_job_from(spec.regenerate, str(spec_path), home, pipeline=pipeline_id)
    path = ensure_private_dir(home.jobs_dir / pipeline_id)
    write_spec_copy(spec.extract, path / EXTRACT_SPEC_FILE)
    atomic_write_json(path / PIPELINE_FILE, {"regenerate": regen_id, "extract": None, "reason": None})
    atomic_write_json(path / JOB_FILE, {"job_id": pipeline_id, "mode": MODE, "name": spec.name,
                                         "created_at": time.time(), "spec_source": str(spec.source_path),
                                         "home_demo": home.demo})
    return pipeline_id, path, regen_id


def run_pipeline(spec_path: Path | str, home: Home | None = None) -> str:
    """``extract run`` / ``regenerate run`` of a pipeline spec: create it and start its first stage."""
    pipeline_id, _path, regen_id = create_pipeline(spec_path, home)
    spawn(job_dir(regen_id, home), resume=False)
    return pipeline_id


def run_any_job(spec_path: Path | str, home: Home | None = None, allow_partial: bool = False) -> str:
    """``extract run`` and the jobs screen's ``n``: a spec with ``[regenerate]`` and ``[extract]`` tables
    starts a pipeline, one with ``mode = "regenerate"`` a regeneration job (as ``regenerate run`` does),
    any other an extraction job (``allow_partial`` is extraction's)."""
    from sessions.regeneration.job import run_regen_job
    from sessions.regeneration.spec import is_regeneration_spec_file

    if is_pipeline_spec_file(spec_path):
        return run_pipeline(spec_path, home)
    if is_regeneration_spec_file(spec_path):
        return run_regen_job(spec_path, home)
    return run_job(spec_path, home, allow_partial=allow_partial)


def run_regen_or_pipeline(spec_path: Path | str, home: Home | None = None) -> str:
    """``regenerate run``: a pipeline spec starts its pipeline, any other is a regeneration spec."""
    from sessions.regeneration.job import run_regen_job

    if is_pipeline_spec_file(spec_path):
        return run_pipeline(spec_path, home)
    return run_regen_job(spec_path, home)


def _stage(job_id: Any, home: Home) -> JobProgress | None:
    if not job_id:
        return None
    try:
        return job_status(str(job_id), home)
    except JobError:
        return None


def read_pipeline(path: Path, home: Home) -> PipelineProgress | None:
    recorded = read_json(path / PIPELINE_FILE, default=None)
    meta = read_json(path / JOB_FILE, default=None)
    if not isinstance(recorded, dict) or not isinstance(meta, dict):
        return None
    regen, extract = _stage(recorded.get("regenerate"), home), _stage(recorded.get("extract"), home)
    reason = recorded.get("reason")
    if extract is not None:
        state, stage, reason = extract.state, "extract", extract.reason
    elif regen is None:
        state, stage = "failed", "regenerate"
        reason = reason or f"its regeneration job {recorded.get('regenerate')} is gone"
    elif regen.state != "done":
        state, stage, reason = regen.state, "regenerate", regen.reason
    elif reason:
        state, stage = "failed", "extract"
    elif process_alive(regen.pid, regen.create_time):
        state, stage = "starting", "extract"  # the regeneration process is handing over
    else:
        state, stage = "interrupted", "extract"
        reason = "the regeneration finished but its process stopped before it started the extraction; resume starts it"
    return PipelineProgress(job_id=str(meta.get("job_id") or path.name), name=str(meta.get("name") or ""),
                            state=state, stage=stage, job_dir=str(path), regenerate=regen, extract=extract,
                            reason=reason, started_at=meta.get("created_at"))


def pipeline_status(pipeline_id: str, home: Home | None = None) -> PipelineProgress:
    home = home or resolve_home()
    progress = read_pipeline(job_dir(pipeline_id, home), home)
    if progress is None:
        raise JobError(f"no pipeline {pipeline_id!r} under {home.jobs_dir}", code=2)
    return progress


def list_pipelines(home: Home) -> list[PipelineProgress]:
    """Every pipeline of the home, newest first."""
    from sessions import safe_files

    if not safe_files.folder_exists(home.jobs_dir, "jobs folder"):
        return []
    found = [p for d in home.jobs_dir.iterdir() if (d / PIPELINE_FILE).is_file() and (p := read_pipeline(d, home))]
    return sorted(found, key=lambda p: p.started_at or 0.0, reverse=True)


def resume_pipeline(pipeline_id: str, home: Home | None = None) -> PipelineProgress:
    """Continue whichever stage stopped: the regeneration (its runner then starts the extraction), the
    extraction, or, when the regeneration is done and nothing started the extraction, start it."""
    from sessions.regeneration.job import resume_regen_job

    home = home or resolve_home()
    progress = pipeline_status(pipeline_id, home)
    if progress.extract is not None:
        resume_job(progress.extract.job_id, home)
    elif progress.regenerate is None:
        raise JobError(f"pipeline {pipeline_id}: {progress.reason}", code=1)
    elif progress.regenerate.state != "done":
        resume_regen_job(progress.regenerate.job_id, home)
    elif progress.state == "starting":
        raise JobError(f"pipeline {pipeline_id} is starting its extraction stage", code=1)
    else:
        start_extract_stage(Path(progress.job_dir), home)
    return pipeline_status(pipeline_id, home)


def stage_job_id(pipeline_id: str, home: Home | None = None) -> str:
    """The job id of the pipeline's current stage (what pause and cancel act on)."""
    current = pipeline_status(pipeline_id, home).current
    if current is None:
        raise JobError(f"pipeline {pipeline_id} has no stage job", code=1)
    return current.job_id
