"""The demo's capture + extraction flow, as a user drives it (issues 6 and 7, "Done means").

In the demo home (``EAGLE3_TUI_DEMO=1``): the tiny capture profile is launched from the dashboard, the
capture panel shows the server's ``eagle3-capture active`` line, ``x`` opens the jobs screen, ``n`` +
Enter starts the demo job spec, the job process is SIGKILLed mid-run by pid (a crash), ``r`` resumes it,
and the output passes ``extract verify`` and loads with SpecForge's own reader.  Real processes: the
emulator (the one stand-in) running the tiny model's real forwards, the detached job process, the CLI.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
import tomli_w
from _extract_support import assert_specforge_reads, run_cli, stop_job
from _tui_support import first_poll, run, screen_host, screen_text, wait_until

from app.screens.jobs import JobRow, JobsScreen, SpecPathModal
from sessions.demo import (
    CAPTURE_PROFILE,
    DEMO_MALFORMED_LINE,
    DEMO_PROFILES,
    HEALTHY_PROFILE,
    demo_capture_dir,
    demo_dataset_rows,
    demo_job_spec_path,
    demo_note,
    demo_output_dir,
    ensure_demo_home,
    tiny_model_dir,
)
from sessions.home import Home, resolve_home
from widgets.confirm_modal import ConfirmModal

REPO_ROOT = Path(__file__).resolve().parent.parent
FLOW_LINES = 120  # lines of the demo dataset that the flow's job runs (see the test)


@pytest.fixture
def demo_home(home, monkeypatch: pytest.MonkeyPatch):
    """The demo home under this test's EAGLE3_TUI_HOME, with ``--demo`` semantics for children too."""
    monkeypatch.setenv("EAGLE3_TUI_DEMO", "1")
    resolved = resolve_home()
    assert resolved.demo
    return ensure_demo_home(resolved)


@pytest.fixture
def seeded_demo_home(home, monkeypatch: pytest.MonkeyPatch, seed_demo_models):
    """`demo_home` with the tiny model copied in first (conftest): for the tests that do not check the
    writing itself (the first test here and test_demo_entry do)."""
    monkeypatch.setenv("EAGLE3_TUI_DEMO", "1")
    resolved = resolve_home()
    assert resolved.demo
    seed_demo_models(resolved)
    return ensure_demo_home(resolved)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _manifest_lines(out: Path) -> list[dict]:
    path = out / "manifest.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the demo home ------------------------------------------------------------------------------------
def test_the_demo_home_has_a_capture_profile_a_dataset_and_a_job_spec_that_check(demo_home) -> None:
    from sessions.extraction.datasets import DatasetLineError, DatasetRecord, iter_dataset
    from sessions.extraction.spec import check_paths, load_job_spec
    from sessions.profiles import list_profiles, load_profile, read_model_config, validate_profile
    from sessions.profiles.capture_toggle import capture_status

    names = list_profiles(demo_home)
    assert set(DEMO_PROFILES) | {CAPTURE_PROFILE} <= set(names)
    profile = load_profile(CAPTURE_PROFILE, demo_home)
    assert profile.server.launcher == "emulator" and profile.server.tp_size == 1
    assert profile.capture.enabled and not profile.is_explicit("server.radix_cache")
    assert profile.capture.layers is None  # SGLang's default set
    assert [p for p in validate_profile(profile, check_port=False) if p.is_error] == []
    assert profile.server.port not in {load_profile(n, demo_home).server.port for n in DEMO_PROFILES}
    shape = read_model_config(tiny_model_dir(demo_home))
    assert shape.architecture == "LlamaForCausalLM" and shape.num_hidden_layers == 8
    assert any(tiny_model_dir(demo_home).glob("*.safetensors"))
    status = capture_status(profile)
    assert status.errors == () and status.dir == str(demo_capture_dir(demo_home))
    assert oct(demo_capture_dir(demo_home).stat().st_mode & 0o777) == "0o700"
    assert demo_note(demo_home) is None

    spec = load_job_spec(demo_job_spec_path(demo_home))
    assert check_paths(spec) == []
    assert spec.server_url == f"http://127.0.0.1:{profile.server.port}"
    assert spec.capture_dir == demo_capture_dir(demo_home) and spec.model_path == tiny_model_dir(demo_home)
    assert spec.output_dir == demo_output_dir(demo_home) and not spec.output_dir.exists()
    read = list(iter_dataset(spec.dataset, spec.dataset_format))
    records = [r for r in read if isinstance(r, DatasetRecord)]
    errors = [r for r in read if isinstance(r, DatasetLineError)]
    assert len(records) == len(demo_dataset_rows()) >= 24
    assert [e.line for e in errors] == [DEMO_MALFORMED_LINE]


