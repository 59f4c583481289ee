"""One extraction job over many servers (issue 24 item 3): a shared queue over real emulator servers (the demo
model, capture on), servers killed by pid mid-job, one refused as odd (another model), one rejoining, and
the output checked as one dataset: each sample exactly once, bit-identical to a one-server run."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from _extract_support import (
    chat_rows,
    run_cli,
    start_job,
    stop_job,
    wait_for,
    wait_state,
    write_dataset,
    write_spec,
)

from sessions import probes
from sessions.extraction.job import job_status

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "demo", num_layers=8, hidden_size=64)


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another model of the same family: 12 layers, so another config (and other capture layers)."""
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "other", num_layers=12, hidden_size=64)


def start_server(make_emulator_profile, launched, model: Path, capture_dir: Path, name: str, gpu: int,
                 port: int | None = None, extra_args: tuple[str, ...] = (), capture_layers: list[int] | None = None,
                 **server):
    """A TP1 emulator session on emulated GPU ``gpu`` serving ``model`` with capture on into ``capture_dir``
    (SGLang's default layers unless ``capture_layers``)."""
    capture_dir.mkdir(mode=0o700, exist_ok=True)
    capture: dict = {"enabled": True, "dir": str(capture_dir), "rid_prefix": "eagle3-"}
    if capture_layers is not None:
        capture["layers"] = capture_layers
    overrides: dict = {"model_path": str(model), "chunked_prefill_size": 24,
                       "extra_args": [*extra_args, "--base-gpu-id", str(gpu)], "capture": capture, **server}
    if port:
        overrides["port"] = port
    session = launched.launch(make_emulator_profile(name, tp=1, **overrides))
    wait_for(lambda: session.status().state == "ready", f"session {session.session_id} ready", 180)
    launched.remember(session)
    return session


def manifest(out: Path) -> list[dict]:
    path = out / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def assert_each_sample_once(out: Path, rows: int) -> list[dict]:
    entries = manifest(out)
    ok = [e for e in entries if e["status"] == "ok"]
    assert sorted(e["index"] for e in ok) == list(range(rows))  # each sample exactly once, none lost
    assert len(entries) == rows  # and no second line for any of them
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*.ckpt"))
    assert files == sorted(e["path"] for e in ok)
    assert not list(out.rglob("*.tmp"))
    return ok


def tensors_by_index(out: Path) -> dict[int, dict]:
    found = {}
    for entry in manifest(out):
        data = torch.load(out / entry["path"], weights_only=True)
        found[entry["index"]] = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
    return found


def job_spec(tmp_path: Path, name: str, rows: int, **keys) -> Path:
    dataset = tmp_path / "data.jsonl"
    if not dataset.exists():
        write_dataset(dataset, chat_rows(rows))
    return write_spec(tmp_path / f"{name}.toml", name=name, dataset=dataset, output_dir=tmp_path / f"out-{name}",
                      **keys)


def rows_by_name(progress) -> dict[str, dict]:
    return {row["name"]: row for row in progress.servers or []}


