"""`b` in the demo on tiny-llama: the bench runs against the real emulated server and shows its table;
the history lists kept results side by side; the CLI's bench and bench history agree with it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from textual.widgets import DataTable

from app.screens.bench import BenchScreen
from app.tui import Eagle3App
from sessions.bench.session_bench import BenchOptions
from sessions.bench.store import flag_changes, load_history
from sessions.demo import CAPTURE_PROFILE, ensure_demo_home
from sessions.home import resolve_home
from sessions.profiles import load_profile, save_profile
from tests._tui_support import first_poll, run, screen_text, wait_until


@pytest.fixture
def demo_home(home, seed_demo_models):
    seed_demo_models()  # the tiny model written once per worker (conftest), not once per test
    return ensure_demo_home(resolve_home(demo=True))


def test_b_on_the_tiny_llama_demo_shows_a_result_table_and_the_history(demo_home, launched, monkeypatch, cli_env):
    pytest.importorskip("torch")
    # A bench that stays short on a loaded CI machine: the path is the one `b` always takes.
    monkeypatch.setattr(BenchScreen, "default_options", BenchOptions(input_len=8, output_len=4,
                                                                     num_prompts=2, concurrency=(1, 2)))
    save_profile(load_profile(CAPTURE_PROFILE, demo_home).with_changes(emulator={"time_scale": 0.004}))
    launched.home = demo_home

    seen: dict[str, str] = {}

    async def scenario() -> None:
        app = Eagle3App(demo_home, demo=True, refresh_s=0.2)
        async with app.run_test(size=(140, 45)) as pilot:
            await first_poll(pilot, app)
            app.dashboard.select_profile(CAPTURE_PROFILE)  # the profile cursor: l acts on what is in view
            await pilot.press("l")
            status = await wait_until(
                pilot, lambda: (s := app.dashboard.last_snapshot.status) and s.state == "ready" and s,
                "the tiny-llama session is ready", 120)
            launched.track(status.session_id)
            seen["session"] = status.session_id
            await pilot.press("b")
            screen = await wait_until(pilot, lambda: isinstance(app.screen, BenchScreen) and app.screen,
                                      "the bench screen opens", 10)
            results = screen.query_one("#results", DataTable)
            await wait_until(pilot, lambda: results.row_count >= 1 or not screen.running,
                             "the first concurrency's row", 240)
            # shown while the next concurrency runs (each run waits a second to settle, then takes longer)
            assert results.row_count == 1 and screen.running and screen.last_result is None
            await wait_until(pilot, lambda: screen.last_result is not None or not screen.running,
                             "the bench finishes", 240)
            assert results.row_count == 2
            assert screen.last_result is not None, screen_text(app)
            text = screen_text(app)
            assert "OUT tok/s" in text and "TTFT med" in text and "ITL med" in text
            assert CAPTURE_PROFILE in text and "★" in text
            runs = screen.last_result["runs"]
            assert [r["max_concurrency"] for r in runs] == [1, 2] and all(r["completed"] == 2 for r in runs)
            # the serving view has the figures of the bench's requests now
            await pilot.press("escape")
            await wait_until(pilot, lambda: (s := app.dashboard.last_snapshot.status) and s.serving is not None,
                             "the serving figures appear", 30)
            assert "serving" in screen_text(app) and "tok/s" in screen_text(app)

    run(scenario)
    rows, problems = load_history(demo_home)
    assert problems == [] and len(rows) == 1 and rows[0].profile == CAPTURE_PROFILE
    assert rows[0].command and "--api-key" not in " ".join(rows[0].command)
    assert rows[0].sglang_version == "0.5.23"
    out = subprocess.run([sys.executable, "-m", "app", "--demo", "bench", "history", "--json"], env=cli_env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert listed[0]["profile"] == CAPTURE_PROFILE and listed[0]["best"] is True
    # the CLI on the same session: the TUI's runs flushed the cache before each concurrency, this one not
    assert all(r["cache_flushed"] is True for r in runs_seen(demo_home))
    small = ["--concurrency", "1", "--num-prompts", "1", "--input-len", "8", "--output-len", "4"]
    out = subprocess.run([sys.executable, "-m", "app", "--demo", "bench", seen["session"], "--no-flush-cache",
                          "--json", *small], env=cli_env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    kept = json.loads(out.stdout)
    assert kept["request"]["flush_cache"] is False and kept["runs"][0]["cache_flushed"] is None
    out = subprocess.run([sys.executable, "-m", "app", "--demo", "bench", seen["session"], *small], env=cli_env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.splitlines()[0].split()[:3] == ["CONC", "DONE", "OUT"], out.stdout


def runs_seen(home) -> list[dict]:
    from sessions.bench.store import bench_dir

    return [run for path in bench_dir(home).glob("*.json") for run in json.loads(path.read_text())["runs"]]


def test_the_run_table_says_when_a_runs_cache_was_not_flushed():
    from app.cli_bench import runs_table

    run = {"max_concurrency": 8, "completed": 16, "output_throughput": 500.0, "input_throughput": 1000.0,
           "request_throughput": 4.0, "median_ttft_ms": 70.0, "p99_ttft_ms": 80.0, "median_tpot_ms": 14.0,
           "median_itl_ms": 14.0, "p99_itl_ms": 17.0, "median_e2e_latency_ms": 970.0,
           "cache_note": "prefix cache not flushed (HTTP 400: Timed out waiting for idle state.)"}
    lines = runs_table([run, dict(run, max_concurrency=32, cache_note=None)]).splitlines()
    assert lines[0].split()[0] == "CONC" and lines[1].split()[:3] == ["8", "16", "500.0"]
    assert lines[-1] == "concurrency 8: prefix cache not flushed (HTTP 400: Timed out waiting for idle state.)"


def test_flag_changes_name_what_differs():
    a = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--attention-backend", "flashinfer",
         "--tp-size", "8"]
    b = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--attention-backend", "triton",
         "--tp-size", "8", "--enable-metrics"]
    assert flag_changes(a, b) == ["~ --attention-backend flashinfer -> triton", "+ --enable-metrics"]


def test_bench_cli_rejects_bad_input_by_name(cli_env):
    out = subprocess.run([sys.executable, "-m", "app", "bench", "nosuch", "--concurrency", "1,x"], env=cli_env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "--concurrency" in out.stderr and "'x'" in out.stderr
    out = subprocess.run([sys.executable, "-m", "app", "bench", "nosuch"], env=cli_env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode != 0 and "nosuch" in out.stderr
