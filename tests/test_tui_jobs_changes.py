"""The jobs screen while the set of jobs changes under it (jobs added, removed, reordered, every poll):
rows are updated in place by job id, never cleared and re-mounted (the DuplicateIds crash), the cursor
stays on its job, and a job with failed samples shows why (the reasons in its errors.jsonl)."""

from __future__ import annotations

import json
import time

from app.screens import jobs as jobs_screen
from app.screens.jobs import JobRow, JobsScreen
from tests._tui_support import run, screen_host, screen_text, wait_until


def _write_job(home, job_id: str, started_at: float, state: str = "done", errors: list[str] = ()) -> None:
    job_dir = home.jobs_dir / job_id
    out = job_dir / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "errors.jsonl").write_text("".join(
        json.dumps({"index": i, "line": i + 1, "sample_id": f"s{i}", "status": "error", "reason": r}) + "\n"
        for i, r in enumerate(errors)))
    progress = {"job_id": job_id, "state": state, "name": job_id, "total": 10, "done": 10,
                "failed_lines": len(errors), "started_at": started_at, "output_dir": str(out)}
    (job_dir / "progress.json.tmp").write_text(json.dumps(progress))
    (job_dir / "progress.json.tmp").replace(job_dir / "progress.json")


def _remove_job(home, job_id: str) -> None:
    import shutil

    shutil.rmtree(home.jobs_dir / job_id)


def test_jobs_added_and_removed_under_an_open_jobs_screen_update_in_place(home, monkeypatch):
    monkeypatch.setattr(jobs_screen, "POLL_INTERVAL_S", 0.02)
    now = time.time()
    home.jobs_dir.mkdir(parents=True, exist_ok=True)
    _write_job(home, "job-a", now - 100, errors=["not JSON", "not JSON", "tokenizer: empty"])

    async def scenario() -> None:
        app = screen_host(lambda: JobsScreen(home))
        async with app.run_test(size=(120, 30)) as pilot:
            screen = app.screen

            def ids() -> list[str]:
                return [row.progress.job_id for row in screen.query(JobRow)]

            await wait_until(pilot, lambda: ids() == ["job-a"], "job-a listed")
            await wait_until(pilot, lambda: "why: not JSON (2) · tokenizer: empty" in screen_text(app),
                             "the reasons of the failed samples, counted, most common first")
            first_row = screen.query_one(JobRow)
            for n in range(12):  # a job starts, another ends and is deleted, many polls in between
                _write_job(home, f"job-{n}", now - 50 + n)
                if n >= 2:
                    _remove_job(home, f"job-{n - 2}")
                await wait_until(pilot, lambda n=n: ids()[:1] == [f"job-{n}"], f"job-{n} on top")
            await wait_until(pilot, lambda: ids() == ["job-11", "job-10", "job-a"], "the final set")
            assert screen.query_one("#jobs").children[-1] is first_row  # updated in place, never re-mounted
            screen.query_one("#jobs").index = 2
            _write_job(home, "job-new", now)
            await wait_until(pilot, lambda: ids()[0] == "job-new", "job-new on top")
            assert screen.selected().job_id == "job-a"  # the cursor stayed on its job

    run(scenario)