def test_three_servers_share_one_queue_and_write_the_tensors_of_a_one_server_run(
        home, cli_env, make_emulator_profile, launched, demo_model, tmp_path) -> None:
    servers = [start_server(make_emulator_profile, launched, demo_model, tmp_path / f"cap{i}", f"s{i}", i)
               for i in range(3)]
    rows = 30
    one = start_job(job_spec(tmp_path, "one", rows, session=servers[0].session_id, concurrency=4), cli_env)
    try:
        single = wait_state(one, home, ("done", "failed"))
    finally:
        stop_job(one, home)
    assert single.state == "done", single.reason
    # Issue 24 item 6: a one-server job is the same scheduler over a list of one lane, so its status has the
    # same per-server row as a job over several (the human status and the jobs screen name servers only
    # when there are several: one server's row says what the job's own line says).
    assert [row["name"] for row in single.servers or []] == [servers[0].session_id]
    assert single.servers[0]["state"] == "live" and single.servers[0]["done"] == rows
    assert f"server {servers[0].session_id}  live" not in run_cli(["extract", "status", one], cli_env).stdout
    many = start_job(job_spec(tmp_path, "many", rows, servers=[s.session_id for s in servers], concurrency=4),
                     cli_env)
    try:
        done = wait_state(many, home, ("done", "failed"))
    finally:
        stop_job(many, home)
    assert done.state == "done", done.reason
    assert_each_sample_once(tmp_path / "out-many", rows)
    # Every server took part, and their rows add up to the dataset.
    by_name = rows_by_name(done)
    assert set(by_name) == {s.session_id for s in servers}
    assert all(row["done"] > 0 and row["failures"] == 0 and row["state"] == "live" for row in by_name.values())
    assert sum(row["done"] for row in by_name.values()) == rows
    # The tensors of every sample are the one-server run's, bit for bit.
    a, b = tensors_by_index(tmp_path / "out-one"), tensors_by_index(tmp_path / "out-many")
    assert sorted(a) == sorted(b) == list(range(rows))
    for index in a:
        assert set(a[index]) == set(b[index])
        for key in a[index]:
            assert torch.equal(a[index][key], b[index][key]), (index, key)
    # `extract status --json` carries the rows; the human status names each server.
    status = json.loads(run_cli(["extract", "status", many, "--json"], cli_env).stdout)
    assert [r["name"] for r in status["servers"]] == [s.session_id for s in servers]
    assert {"state", "done", "samples_per_s", "failures"} <= set(status["servers"][0])
    assert set(status["servers"][0]) == set(single.servers[0])  # the one-server job's row: the same fields
    text = run_cli(["extract", "status", many], cli_env).stdout
    assert all(f"server {s.session_id}  live" in text for s in servers)
    info = json.loads((tmp_path / "out-many" / "dataset.json").read_text())
    assert [s["name"] for s in info["servers"]] == [s.session_id for s in servers]
    assert run_cli(["extract", "verify", str(tmp_path / "out-many")], cli_env).returncode == 0


def test_a_server_killed_mid_job_gives_its_samples_back_and_the_others_finish(
        home, cli_env, make_emulator_profile, launched, demo_model, tmp_path) -> None:
    a = start_server(make_emulator_profile, launched, demo_model, tmp_path / "capa", "a", 0)
    b = start_server(make_emulator_profile, launched, demo_model, tmp_path / "capb", "b", 1)
    rows = 40
    spec = job_spec(tmp_path, "kill", rows, concurrency=4)
    out = tmp_path / "out-kill"
    result = run_cli(["extract", "run", str(spec), "--servers", f"{a.session_id},{b.session_id}"], cli_env)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    try:
        def b_has_work() -> bool:
            row = rows_by_name(job_status(job_id, home)).get(b.session_id) or {}
            return row.get("done", 0) >= 2 and row.get("in_flight", 0) > 0

        wait_for(b_has_work, "server b has done samples and has more in flight", 240, interval_s=0.01)
        pid, create_time = b.state_record["pid"], b.state_record["create_time"]
        os.killpg(os.getpgid(pid), signal.SIGKILL)  # the whole server, at once, with requests in flight
        wait_for(lambda: not probes.process_alive(pid, create_time), "server b gone", 30)
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert_each_sample_once(out, rows)
    by_name = rows_by_name(done)
    assert by_name[b.session_id]["state"] == "down" and by_name[b.session_id]["failures"] >= 1
    assert by_name[a.session_id]["state"] == "live"
    assert by_name[a.session_id]["done"] + by_name[b.session_id]["done"] == rows
    log = (Path(done.job_dir) / "job.log").read_text()
    assert f"server {b.session_id}: down" in log


def test_a_server_of_another_model_is_left_out_by_name_and_the_job_goes_on(
        home, cli_env, make_emulator_profile, launched, demo_model, other_model, tmp_path) -> None:
    a = start_server(make_emulator_profile, launched, demo_model, tmp_path / "capa", "a", 0)
    b = start_server(make_emulator_profile, launched, demo_model, tmp_path / "capb", "b", 1)
    odd = start_server(make_emulator_profile, launched, other_model, tmp_path / "capodd", "odd", 2)
    # The same model with another layer list: the known source of useless drafters (SGLang #25454).
    layers = start_server(make_emulator_profile, launched, demo_model, tmp_path / "caplayers", "layers", 3,
                          capture_layers=[1, 3, 5])
    rows = 12
    spec = job_spec(tmp_path, "odd", rows, servers=[odd.session_id, a.session_id, b.session_id, layers.session_id],
                    model_path=demo_model, concurrency=2)
    job_id = start_job(spec, cli_env)
    try:
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert_each_sample_once(tmp_path / "out-odd", rows)
    row = rows_by_name(done)[odd.session_id]
    assert row["state"] == "refused" and row["done"] == 0
    assert "serves another model than the job's" in row["reason"] and "model_config" in row["reason"]
    other = rows_by_name(done)[layers.session_id]
    assert other["state"] == "refused" and other["done"] == 0
    # Capture points 1, 3, 5 are SGLang's --return-aux-hidden-state-layer-ids 0, 2, 4 (Llama: point - 1).
    assert "capture_layers: default → [0, 2, 4]" in other["reason"] and "model_config" not in other["reason"]
    assert not list((tmp_path / "capodd").iterdir()) and not list((tmp_path / "caplayers").iterdir())  # nothing sent
    log = (Path(done.job_dir) / "job.log").read_text()
    assert f"server {odd.session_id} (" in log and "refused: serves another model" in log


