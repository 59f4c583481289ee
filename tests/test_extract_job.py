"""Extraction jobs end to end: the CLI, a detached job process, the emulator with the demo model and capture
on (the one stand-in), real dumps, real signals.  What is checked is the output itself: each expected
sample exactly once, complete, equal to what the model computes, and readable by SpecForge."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _extract_support import (
    DownServerStandIn,
    assert_specforge_reads,
    chat_rows,
    run_cli,
    start_job,
    stop_job,
    wait_for,
    wait_state,
    write_dataset,
    write_spec,
)

from sessions.extraction.job import job_status

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "demo", num_layers=8, hidden_size=64)


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    path = tmp_path / "capture"
    path.mkdir(mode=0o700)
    return path


def start_server(make_emulator_profile, launched, demo_model: Path, capture_dir: Path | None,
                 name: str = "capture", chunked_prefill_size: int = 24, port: int | None = None, **server):
    """A TP1 emulator session serving the demo model, capture on (unless ``capture_dir`` is None)."""
    overrides: dict = {"model_path": str(demo_model), "chunked_prefill_size": chunked_prefill_size, **server}
    if port:
        overrides["port"] = port
    if capture_dir is not None:
        overrides["capture"] = {"enabled": True, "dir": str(capture_dir), "rid_prefix": "eagle3-"}
    profile = make_emulator_profile(name, tp=1, **overrides)
    session = launched.launch(profile)
    wait_for(lambda: session.status().state == "ready", f"session {session.session_id} ready", 180)
    launched.remember(session)
    return session


def manifest(out: Path) -> list[dict]:
    if not (out / "manifest.jsonl").exists():
        return []
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines() if line.strip()]


def job_spec(tmp_path: Path, session, rows: int, bad: dict[int, bytes] | None = None, **keys) -> Path:
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(rows), bad=bad)
    return write_spec(tmp_path / "job.toml", name="t", session=session.session_id, dataset=dataset,
                      output_dir=tmp_path / "out", **keys)


def expected_indices(rows: int, bad: dict[int, bytes]) -> set[int]:
    """0-based line indices of the good rows when bad lines are inserted before some rows."""
    indices, line = set(), 0
    for i in range(rows):
        if i in bad:
            line += 1
        indices.add(line)
        line += 1
    return indices


def assert_each_sample_once(out: Path, good: set[int], job_id: str) -> None:
    entries = manifest(out)
    ok = [e for e in entries if e["status"] == "ok"]
    assert sorted(e["index"] for e in ok) == sorted(good)  # each expected sample, exactly once
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*.ckpt"))
    assert files == sorted(e["path"] for e in ok)  # no file without its line, no line without its file
    assert not list(out.rglob("*.tmp"))
    for entry in ok:
        data = torch.load(out / entry["path"], weights_only=True)
        assert data["sample_id"] == f"{job_id}-{entry['index']}"
        assert data["input_ids"].shape == (entry["tokens"],)


def test_a_job_extracts_every_good_line_once_records_bad_ones_and_specforge_reads_the_result(
        home, cli_env, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:
    session = start_server(make_emulator_profile, launched, demo_model, capture_dir)
    bad = {3: b"{not json", 7: b'{"conversations": [{"from": "martian", "value": "x"}]}'}
    spec = job_spec(tmp_path, session, 14, bad=bad, concurrency=4)
    job_id = start_job(spec, cli_env)
    try:
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    status = run_cli(["extract", "status", job_id, "--json"], cli_env)
    fields = json.loads(status.stdout)
    for key in ("job_id", "pid", "state", "total", "done", "failed_lines", "tokens", "bytes", "samples_per_s",
                "output_dir"):
        assert key in fields
    assert (fields["state"], fields["total"], fields["done"], fields["failed_lines"]) == ("done", 16, 16, 2)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["dataset.json", "errors.jsonl", "manifest.jsonl", "rows_0-2000"]
    assert_each_sample_once(out, expected_indices(14, bad), job_id)
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["line"], e["status"]) for e in errors] == [(4, "error"), (9, "error")]
    assert "not JSON" in errors[0]["reason"] and "martian" in errors[1]["reason"]
    info = json.loads((out / "dataset.json").read_text())
    assert info["complete"] and info["counts"]["ok"] == 14 and info["counts"]["error"] == 2
    assert info["layers"]["capture_points"] == [2, 4, 5]  # [2, L//2, L-3] for L = 8
    assert info["layers"]["draft_config_ids"] == [1, 3, 4]  # Llama family: SGLang adds 1
    assert info["sglang_version"] and info["hidden_size"] == 64 and info["aux_width"] == 3 * 64
    assert not [p for p in capture_dir.iterdir() if p.name.startswith(f"eagle3-{job_id}")]  # dumps consumed
    assert assert_specforge_reads(out, 64, 192) == 14
    verify = run_cli(["extract", "verify", str(out)], cli_env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # The states are the model's own: recompute one sample with transformers and compare.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model, local_files_only=True, dtype=torch.float32).eval()
    entry = next(e for e in manifest(out) if e["status"] == "ok" and e["tokens"] > 24)  # spans chunks
    sample = torch.load(out / entry["path"], weights_only=True)
    with torch.inference_mode():
        hf = model.model(input_ids=sample["input_ids"][None], output_hidden_states=True)
    aux = torch.cat([hf.hidden_states[p][0] for p in (2, 4, 5)], dim=-1)
    torch.testing.assert_close(sample["aux_hidden_state"][0].float(), aux, atol=0.05, rtol=0.02)
    torch.testing.assert_close(sample["hidden_state"][0].float(), hf.last_hidden_state[0], atol=0.05, rtol=0.02)
    loss = sample["loss_mask"].tolist()
    assert loss[0] == 0 and 1 in loss  # the prompt is not supervised, the answer is


def test_sigkill_mid_run_then_resume_gives_each_expected_sample_exactly_once(
        home, cli_env, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:
    session = start_server(make_emulator_profile, launched, demo_model, capture_dir)
    rows = 24
    spec = job_spec(tmp_path, session, rows, concurrency=4)
    out = tmp_path / "out"
    job_id = start_job(spec, cli_env)
    try:
        # Killed as soon as two samples are recorded: the others are in flight, in the collector, or queued.
        wait_for(lambda: len(manifest(out)) >= 2, "2 samples recorded", 240, interval_s=0.002)
        pid = job_status(job_id, home).pid
        os.kill(pid, signal.SIGKILL)
        recorded_at_kill = len(manifest(out))
        assert recorded_at_kill < rows, "the job finished before it could be killed mid-run"
        assert wait_state(job_id, home, ("interrupted",), 30).state == "interrupted"
        resumed = run_cli(["extract", "resume", job_id], cli_env)
        assert resumed.returncode == 0, resumed.stderr
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert done.job_id == job_id
    assert_each_sample_once(out, set(range(rows)), job_id)
    assert run_cli(["extract", "verify", str(out)], cli_env).returncode == 0


def test_server_killed_mid_run_pauses_the_job_and_a_restarted_server_lets_it_finish(
        home, cli_env, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:
    session = start_server(make_emulator_profile, launched, demo_model, capture_dir)
    port = session.status().port
    rows = 20
    spec = job_spec(tmp_path, session, rows, concurrency=4)
    out = tmp_path / "out"
    job_id = start_job(spec, cli_env)
    try:
        wait_for(lambda: len(manifest(out)) >= 2, "2 samples recorded", 240, interval_s=0.002)
        pid, create_time = session.state_record["pid"], session.state_record["create_time"]
        os.killpg(os.getpgid(pid), signal.SIGKILL)  # the whole server, at once, mid-request
        paused = wait_state(job_id, home, ("paused", "failed"), 60)
        assert paused.state == "paused" and "server unreachable" in paused.reason
        from sessions import probes

        wait_for(lambda: not probes.process_alive(pid, create_time), "the old server gone", 30)
        # Nothing is recorded while the server is gone.  Proof that the job went on being paused rather
        # than a pause in the test: a stand-in on the port answers 503, and the job's /ready probes show
        # it read the answers and still waits; meanwhile it sent no /generate.  The count is taken after
        # its second probe: a request whose whole answer came before the kill (concurrency 4) may still be
        # recorded after the first failure paused the job, and that sample is complete.
        with DownServerStandIn(port) as down:
            wait_for(lambda: len(down.requests) >= 2, "two /ready probes of the paused job", 60)
            recorded = len(manifest(out))
            wait_for(lambda: len(down.requests) >= 4, "two more /ready probes", 60)
        assert all(r.startswith("GET /ready") for r in down.requests), down.requests
        assert len(manifest(out)) == recorded and recorded < rows
        assert job_status(job_id, home).state == "paused"
        start_server(make_emulator_profile, launched, demo_model, capture_dir, name="capture2", port=port)
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert_each_sample_once(out, set(range(rows)), job_id)


def test_a_small_capture_budget_applies_back_pressure_and_a_full_one_pauses_the_job(
        home, cli_env, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:
    """The capture filesystem is simulated by ``capture_budget_bytes``: the job measures the real size of the
    capture dir against that budget (a small tmpfs cannot be mounted here)."""
    session = start_server(make_emulator_profile, launched, demo_model, capture_dir)
    # Dumps take (3·64 + 64)·2 + 8 = 520 B/token; the longest prompts here are ~150 tokens (~80 KB).
    budget = 200_000
    foreign = capture_dir / "someone-elses-file"
    foreign.write_bytes(b"\0" * 190_000)  # 95% full before the job starts
    spec = job_spec(tmp_path, session, 16, concurrency=8, capture_budget_bytes=budget, capture_fill_threshold=0.8)
    out = tmp_path / "out"
    job_id = start_job(spec, cli_env)
    try:
        paused = wait_state(job_id, home, ("paused", "failed"), 120)
        assert paused.state == "paused" and "95% full (threshold 80%)" in paused.reason
        assert manifest(out) == []
        foreign.unlink()
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    raw = json.loads((Path(done.job_dir) / "progress.json").read_text())
    assert raw["backpressure_waits"] > 0  # eight workers, room for about two samples' dumps
    assert raw["peak_reserved_capture_bytes"] <= budget
    assert_each_sample_once(out, set(range(16)), job_id)


def test_a_server_without_capture_fails_the_job_after_consecutive_failures_with_the_reason(
        home, cli_env, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:
    session = start_server(make_emulator_profile, launched, demo_model, None, name="nocapture")
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(20))
    spec = write_spec(tmp_path / "job.toml", name="t", server_url=f"http://127.0.0.1:{session.status().port}",
                      dataset=dataset, output_dir=tmp_path / "out", capture_dir=capture_dir,
                      model_path=demo_model, concurrency=2, dump_wait_s=0.2, max_retries=1,
                      retry_backoff_s=0.01, max_consecutive_failures=4)
    job_id = start_job(spec, cli_env)
    try:
        failed = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert failed.state == "failed"
    assert "4 consecutive attempts failed" in failed.reason and "is capture on" in failed.reason


def test_bad_specs_are_refused_before_anything_starts(home, cli_env, tmp_path) -> None:
    spec = write_spec(tmp_path / "job.toml", name="t", server_url="http://127.0.0.1:1", dataset=tmp_path / "nope",
                      output_dir=tmp_path / "out", capture_dir=tmp_path, model_path=tmp_path, concurency=3)
    result = run_cli(["extract", "run", str(spec)], cli_env)
    assert result.returncode == 2 and result.stdout == ""
    assert "job.concurency (line" in result.stderr
    spec = write_spec(tmp_path / "job.toml", name="t", server_url="http://127.0.0.1:1",
                      dataset=tmp_path / "missing.jsonl", output_dir=tmp_path / "out", capture_dir=tmp_path / "c",
                      model_path=tmp_path)
    result = run_cli(["extract", "run", str(spec)], cli_env)
    assert result.returncode == 2 and "job.dataset" in result.stderr and "job.model_path" in result.stderr
    result = run_cli(["extract", "status", "no-such-job"], cli_env)
    assert result.returncode == 2 and "no-such-job" in result.stderr


def _interpreter_wrapper(path: Path) -> Path:
    """An interpreter at another path than ours (as SGLang's venv python is), which has torch: it execs ours."""
    path.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return path


def test_a_job_runs_under_the_session_profiles_python_and_its_status_names_it(
        home, cli_env, make_emulator_profile, launched, demo_model, capture_dir, tmp_path) -> None:
    server_python = _interpreter_wrapper(tmp_path / "sglang-python")
    session = start_server(make_emulator_profile, launched, demo_model, capture_dir, python=str(server_python))
    job_id = start_job(job_spec(tmp_path, session, 4), cli_env)
    try:
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert done.python == str(server_python)
    status = run_cli(["extract", "status", job_id], cli_env)
    assert f"python: {server_python}" in status.stdout
    # Under another interpreter only our own package is put on its path, never this venv's site-packages.
    link_dir = home.state_root / "job-pythonpath"
    assert [p.name for p in link_dir.iterdir()] == ["sessions"]


def test_a_job_whose_python_lacks_torch_is_refused_naming_the_interpreter(home, cli_env, demo_model,
                                                                          tmp_path) -> None:
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(2))
    spec = write_spec(tmp_path / "job.toml", name="t", server_url="http://127.0.0.1:9", dataset=dataset,
                      output_dir=tmp_path / "out", model_path=demo_model, capture_dir=tmp_path / "cap",
                      python=str(bare / "bin" / "python"))
    result = run_cli(["extract", "run", str(spec)], cli_env)
    assert result.returncode == 2
    assert f"{bare / 'bin' / 'python'} cannot import torch" in result.stderr
    assert not list((home.jobs_dir).iterdir())  # nothing was started
