"""A full output disk pauses the job, whatever the write raised; rates and ETA come from this run alone
(issue 14 item 3).  The end-to-end test fills a real 1 MB tmpfs (root may mount one here), then grows it."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from _extract_support import chat_rows, run_cli, stop_job, wait_for, write_dataset, write_spec

from sessions.extraction.job import job_status
from sessions.extraction.progress import RateMeter


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory() as d:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d], capture_output=True,
                            check=False).returncode == 0
        if ok:
            subprocess.run(["umount", d], check=False)
        return ok


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 1 MB tmpfs at ``tmp_path/small`` (grown with ``remount``), unmounted at teardown."""
    if not _can_mount_tmpfs():
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); the fault-injection tests cover the logic")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "demo", num_layers=8, hidden_size=64)


@pytest.mark.slow
def test_a_full_output_tmpfs_pauses_the_job_with_no_failed_sample_and_it_finishes_when_there_is_room(
        home, cli_env, make_emulator_profile, launched, demo_model, small_fs, tmp_path) -> None:
    capture = tmp_path / "capture"
    capture.mkdir(mode=0o700)
    profile = make_emulator_profile("disk", tp=1, model_path=str(demo_model), chunked_prefill_size=24,
                                    capture={"enabled": True, "dir": str(capture), "rid_prefix": "eagle3-"})
    session = launched.launch(profile)
    wait_for(lambda: session.status().state == "ready", "session ready", 180)
    launched.remember(session)
    rows = 40  # ~40-80 KB per sample: about 15 fit in 1 MB
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(rows))
    out = small_fs / "out"
    spec = write_spec(tmp_path / "job.toml", name="disk", session=session.session_id, dataset=dataset,
                      output_dir=out, concurrency=4, disk_preflight=False)
    started = run_cli(["extract", "run", str(spec)], cli_env)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    try:
        paused = wait_for(lambda: (p := job_status(job_id, home)).state in ("paused", "done", "failed") and p,
                          "the job paused on the full disk", 180)
        assert paused.state == "paused", (paused.state, paused.reason)
        assert "output filesystem full" in paused.reason and str(out) in paused.reason
        assert paused.eta_s is None  # no ETA while paused
        shown = run_cli(["extract", "status", job_id], cli_env).stdout
        assert "paused" in shown and "ETA" not in shown
        assert paused.extraction_failures == 0 and paused.failed_lines == 0
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)  # room again
        done = wait_for(lambda: (p := job_status(job_id, home)).state in ("done", "failed") and p, "done", 240)
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert (done.ok, done.failed_lines, done.extraction_failures) == (rows, 0, 0)
    entries = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert sorted(e["index"] for e in entries if e["status"] == "ok") == list(range(rows))
    assert len(entries) == rows
    assert sorted(p.name for p in out.rglob("*.ckpt")) == sorted(f"data_{i}.ckpt" for i in range(rows))
    assert done.eta_s is None


def test_torch_save_runtime_error_on_a_nearly_full_disk_pauses_and_retries(tmp_path: Path, monkeypatch) -> None:
    """Fault injection at the write call: the RuntimeError torch.save raises on a full disk is a pause."""
    import shutil
    import threading

    from sessions.extraction import bookkeeping
    from sessions.extraction.bookkeeping import OutputBookkeeping
    from sessions.extraction.job_state import JobState

    state = JobState(tmp_path, {"job_id": "j"}, resume=False, log=lambda _line: None)
    run = OutputBookkeeping(state, output_root=tmp_path)  # the bookkeeping alone (issue 24 item 6)
    free = {"bytes": 1000}
    calls: list[int] = []

    class Output:
        root = tmp_path

        def write_sample(self, index: int, data: dict) -> tuple[str, int, str]:
            calls.append(index)
            if free["bytes"] < 10 << 20:
                raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed "
                                   "writing file data/0: file write failed, unexpected pos 1234")
            return "rows_0-2000/data_0.ckpt", 10, "crc32:0"

    run.output = Output()  # type: ignore[assignment]
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(bookkeeping.shutil, "disk_usage",
                        lambda _p: usage._replace(free=free["bytes"]))
    monkeypatch.setattr(bookkeeping, "OUTPUT_FULL_RETRY_S", 0.01)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(run.write_until_space(0, {})))
    worker.start()
    wait_for(lambda: "output" in run.pause_reasons, "paused", 10, interval_s=0.01)
    assert "output filesystem full" in run.pause_reasons["output"] and "unexpected pos" in run.pause_reasons["output"]
    assert worker.is_alive()  # waiting for room, not failing the sample
    free["bytes"] = 1 << 30
    worker.join(10)
    assert result == [("rows_0-2000/data_0.ckpt", 10, "crc32:0")]
    assert "output" not in run.pause_reasons and len(calls) >= 2

    # A write error with plenty of room is not a full disk: it still fails the attempt.
    class Broken(Output):
        def write_sample(self, index: int, data: dict) -> tuple[str, int, str]:
            raise RuntimeError("something else")

    run.output = Broken()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="something else"):
        run.write_until_space(0, {})


