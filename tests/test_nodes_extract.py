"""Extraction on a server across nodes (issue 26 item 3): a 2-node TP4 emulator server with capture on, each
"node" its own home at its own loopback address reached through the local stand-in for the SSH link (as
tests/test_nodes_sessions.py), real emulator process trees with a real TCP rendezvous and the demo model's
real forward.  Only TP0 writes captures and TP0 is on node 0, so the job runs on node 0's host against node
0's session; a job on node 1's session, or one naming the multi-node id, is refused naming node 0's host.
Everything started (servers, jobs) is killed by pid at the end."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest
import tomli_w
import torch
from _extract_support import chat_rows, wait_for, write_dataset, write_spec
from _nodes_support import free_port_on, kill_node_sessions, local_nodes

from sessions.profiles import load_profile
from sessions.server.nodes import launch_nodes
from sessions.server.nodes_status import multi_node_status

pytestmark = pytest.mark.slow
WAIT_S = 240.0  # hang guard only
ROWS = 8


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "demo", num_layers=8, hidden_size=64)


@pytest.fixture
def capture_cluster(tmp_path: Path, home, demo_model: Path):
    """A ready 2-node TP4 server with capture on: (record, table, capture dir); jobs and servers killed by pid."""
    port = free_port_on(("127.0.0.1", "127.0.0.2"))
    capture_dir = tmp_path / "cap"
    capture_dir.mkdir(mode=0o700)
    doc = {
        "server": {"launcher": "emulator", "python": sys.executable, "model_path": str(demo_model), "tp_size": 4,
                   "host": "127.0.0.1", "port": port, "nnodes": 2, "hosts": ["node0", "node1"],
                   "chunked_prefill_size": 24,
                   # ~a second a sample (modelled prefill speed): the job outlasts the kill -9 below
                   "extra_args": ["--emulate-prefill-tokens-per-s", "40"]},
        "capture": {"enabled": True, "dir": str(capture_dir), "rid_prefix": "eagle3-"},
        "watch": {"stall_after_s": 300},
        "emulator": {"time_scale": 0.003, "fault": "none"},
    }
    path = tmp_path / "two-node-capture.toml"
    path.write_text(tomli_w.dumps(doc))
    table = local_nodes(tmp_path, 2)
    record = launch_nodes(home, load_profile(path), table.__getitem__)
    jobs: list[tuple[str, int]] = []  # (node name, job id): their pids are killed at the end
    try:
        wait_for(lambda: multi_node_status(record, table.__getitem__).state == "ready", "ready across nodes", WAIT_S)
        yield record, table, capture_dir, jobs
    finally:
        for node, job_id in jobs:
            stop_job_on(table[node], job_id)
        kill_node_sessions(table, record)


def job_status_on(node, job_id: str) -> dict:
    result = node.call(["extract", "status", job_id, "--json"])
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def stop_job_on(node, job_id: str) -> None:
    """Teardown: the job's pid (if it is still a job process of ours) gets SIGKILL."""
    with contextlib.suppress(Exception):
        pid = job_status_on(node, job_id).get("pid")
        if isinstance(pid, int) and psutil.pid_exists(pid):
            proc = psutil.Process(pid)
            if "sessions.extraction" in " ".join(proc.cmdline()) or "extract" in " ".join(proc.cmdline()):
                proc.send_signal(signal.SIGKILL)


def manifest(out: Path) -> list[dict]:
    path = out / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def assert_each_sample_once(out: Path, rows: int) -> None:
    entries = manifest(out)
    ok = [e for e in entries if e["status"] == "ok"]
    assert sorted(e["index"] for e in ok) == list(range(rows))  # each sample exactly once, none lost
    assert len(entries) == rows  # and no second line for any of them
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.ckpt")) == sorted(e["path"] for e in ok)
    assert not list(out.rglob("*.tmp"))


def spec_for(tmp_path: Path, name: str, session: str, **keys) -> Path:
    dataset = tmp_path / "data.jsonl"
    if not dataset.exists():
        write_dataset(dataset, chat_rows(ROWS))
    return write_spec(tmp_path / f"{name}.toml", name=name, dataset=dataset, output_dir=tmp_path / f"out-{name}",
                      session=session, **keys)


def start_on(node, spec: Path, jobs: list) -> str:
    result = node.call(["extract", "run", str(spec)])
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    jobs.append((node.name, job_id))
    return job_id