def test_creating_the_demo_home_again_keeps_edits_and_a_new_spec_follows_the_capture_profile(
        seeded_demo_home) -> None:
    from sessions.extraction.spec import load_job_spec
    from sessions.profiles import load_profile, save_profile

    demo_home = seeded_demo_home
    spec_path = demo_job_spec_path(demo_home)
    spec_path.write_text(spec_path.read_text().replace("concurrency = 4", "concurrency = 2"))
    port = _free_port()
    save_profile(load_profile(CAPTURE_PROFILE, demo_home).with_changes(server={"port": port}))
    model_mtime = (tiny_model_dir(demo_home) / "model.safetensors").stat().st_mtime_ns
    ensure_demo_home(demo_home)
    assert load_job_spec(spec_path).concurrency == 2  # the user's edit is kept
    assert load_profile(CAPTURE_PROFILE, demo_home).server.port == port
    assert (tiny_model_dir(demo_home) / "model.safetensors").stat().st_mtime_ns == model_mtime  # not rewritten
    spec_path.unlink()
    ensure_demo_home(demo_home)  # a missing spec is written again, with the profile's current port
    assert load_job_spec(spec_path).server_url == f"http://127.0.0.1:{port}"


def test_without_torch_the_capture_demo_is_skipped_with_a_note_and_made_once_torch_is_there(home, tmp_path) -> None:
    # `python -S` leaves site-packages out, so torch, transformers, safetensors and tokenizers are missing.
    env = dict(os.environ, EAGLE3_TUI_HOME=str(tmp_path / "bare"), EAGLE3_TUI_DEMO="1", PYTHONPATH=str(REPO_ROOT))
    code = ("import json, os; from sessions.demo import ensure_demo_home, demo_note\n"
            "h = ensure_demo_home()\n"
            "print(json.dumps({'note': demo_note(h), 'profiles': sorted(os.listdir(h.profiles_dir)),"
            " 'spec': os.path.exists(os.path.join(h.config_root, 'jobs'))}))\n")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["profiles"] == sorted(f"{n}.toml" for n in DEMO_PROFILES)  # the Kimi demos still work
    assert not result["spec"]
    note = result["note"]
    assert note and "\n" not in note and "Capture demo skipped" in note and "torch" in note
    # The same home, now where torch is importable: the capture demo appears and the note goes away.
    bare = Home(config_root=tmp_path / "bare" / "demo" / "config", state_root=tmp_path / "bare" / "demo" / "state",
                demo=True)
    ensure_demo_home(bare)
    assert demo_note(bare) is None and (bare.profiles_dir / f"{CAPTURE_PROFILE}.toml").is_file()
    assert demo_job_spec_path(bare).is_file()


def test_the_new_job_prompt_lists_known_specs_outside_the_demo_and_starts_empty(home) -> None:
    from textual.widgets import Input, Static

    jobs_dir = home.config_root / "jobs"
    jobs_dir.mkdir(parents=True)
    for name in ("alpha", "beta"):
        (jobs_dir / f"{name}.toml").write_text(tomli_w.dumps({"job": {"name": name}}))

    async def scenario() -> None:
        app = screen_host(lambda: JobsScreen(home))
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.press("n")
            modal = await wait_until(pilot, lambda: isinstance(app.screen, SpecPathModal) and app.screen,
                                     "the spec prompt")
            assert modal.query_one("#spec-path", Input).value == ""  # not the demo: nothing pre-filled
            listed = str(modal.query_one("#known-specs", Static).content)  # long tmp paths wrap on screen
            assert all(str(jobs_dir / f"{n}.toml") in listed for n in ("alpha", "beta")), listed
            await pilot.press("escape")

    run(scenario)


