"""Capture and extraction against a ``--dp-size 2`` server: both replicas dump, the job collects them all.

Under SGLang's DP controller each replica is its own TP group, so TP0 of every replica is a writing rank
(``attn_tp_rank == 0`` on the last PP rank) and dumps the requests the controller sent it; the dumps are
keyed by rid, so the job's collector finds a sample whichever replica served it.  The test runs a real job
against a real DP emulator session (the model-backed forward of the demo model) and checks the output
with ``extract verify``, and that both replicas served and dumped.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from _extract_support import run_cli, stop_job, wait_for, write_spec

SAMPLES = 8


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "demo", num_layers=8, hidden_size=64)


@pytest.mark.slow
def test_a_job_against_a_dp2_server_collects_every_sample_from_both_replicas(
        home, cli_env, make_emulator_profile, launched, demo_model, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from sessions.extraction.job import job_status, run_job

    capture = tmp_path / "capture"
    capture.mkdir(mode=0o700)
    profile = make_emulator_profile("dp2", tp=1, model_path=str(demo_model), chunked_prefill_size=-1,
                                    extra_args=["--dp-size", "2"],
                                    capture={"enabled": True, "dir": str(capture), "rid_prefix": "eagle3-"})
    session = launched.launch(profile)
    wait_for(lambda: session.status().state == "ready", "server ready", 180)
    log_path = Path(session.status().log_path)

    def capture_lines() -> list[str]:
        return sorted(dp for dp, message in _replica_messages(log_path)
                      if dp is not None and message.startswith("eagle3-capture active: "))

    # Each replica's line is written by its own scheduler process; the second may reach the file a moment
    # after the server reads ready (seen once on CI), so wait for both, then check there are exactly two.
    with contextlib.suppress(AssertionError, TimeoutError):
        wait_for(lambda: len(capture_lines()) >= 2, "both replicas' capture lines", 60)
    assert capture_lines() == ["DP0", "DP1"], [m for m in _replica_messages(log_path) if "capture" in m[1]]  # each replica's TP0 writes

    tokenizer = AutoTokenizer.from_pretrained(demo_model, local_files_only=True)
    rows = []
    for i in range(SAMPLES):
        prompt = list(tokenizer.apply_chat_template([{"role": "user", "content": f"Question {i}: where?"}],
                                                    add_generation_prompt=True, tokenize=True)["input_ids"])
        answer = tokenizer.encode(f" Answer {i}: " + "Paris " * (1 + i % 3), add_special_tokens=False)
        rows.append({"input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer)})
    dataset = tmp_path / "tokenized.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = write_spec(tmp_path / "job.toml", name="dp", session=session.session_id, dataset=dataset,
                      output_dir=tmp_path / "out", dataset_format="tokenized")
    prefills_before = _prefills(log_path)
    job_id = run_job(spec, home)
    try:
        progress = wait_for(lambda: (p := job_status(job_id, home)).state in ("done", "failed") and p,
                            "job finished", 240)
    finally:
        stop_job(job_id, home)
    assert progress.state == "done", progress

    # Both replicas served the job's requests (their prefill lines carry their DP rank).
    served = _prefills(log_path)
    for dp in ("DP0", "DP1"):
        assert served.get(dp, 0) > prefills_before.get(dp, 0), served

    result = run_cli(["extract", "verify", str(tmp_path / "out"), "--json"], cli_env)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], report
    assert report["files_checked"] == SAMPLES
    dataset_json = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert dataset_json["counts"].get("ok") == SAMPLES, dataset_json["counts"]


def _prefills(log_path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for dp, message in _replica_messages(log_path):
        if dp is not None and message.startswith("Prefill batch"):
            counts[dp] = counts.get(dp, 0) + 1
    return counts


def _replica_messages(log_path: Path) -> list[tuple[str | None, str]]:
    """(``DPn`` or None, message) of each SGLang line, read by the panel's own log reader.  A replica's line
    may land behind another replica's unfinished tqdm render (no newline until its bar closes; seen on CI
    as DP1's capture line behind DP0's "Loading safetensors" render): the reader's cleaning finds the line
    there as a terminal shows it, with its ``DPn`` tag."""
    from sessions.logs.lines import lines_of_text, own_header, rank_tag

    out: list[tuple[str | None, str]] = []
    for line in lines_of_text(log_path.read_text(errors="replace")):
        header = own_header(line.text)
        if header is None:
            continue
        dp = dict(rank_tag(line.text) or ()).get("DP")
        out.append((f"DP{dp}" if dp is not None else None, line.text[header.end():]))
    return out
