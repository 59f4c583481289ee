"""Stall detection knows the phases whose silence is legitimate (issue 5 §1)."""
from __future__ import annotations

import math

from sessions.history import record_start
from sessions.phases import StartupTracker
from sessions.profiles import parse_profile
from sessions.stall import (
    COMPILE_LIMIT_S,
    DEEPGEMM_LIMIT_S,
    is_compiler_name,
    stall_limit_s,
    stall_verdict,
)

PROFILE = parse_profile(
    '[server]\nlauncher = "emulator"\nmodel_path = "/m"\ntp_size = 2\n[watch]\nstall_after_s = 300\n', "p"
)

HEAD = [
    "[2026-11-01 10:00:00] server_args={'tp_size': 2, 'model_path': '/m'}",
    "[2026-11-01 10:00:01 TP0] Init parallel begin.",
    "[2026-11-01 10:00:01 TP1] Init parallel begin.",
    "[2026-11-01 10:00:02 TP0] Init parallel ends. elapsed=1.00 s",
    "[2026-11-01 10:00:02 TP1] Init parallel ends. elapsed=1.00 s",
    "[2026-11-01 10:00:03 TP0] Load weight begin. avail mem=138.42 GB",
    "[2026-11-01 10:00:03 TP1] Load weight begin. avail mem=138.42 GB",
]
WEIGHT_END = "Load weight end. elapsed=60.00 s, type=DeepseekV3ForCausalLM, avail mem=60.00 GB, mem usage=78.00 GB."
LOADED = [f"[2026-11-01 10:01:03 TP{rank}] {WEIGHT_END}" for rank in (0, 1)]
DEEPGEMM = [
    (
        "[2026-11-01 10:01:10 TP0] Entering DeepGEMM JIT Pre-Compile session. It may take a long time "
        "(typically 10-20 mins) if you have not run `sglang.compile_deep_gemm`."
    ),
    (
        "[2026-11-01 10:01:11 TP0] Try DeepGEMM JIT Compiling for <GEMM_NT_F8F8BF16> N=7168, K=2048, "
        "num_groups=1 with all Ms."
    ),
]
READY = ["[2026-11-01 10:06:00] The server is fired up and ready to roll!"]


def summary_of(lines: list[str]):
    tracker = StartupTracker()
    for line in lines:
        tracker.feed_line(line)
    return tracker.summary()


def test_silence_beyond_stall_after_s_is_a_stall_and_within_it_is_not():
    summary = summary_of(HEAD + LOADED)
    assert stall_limit_s(PROFILE, summary, None, False) == 300
    assert stall_verdict(PROFILE, summary, 301, None, None, False).stalled
    assert not stall_verdict(PROFILE, summary, 299, None, None, False).stalled


def test_a_ready_or_crashed_start_is_never_stalled():
    assert not stall_verdict(PROFILE, summary_of(HEAD + LOADED + READY), 10_000, None, None, False).stalled
    assert not stall_verdict(PROFILE, summary_of(HEAD + LOADED), 10_000, True, None, False).stalled
    crashed = summary_of(HEAD + ["[2026-11-01 10:00:04 TP1] Scheduler hit an exception: Traceback"])
    assert crashed.outcome == "crashed"
    assert not stall_verdict(PROFILE, crashed, 10_000, None, None, False).stalled


def test_deepgemm_jit_gets_the_long_limit_from_the_tracker_or_the_last_lines():
    summary = summary_of(HEAD + LOADED + DEEPGEMM)
    assert stall_limit_s(PROFILE, summary, None, False) == DEEPGEMM_LIMIT_S
    assert not stall_verdict(PROFILE, summary, 15 * 60, None, None, False).stalled
    assert stall_verdict(PROFILE, summary, DEEPGEMM_LIMIT_S + 1, None, None, False).stalled
    # a tracker that does not report it: the latest lines are enough
    plain = summary_of(HEAD + LOADED)
    assert stall_limit_s(PROFILE, plain, None, False, last_lines=DEEPGEMM) == DEEPGEMM_LIMIT_S
    # DeepGEMM long done, graphs now: the normal limit again
    assert stall_limit_s(PROFILE, plain, None, False, last_lines=DEEPGEMM + ["x", "y", "z"]) == 300


def test_a_live_compiler_child_keeps_a_silent_start_from_counting_as_stalled():
    summary = summary_of(HEAD + LOADED)
    assert not stall_verdict(PROFILE, summary, 40 * 60, None, None, True).stalled
    assert stall_limit_s(PROFILE, summary, None, True) == COMPILE_LIMIT_S
    verdict = stall_verdict(PROFILE, summary, 40 * 60, None, None, True)
    assert not verdict.stalled and "compiler" in verdict.reason
    assert all(is_compiler_name(n) for n in ("ninja", "/usr/local/cuda/bin/nvcc", "cc1plus", "cicc"))
    assert not is_compiler_name("python3")


def test_the_good_start_of_the_profile_stretches_the_limit_of_a_slow_phase(home):
    # the good start spent 10 minutes between "Load weight end" and the next phase
    t0 = 1_700_000_000.0
    good = summary_of(HEAD + LOADED + [
        "[2026-11-01 10:11:03 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 100, KV size: 1 GB",
        "[2026-11-01 10:11:03 TP1] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 100, KV size: 1 GB",
    ] + READY)
    entered = {"launching": t0, "dist_init": t0 + 1, "loading_weights": t0 + 3, "weights_loaded": t0 + 63,
               "kv_cache": t0 + 663, "ready": t0 + 700}
    baseline = record_start(home, "p", "good", good, entered, "ready")
    assert baseline.phase_duration_s("weights_loaded") == 600
    hung = summary_of(HEAD + LOADED)
    assert stall_limit_s(PROFILE, hung, baseline, False) == 1200
    assert not stall_verdict(PROFILE, hung, 900, None, baseline, False).stalled
    assert stall_verdict(PROFILE, hung, 1201, None, baseline, False).stalled
    # a phase the good start went through quickly keeps stall_after_s
    assert stall_limit_s(PROFILE, summary_of(HEAD), baseline, False) == 300


def test_limits_are_wall_clock_whatever_the_emulator_time_scale():
    fast = parse_profile(
        '[server]\nlauncher = "emulator"\nmodel_path = "/m"\n[watch]\nstall_after_s = 2\n'
        '[emulator]\ntime_scale = 0.003\n', "fast",
    )
    assert stall_limit_s(fast, summary_of(HEAD + LOADED), None, False) == 2


def test_stall_detection_off_is_an_infinite_limit():
    class Off:
        class watch:
            stall_after_s = 0

    assert math.isinf(stall_limit_s(Off, summary_of(HEAD), None, False))
