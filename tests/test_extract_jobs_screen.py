"""The jobs screen drives a real detached job: progress bar, pause, cancel (confirmed), resume, and a
notification when the job's state changes.  The job's server is a port that refuses connections, so
the job stays live and paused while the screen acts on it."""
from __future__ import annotations

import asyncio
from pathlib import Path

from _extract_support import chat_rows, free_port, make_tokenizer_dir, stop_job, write_dataset, write_spec
from _tui_support import wait_until
from textual.app import App

from app.screens.jobs import JobRow, JobsScreen
from sessions.extraction.job import job_status


class _JobsApp(App):
    def __init__(self, home) -> None:
        super().__init__()
        self.home = home
        self.notes: list[str] = []

    def on_mount(self) -> None:
        self.push_screen(JobsScreen(self.home))

    def notify(self, message, **kwargs) -> None:  # record what the user is told
        self.notes.append(str(message))
        super().notify(message, **kwargs)


def test_jobs_screen_shows_a_progress_bar_and_pauses_cancels_and_resumes_a_real_job(home, tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    capture.mkdir(mode=0o700)
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(5), bad={2: b"{broken"})
    spec = write_spec(tmp_path / "job.toml", name="screen", server_url=f"http://127.0.0.1:{free_port()}",
                      dataset=dataset, output_dir=tmp_path / "out", capture_dir=capture,
                      model_path=make_tokenizer_dir(tmp_path / "model", "kimi"), concurrency=2)
    started: list[str] = []

    async def scenario() -> None:
        app = _JobsApp(home)
        async with app.run_test(size=(140, 30)) as pilot:
            screen = app.screen
            assert isinstance(screen, JobsScreen)
            await pilot.press("n")  # start the job from the keyboard
            app.screen.query_one("#spec-path").value = str(spec)
            await pilot.press("enter")
            await wait_until(pilot, lambda: screen.jobs, "the new job listed", 180)
            started.append(screen.jobs[0].job_id)
            job_id = started[0]
            assert any(f"Started job {job_id}" in n for n in app.notes)

            def job():
                return next((p for p in screen.jobs if p.job_id == job_id), None)

            await wait_until(pilot, lambda: job() and job().state == "paused" and job().done == 1,
                             "the job paused on the down server with the bad line recorded", 180)
            row = screen.query_one(JobRow)
            assert row.query_one("#bar").total == 6 and row.query_one("#bar").progress == 1
            assert "server unreachable" in (job().reason or "")
            await pilot.press("p")
            await wait_until(pilot, lambda: job().paused_by_user, "the pause reached the job")
            await pilot.press("c")
            await pilot.press("y")
            await wait_until(pilot, lambda: job().state == "cancelled", "the job was cancelled")
            await wait_until(pilot, lambda: any("cancelled" in n and "screen" in n for n in app.notes),
                             "a notification that the job was cancelled")
            await pilot.press("r")
            await wait_until(pilot, lambda: job().state in ("starting", "paused", "running"),
                             "the job was resumed as a new process", 180)
            await wait_until(pilot, lambda: job().state == "paused", "the resumed job paused on the server again", 180)
            assert job().done == 1  # the bad line is not recorded twice
            await pilot.press("c")
            await pilot.press("y")
            await wait_until(pilot, lambda: job().state == "cancelled", "cancelled again")

    try:
        asyncio.run(scenario())
    finally:  # every job this test started, even one the screen never got to show
        for job_dir in home.jobs_dir.iterdir():
            stop_job(job_dir.name, home)
    assert job_status(started[0], home).state == "cancelled"


def test_a_job_over_several_servers_shows_a_line_per_server_with_state_done_rate_and_failures(home) -> None:
    """The row draws the progress file's ``servers`` rows (written by the job: tests/test_extract_multi.py)."""
    from sessions.extraction.progress import JobProgress

    rows = [{"name": "s-a", "url": "http://127.0.0.1:1", "state": "live", "reason": None, "done": 12,
             "samples_per_s": 3.5, "failures": 0, "in_flight": 2, "window": 4},
            {"name": "s-b", "url": "http://127.0.0.1:2", "state": "left out", "done": 3, "samples_per_s": 0.0,
             "failures": 20, "in_flight": 0, "window": 1, "reason": "20 straight failures; last: timed out"}]
    progress = JobProgress(job_id="j-1", state="running", name="multi", total=40, done=15, servers=rows,
                           eta_s=7.0)

    class _RowApp(App):
        def compose(self):
            yield JobRow(progress)

    async def scenario() -> None:
        app = _RowApp()
        async with app.run_test(size=(160, 20)) as pilot:
            await wait_until(pilot, lambda: "server s-a" in str(app.query_one("#rates").render()),
                             "the row drew its server lines")
            text = str(app.query_one("#rates").render())
            assert "server s-a  live  12 done, 3.5 samples/s, 0 failures, 2/4 in flight" in text
            assert ("server s-b  left out  3 done, 0.0 samples/s, 20 failures, 0/1 in flight "
                    "(20 straight failures; last: timed out)") in text

    asyncio.run(scenario())
