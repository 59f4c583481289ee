"""Regeneration jobs end to end: the CLI, a detached job process, the emulator serving the demo model's
/v1/chat/completions (the one stand-in), real files and real kill -9s.  What is checked is the output:
the replay order, SpecForge's three files and their accounting, its validation rules, each row exactly once
after kills, and the statistics."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import openai
import pytest
from _emulator_support import Emulator
from _extract_support import run_cli, run_job_to_end, start_job, stop_job, wait_for, wait_state, write_spec

from sessions.extraction.job import job_status
from sessions.regeneration.rows import output_problem

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from sessions.demo_model import write_demo_model

    model = write_demo_model(tmp_path_factory.mktemp("models") / "demo", num_layers=8, hidden_size=64)
    emu = Emulator(tmp_path_factory.mktemp("run"), model, "--served-model-name", "demo", tp=1)
    try:
        emu.wait_ready()
        yield emu
    finally:
        emu.kill()


def two_turn_rows(count: int) -> list[dict]:
    return [{"id": f"row-{i}", "conversations": [
        {"from": "human", "value": f"Question {i}: what is the capital city of France?"},
        {"from": "gpt", "value": f"Old answer {i} from another model."},
        {"from": "human", "value": f"And tell me a short story number {i}."},
        {"from": "gpt", "value": "Once upon a time."}]} for i in range(count)]


def write_lines(path: Path, rows: list) -> Path:
    with open(path, "w") as fh:
        fh.writelines((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
    return path


def spec_for(tmp_path: Path, server: Emulator, dataset: Path, name: str = "r", **keys) -> Path:
    keys = {"window": 2, "temperature": 0.0, "max_tokens": 16, **keys}
    return write_spec(tmp_path / f"{name}.toml", mode="regenerate", name=name, dataset=dataset,
                      output=tmp_path / name / "regen.jsonl", servers=[server.url("")], **keys)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_each_answer_is_the_servers_reply_to_the_history_with_the_earlier_regenerated_answers(
        home, cli_env, server, tmp_path) -> None:
    dataset = write_lines(tmp_path / "data.jsonl", two_turn_rows(3))
    done = run_job_to_end(spec_for(tmp_path, server, dataset), cli_env, home, "regenerate")
    assert done.state == "done", done.reason
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="None", max_retries=0)
    out = rows_of(tmp_path / "r" / "regen.jsonl")
    assert sorted(r["id"] for r in out) == ["row-0", "row-1", "row-2"]
    for row in out:
        conv = row["conversations"]
        assert [m["role"] for m in conv] == ["user", "assistant", "user", "assistant"]
        assert not any(m["content"].startswith(("Old answer", "Once upon")) for m in conv[1::2])
        for turn in (1, 3):  # the reply to exactly the history before it, earlier answers regenerated
            reply = client.chat.completions.create(model="demo", messages=conv[:turn], max_tokens=16,
                                                   temperature=0.0)
            assert reply.choices[0].message.content == conv[turn]["content"]


def test_the_three_files_account_for_every_input_row_and_pass_specforges_validation(
        home, cli_env, server, tmp_path) -> None:
    rows: list = [
        *two_turn_rows(2),
        {"uuid": 7, "messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Hello! How are you today?"}]},  # OpenAI rows
        {"conversations": [{"role": "user", "content": "A row without an id"}]},  # content hash
        {"id": "starts-with-assistant", "conversations": [{"role": "assistant", "content": "Hi"}]},
        {"id": "tool", "conversations": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]},
        "not json",
        {"id": "row-0", "conversations": [{"role": "user", "content": "the same id again"}]},
        {"id": "too-long", "conversations": [{"role": "user", "content": "word " * 5000}]},  # refused: 400
    ]
    dataset = write_lines(tmp_path / "data.jsonl", rows)
    done = run_job_to_end(spec_for(tmp_path, server, dataset), cli_env, home, "regenerate")
    assert done.state == "done", done.reason
    base = tmp_path / "r"
    success, error, skipped = (rows_of(base / f"regen{s}.jsonl") for s in ("", "_error", "_skipped"))
    assert len(success) + len(error) + len(skipped) == len(rows) == done.total
    assert (done.ok, done.failed_lines, done.skipped) == (len(success), len(error), len(skipped))
    assert {r["status"] for r in success} == {"success"} and {r["status"] for r in error} == {"error"}
    assert {r["status"] for r in skipped} == {"skipped"}
    ids = [r["id"] for r in success + error + skipped]
    assert len(set(ids)) == len(rows)
    assert {"row-0", "row-1", "7", "row-0@line8"} <= {r["id"] for r in success}
    assert any(i.startswith("sha256:") for i in (r["id"] for r in success))
    assert [r["id"] for r in error] == ["too-long"] and "context length" in error[0]["error"]
    reasons = {r["id"]: r["error"] for r in skipped}
    assert reasons["starts-with-assistant"] == "Data starts with an assistant message"
    assert reasons["tool"] == "Invalid message role: tool"
    assert any("not JSON" in e for e in reasons.values())
    for row in success:
        assert output_problem(row) is None  # validate_regenerated_data.py --strict-think-markers
    openai_row = next(r for r in success if r["id"] == "7")
    assert "messages" not in openai_row and openai_row["uuid"] == 7  # the input row, conversations replaced
    assert openai_row["conversations"][0] == {"role": "system", "content": "Be brief."}


def test_kill_9_at_any_point_then_resume_writes_each_row_exactly_once_and_keeps_finished_rows(
        home, cli_env, server, tmp_path) -> None:
    count = 16
    dataset = write_lines(tmp_path / "data.jsonl", two_turn_rows(count))
    assert run_job_to_end(spec_for(tmp_path, server, dataset, name="ref"), cli_env, home, "regenerate").state == "done"
    reference = {r["id"]: r for r in rows_of(tmp_path / "ref" / "regen.jsonl")}
    out = tmp_path / "r" / "regen.jsonl"
    job_id = start_job(spec_for(tmp_path, server, dataset), cli_env, "regenerate")
    written_before: list[bytes] = []
    try:
        for threshold in (1, 6):  # killed twice, each time with conversations in flight
            wait_for(lambda t=threshold: out.exists() and out.read_bytes().count(b"\n") >= t,
                     f"{threshold} rows written", 240, interval_s=0.005)
            os.kill(job_status(job_id, home).pid, signal.SIGKILL)
            wait_for(lambda: job_status(job_id, home).state == "interrupted", "interrupted", 30)
            kept = out.read_bytes()
            kept = kept[: kept.rfind(b"\n") + 1]
            assert kept.count(b"\n") < count, "the job finished before it could be killed mid-run"
            written_before.append(kept)
            resumed = run_cli(["regenerate", "resume", job_id], cli_env)
            assert resumed.returncode == 0, resumed.stderr
        done = wait_state(job_id, home)
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    final = out.read_bytes()
    for kept in written_before:
        assert final.startswith(kept)  # finished rows are never redone nor rewritten
    rows = rows_of(out)
    assert sorted(r["id"] for r in rows) == sorted(reference)  # each row exactly once
    for row in rows:
        assert row == reference[row["id"]]  # the redone rows are what an uninterrupted run writes
    log = (Path(done.job_dir) / "job.log").read_text()
    for kept in written_before:
        finished = kept.count(b"\n")
        assert f"{finished} already written, {count - finished} to do" in log


def test_resume_drops_a_torn_last_line_and_redoes_that_row(home, cli_env, server, tmp_path) -> None:
    dataset = write_lines(tmp_path / "data.jsonl", two_turn_rows(3))
    job_id = start_job(spec_for(tmp_path, server, dataset), cli_env, "regenerate")
    try:
        assert wait_state(job_id, home).state == "done"
        out = tmp_path / "r" / "regen.jsonl"
        lines = out.read_bytes().splitlines(keepends=True)
        out.write_bytes(b"".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # a write cut by a crash
        from sessions.home import atomic_write_json
        progress = Path(job_status(job_id, home).job_dir) / "progress.json"
        atomic_write_json(progress, {**json.loads(progress.read_text()), "state": "interrupted"})
        assert run_cli(["regenerate", "resume", job_id], cli_env).returncode == 0
        done = wait_state(job_id, home)
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert out.read_bytes().startswith(b"".join(lines[:2]))
    assert sorted(r["id"] for r in rows_of(out)) == ["row-0", "row-1", "row-2"]


def test_status_json_shows_the_shape_of_the_data(home, cli_env, server, tmp_path) -> None:
    rows = two_turn_rows(4)
    dataset = write_lines(tmp_path / "data.jsonl", rows)
    job_id = run_job_to_end(spec_for(tmp_path, server, dataset, max_tokens=4), cli_env, home, "regenerate").job_id
    shown = run_cli(["regenerate", "status", job_id, "--json"], cli_env)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    stats = status["stats"]
    assert status["mode"] == "regenerate" and status["done"] == status["total"] == 4
    assert stats["answers"] == 8 == sum(stats["finish_reasons"].values())
    old = [len(m["value"]) for r in rows for m in r["conversations"] if m["from"] == "gpt"]
    assert stats["mean_answer_chars_before"] == round(sum(old) / len(old), 1)
    new = [len(m["content"]) for r in rows_of(tmp_path / "r" / "regen.jsonl") for m in r["conversations"]
           if m["role"] == "assistant"]
    assert stats["mean_answer_chars_after"] == round(sum(new) / len(new), 1)
    lengths = stats["finish_reasons"].get("length", 0)
    assert stats["length_share"] == round(lengths / 8, 4)
    assert lengths > 0  # max_tokens=4 cuts answers: that shows
    assert "tokens_per_s" in status and "eta_s" in status


def test_a_bad_spec_names_the_key_and_its_line(home, cli_env, tmp_path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text('[job]\nmode = "regenerate"\nname = "x"\ndataset = "d.jsonl"\noutput = "o.json"\n'
                    'servers = ["http://127.0.0.1:1"]\nreasoning = "maybe"\ntemprature = 0.5\n')
    result = run_cli(["regenerate", "run", str(spec)], cli_env)
    assert result.returncode == 2
    assert "job.output (line 5): must end in .jsonl" in result.stderr
    assert "job.reasoning (line 7)" in result.stderr and "job.temprature (line 8): unknown key" in result.stderr


def test_rows_are_shared_over_several_servers_with_a_line_each_and_a_dead_one_left_out(
        home, cli_env, tmp_path, models) -> None:
    from _extract_support import free_port

    emus = [Emulator(tmp_path / f"run{i}", models["small"], "--served-model-name", "small", tp=1) for i in (0, 1)]
    try:
        for emu in emus:
            emu.wait_ready()
        dataset = write_lines(tmp_path / "data.jsonl", two_turn_rows(12))
        dead = f"http://127.0.0.1:{free_port()}"
        spec = write_spec(tmp_path / "multi.toml", mode="regenerate", name="multi", dataset=dataset,
                          output=tmp_path / "multi" / "regen.jsonl", window=2, max_tokens=8,
                          servers=[emus[0].url(""), emus[1].url(""), dead])
        done = run_job_to_end(spec, cli_env, home, "regenerate")
    finally:
        for emu in emus:
            emu.kill()
    assert done.state == "done", done.reason
    servers = done.stats["servers"]
    assert set(servers) == {emus[0].url(""), emus[1].url("")}  # the dead one was left out at the probe
    assert sum(line["rows"] for line in servers.values()) == 12 and all(line["rows"] for line in servers.values())
    assert f"server {dead} does not answer /v1/models" in (Path(done.job_dir) / "job.log").read_text()
    shown = run_cli(["regenerate", "status", done.job_id], cli_env)
    assert all(f"{url}: " in shown.stdout for url in servers)  # one line per server