def test_a_server_that_comes_back_rejoins_the_job(
        home, cli_env, make_emulator_profile, launched, demo_model, tmp_path) -> None:
    # Server a is slow (20 prompt tokens/s modelled: seconds a sample), so the job outlasts b's death and
    # return.
    a = start_server(make_emulator_profile, launched, demo_model, tmp_path / "capa", "a", 0,
                     extra_args=["--emulate-prefill-tokens-per-s", "20"])
    b = start_server(make_emulator_profile, launched, demo_model, tmp_path / "capb", "b", 1)
    port = b.status().port
    rows = 60
    spec = job_spec(tmp_path, "back", rows, servers=[a.session_id, b.session_id], concurrency=2)
    job_id = start_job(spec, cli_env)
    try:
        wait_for(lambda: rows_by_name(job_status(job_id, home)).get(b.session_id, {}).get("done", 0) >= 2,
                 "server b did 2 samples", 240, interval_s=0.01)
        pid, create_time = b.state_record["pid"], b.state_record["create_time"]
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        wait_for(lambda: rows_by_name(job_status(job_id, home))[b.session_id]["state"] == "down",
                 "server b down in the job's row", 60)
        done_before = rows_by_name(job_status(job_id, home))[b.session_id]["done"]
        assert job_status(job_id, home).state == "running"  # a goes on alone
        wait_for(lambda: not probes.process_alive(pid, create_time), "server b gone", 30)
        start_server(make_emulator_profile, launched, demo_model, tmp_path / "capb", "b2", 1, port=port)
        wait_for(lambda: (r := rows_by_name(job_status(job_id, home))[b.session_id])["state"] == "live"
                 and r["done"] > done_before, "server b rejoined and did more samples", 240)
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert_each_sample_once(tmp_path / "out-back", rows)
    assert f"server {b.session_id} rejoins the job" in (Path(done.job_dir) / "job.log").read_text()


def test_sigkill_of_a_two_server_job_then_resume_gives_each_sample_exactly_once(
        home, cli_env, make_emulator_profile, launched, demo_model, tmp_path) -> None:
    profile = make_emulator_profile("grp", tp=1, replicas=2, model_path=str(demo_model), chunked_prefill_size=24,
                                    capture={"enabled": True, "dir": str(tmp_path / "capg"), "rid_prefix": "eagle3-"})
    from sessions.server import ServerSession

    members = [launched.track(m) for m in ServerSession.launch_group(profile, home)]
    for member in members:
        wait_for(lambda m=member: m.status().state == "ready", f"member {member.session_id} ready", 180)
        launched.remember(member)
    group_id = members[0].group.group_id
    rows = 30
    spec = job_spec(tmp_path, "grp", rows, servers=[group_id], concurrency=4)
    out = tmp_path / "out-grp"
    job_id = start_job(spec, cli_env)
    try:
        wait_for(lambda: len(manifest(out)) >= 3, "3 samples recorded", 240, interval_s=0.002)
        os.kill(job_status(job_id, home).pid, signal.SIGKILL)
        assert len(manifest(out)) < rows, "the job finished before it could be killed mid-run"
        assert wait_state(job_id, home, ("interrupted",), 30).state == "interrupted"
        resumed = run_cli(["extract", "resume", job_id], cli_env)
        assert resumed.returncode == 0, resumed.stderr
        done = wait_state(job_id, home, ("done", "failed"))
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert_each_sample_once(out, rows)
    assert [r["name"] for r in done.servers] == [m.session_id for m in members]  # the group's members
    for member in members:  # no dumps of the job left in either member's capture dir
        assert not [p for p in Path(member.profile.capture.dir).iterdir() if job_id in p.name]
    assert run_cli(["extract", "verify", str(out)], cli_env).returncode == 0
