"""The hand-over between a pipeline's stages (`sessions.regeneration.pipeline`): once its regeneration is
done, the extraction of its output is created and spawned, once.  Called by the regeneration process when
it ends ``done`` (`hand_over`) and by a pipeline's resume when nothing did; it imports neither the
regeneration job nor the pipeline module, so the runner can call it without an import cycle."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessions.extraction.job import JOB_FILE, JobError, create_job, spawn
from sessions.home import Home, atomic_write_json, read_json, resolve_home

PIPELINE_FILE = "pipeline.json"  # {"regenerate": <job id>, "extract": <job id> | null, "reason"}
EXTRACT_SPEC_FILE = "extract.toml"  # the extraction stage's spec, its dataset the regeneration's output


def _record(path: Path, **changes: Any) -> None:
    current = read_json(path / PIPELINE_FILE, default={}) or {}
    current.update(changes)
    atomic_write_json(path / PIPELINE_FILE, current)


def start_extract_stage(pipeline_dir: Path, home: Home) -> str:
    """Create and spawn the extraction stage (once: an id already recorded is returned as it is).

    Its id is recorded before its process starts, so a kill in between leaves a job that `resume` starts,
    never a second one.  A stage that cannot start is recorded as the pipeline's reason."""
    recorded = read_json(pipeline_dir / PIPELINE_FILE, default={}) or {}
    if recorded.get("extract"):
        return str(recorded["extract"])
    try:
        extract_id, extract_path = create_job(pipeline_dir / EXTRACT_SPEC_FILE, home)
    except JobError as exc:
        _record(pipeline_dir, reason=f"the extraction stage did not start: {exc}")
        raise
    _record(pipeline_dir, extract=extract_id, reason=None)
    spawn(extract_path, resume=False)
    return extract_id


def hand_over(regen_job_dir: Path, log: Callable[[str], Any] = print) -> None:
    """Called by a pipeline's regeneration process once it is done: start the extraction stage."""
    meta = read_json(regen_job_dir / JOB_FILE, default={}) or {}
    pipeline_id = meta.get("pipeline")
    if not pipeline_id:
        return
    home = resolve_home(bool(meta.get("home_demo")))
    if home.jobs_dir.resolve() != regen_job_dir.parent.resolve():  # another home in this environment
        home = Home(config_root=home.config_root, state_root=regen_job_dir.parent.parent, demo=home.demo)
    path = home.jobs_dir / str(pipeline_id)
    try:
        extract_id = start_extract_stage(path, home)
    except JobError as exc:
        log(f"pipeline {pipeline_id}: the extraction stage did not start: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - the regeneration is done whatever happens here: record why
        _record(path, reason=f"the extraction stage did not start: {type(exc).__name__}: {exc}")
        log(f"pipeline {pipeline_id}: the extraction stage did not start: {type(exc).__name__}: {exc}")
        return
    log(f"pipeline {pipeline_id}: started the extraction stage, job {extract_id}")
