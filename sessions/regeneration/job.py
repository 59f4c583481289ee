"""Regeneration jobs: create, spawn, resume.  Status, pause and cancel are the extraction job's own
functions (`sessions.extraction.job`), since both kinds keep the same files in the same jobs dir
(``spec.toml``, ``job.json``, ``progress.json`` with ``mode = "regenerate"``, ``control.json``, ``job.log``)
plus ``servers.json`` (the resolved URLs) and ``rows.jsonl`` (per-row statistics).  Nothing here imports
torch; the job process needs only httpx, so it runs under this interpreter.
"""
from __future__ import annotations

import time
from pathlib import Path

from sessions.extraction.job import (
    JOB_FILE,
    SPEC_FILE,
    JobError,
    job_status,
    load_spec_for_job,
    resume_job,
    spawn,
    update_progress,
)
from sessions.extraction.progress import JobProgress
from sessions.home import Home, atomic_write_json, atomic_write_text, ensure_private_dir, resolve_home
from sessions.regeneration.runner import SERVERS_FILE
from sessions.regeneration.spec import RegenSpec, load_regen_spec


def _session_url(session_id: str, home: Home) -> str:
    from sessions.server import ServerSession, SessionNotFound

    try:
        session = ServerSession.load(session_id, home)
    except SessionNotFound as exc:
        raise JobError(f"job.sessions: {exc}", code=2) from None
    except Exception as exc:  # noqa: BLE001 - a damaged session folder: say which
        raise JobError(f"job.sessions: cannot read session {session_id}: {exc}", code=2) from None
    server = session.profile.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    return f"http://{host}:{session.state_record.get('port') or server.port}"


def create_regen_job(spec_path: Path | str, home: Home | None = None,
                     pipeline: str | None = None) -> tuple[str, Path, RegenSpec]:
    """Check the spec, its dataset and its output, resolve its sessions, make the job dir (no process)."""
    spec = load_spec_for_job(spec_path, load_regen_spec)
    return create_regen_job_from(spec, str(spec_path), home, pipeline)


def create_regen_job_from(spec: RegenSpec, where: str, home: Home | None = None,
                          pipeline: str | None = None) -> tuple[str, Path, RegenSpec]:
    """`create_regen_job` of a spec already loaded (``where`` names it in errors); ``pipeline``: the id of
    the pipeline whose first stage this job is (its runner starts the extraction stage when done)."""
    from sessions.extraction.job import new_job_id
    from sessions.safe_files import DATASET, check_file

    home = (home or resolve_home()).ensure()
    try:
        check_file(spec.dataset, DATASET)
    except OSError as exc:
        raise JobError(f"{where}: job.dataset: {spec.dataset}: {exc.strerror or exc}", code=2) from None
    for path in (spec.output, spec.error_path, spec.skipped_path):
        if path.exists() or path.is_symlink():
            raise JobError(f"{where}: job.output: {path} already exists; choose a fresh output (or resume "
                           "the job that wrote it)", code=1)
    servers = list(spec.servers) or [_session_url(s, home) for s in spec.sessions]
    job_id = new_job_id(spec.name)
    path = ensure_private_dir(home.jobs_dir / job_id)
    import tomli_w

    atomic_write_text(path / SPEC_FILE, tomli_w.dumps(spec.to_toml_dict()))
    atomic_write_json(path / SERVERS_FILE, {"servers": servers})
    meta = {"job_id": job_id, "mode": "regenerate", "created_at": time.time(),
            "spec_source": str(spec.source_path), "home_demo": home.demo}
    if pipeline:
        meta["pipeline"] = pipeline
    atomic_write_json(path / JOB_FILE, meta)
    update_progress(path, job_id=job_id, name=spec.name, mode="regenerate", state="starting",
                    output_dir=str(spec.output), dataset=str(spec.dataset), server_url=servers[0],
                    started_at=time.time())
    return job_id, path, spec


def run_regen_job(spec_path: Path | str, home: Home | None = None) -> str:
    """``regenerate run``: create and spawn; returns the job id."""
    job_id, path, _spec = create_regen_job(spec_path, home)
    spawn(path, resume=False)  # the runner and interpreter of job.json's mode
    return job_id


def regen_status(job_id: str, home: Home | None = None) -> JobProgress:
    progress = job_status(job_id, home)
    if progress.mode != "regenerate":
        raise JobError(f"job {job_id} is an extraction job: `eagle3-tui extract status {job_id}`", code=2)
    return progress


def resume_regen_job(job_id: str, home: Home | None = None) -> JobProgress:
    """A paused live job continues; a stopped one gets a new process that skips the rows already written."""
    regen_status(job_id, home)
    return resume_job(job_id, home)  # shared with extraction: spawn picks the runner from job.json's mode
