"""The card tells the present (issue 21 item 7): serving figures carry their age, and an idle server reads
idle, not the last busy line's "running 32"; a stopped capture session says what was captured.

A real emulator session is benched by the real `bench` command; once it ends, the server logs no stats line
for longer than its logging interval, and the status must say idle with 0 running (with and without
``--enable-metrics``).  The old status kept the last Decode line's figures forever.
"""
from __future__ import annotations

import time

import pytest
from _extract_support import wait_for
from test_server import run_cli, wait_for_state

from sessions.serving import (
    IDLE_MIN_S,
    ServingSnapshot,
    ServingTracker,
    as_idle,
    idle_after_s,
    parse_batch_line,
)
from widgets.serving_line import serving_segments

DECODE = (
    "[2026-05-01 10:00:00 TP0] Decode batch, #running-req: 32, #token: 9000, token usage: 0.40, "
    "cuda graph: True, gen throughput (token/s): 3200.00, #queue-req: 0"
)


def test_the_idle_limit_follows_the_logging_interval():
    line = parse_batch_line(DECODE)
    assert line is not None
    # 40 steps x 32 running / 3200 tok/s = 0.4 s between lines: the floor holds.
    assert idle_after_s(line, 40) == IDLE_MIN_S
    # A slow server: 40 steps x 32 running / 64 tok/s = 20 s between lines -> idle after 41 s.
    slow = parse_batch_line(DECODE.replace("3200.00", "64.00"))
    assert idle_after_s(slow, 40) == pytest.approx(41.0)
    assert idle_after_s(slow, 400) > idle_after_s(slow, 40)


def test_an_idle_snapshot_reads_nothing_running_and_says_when_the_last_batch_was():
    tracker = ServingTracker()
    tracker.feed_line(DECODE, read_at=1000.0)
    busy = tracker.snapshot()
    assert busy is not None and busy.running_reqs == 32
    idle = as_idle(busy)
    assert (idle.running_reqs, idle.queue_reqs, idle.gen_throughput, idle.idle) == (0, 0, 0.0, True)
    import dataclasses

    idle = dataclasses.replace(idle, last_batch_at=busy.updated_at, taken_at=(busy.updated_at or 0) + 125)
    text = " ".join(t.plain for t in serving_segments(idle, now=(busy.updated_at or 0) + 125))
    assert "idle" in text and "running 0" in text and "last batch 2:05 ago" in text, text
    assert "running 32" not in text and "3200" not in text
    assert idle.to_json()["idle"] is True and idle.to_json()["age_s"] == 125.0
    fresh = ServingSnapshot(10.0, 1, 0, 0.1, None, updated_at=50.0, taken_at=53.0)
    assert fresh.age_s == 3.0 and fresh.to_json()["age_s"] == 3.0


@pytest.mark.parametrize("metrics", [False, True], ids=["log only", "with /metrics"])
def test_after_a_bench_the_status_reads_idle(metrics, launched, make_emulator_profile, cli_env):
    extra = {"extra_args": ["--enable-metrics"]} if metrics else {}
    profile = make_emulator_profile("serve", tp=1, time_scale=0.01, **extra)
    session = launched.launch(profile)
    wait_for_state(session, {"ready"})
    launched.remember(session)
    bench = run_cli("bench", session.session_id, "--concurrency", "8", "--num-prompts", "16", "--input-len", "64",
                    "--output-len", "64", "--json", env=cli_env, timeout=300)
    assert bench.returncode == 0, bench.stderr
    busy_lines = [ln for ln in session.log_path.read_text().splitlines() if "Decode batch" in ln and
                  "#running-req: 0," not in ln]
    assert busy_lines, "the bench logged Decode lines with requests running"
    # The server logs nothing more: once the silence passes the logging interval it reads idle.
    status = wait_for(lambda: (st := session.status()).serving is not None and st.serving.idle and st,
                      "the serving figures to read idle", 120, interval_s=0.2)
    assert status.serving.running_reqs == 0 and status.serving.queue_reqs == 0
    assert status.serving.gen_throughput == 0.0
    as_json = status.to_json()["serving"]
    assert as_json["idle"] is True and as_json["age_s"] is not None and as_json["last_batch_at"] is not None
    assert time.time() - as_json["last_batch_at"] >= IDLE_MIN_S


# -- capture of an ended session ----------------------------------------------------------------------------


def test_a_stopped_capture_session_says_what_was_captured_not_active():
    import dataclasses

    from test_capture_panel import _PanelApp
    from test_capture_panel import _status as capture_status
    from test_tui_snapshots import _status as session_status
    from textual.app import App, ComposeResult

    from sessions.phases import StartupPhase, StartupSummary
    from tests._tui_support import run, screen_text, wait_until
    from widgets.capture_panel import CapturePanel
    from widgets.phase_timeline import PhaseTimeline

    capture = capture_status(points=(2, 30, 58), draft_ids=(1, 29, 57), warnings=())
    texts: dict[str, str] = {}

    async def panel(state: str) -> None:
        app = _PanelApp()
        async with app.run_test(size=(140, 12)) as pilot:
            app.query_one(CapturePanel).update_status(capture, server_layers=[2, 30, 58], server_state=state)
            await wait_until(pilot, lambda: "CUDA graphs" in screen_text(app), "the panel drawn")
            texts[state] = screen_text(app)

    for state in ("ready", "stopped"):
        run(lambda state=state: panel(state))
    assert "✓ capture active" in texts["ready"]
    assert "capture active" not in texts["stopped"], texts["stopped"]
    assert "stopped session captured layers [2, 30, 58] · 12 files, 3.0G in the capture dir" in texts["stopped"]

    summary = StartupSummary(phase=StartupPhase.READY, ranks_expected=1,
                             rank_arrival={"load_weight_end": (0,), "capture_active": (0,)}, line_count=90)
    ended = dataclasses.replace(session_status("stopped", "ready"), summary=summary, alive=False, ranks=())

    class _OneTimeline(App):
        def compose(self) -> ComposeResult:
            yield PhaseTimeline(id="timeline")

    async def timeline() -> None:
        app = _OneTimeline()
        async with app.run_test(size=(140, 8)) as pilot:
            app.query_one(PhaseTimeline).update_status(ended)
            await wait_until(pilot, lambda: "1/1" in screen_text(app), "the timeline drawn")
            texts["timeline"] = screen_text(app)

    run(timeline)
    assert "capture was active until stopped: 1/1" in texts["timeline"], texts["timeline"]
    assert "capture active 1/1" not in texts["timeline"]
