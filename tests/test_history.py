"""Per-profile start history: phase timings kept privately, the last good start, the seed's sentence."""
from __future__ import annotations

import json
import stat
import threading

from sessions.history import (
    compare,
    compare_rows,
    format_duration_s,
    history_path,
    last_good,
    load_history,
    record_start,
)
from sessions.home import Home
from sessions.phases import PhaseEvent, StartupPhase, StartupSummary

P = StartupPhase
T0 = 1_700_000_000.0


def _home(tmp_path) -> Home:
    return Home(config_root=tmp_path / "config", state_root=tmp_path / "state").ensure()


def _summary(phase_lines: dict[StartupPhase, int], line_count: int) -> StartupSummary:
    events = tuple(PhaseEvent(p, n) for p, n in phase_lines.items())
    furthest = max(phase_lines, key=lambda p: p.order)
    return StartupSummary(
        phase=furthest,
        outcome="ready" if furthest == P.READY else "incomplete",
        events=events,
        line_count=line_count,
    )


GOOD_LINES = {P.DIST_INIT: 40, P.LOADING_WEIGHTS: 60, P.WEIGHTS_LOADED: 210, P.KV_CACHE: 230,
              P.CUDA_GRAPH: 250, P.WARMUP: 600, P.READY: 641}
GOOD_TIMES = {P.LAUNCHING: 0.0, P.DIST_INIT: 8.0, P.LOADING_WEIGHTS: 15.0, P.WEIGHTS_LOADED: 290.0,
              P.KV_CACHE: 300.0, P.CUDA_GRAPH: 310.0, P.WARMUP: 360.0, P.READY: 372.0}


def _record_good(home: Home, session_id: str = "good-1") -> None:
    record_start(
        home, "kimi", session_id, _summary(GOOD_LINES, 645),
        {p.value: T0 + s for p, s in GOOD_TIMES.items()}, "ready",
    )


def test_the_seed_sentence_comes_out_of_a_good_start_and_a_hung_one(tmp_path):
    home = _home(tmp_path)
    _record_good(home)
    hung = _summary({P.DIST_INIT: 40, P.LOADING_WEIGHTS: 60, P.WEIGHTS_LOADED: 210}, 217)
    entered = {"launching": T0 + 5000, "dist_init": T0 + 5008, "loading_weights": T0 + 5015,
               "weights_loaded": T0 + 5290}
    baseline = last_good(home, "kimi")
    assert baseline is not None
    assert compare(baseline, hung, entered, silent_for_s=12 * 60 + 3) == (
        "the good start reached ready at line 641 after 6m12s; "
        "this one stopped at line 217 in weights_loaded, silent for 12m"
    )
    rows = {r.phase: r for r in compare_rows(baseline, hung, entered)}
    assert rows["weights_loaded"].good_line == 210 and rows["weights_loaded"].this_line == 210
    assert rows["weights_loaded"].good_at_s == 290.0 and rows["weights_loaded"].this_at_s == 290.0
    assert rows["ready"].this_line is None and rows["ready"].good_at_s == 372.0
    assert baseline.phase_duration_s("weights_loaded") == 10.0
    assert baseline.phase_duration_s("ready") is None


def test_without_a_good_start_the_sentence_says_so(tmp_path):
    home = _home(tmp_path)
    record_start(home, "kimi", "bad-1", _summary({P.DIST_INIT: 3}, 9), {"launching": T0}, "crashed")
    assert last_good(home, "kimi") is None
    text = compare(None, _summary({P.DIST_INIT: 3}, 9), {"launching": T0}, 65)
    assert text == "no earlier start of this profile reached ready; this one stopped at line 9 in dist_init, silent for 1m05s"


def test_recording_the_same_session_again_updates_its_one_record(tmp_path):
    home = _home(tmp_path)
    record_start(home, "kimi", "s1", _summary({P.DIST_INIT: 40}, 50), {"launching": T0, "dist_init": T0 + 2},
                 "incomplete")
    record_start(home, "kimi", "s1", _summary(GOOD_LINES, 645),
                 {p.value: T0 + s for p, s in GOOD_TIMES.items()}, "ready")
    records = load_history(home, "kimi")
    assert [r.session_id for r in records] == ["s1"]
    assert records[0].outcome == "ready" and records[0].line_count == 645
    assert records[0].ready_line == 641 and records[0].ready_after_s == 372.0
    path = history_path(home, "kimi")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_start_that_was_ready_and_then_stopped_is_still_a_good_start(tmp_path):
    home = _home(tmp_path)
    _record_good(home, "s1")
    # stopped later: the caller passes a summary that knows less, the record keeps what it knew
    record_start(home, "kimi", "s1", None, {}, "stopped")
    good = last_good(home, "kimi")
    assert good is not None and good.session_id == "s1" and good.outcome == "stopped"
    assert good.ready_line == 641