def test_rates_are_this_runs_own_window_not_the_resumed_past() -> None:
    meter = RateMeter()
    meter.start(1000, 10**6, 10**9, now=100.0)  # a resume: 1000 samples were done by earlier runs
    meter.add(1256, 10**6 + 256, 10**9 + 256, now=100.0001)  # one group commit of 256 samples
    assert meter.rates(now=100.0002) == (0.0, 0.0, 0.0)  # no rate from a microsecond
    samples_s, _, _ = meter.rates(now=102.0)
    assert samples_s == pytest.approx(128.0)
    samples_s, _, _ = meter.rates(now=200.0)  # nothing moves: the rate falls, it is not frozen
    assert samples_s < 3


def test_no_eta_unless_running(tmp_path: Path) -> None:
    from sessions.extraction.job_state import JobState
    from sessions.extraction.run_report import RunReport

    job = JobState(tmp_path, {"job_id": "j"}, resume=False, log=lambda _line: None)
    job.counts = {"ok": 10, "skipped": 0, "error": 0, "failed": 0}
    job.total = 100
    job.rates.start(0, 0, 0, now=time.monotonic() - 10)
    job.rates.add(10, 0, 0)
    job.counted = True  # a first run: nothing carried over from an earlier one
    run = RunReport(job)  # no spec, no scheduler yet: nothing sent
    for state, expect_eta in (("running", True), ("cancelled", False), ("failed", False), ("done", False)):
        job.state = state
        assert (run.snapshot()["eta_s"] is not None) is expect_eta, state
    job.state, job.pause_reasons = "running", {"server": "server unreachable"}
    snap = run.snapshot()
    assert snap["state"] == "paused" and snap["eta_s"] is None


@pytest.mark.slow
def test_a_job_stays_paused_against_a_different_server_on_its_port_and_continues_on_a_relaunch(
        home, cli_env, make_emulator_profile, launched, demo_model, tmp_path) -> None:
    """Issue 14 item 4 / issue 12 item 8: another server (other capture dir) on the job's port never gets
    the job's requests; the job is paused with the reason, no ETA; a relaunch of its profile continues it."""
    from sessions import probes
    from sessions.server import ServerSession

    def serve(name: str, capture: Path, port: int | None = None):
        capture.mkdir(mode=0o700, exist_ok=True)
        overrides = {"port": port} if port else {}
        profile = make_emulator_profile(name, tp=1, model_path=str(demo_model), chunked_prefill_size=24,
                                        capture={"enabled": True, "dir": str(capture), "rid_prefix": "eagle3-"},
                                        **overrides)
        session = launched.launch(profile)
        wait_for(lambda: session.status().state == "ready", f"{name} ready", 180)
        launched.remember(session)
        return session, profile

    def session_processes_gone(session_id: str) -> bool:
        """No live process carries the session's marker (its ranks too: a rank that outlives the main, e.g.
        on its way out after PDEATHSIG, still holds its emulated GPU and the relaunch would be GPU-busy)."""
        import psutil

        for proc in psutil.process_iter(["status"]):
            try:
                if (proc.info["status"] != psutil.STATUS_ZOMBIE
                        and proc.environ().get("EAGLE3_TUI_SESSION") == session_id):
                    return False
            except psutil.Error:
                continue
        return True

    def kill(session) -> None:
        pid, create_time = session.state_record["pid"], session.state_record["create_time"]
        os.killpg(os.getpgid(pid), 9)
        wait_for(lambda: not probes.process_alive(pid, create_time), "server gone", 30)
        wait_for(lambda: session_processes_gone(session.session_id), "every process of the session gone", 60)
        wait_for(lambda: probes.port_free("127.0.0.1", session.state_record["port"]), "port free", 30)

    first, _profile = serve("mine", tmp_path / "cap-mine")
    port = first.status().port
    rows = 30
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(rows))
    out = tmp_path / "out"
    spec = write_spec(tmp_path / "job.toml", name="id", session=first.session_id, dataset=dataset,
                      output_dir=out, concurrency=2)
    started = run_cli(["extract", "run", str(spec)], cli_env)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    try:
        wait_for(lambda: job_status(job_id, home).done >= 2, "2 samples", 180, interval_s=0.01)
        kill(first)
        other, _ = serve("other", tmp_path / "cap-other", port=port)
        paused = wait_for(lambda: (p := job_status(job_id, home)).state == "paused" and "different server"
                          in (p.reason or "") and p, "paused naming the different server", 60)
        assert "capture_dir" in paused.reason and "cap-other" in paused.reason and paused.eta_s is None
        shown = run_cli(["extract", "status", job_id], cli_env).stdout
        assert "paused" in shown and "different server" in shown and "ETA" not in shown
        held = job_status(job_id, home).done
        assert not list((tmp_path / "cap-other").iterdir())  # the other server never got a request
        kill(other)
        relaunched = launched.launch(ServerSession.load(first.session_id, home).profile)
        wait_for(lambda: relaunched.status().state == "ready", "relaunch ready", 180)
        launched.remember(relaunched)
        done = wait_for(lambda: (p := job_status(job_id, home)).state in ("done", "failed") and p, "done", 240)
    finally:
        stop_job(job_id, home)
    assert done.state == "done", done.reason
    assert done.ok == rows and done.done > held
