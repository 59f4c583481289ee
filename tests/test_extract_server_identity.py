"""A job's server identity covers what changes hidden states (issue 22 item 20).

A job extracts from a real emulator serving the demo model with capture on; the server is killed mid-job
and, on the same port and with the same capture dir and rid prefix (what the old check compared), other
servers come up one after another, each with one change: the same folder with a checkpoint file
rewritten, other capture layers, another chat template, and (last) another model folder of the same
architecture with other weights.  Against each the job stays paused, the reason names what changed, and the
server gets no /generate (its capture dir stays empty).  A recorded SGLang version that differs pauses it
too.  Then `extract resume JOB --accept-server` lets it finish against the last changed server (the other
model's: it stays up, so the job's six servers start six times, not seven), and the change is on the record
in job.json and dataset.json.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from _extract_support import chat_rows, run_cli, stop_job, wait_for, write_dataset, write_spec

from sessions.extraction.job import job_status

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo model and another of the same architecture and shape with other (seeded) weights."""
    from sessions.demo_model import write_demo_model

    root = tmp_path_factory.mktemp("models")
    return (write_demo_model(root / "mine", num_layers=8, hidden_size=64, seed=0),
            write_demo_model(root / "other", num_layers=8, hidden_size=64, seed=7))


@pytest.mark.timeout(1200)  # six server starts of a real model on a shared CPU
def test_any_change_of_what_shapes_hidden_states_pauses_the_job_and_accept_server_lets_it_on_record(
        home, cli_env, make_emulator_profile, launched, models, tmp_path) -> None:
    from sessions import probes

    mine, other = models
    capture = tmp_path / "capture"
    capture.mkdir(mode=0o700)
    port: int | None = None

    def serve(name: str, model: Path, **overrides):
        nonlocal port
        capture_table = {"enabled": True, "dir": str(capture), "rid_prefix": "eagle3-", **overrides.pop("capture", {})}
        profile = make_emulator_profile(name, tp=1, model_path=str(model), capture=capture_table,
                                        **({"port": port} if port else {}), **overrides)
        session = launched.launch(profile)
        wait_for(lambda: session.status().state == "ready", f"{name} ready", 180)
        launched.remember(session)
        port = session.status().port
        return session

    def kill(session) -> None:
        pid, create_time = session.state_record["pid"], session.state_record["create_time"]
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        wait_for(lambda: not probes.process_alive(pid, create_time), "server gone", 30)
        wait_for(lambda: probes.port_free("127.0.0.1", session.state_record["port"]), "port free", 60)

    def paused_naming(*words: str):
        return wait_for(lambda: (p := job_status(job_id, home)).state == "paused" and p.reason
                        and all(w in p.reason for w in words) and p, f"paused naming {words}", 120)

    first = serve("mine", mine)
    rows = 40
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(rows))
    spec = write_spec(tmp_path / "job.toml", name="ident", server_url=f"http://127.0.0.1:{port}",
                      dataset=dataset, output_dir=tmp_path / "out", capture_dir=capture, model_path=mine,
                      concurrency=2)
    started = run_cli(["extract", "run", str(spec)], cli_env)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    job_json = home.jobs_dir / job_id / "job.json"
    try:
        wait_for(lambda: job_status(job_id, home).done >= 2, "2 samples", 240, interval_s=0.01)
        recorded = json.loads(job_json.read_text())["server_identity"]
        assert recorded["weights"] and "model.safetensors" in recorded["weights"]
        assert recorded["capture_layers"] == "default" and recorded["chat_template"].startswith("sha256:")
        kill(first)
        # Dumps of requests in flight at the kill may be left; a killed server writes nothing more, so any
        # dump folder beyond these would be a request that reached another server.
        leftovers = {p.name for p in capture.iterdir()}
        # Samples answered before the kill may still be recorded after it: the count is taken once the job
        # stands paused against the first other server, and must not move after that.
        held: list[int] = []

        def against(session, *words: str, keep: bool = False) -> None:
            paused = paused_naming("different server", *words)
            assert f"extract resume {job_id} --accept-server" in paused.reason
            assert {p.name for p in capture.iterdir()} <= leftovers  # no request got through
            held.append(job_status(job_id, home).done)
            if not keep:
                kill(session)
            assert len(set(held)) == 1 and held[0] < rows, held

        # The same folder, a checkpoint rewritten (same size, new modification time).
        weights = mine / "model.safetensors"
        before = weights.stat()
        weights.write_bytes(weights.read_bytes())
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
        against(serve("rewritten", mine), "weights: model.safetensors changed", "modified")
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
        # Other capture layers (profile points [1, 3, 5]: the server is given their draft-config ids).
        against(serve("layers", mine, capture={"layers": [1, 3, 5]}), "capture_layers: default → [")
        # Another chat template (the server's --chat-template).
        template = tmp_path / "other.jinja"
        template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        against(serve("template", mine, extra_args=["--chat-template", str(template)]), "chat_template: sha256:")
        # A recorded SGLang version that the server no longer has: the job, stopped, is made to have started
        # under 0.5.22 (the running one keeps its identity in memory), and its resume pauses at once.
        stop_job(job_id, home)
        assert job_status(job_id, home).state == "cancelled"
        meta = json.loads(job_json.read_text())
        meta["server_identity"]["sglang_version"] = "0.5.22"
        job_json.write_text(json.dumps(meta))
        same = serve("same", mine)
        resumed = run_cli(["extract", "resume", job_id], cli_env)
        assert resumed.returncode == 0, resumed.stderr
        paused_naming("sglang_version: 0.5.22 → 0.5.23")
        assert job_status(job_id, home).done == held[0]
        kill(same)

        # Another folder of the same architecture, other weights; kept up for the explicit override: it is
        # accepted, and the job finishes against it.
        changed = serve("other", other)
        against(changed, "model_path:", str(other), "weights:", keep=True)
        accepted = run_cli(["extract", "resume", job_id, "--accept-server"], cli_env)
        assert accepted.returncode == 0 and "accepts the server" in accepted.stderr, accepted.stderr
        done = wait_for(lambda: (p := job_status(job_id, home)).state in ("done", "failed") and p, "done", 300)
    finally:
        stop_job(job_id, home)
    assert done.state == "done" and done.ok == rows, done.reason
    meta = json.loads(job_json.read_text())
    (change,) = meta["accepted_server_changes"]
    assert change["by"] == "extract resume --accept-server"
    assert any(d.startswith("model_path:") for d in change["differences"])
    assert change["accepted"]["model_path"] == str(other) and meta["server_identity"]["model_path"] == str(other)
    info = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert info["accepted_server_changes"] == meta["accepted_server_changes"]
    assert info["server_identity"]["model_path"] == str(other)
    assert changed.status().alive
    # One acceptance is for that server only: the flag is spent.
    assert json.loads((home.jobs_dir / job_id / "control.json").read_text()).get("accept_server") is False
