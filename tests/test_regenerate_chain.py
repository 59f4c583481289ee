"""Regenerate, then extract: an extraction job whose dataset is a regeneration job's output
(``dataset = "job:<id>"``), over the same capture session; the sample ids follow the row ids."""
from __future__ import annotations

import json

import pytest
from _extract_support import run_cli, run_job_to_end, start_job, stop_job, wait_state, write_spec
from test_extract_job import capture_dir, demo_model, manifest, start_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


def test_an_extraction_job_reads_a_regeneration_jobs_output_with_its_row_ids(
        home, cli_env, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:  # noqa: F811
    session = start_server(make_emulator_profile, launched, demo_model, capture_dir)
    rows = [{"id": f"q{i}", "conversations": [{"from": "human", "value": f"Question {i}: where is Paris?"},
                                               {"from": "gpt", "value": "Somewhere."}]} for i in range(6)]
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    regen_spec = write_spec(tmp_path / "regen.toml", mode="regenerate", name="regen", dataset=dataset,
                            output=tmp_path / "regen" / "data.jsonl", sessions=[session.session_id],
                            temperature=0.0, max_tokens=24, window=2)
    regen_id = start_job(regen_spec, cli_env, "regenerate")
    extract_spec = write_spec(tmp_path / "extract.toml", name="x", session=session.session_id,
                              dataset=f"job:{regen_id}", output_dir=tmp_path / "out", concurrency=2)
    try:
        regen = wait_state(regen_id, home)
    finally:
        stop_job(regen_id, home)
    assert regen.state == "done", regen.reason
    done = run_job_to_end(extract_spec, cli_env, home)
    assert done.state == "done", done.reason
    assert done.dataset == str(tmp_path / "regen" / "data.jsonl")
    ok = [e for e in manifest(tmp_path / "out") if e["status"] == "ok"]
    assert sorted(e["sample_id"] for e in ok) == [f"q{i}" for i in range(6)]
    import torch

    for entry in ok:
        assert torch.load(tmp_path / "out" / entry["path"], weights_only=True)["sample_id"] == entry["sample_id"]
    # (No --lm-head-check here: the demo model's random weights emit partial UTF-8 tokens, whose "\ufffd"
    # text does not re-tokenize to the ids it generated, so its own answers do not survive the text round trip.)
    # The output passes `extract verify`'s checks, run here (the CLI's own exit codes are test_extract_verify's;
    # a CLI start here cost a second torch import for the same report).
    from sessions.extraction.verify import verify_output

    report = verify_output(tmp_path / "out")
    assert report.ok, report.summary()


def test_a_job_dataset_that_is_not_done_or_not_a_regeneration_job_is_refused(home, cli_env, tmp_path) -> None:
    spec = write_spec(tmp_path / "extract.toml", name="x", server_url="http://127.0.0.1:1",
                      capture_dir=tmp_path, model_path=tmp_path, dataset="job:nope-1", output_dir=tmp_path / "o")
    result = run_cli(["extract", "run", str(spec)], cli_env)
    assert result.returncode == 2
    assert "job.dataset: no job 'nope-1'" in result.stderr