# -- the flow -----------------------------------------------------------------------------------------
class _KillAfter(threading.Thread):
    """SIGKILLs the job's process (by pid) once ``at_least`` samples are in its manifest: a crash mid-run.

    A thread, polling every 2 ms, so that the kill lands mid-run however fast the tiny model is."""

    def __init__(self, home, out: Path, at_least: int) -> None:
        super().__init__(daemon=True, name="kill-job")
        self.home, self.out, self.at_least = home, out, at_least
        self.done = threading.Event()
        self.stop = threading.Event()
        self.killed_pid: int | None = None
        self.recorded_at_kill: int | None = None
        self.job_id: str | None = None

    def run(self) -> None:
        from sessions.extraction.progress import list_jobs

        try:
            while not self.stop.is_set():
                jobs = list_jobs(self.home)
                if jobs and jobs[0].pid and len(_manifest_lines(self.out)) >= self.at_least:
                    self.job_id, pid = jobs[0].job_id, jobs[0].pid
                    os.kill(pid, signal.SIGKILL)
                    self.killed_pid = pid
                    self.recorded_at_kill = len(_manifest_lines(self.out))
                    return
                self.stop.wait(0.002)
        finally:
            self.done.set()


@pytest.mark.slow
def test_demo_user_launches_capture_sees_it_confirmed_runs_kills_resumes_and_verifies_a_job(
        seeded_demo_home, launched, cli_env) -> None:
    from textual.widgets import Input

    from app.tui import Eagle3App
    from sessions.profiles import load_profile, save_profile
    from sessions.profiles.capture_toggle import capture_status
    from sessions.server import ServerSession
    from widgets.capture_panel import CapturePanel

    demo_home = seeded_demo_home
    # Faster than the demo's own pace, and a port free now; the job spec is written again for that port.
    profile = load_profile(CAPTURE_PROFILE, demo_home)
    save_profile(profile.with_changes(server={"port": _free_port()}, emulator={"time_scale": 0.004}))
    spec_path = demo_job_spec_path(demo_home)
    spec_path.unlink()
    ensure_demo_home(demo_home)
    # The demo dataset's first FLOW_LINES lines (the spec's own num_samples): its 720 rows are there so that
    # a person has time to watch the job, kill it and resume it; ten times as many samples as fit in the
    # test's wait only made it run 10x longer (the kill still lands mid-run: after 2 of ~120 samples).
    spec_doc = tomllib.loads(spec_path.read_text())
    assert DEMO_MALFORMED_LINE < FLOW_LINES < len(demo_dataset_rows()) and "num_samples" not in spec_doc["job"]
    spec_doc["job"]["num_samples"] = FLOW_LINES
    spec_path.write_text(tomli_w.dumps(spec_doc))
    expected_points = list(capture_status(load_profile(CAPTURE_PROFILE, demo_home)).points)
    launched.home = demo_home
    out = demo_output_dir(demo_home)
    rows = FLOW_LINES - 1  # the broken line is one of them
    killer = _KillAfter(demo_home, out, at_least=2)
    state: dict = {}

    async def scenario() -> None:
        app = Eagle3App(demo_home, demo=True, refresh_s=0.2)
        async with app.run_test(size=(160, 50)) as pilot:
            await first_poll(pilot, app)
            dash = app.dashboard
            assert dash.selected_profile == HEALTHY_PROFILE  # the healthy Kimi profile stays first
            for _ in range(4):  # down the profile list to the capture profile
                if dash.selected_profile == CAPTURE_PROFILE:
                    break
                await pilot.press("down")
                await pilot.pause()
            assert dash.selected_profile == CAPTURE_PROFILE
            panel = await wait_until(pilot, lambda: (p := app.screen.query(CapturePanel)) and p.first().status
                                     and p.first(), "the capture panel of the capture profile")
            assert panel.status.enabled and "CAPTURE ON" in screen_text(app)

            # c toggles capture (off, then on again), saved in the profile.
            await pilot.press("c")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the capture question")
            await pilot.press("y")
            await wait_until(pilot, lambda: not load_profile(CAPTURE_PROFILE, demo_home).capture.enabled,
                             "capture turned off in the profile")
            await pilot.press("c")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the capture question")
            await pilot.press("y")
            await wait_until(pilot, lambda: load_profile(CAPTURE_PROFILE, demo_home).capture.enabled,
                             "capture turned on again")

            await pilot.press("l")
            status = await wait_until(
                pilot,
                lambda: (s := dash.last_snapshot.status) and s.profile == CAPTURE_PROFILE and s.state == "ready"
                and s,
                "the capture session is ready", 180)
            launched.track(status.session_id)
            state["session_id"] = status.session_id
            # The tracker read the plugin-format line from the server's log...
            confirmed = await wait_until(
                pilot, lambda: ServerSession.load(status.session_id, demo_home).status().summary.capture_layers,
                "the session's tracker saw the capture-active line", 60)
            assert list(confirmed) == expected_points
            log_text = Path(status.log_path).read_text()
            assert f"eagle3-capture active: layers_to_capture={expected_points}" in log_text
            # ... and the capture panel shows it, agreeing with the profile.
            await wait_until(pilot, lambda: panel.server_layers == expected_points, "the panel got the layers", 60)
            text = screen_text(app)
            assert f"server: layers_to_capture {expected_points}" in text and "✓ capture active" in text

            # x: the jobs screen; n: the prompt holds the demo spec; Enter starts it.
            await pilot.press("x")
            jobs = await wait_until(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen,
                                    "the jobs screen")
            await pilot.press("n")
            modal = await wait_until(pilot, lambda: isinstance(app.screen, SpecPathModal) and app.screen,
                                     "the spec prompt")
            assert modal.query_one("#spec-path", Input).value == str(demo_job_spec_path(demo_home))
            killer.start()
            await pilot.press("enter")
            await wait_until(pilot, lambda: jobs.jobs, "the demo job listed", 120)
            job_id = jobs.jobs[0].job_id
            state["job_id"] = job_id
            await wait_until(pilot, killer.done.is_set, "the job killed mid-run", 240)
            assert killer.killed_pid is not None and killer.job_id == job_id
            assert killer.recorded_at_kill < rows, "the job finished before it could be killed mid-run"

            def job():
                return next((p for p in jobs.jobs if p.job_id == job_id), None)

            await wait_until(pilot, lambda: job() and job().state == "interrupted", "the job reads interrupted", 60)
            assert "r resumes" in screen_text(app)
            await pilot.press("r")
            await wait_until(pilot, lambda: job().pid != killer.killed_pid, "a new job process", 60)
            done = await wait_until(pilot, lambda: job().state in ("done", "failed") and job(), "the job ends", 300)
            assert done.state == "done", done.reason
            row = jobs.query_one(JobRow)
            bar = row.query_one("#bar")
            assert (bar.total, bar.progress) == (rows + 1, rows + 1)  # every line, the malformed one included
            assert (done.done, done.total, done.failed_lines) == (rows + 1, rows + 1, 1)
            state["done"] = done

    try:
        run(scenario)
    finally:
        killer.stop.set()
        if state.get("job_id"):
            stop_job(state["job_id"], demo_home)
    # The dataset: each sample once, the bad line recorded, verify passes, SpecForge reads it.
    ok = [e for e in _manifest_lines(out) if e["status"] == "ok"]
    assert len(ok) == rows and len({e["index"] for e in ok}) == rows
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [e["line"] for e in errors] == [DEMO_MALFORMED_LINE]
    verify = run_cli(["--demo", "extract", "verify", str(out), "--lm-head-check"], cli_env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert assert_specforge_reads(out, 64, 3 * 64) == rows
    info = json.loads((out / "dataset.json").read_text())
    assert info["layers"]["capture_points"] == expected_points
