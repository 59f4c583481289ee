"""The demo pipeline (issue 25 item 7): the demo home's ready spec regenerates the seed chats (answers another
model wrote) with the tiny model, then extracts the regenerated chats, and `extract verify --lm-head-check`
passes on that output: the answers the extraction trains on are the model's own.

Real parts: the demo home as `ensure_demo_home` makes it, its capture profile launched (the emulator running
the tiny model's real forwards), both detached job processes, the CLI with ``--demo``.
"""
from __future__ import annotations

import json
import tomllib

import pytest
import tomli_w
from _extract_support import run_cli, stop_job, wait_for
from conftest import LaunchedSessions
from test_demo_flow import demo_home  # noqa: F401 - a fixture

from sessions.demo import (
    CAPTURE_PROFILE,
    DEMO_MALFORMED_LINE,
    DEMO_PIPELINE_ROWS,
    demo_pipeline_output_dir,
    demo_pipeline_spec_path,
    demo_regeneration_output,
)
from sessions.extraction.verify import verify_output
from sessions.profiles import load_profile
from sessions.regeneration.pipeline import pipeline_status
from sessions.regeneration.pipeline_spec import load_pipeline_spec

pytestmark = pytest.mark.slow
PIPELINE_ROWS = 24  # seed rows the test's pipeline regenerates (see the test)


def test_the_demo_pipeline_regenerates_the_seed_then_extracts_and_passes_the_lm_head_check(
        demo_home, cli_env) -> None:  # noqa: F811
    spec_path = demo_pipeline_spec_path(demo_home)
    spec = load_pipeline_spec(spec_path)
    profile = load_profile(CAPTURE_PROFILE, demo_home)
    assert spec.regenerate.servers == (f"http://127.0.0.1:{profile.server.port}",)
    assert spec.extract.server_url == spec.regenerate.servers[0] and spec.extract.dataset == spec.regenerate.output
    # The spec's first PIPELINE_ROWS seed rows, through its own num_samples: the demo's 48 give a person about a
    # minute to watch; the tiny model's real forwards make each row seconds of CPU here, and 24 rows already
    # hold every kind of row (system prompt, one and two turns, each answer length) and the broken line.
    doc = tomllib.loads(spec_path.read_text())
    assert doc["regenerate"]["num_samples"] == DEMO_PIPELINE_ROWS > PIPELINE_ROWS > DEMO_MALFORMED_LINE
    doc["regenerate"]["num_samples"] = PIPELINE_ROWS
    spec_path.write_text(tomli_w.dumps(doc))
    launched = LaunchedSessions(demo_home)
    try:
        session = launched.launch(profile)
        wait_for(lambda: session.status().state == "ready", "the capture server ready", 180)
        launched.remember(session)
        started = run_cli(["--demo", "extract", "run", str(demo_pipeline_spec_path(demo_home))], cli_env)
        assert started.returncode == 0, started.stderr
        pipeline_id = started.stdout.strip()
        try:
            done = wait_for(lambda: (p := pipeline_status(pipeline_id, demo_home)).state in ("done", "failed")
                            and p, "the demo pipeline done", 600, interval_s=0.5)
        finally:
            progress = pipeline_status(pipeline_id, demo_home)
            for stage in (progress.regenerate, progress.extract):
                if stage is not None:
                    stop_job(stage.job_id, demo_home)
    finally:
        launched.cleanup()
    assert done.state == "done", done.reason
    regen = done.regenerate
    # The seed's first rows, its broken line among them: skipped, and every row accounted for.
    assert (regen.total, regen.ok, regen.failed_lines, regen.skipped) == (PIPELINE_ROWS, PIPELINE_ROWS - 1, 0, 1)
    rows = [json.loads(line) for line in demo_regeneration_output(demo_home).read_text().splitlines()]
    answers = [m["content"] for r in rows for m in r["conversations"] if m["role"] == "assistant"]
    assert answers and not any("Another model's answer" in a for a in answers)  # all rewritten by the target
    assert regen.stats["mean_answer_chars_before"] != regen.stats["mean_answer_chars_after"]
    out = demo_pipeline_output_dir(demo_home)
    ok = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert sorted(e["sample_id"] for e in ok if e["status"] == "ok") == sorted(r["id"] for r in rows)
    verified = run_cli(["--demo", "extract", "verify", str(out), "--lm-head-check"], cli_env, timeout=300)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "lm_head top-1 agreement" in verified.stdout and "(ok)" in verified.stdout
    report = verify_output(out, lm_head_check=True)
    assert report.ok and report.lm_head is not None and report.lm_head.positions > 1000
    assert report.lm_head.top1 >= 0.85, report.summary()  # the model's own answers: its head predicts them
