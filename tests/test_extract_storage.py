"""Storage before it runs out (issue 24, item 4): the job's output estimate against the free space of the
output filesystem and of the capture dir, refused with the numbers before the first request unless
--allow-partial.  The small-disk cases plant the free space through the function that reads it (no tmpfs
without root); one test runs the real path against this machine's real filesystem."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _extract_support import (
    DownServerStandIn,
    free_port,
    make_tokenizer_dir,
    run_cli,
    stop_job,
    wait_for,
    write_dataset,
    write_spec,
)

from sessions.extraction.job import job_status
from sessions.extraction.storage import dump_bytes_per_token, estimate_storage, free_bytes, gb


class StatvfsResult:
    """What os.statvfs returns, for the two fields the estimate reads."""

    def __init__(self, free: int, frsize: int = 4096) -> None:
        self.f_bavail = free // frsize
        self.f_frsize = frsize


def planted(free_by_folder: dict[Path, int]):
    """A statvfs that answers the planted free space of the folder asked (or of its nearest parent)."""

    def statvfs(path: str) -> StatvfsResult:
        p = Path(path)
        while p not in free_by_folder:
            assert p.parent != p, f"no planted free space for {path}"
            p = p.parent
        return StatvfsResult(free_by_folder[p])

    return statvfs


def test_the_estimate_is_tokens_times_hidden_times_aux_layers_plus_one_in_bf16(tmp_path):
    est = estimate_storage([100, 300], 10, hidden_size=4096, num_aux_layers=3, concurrency=4,
                           output_dir=tmp_path / "out", capture_dirs=[tmp_path / "cap"],
                           statvfs=planted({tmp_path: 10**15}), device_of=lambda p: 1 if "out" in str(p) else 2)
    per_token = 2 * 4096 * (3 + 1) + 16  # bf16 aux + final states, int64 ids and mask
    assert est.output_bytes_per_token == per_token
    assert est.output_bytes == int(200 * 10 * per_token * 1.01)
    assert est.capture_bytes == 300 * dump_bytes_per_token(4096, 3) * 4  # four longest dumps in flight
    assert est.fits and [c.roles for c in est.checks] == [("output",), ("capture",)]


def test_an_output_that_does_not_fit_is_refused_with_needed_free_and_where(tmp_path):
    out, cap = tmp_path / "out", tmp_path / "cap"
    out.mkdir()
    cap.mkdir()
    est = estimate_storage([1000] * 8, 1000, hidden_size=7168, num_aux_layers=3, concurrency=8, output_dir=out,
                           capture_dirs=[cap], statvfs=planted({out: 50 * 10**9, cap: 10**12}),
                           device_of=lambda p: hash(str(p)))
    assert not est.fits
    [short] = est.shortfalls()
    assert short.roles == ("output",) and short.folders == (str(out),)
    text = est.refusal()
    need = est.output_bytes
    assert f"output {out}: needs {need / 1e9:.2f} GB but has 50.00 GB free" in text
    assert "--allow-partial" in text
    assert f"capture {cap}" not in text.split("estimate:")[0]  # the capture dir fits: not named as short


def test_a_capture_dir_too_small_for_the_dumps_in_flight_is_refused(tmp_path):
    out, cap = tmp_path / "out", tmp_path / "shm"
    out.mkdir()
    cap.mkdir()
    est = estimate_storage([4000, 8000], 2, hidden_size=7168, num_aux_layers=3, concurrency=8, output_dir=out,
                           capture_dirs=[cap], statvfs=planted({out: 10**13, cap: 64 * 10**6}),
                           device_of=lambda p: 1 if p == out else 2)
    [short] = est.shortfalls()
    assert short.roles == ("capture",)
    # Two samples pending: at most two dumps in flight, each as long as the longest sampled.
    assert short.needed_bytes == 8000 * dump_bytes_per_token(7168, 3) * 2
    assert f"capture {cap}: needs" in est.refusal() and "64.0 MB free" in est.refusal()


def test_a_capture_dir_on_the_outputs_filesystem_adds_to_its_need(tmp_path):
    out, cap = tmp_path / "out", tmp_path / "cap"
    est = estimate_storage([500] * 4, 100, hidden_size=1024, num_aux_layers=3, concurrency=4, output_dir=out,
                           capture_dirs=[cap], statvfs=planted({tmp_path: 10**12}), device_of=lambda p: 7)
    [check] = est.checks
    assert check.roles == ("output", "capture")
    assert check.needed_bytes == est.output_bytes + est.capture_bytes


def test_free_space_is_what_an_unprivileged_writer_may_use(tmp_path):
    st = os.statvfs(tmp_path)
    assert free_bytes(tmp_path / "not" / "yet") == st.f_bavail * st.f_frsize  # the nearest existing parent


@pytest.fixture
def huge_model(tmp_path) -> Path:
    """A model dir whose hidden size makes any real dataset too big for this disk (2^22: 32 MiB a token)."""
    return make_tokenizer_dir(tmp_path / "huge", "llama3", hidden_size=1 << 22, num_layers=8)


def test_a_job_whose_output_cannot_fit_the_real_disk_fails_before_its_first_request(
        home, cli_env, huge_model, tmp_path):
    rows = [{"input_ids": list(range(1, 301)), "loss_mask": [1] * 300} for _ in range(40)]
    dataset = write_dataset(tmp_path / "tok.jsonl", rows)
    out, cap = tmp_path / "out", tmp_path / "cap"
    port = free_port()
    with DownServerStandIn(port) as server:
        spec = write_spec(tmp_path / "job.toml", name="huge", server_url=f"http://127.0.0.1:{port}",
                          dataset=dataset, dataset_format="tokenized", output_dir=out, capture_dir=cap,
                          model_path=huge_model, concurrency=2)
        started = run_cli(["extract", "run", str(spec)], cli_env)
        assert started.returncode == 0, started.stderr
        job_id = started.stdout.strip()
        try:
            failed = wait_for(lambda: (p := job_status(job_id, home)).state in ("failed", "running", "paused") and p,
                              "the job to end its preflight", 180)
        finally:
            stop_job(job_id, home)
        requests = list(server.requests)
    assert failed.state == "failed", failed.reason
    assert requests == []  # not one request reached the server
    per_token = 2 * (1 << 22) * 4 + 16
    need = int(300 * 40 * per_token * 1.01)
    assert failed.estimated_output_bytes == need
    # The capture dir is on the same filesystem here: its dumps in flight add to the output's need.
    [fs] = failed.storage["filesystems"]
    assert fs["roles"] == ["output", "capture"] and not fs["fits"]
    assert fs["needed_bytes"] == need + failed.storage["capture_bytes"]
    assert fs["free_bytes"] == pytest.approx(free_bytes(out), rel=0.05)
    assert (f"output {out}, capture {cap}: needs {gb(fs['needed_bytes'])} but has {gb(fs['free_bytes'])} free"
            in failed.reason)
    status = run_cli(["extract", "status", job_id, "--json"], cli_env)
    doc = json.loads(status.stdout)
    assert doc["estimated_output_bytes"] == need and doc["storage"]["fits"] is False
    human = run_cli(["extract", "status", job_id], cli_env).stdout
    assert "storage: 0 B written of ~" in human and "(does not fit)" in human


def test_allow_partial_starts_the_job_anyway_and_it_asks_the_server(home, cli_env, huge_model, tmp_path):
    rows = [{"input_ids": list(range(1, 301)), "loss_mask": [1] * 300} for _ in range(40)]
    dataset = write_dataset(tmp_path / "tok.jsonl", rows)
    port = free_port()
    with DownServerStandIn(port) as server:
        spec = write_spec(tmp_path / "job.toml", name="huge", server_url=f"http://127.0.0.1:{port}",
                          dataset=dataset, dataset_format="tokenized", output_dir=tmp_path / "out",
                          capture_dir=tmp_path / "cap", model_path=huge_model, concurrency=2)
        started = run_cli(["extract", "run", str(spec), "--allow-partial"], cli_env)
        assert started.returncode == 0, started.stderr
        job_id = started.stdout.strip()
        try:
            wait_for(lambda: server.requests, "the job's first request (past the preflight)", 180)
            progress = job_status(job_id, home)
        finally:
            stop_job(job_id, home)
    assert progress.state != "failed", progress.reason
    assert progress.storage is not None and progress.storage["fits"] is False
    log = (Path(progress.job_dir) / "job.log").read_text()
    assert "going on (--allow-partial)" in log