def wait_job(node, job_id: str, states: tuple[str, ...] = ("done", "failed", "cancelled")) -> dict:
    return wait_for(lambda: (s := job_status_on(node, job_id))["state"] in states and s,
                    f"job {job_id} on {node.name} in {states}", WAIT_S)


@pytest.mark.timeout(900)  # two server starts and two jobs on a shared CPU; WAIT_S guards each wait
def test_a_two_node_extraction_job_runs_on_node0s_host_and_survives_a_kill(capture_cluster, tmp_path: Path,
                                                                           home) -> None:
    record, table, capture_dir, jobs = capture_cluster
    node0, node1 = table["node0"], table["node1"]
    session0, session1 = record.nodes[0].session_id, record.nodes[1].session_id
    # New behaviour: node 1's session is refused before anything starts (its ranks TP2-3 write no captures),
    # naming node 0's host; the old code started that job, which then waited for dumps that never come.
    refused = node1.call(["extract", "run", str(spec_for(tmp_path, "worker", session1))])
    if refused.returncode == 0:  # (the old code) a job started after all: the teardown kills it by pid
        jobs.append((node1.name, refused.stdout.strip()))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"session {session1} is node 1 (TP2–3) of a server across 2 nodes" in refused.stderr
    assert "only TP0 writes, on node 0, the host of --dist-init-addr 127.0.0.1" in refused.stderr
    assert not (tmp_path / "out-worker").exists()
    # New behaviour: the multi-node id here is refused naming node 0's host and session (old: "not found").
    here = node_id_refusal(spec_for(tmp_path, "here", record.node_id), home)
    assert f"every capture is written by TP0 on node 0, host 'node0' (127.0.0.1), into node 0's session {session0}" \
        in here and "--host node0" in here
    # The job on node 0's host against node 0's session, killed -9 mid-run and resumed: every sample once,
    # verify clean, and each sample's tensors those of a run that was never killed.
    out = tmp_path / "out-n0"
    job_id = start_on(node0, spec_for(tmp_path, "n0", session0, concurrency=2), jobs)
    pid = wait_for(lambda: job_status_on(node0, job_id).get("pid"), "the job's pid", WAIT_S)
    wait_for(lambda: len(manifest(out)) >= 2, "2 samples recorded", WAIT_S, interval_s=0.002)
    os.kill(pid, signal.SIGKILL)  # kill -9 of the job mid-run: its requests are still in the server
    assert len(manifest(out)) < ROWS, "the job finished before it could be killed mid-run"
    assert wait_job(node0, job_id, ("interrupted",))["state"] == "interrupted"
    resumed = node0.call(["extract", "resume", job_id])
    assert resumed.returncode == 0, resumed.stderr
    done = wait_job(node0, job_id)
    assert done["state"] == "done", done
    assert_each_sample_once(out, ROWS)
    assert not [p for p in capture_dir.iterdir() if job_id in p.name]  # every dump collected, none left
    verify = node0.call(["extract", "verify", str(out)], timeout_s=WAIT_S)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    reference = start_on(node0, spec_for(tmp_path, "ref", session0, concurrency=2), jobs)
    assert wait_job(node0, reference)["state"] == "done"
    killed, unkilled = tensors_by_index(out), tensors_by_index(tmp_path / "out-ref")
    assert sorted(killed) == sorted(unkilled) == list(range(ROWS))
    for index, sample in unkilled.items():
        assert set(killed[index]) == set(sample)
        for key, value in sample.items():
            assert torch.equal(killed[index][key], value), (index, key)
    # Node 1 holds TP2-3 only, so it has no writer rank (the rule the refusal above relies on).
    log1 = node1.call(["logs", session1]).stdout
    assert "TP0]" not in log1 and "TP2]" in log1


def tensors_by_index(out: Path) -> dict[int, dict]:
    """Each ok sample's tensors, by dataset index (sample ids name the job, so they are left out)."""
    result = {}
    for entry in manifest(out):
        data = torch.load(out / entry["path"], weights_only=True)
        result[entry["index"]] = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
    return result


def node_id_refusal(spec: Path, home) -> str:
    from sessions.extraction.job import JobError, create_job

    with pytest.raises(JobError) as err:
        create_job(spec, home)
    assert err.value.code == 2
    return str(err.value)
