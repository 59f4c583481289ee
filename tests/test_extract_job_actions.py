"""Job actions say what is true (issue 21 smaller items, issue 22 item 14).

* Cancel on a done job never says "cancelled" (CLI and TUI), and the job stays done.
* Re-running a spec whose output holds a finished job's dataset never suggests resuming that done job;
  an unfinished one's is offered for resume.
* A resumed job shows its name and last counts from its first progress write, not 0/0 and its id.
* ``job.log`` is 0600, also when an older version left it 0644.
Real files, the real CLI and job process; no server is needed for these.
"""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from _extract_support import chat_rows, run_cli, stop_job, wait_for, write_dataset, write_spec

from app.screens.jobs import JobRow, JobsScreen
from sessions.extraction.job import JobError, cancel_job, create_job, job_status, spawn
from sessions.extraction.progress import read_progress
from sessions.extraction.runner import JobRun
from tests._tui_support import run, screen_host, wait_until
from widgets.confirm_modal import ConfirmModal


def _job(home, job_id: str, state: str, **progress) -> Path:
    path = home.jobs_dir / job_id
    path.mkdir(parents=True, exist_ok=True)
    (path / "job.json").write_text(json.dumps({"job_id": job_id, "created_at": time.time()}))
    fields = {"job_id": job_id, "state": state, "name": "named", "total": 10, "done": 10, "ok": 10,
              "started_at": time.time(), **progress}
    (path / "progress.json").write_text(json.dumps(fields))
    return path


def _spec(tmp_path: Path, out: Path, model_dir: Path) -> Path:
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(4))
    return write_spec(tmp_path / "job.toml", name="again", server_url="http://127.0.0.1:9", dataset=dataset,
                      output_dir=out, capture_dir=tmp_path / "cap", model_path=model_dir)


@pytest.fixture
def model_dir(small_model_dir: Path) -> Path:
    return small_model_dir


def test_cancel_on_a_done_job_says_it_is_done_and_leaves_it_done(home, cli_env) -> None:
    _job(home, "job-done", "done")
    with pytest.raises(JobError, match="job job-done is already done: nothing to cancel"):
        cancel_job("job-done", home)
    result = run_cli(["extract", "cancel", "job-done"], cli_env)
    assert result.returncode == 1 and "already done: nothing to cancel" in result.stderr, result.stderr
    assert "is cancelled" not in result.stderr
    assert job_status("job-done", home).state == "done"


def test_the_jobs_screen_does_not_offer_to_cancel_a_done_job(home) -> None:
    _job(home, "job-done", "done")

    async def scenario() -> None:
        app = screen_host(lambda: JobsScreen(home))
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_until(pilot, lambda: list(app.screen.query(JobRow)), "the done job listed")
            await pilot.press("c")
            await wait_until(pilot, lambda: any("nothing to cancel" in str(n.message)
                                                for n in app._notifications), "the done-job notice")
            assert not isinstance(app.screen, ConfirmModal)
            assert not any("cancelled" in str(n.message) for n in app._notifications)

    run(scenario)
    assert job_status("job-done", home).state == "done"


def test_rerunning_a_finished_spec_never_suggests_resuming_the_done_job(home, tmp_path, model_dir) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "dataset.json").write_text(json.dumps({"job_id": "job-old"}))
    (out / "manifest.jsonl").write_text("")
    spec = _spec(tmp_path, out, model_dir)
    _job(home, "job-old", "done")
    with pytest.raises(JobError) as done:
        create_job(spec, home)
    assert "finished dataset of job job-old (done)" in str(done.value) and "resume" not in str(done.value)
    assert "another output_dir" in str(done.value)
    # An unfinished owner is offered for resume, naming its state.
    _job(home, "job-old", "interrupted", done=4)
    with pytest.raises(JobError) as unfinished:
        create_job(spec, home)
    assert "`eagle3-tui extract resume job-old`" in str(unfinished.value) and "interrupted" in str(unfinished.value)
    # A done job with failed samples can be resumed (its failures are retried).
    _job(home, "job-old", "done", extraction_failures=2)
    with pytest.raises(JobError, match="extract resume job-old"):
        create_job(spec, home)