def test_last_good_is_the_latest_ready_start_and_can_exclude_the_current_one(tmp_path):
    home = _home(tmp_path)
    _record_good(home, "good-1")
    _record_good(home, "good-2")
    record_start(home, "kimi", "crash-3", _summary({P.DIST_INIT: 3}, 9), {"launching": T0}, "crashed")
    assert last_good(home, "kimi").session_id == "good-2"
    assert last_good(home, "kimi", exclude_session_id="good-2").session_id == "good-1"
    assert last_good(home, "other-profile") is None


def test_unreadable_lines_are_skipped_and_kept(tmp_path):
    home = _home(tmp_path)
    _record_good(home, "good-1")
    path = history_path(home, "kimi")
    path.write_text(path.read_text() + "{not json\n")
    _record_good(home, "good-2")
    lines = path.read_text().splitlines()
    assert "{not json" in lines
    assert [r.session_id for r in load_history(home, "kimi")] == ["good-1", "good-2"]


def test_log_timestamps_give_phase_times_when_the_session_was_watched_late(tmp_path):
    home = _home(tmp_path)
    import time as _time

    def stamp(offset_s: float) -> str:
        return _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(T0 + offset_s))

    summary = StartupSummary(
        phase=P.READY, outcome="ready", line_count=100,
        events=(PhaseEvent(P.DIST_INIT, 5, stamp(3)), PhaseEvent(P.WEIGHTS_LOADED, 50, stamp(100)),
                PhaseEvent(P.READY, 99, stamp(200))),
    )
    # everything "first seen" at one poll long after the fact
    seen = {p: T0 + 900 for p in ("dist_init", "weights_loaded", "ready")}
    record = record_start(home, "kimi", "late", summary, seen, "ready", started_at=T0)
    assert record.mark("weights_loaded").at_s == 100.0
    assert record.ready_after_s == 200.0


def test_concurrent_writers_lose_no_record(tmp_path):
    home = _home(tmp_path)
    threads = [threading.Thread(target=_record_good, args=(home, f"s{i}")) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = {json.loads(line)["session_id"] for line in history_path(home, "kimi").read_text().splitlines()}
    assert ids == {f"s{i}" for i in range(12)}


def test_durations_read_like_the_seed():
    assert format_duration_s(45) == "45s"
    assert format_duration_s(372) == "6m12s"
    assert format_duration_s(180) == "3m"
    assert format_duration_s(12 * 60 + 29) == "12m"
    assert format_duration_s(3900) == "1h05m"
    assert format_duration_s(None) == "?"


def test_ready_seen_over_http_before_the_log_said_so_uses_the_line_count(tmp_path):
    home = _home(tmp_path)
    lines = {p: n for p, n in GOOD_LINES.items() if p != P.READY}
    record_start(home, "kimi", "http-ready", _summary(lines, 602),
                 {p.value: T0 + s for p, s in GOOD_TIMES.items()}, "ready")
    good = last_good(home, "kimi")
    assert good.mark("ready").line is None and good.ready_line == 602 and good.ready_after_s == 372.0


def test_a_crashed_start_keeps_its_exception_and_rank_redacted(tmp_path):
    from sessions.phases import summarize_text

    home = _home(tmp_path)
    log = ("[2026-11-01 10:00:09 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
           '  File "/sgl/python/sglang/srt/model_loader/loader.py", line 3, in load_model\n'
           "RuntimeError: cannot fetch with token hf_abcdefghijklmnopqrstuvwxyz1234\n")
    record_start(home, "kimi", "c1", summarize_text(log), {"launching": T0}, "crashed")
    (kept,) = load_history(home, "kimi")
    assert kept.error is not None and kept.error.startswith("TP1: RuntimeError: cannot fetch with token ")
    assert "hf_abc" not in kept.error and "Traceback" not in kept.error
