"""The jobs screen with a regeneration job: started from the keyboard, its row shows rows done/failed/
skipped and the data's shape, and ``r`` resumes it after a kill -9 as a regeneration process (the runner
is chosen from the job's mode), which writes each row exactly once."""
from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from _emulator_support import Emulator
from _extract_support import stop_job, write_spec
from _tui_support import wait_until
from test_extract_jobs_screen import _JobsApp

from app.screens.jobs import JobRow, JobsScreen


def test_a_regeneration_job_in_the_jobs_screen_shows_its_data_and_resumes_after_kill_9(
        home, tmp_path: Path, models) -> None:
    emu = Emulator(tmp_path / "run", models["small"], "--served-model-name", "small", tp=1)
    try:
        emu.wait_ready()
        rows = [{"id": f"r{i}", "conversations": [{"role": "user", "content": f"Question {i}?"},
                                                  {"role": "assistant", "content": "old " * (i + 1)}]}
                for i in range(12)] + [{"id": "bad", "conversations": []}]
        dataset = tmp_path / "data.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = tmp_path / "o" / "regen.jsonl"
        spec = write_spec(tmp_path / "regen.toml", mode="regenerate", name="screen-regen", dataset=dataset,
                          output=out, servers=[emu.url("")], window=1, max_tokens=200)

        async def scenario() -> None:
            app = _JobsApp(home)
            async with app.run_test(size=(160, 30)) as pilot:
                screen = app.screen
                assert isinstance(screen, JobsScreen)
                await pilot.press("n")
                app.screen.query_one("#spec-path").value = str(spec)
                await pilot.press("enter")
                await wait_until(pilot, lambda: screen.jobs, "the new job listed", 180)
                job_id = screen.jobs[0].job_id
                assert screen.jobs[0].mode == "regenerate"
                await wait_until(pilot, lambda: out.exists() and out.read_bytes().count(b"\n") >= 1,
                                 "a row written", 180)
                os.kill(screen.jobs[0].pid, signal.SIGKILL)
                await wait_until(pilot, lambda: screen.jobs[0].state == "interrupted", "interrupted", 60)
                await pilot.press("r")
                await wait_until(pilot, lambda: screen.jobs[0].state == "done", "the resumed job is done", 180)
                text = str(screen.query_one(JobRow).query_one("#rates").render())
                assert "13/13 rows · 12 success · 0 error · 1 skipped" in text
                assert "answers: 12" in text and "mean chars" in text and "cut by max_tokens" in text
                ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
                assert sorted(ids) == sorted(f"r{i}" for i in range(12))
                stop_job(job_id, home)

        asyncio.run(scenario())
    finally:
        for job_dir in home.jobs_dir.iterdir():
            stop_job(job_dir.name, home)
        emu.kill()
