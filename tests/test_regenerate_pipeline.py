"""One spec, two stages: ``[regenerate]`` then ``[extract]`` (issue 25 item 5).

Real parts: the CLI, detached job processes, an emulator session with capture on serving the demo model
(both stages send to it), real kill -9s.  Checked: the spec's problems name the stage's key and line; the
pipeline runs regeneration, then extraction with the sample ids following the row ids; a kill -9 in
either stage is resumed by the pipeline's id with nothing skipped or duplicated; `status --json` of both
commands shows both stages; the jobs screen starts it with ``n`` and shows one card with two bars.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
import tomli_w
from _extract_support import run_cli, start_job, stop_job, wait_for
from _tui_support import screen_text, wait_until
from test_extract_job import capture_dir, demo_model, manifest, start_server  # noqa: F401 - fixtures
from test_extract_jobs_screen import _JobsApp

from sessions.regeneration.pipeline import pipeline_status

pytestmark = pytest.mark.slow
ROWS = 16


def pipeline_spec(path: Path, session_id: str, dataset: Path, out: Path, **regen) -> Path:
    doc = {"regenerate": {"name": "regen", "dataset": str(dataset), "output": str(out / "regen" / "data.jsonl"),
                          "sessions": [session_id], "temperature": 0.0, "max_tokens": 24, "window": 1, **regen},
           "extract": {"name": "extract", "session": session_id, "output_dir": str(out / "hidden"),
                       "concurrency": 1}}
    path.write_text(tomli_w.dumps(doc))
    return path


def chat_dataset(path: Path, count: int = ROWS) -> Path:
    rows = [{"id": f"q{i}", "conversations": [
        {"from": "human", "value": f"Question {i}: where is Paris?"}, {"from": "gpt", "value": "Somewhere."},
        {"from": "human", "value": f"And story number {i}?"}, {"from": "gpt", "value": "Once."}]}
        for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_bad_pipeline_spec_names_the_stage_key_and_its_line(home, cli_env, tmp_path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text('# regenerate, then extract\n[regenerate]\nname = "r"\ndataset = "d.jsonl"\noutput = "o.json"\n'
                    'servers = ["http://127.0.0.1:1"]\nmode = "regenerate"\n\n[extract]\nname = "x"\n'
                    'server_url = "http://127.0.0.1:1"\ncapture_dir = "c"\nmodel_path = "m"\noutput_dir = "out"\n'
                    'dataset = "d.jsonl"\nconcurency = 4\nsample_ids = "index"\n\n[other]\nx = 1\n')
    for command in ("extract", "regenerate"):
        result = run_cli([command, "run", str(spec)], cli_env)
        assert result.returncode == 2, result.stderr
        for said in ("regenerate.output (line 5): must end in .jsonl",
                     "regenerate.mode (line 7): leave it out",
                     "extract.dataset (line 15): leave it out: the extraction reads the [regenerate] stage's output",
                     "extract.concurency (line 16): unknown key; did you mean 'concurrency'?",
                     'extract.sample_ids (line 17): must be "row"',
                     "other (line 19): unknown table or key"):
            assert said in result.stderr, result.stderr
    only = tmp_path / "only.toml"
    only.write_text('[extract]\nname = "x"\nsession = "s"\noutput_dir = "out"\n')
    result = run_cli(["extract", "run", str(only)], cli_env)
    assert result.returncode == 2 and "regenerate: missing [regenerate] table" in result.stderr, result.stderr
    swapped = tmp_path / "swapped.toml"
    swapped.write_text('[extract]\nname = "x"\nsession = "s"\noutput_dir = "out"\n\n[regenerate]\nname = "r"\n'
                       'dataset = "d.jsonl"\noutput = "o.jsonl"\nsessions = ["s"]\n')
    result = run_cli(["extract", "run", str(swapped)], cli_env)
    assert result.returncode == 2 and "extract (line 1): put [extract] after [regenerate]" in result.stderr
    assert not any(home.jobs_dir.iterdir())  # nothing was created for a bad spec


def test_a_pipeline_resumes_a_kill_9_in_either_stage_and_extracts_every_regenerated_row_once(
        home, cli_env, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:  # noqa: F811
    session = start_server(make_emulator_profile, launched, demo_model, capture_dir)
    spec = pipeline_spec(tmp_path / "pipeline.toml", session.session_id, chat_dataset(tmp_path / "data.jsonl"),
                         tmp_path)
    regen_out, hidden = tmp_path / "regen" / "data.jsonl", tmp_path / "hidden"
    pipeline_id = start_job(spec, cli_env, "extract")
    try:
        # Stage 1: killed with rows written and rows left; the pipeline's resume continues it.
        wait_for(lambda: lines(regen_out) >= 2, "regenerated rows written", 240, interval_s=0.01)
        progress = pipeline_status(pipeline_id, home)
        assert progress.stage == "regenerate" and progress.extract is None
        os.kill(progress.regenerate.pid, signal.SIGKILL)
        wait_for(lambda: pipeline_status(pipeline_id, home).state == "interrupted", "interrupted in stage 1", 60)
        kept = regen_out.read_bytes()
        assert kept.count(b"\n") < ROWS, "stage 1 finished before it could be killed"
        resumed = run_cli(["regenerate", "resume", pipeline_id], cli_env)
        assert resumed.returncode == 0, resumed.stderr
        # Stage 2 starts by itself once stage 1 is done; killed with samples written and samples left.
        wait_for(lambda: len([e for e in manifest(hidden) if e["status"] == "ok"]) >= 2, "samples extracted", 300,
                 interval_s=0.01)
        progress = pipeline_status(pipeline_id, home)
        assert progress.stage == "extract" and progress.regenerate.state == "done"
        os.kill(progress.extract.pid, signal.SIGKILL)
        wait_for(lambda: pipeline_status(pipeline_id, home).state == "interrupted", "interrupted in stage 2", 60)
        assert len([e for e in manifest(hidden) if e["status"] == "ok"]) < ROWS, "stage 2 finished before the kill"
        resumed = run_cli(["extract", "resume", pipeline_id], cli_env)
        assert resumed.returncode == 0, resumed.stderr
        done = wait_for(lambda: (p := pipeline_status(pipeline_id, home)).state in ("done", "failed") and p,
                        "the pipeline done", 300)
    finally:
        progress = pipeline_status(pipeline_id, home)
        for stage in (progress.regenerate, progress.extract):
            if stage is not None:
                stop_job(stage.job_id, home)
    assert done.state == "done", done.reason
    assert regen_out.read_bytes().startswith(kept)  # the rows finished before the kill were kept, not redone
    regenerated = [json.loads(line)["id"] for line in regen_out.read_text().splitlines()]
    assert sorted(regenerated) == sorted(f"q{i}" for i in range(ROWS))  # each row exactly once
    ok = [e["sample_id"] for e in manifest(hidden) if e["status"] == "ok"]
    assert sorted(ok) == sorted(regenerated)  # every regenerated row extracted once, under its row id
    assert done.extract.dataset == str(regen_out)
    for command in ("extract", "regenerate"):
        shown = run_cli([command, "status", pipeline_id, "--json"], cli_env)
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert (status["mode"], status["state"], status["stage"]) == ("pipeline", "done", "extract")
        stages = status["stages"]
        assert stages["regenerate"]["mode"] == "regenerate" and stages["regenerate"]["ok"] == ROWS
        assert stages["extract"]["mode"] == "extract" and stages["extract"]["done"] == ROWS
        text = run_cli([command, "status", pipeline_id], cli_env).stdout
        assert "pipeline regen, stage extract" in text and "regenerate: " in text and "extract: " in text
    verify = run_cli(["extract", "verify", str(hidden)], cli_env, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_jobs_screen_starts_a_pipeline_and_shows_one_card_with_two_bars(
        home, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:  # noqa: F811
    from app.screens.jobs import JobRow, JobsScreen, PipelineRow

    session = start_server(make_emulator_profile, launched, demo_model, capture_dir)
    spec = pipeline_spec(tmp_path / "pipeline.toml", session.session_id, chat_dataset(tmp_path / "data.jsonl", 4),
                         tmp_path, max_tokens=8)
    seen: dict[str, str] = {}

    async def scenario() -> None:
        app = _JobsApp(home)
        async with app.run_test(size=(200, 50)) as pilot:
            screen = app.screen
            assert isinstance(screen, JobsScreen)
            await pilot.press("n")
            app.screen.query_one("#spec-path").value = str(spec)
            await pilot.press("enter")
            await wait_until(pilot, lambda: screen.jobs, "the pipeline listed", 180)
            assert [p.mode for p in screen.jobs] == ["pipeline"]  # its stage jobs have no rows of their own
            await wait_until(pilot, lambda: screen.jobs[0].state == "done", "the pipeline done", 300)
            await wait_until(pilot, lambda: "4/4 samples" in screen_text(app), "the card redrawn", 30)
            assert not screen.query(JobRow) and len(screen.query(PipelineRow)) == 1
            assert len(screen.query_one(PipelineRow).query("ProgressBar")) == 2
            seen["wide"] = screen_text(app)
            await pilot.resize_terminal(80, 24)
            await wait_until(pilot, lambda: screen_text(app).count("\n") == 23, "the 80x24 redraw", 30)
            seen["narrow"] = screen_text(app)

    try:
        asyncio.run(scenario())
    finally:
        for job_dir in home.jobs_dir.iterdir():
            stop_job(job_dir.name, home)
    pipeline_id = pipeline_status_id(home)
    if os.environ.get("REGEN2_DUMP"):
        Path(os.environ["REGEN2_DUMP"]).write_text(seen["wide"] + "\n\n" + seen["narrow"])
    for size, text in seen.items():
        assert f"pipeline {pipeline_id[:20]}" in text, (size, text)
        assert "1 regenerate" in text and "2 extract" in text, (size, text)
        assert "4/4 rows · 4 success · 0 error · 0 skipped" in text, (size, text)
        assert "4/4 samples · 0 errors" in text, (size, text)
        bars = [line for line in text.splitlines() if line.strip().startswith("━")]
        assert len(bars) == 2 and all(bar.endswith("100%") for bar in bars), (size, text)  # two full bars
    assert "answers: 8" in seen["wide"]


def pipeline_status_id(home) -> str:
    return next(d.name for d in home.jobs_dir.iterdir() if (d / "pipeline.json").is_file())