def test_a_resumed_job_shows_its_name_and_last_counts_before_it_has_counted(home, tmp_path, model_dir) -> None:
    spec = _spec(tmp_path, tmp_path / "out", model_dir)
    _job_id, path = create_job(spec, home)
    last = {**json.loads((path / "progress.json").read_text()), "state": "interrupted", "total": 4, "done": 3,
            "ok": 2, "failed_lines": 1, "tokens": 120, "bytes": 4096}
    (path / "progress.json").write_text(json.dumps(last))
    JobRun(path, resume=True).report.write_progress()  # the new run's first write, before its start-up
    shown = read_progress(path)
    assert shown is not None
    assert (shown.name, shown.total, shown.done, shown.ok, shown.failed_lines, shown.tokens, shown.bytes) == (
        "again", 4, 3, 2, 1, 120, 4096)
    fresh = JobRun(path, resume=False).report.snapshot()  # a fresh run carries the name only
    assert fresh["name"] == "again" and fresh["done"] == 0


def test_job_log_is_private_also_when_an_older_version_left_it_readable(home, tmp_path, model_dir) -> None:
    spec = _spec(tmp_path, tmp_path / "out", model_dir)
    job_id, path = create_job(spec, home)
    log = path / "job.log"
    log.write_text("from an older version\n")
    os.chmod(log, 0o644)
    spawn(path, resume=False)
    try:
        wait_for(lambda: "starting" in log.read_text() or "failed" in log.read_text(), "the job's first log line")
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert log.read_text().startswith("from an older version\n")  # appended, nothing lost
    finally:
        stop_job(job_id, home)
    os.unlink(log)
    spawn(path, resume=True)
    try:
        wait_for(log.exists, "a new job.log")
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
    finally:
        stop_job(job_id, home)


# -- a refused capture folder refuses the job (issue 22 item 18) ---------------------------------------------
def _refused_dirs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Capture folders the plugin refuses, each with the word its reason must hold."""
    real = tmp_path / "real-capture"
    real.mkdir(mode=0o700)
    link = tmp_path / "link-capture"
    link.symlink_to(real)
    foreign = tmp_path / "foreign-capture"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)  # nobody's: the tests run as root, who can give a folder away
    open_dir = tmp_path / "open-capture"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    a_file = tmp_path / "file-capture"
    a_file.write_text("not a folder")
    return {"symlink": (link, "symlink"), "foreign": (foreign, "owned by uid 65534"),
            "open": (open_dir, "0777"), "file": (a_file, "not a directory")}


def test_a_refused_capture_folder_refuses_the_job_before_any_request(home, cli_env, tmp_path, model_dir) -> None:
    from _extract_support import DownServerStandIn, free_port

    port = free_port()
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(4))
    with DownServerStandIn(port) as server:
        for name, (folder, why) in _refused_dirs(tmp_path).items():
            spec = write_spec(tmp_path / f"{name}.toml", name=name, server_url=f"http://127.0.0.1:{port}",
                              dataset=dataset, output_dir=tmp_path / f"out-{name}", capture_dir=folder,
                              model_path=model_dir)
            refused = run_cli(["extract", "run", str(spec)], cli_env)
            assert refused.returncode == 2, (name, refused.stderr)
            assert str(folder) in refused.stderr and why in refused.stderr, (name, refused.stderr)
            assert "nothing was sent" in refused.stderr
        assert not home.jobs_dir.exists() or not any(home.jobs_dir.iterdir())  # no job was made

        # A folder refused after the job was made (here: replaced by a link before it starts) fails the
        # run at its start-up, naming the folder and why, and still nothing reaches the server.
        capture = tmp_path / "later"
        spec = write_spec(tmp_path / "later.toml", name="later", server_url=f"http://127.0.0.1:{port}",
                          dataset=dataset, output_dir=tmp_path / "out-later", capture_dir=capture,
                          model_path=model_dir)
        job_id, path = create_job(spec, home)  # a missing capture dir is fine: the server makes it
        capture.symlink_to(tmp_path / "real-capture")
        spawn(path, resume=False)
        try:
            failed = wait_for(lambda: (p := job_status(job_id, home)).state in ("failed", "done") and p,
                              "the job refused", 120)
        finally:
            stop_job(job_id, home)
        assert failed.state == "failed" and str(capture) in failed.reason and "symlink" in failed.reason
        assert f"extract resume {job_id}" in failed.reason
        assert server.requests == []  # not one request: no /model_info, no /generate
