"""Speculative decoding while serving (real emulator processes) and `bench compare A B`.

The emulator with an EAGLE3 draft: each decode step is a draft + verify cycle yielding a drawn accept
length of the target's own tokens; SGLang's `Decode batch` spec fields, `/metrics` gauges, `meta_info`
keys and `avg_spec_accept_length`.  `bench compare`: profiles launched, benched and stopped one after the
other; low acceptance is a slowdown with a verdict saying so, high acceptance a speedup, and the accept
length read back from B's log is the one that was set.  Config-only Llama-shaped models keep the compares
fast; one compare runs on the demo's own tiny-llama profiles.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from _emulator_support import Emulator, http, http_json
from conftest import get_free_port

from sessions.bench.compare import break_even, compare_results, verdict
from sessions.emulator.spec_decode import SpecDecoding, chain_mean, solve_chain_p

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
                "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                "max_position_embeddings": 4096, "intermediate_size": 128, "torch_dtype": "bfloat16"}
DRAFT_CONFIG = dict(LLAMA_CONFIG, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
                    draft_vocab_size=256)
SPEC_FLAGS = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
# metrics_reporter.py:1005-1043 (0.5.23): the spec part right after token usage, the line ending in #queue-req
SPEC_DECODE_RE = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] Decode batch, #running-req: \d+, #token: \d+, "
    r"token usage: \d+\.\d\d, accept len: (\d+\.\d\d), accept rate: (\d+\.\d\d), cuda graph: (True|False), "
    r"gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+$"
)


@pytest.fixture
def llama(tmp_path: Path) -> tuple[Path, Path]:
    target, draft = tmp_path / "models" / "llama", tmp_path / "models" / "llama-eagle3"
    for path, config in ((target, LLAMA_CONFIG), (draft, DRAFT_CONFIG)):
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps(config))
    return target, draft


# -- the model ---------------------------------------------------------------------------------------------

def test_accept_lengths_are_drawn_around_the_setting_with_a_seed():
    for mean in (1.0, 1.3, 2.2, 3.0, 4.0):
        p = solve_chain_p(mean, 4)
        assert chain_mean(p, 4) == pytest.approx(mean, abs=1e-6)
        model = SpecDecoding(3, 4, mean, 1.1, 0.28, seed=5)
        draws = [model.draw() for _ in range(20000)]
        assert set(draws) <= {1, 2, 3, 4}
        assert statistics.mean(draws) == pytest.approx(mean, abs=0.05)
    again = SpecDecoding(3, 4, 2.2, 1.1, 0.28, seed=5)
    first = SpecDecoding(3, 4, 2.2, 1.1, 0.28, seed=5)
    assert [again.draw() for _ in range(50)] == [first.draw() for _ in range(50)]
    assert SpecDecoding(3, 4, 9.0, 1.1, 0.3, seed=1).accept_length == 4  # at most steps + 1 per step
    assert SpecDecoding(3, 4, 1.3, 1.1, 0.28).cycle_cost == pytest.approx(1.94)


def test_break_even_and_the_verdict_follow_the_measured_step_costs():
    # B: accept 1.3 tokens per step at 2 x A's time per token -> a step costs 2.6 of A's tokens
    assert break_even(1.3, 100.0, 50.0) == pytest.approx(2.6)
    assert break_even(None, 100.0, 50.0) is None
    a = {"runs": [{"max_concurrency": 1, "output_throughput": 90.0, "median_itl_ms": 11.0,
                   "median_tpot_ms": 11.0}]}
    b = {"speculative": {"num_draft_tokens": 4}, "runs": [
        {"max_concurrency": 1, "output_throughput": 59.4, "median_itl_ms": 16.0, "median_tpot_ms": 16.7,
         "accept_length": 1.3, "accept_rate": 0.1}]}
    report = compare_results(a, b)
    run = report["runs"][0]
    assert run["speedup"] == pytest.approx(0.66) and run["itl_ratio"] == pytest.approx(16 / 11)
    assert run["b"]["accept_length"] == 1.3 and run["b"]["accept_rate"] == 0.1
    assert report["verdict"].startswith("B is 0.66× A at concurrency 1: the drafter slows decoding "
                                        "(accept length 1.30 of 4 draft tokens; break-even needs about 1.97)")
    assert "does not use speculative decoding" in verdict(
        [dict(run, speedup=1.2, b={})], None, b_speculates=False)


def _ok(reply: tuple[int, dict]) -> dict:
    status, body = reply
    assert status == 200, body
    return body


# -- the emulator ------------------------------------------------------------------------------------------

def test_spec_serving_keeps_the_targets_tokens_and_reports_like_sglang(tmp_path, llama):
    target, draft = llama
    common = ("--enable-metrics", "--decode-log-interval", "5", "--emulate-decode-tokens-per-s", "200")
    spec = Emulator(tmp_path / "spec", target, *common, *SPEC_FLAGS, "--speculative-draft-model-path",
                    str(draft), "--emulate-spec-accept-length", "2.5", "--random-seed", "7", tp=1)
    plain = Emulator(tmp_path / "plain", target, *common, tp=1)
    try:
        spec.wait_ready()
        plain.wait_ready()
        body = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 41, "ignore_eos": True}}
        got = _ok(http_json("POST", spec.url("/generate"), body))
        want = _ok(http_json("POST", plain.url("/generate"), body))
        assert got["output_ids"] == want["output_ids"] and len(got["output_ids"]) == 41  # overshoot cut
        meta = got["meta_info"]
        keys = list(meta)
        assert keys[keys.index("e2e_latency") + 1:] == [
            "spec_accept_rate", "spec_accept_length", "spec_num_correct_drafts", "spec_num_proposed_drafts",
            "spec_verify_ct", "spec_correct_drafts_histogram"]
        assert "spec_verify_ct" not in want["meta_info"]
        assert meta["spec_accept_length"] == pytest.approx(41 / meta["spec_verify_ct"])
        assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 3
        assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / (meta["spec_verify_ct"]
                                                                                               * 3))
        assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"]
        # streaming: one chunk per verify step, several tokens at once
        status, raw = http("POST", spec.url("/generate"), dict(body, stream=True))
        assert status == 200
        chunks = [json.loads(p[len(b"data: "):]) for p in raw.split(b"\n\n") if p and p != b"data: [DONE]"]
        lengths = [len(c["output_ids"]) for c in chunks]
        assert lengths[-1] == 41 and max(b - a for a, b in itertools.pairwise(lengths)) > 1
        lines = [ln for ln in spec.stderr.splitlines() if "Decode batch" in ln]
        assert lines and all(SPEC_DECODE_RE.match(ln) for ln in lines), lines[:3]
        accepts = [float(SPEC_DECODE_RE.match(ln).group(1)) for ln in lines]
        assert 1.0 <= min(accepts) and max(accepts) <= 4.0
        assert all("accept len" not in ln for ln in plain.stderr.splitlines())
        metrics = http("GET", spec.url("/metrics"))[1].decode()
        gauge = re.search(r"^sglang:spec_accept_length\{[^}]*\} ([\d.]+)$", metrics, re.MULTILINE)
        assert gauge and float(gauge.group(1)) == pytest.approx(accepts[-1], abs=0.006)
        assert re.search(r"^sglang:spec_num_draft_tokens\{[^}]*\} 4\.0$", metrics, re.MULTILINE)
        verify = re.search(r"^sglang:spec_verify_calls_total\{[^}]*\} ([\d.]+)$", metrics, re.MULTILINE)
        assert verify and float(verify.group(1)) >= meta["spec_verify_ct"]
        state = _ok(http_json("GET", spec.url("/server_info")))["internal_states"][0]
        assert 1.0 < state["avg_spec_accept_length"] <= 4.0
        assert "avg_spec_accept_length" not in _ok(http_json("GET", plain.url("/server_info")))["internal_states"][0]
        # the bench pools the accept rate over its own requests' final responses (no log or /metrics needed)
        from sessions.bench.prompts import random_id_prompts
        from sessions.bench.runner import BenchPlan, run_bench

        prompts = tuple(random_id_prompts(3, 8, 30, vocab_size=512, seed=5))
        for emu, speculates in ((spec, True), (plain, False)):
            run = run_bench(BenchPlan(emu.url("").rstrip("/"), prompts, (1,), num_prompts=3, settle_s=0.05))
            rate = run["runs"][0]["accept_rate"]
            assert (rate is not None and 0.0 < rate < 1.0) if speculates else rate is None, (speculates, rate)
    finally:
        spec.kill()
        plain.kill()


def test_the_runs_accept_rate_pools_accepted_over_proposed_drafts():
    from sessions.bench.client import RequestOutput
    from sessions.bench.metrics import calculate_metrics

    outputs = [RequestOutput(True, 4, 10, ttft=0.1, latency=0.5, itl=[0.04] * 9, correct_drafts=6,
                             proposed_drafts=12),
               RequestOutput(True, 4, 10, ttft=0.1, latency=0.5, itl=[0.04] * 9, correct_drafts=0,
                             proposed_drafts=24),
               RequestOutput(False, 4, 0, correct_drafts=30, proposed_drafts=30, error="Bad Request: x")]
    assert calculate_metrics(outputs, [4, 4, 4], 1.0, 2)["accept_rate"] == pytest.approx(6 / 36)
    plain = [RequestOutput(True, 4, 10, ttft=0.1, latency=0.5, itl=[0.04] * 9)]
    assert calculate_metrics(plain, [4], 1.0, 1)["accept_rate"] is None


# -- bench compare -----------------------------------------------------------------------------------------

BENCH = ["--input-len", "16", "--output-len", "40", "--num-prompts", "4", "--concurrency", "1,2", "--rounds", "2"]


def _profiles(make_emulator_profile, llama, accept: float) -> None:
    target, draft = llama
    emulator = {"decode_tokens_per_s": 100.0, "spec_draft_cost": 0.3}
    make_emulator_profile("plain", tp=1, model_path=str(target), emulator=emulator,
                          extra_args=["--decode-log-interval", "5"])
    make_emulator_profile("eagle", tp=1, model_path=str(target),
                          emulator=dict(emulator, spec_accept_length=accept),
                          extra_args=["--decode-log-interval", "5", *SPEC_FLAGS,
                                      "--speculative-draft-model-path", str(draft)])


def _compare(cli_env, *argv: str) -> dict:
    return _compare_said(cli_env, *argv)[0]


def _compare_said(cli_env, *argv: str) -> tuple[dict, list[str]]:
    """The compare's JSON report and the progress lines it said on stderr."""
    out = subprocess.run([sys.executable, "-m", "app", *argv, "--json"], env=cli_env, capture_output=True,
                         text=True, timeout=400, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr.splitlines()


@pytest.mark.parametrize("accept", [1.3, 3.0])
def test_compare_launches_benches_and_stops_both_and_says_why(accept, make_emulator_profile, llama, cli_env,
                                                               home, launched):
    from sessions.bench.store import load_compares, load_history
    from sessions.server import list_sessions

    _profiles(make_emulator_profile, llama, accept)
    report = _compare(cli_env, "bench", "compare", "plain", "eagle", *BENCH)
    for session in list_sessions(home):
        launched.track(session)  # teardown, should the compare have left one running
        assert session.status(probe_http=False).state == "stopped", session.session_id
    assert report["a"]["profile"] == "plain" and report["b"]["profile"] == "eagle"
    assert report["a"]["launched"] and report["b"]["launched"] and report["same_prompts"]
    # both on GPU 0: one up at a time, A B then B A (3 launches for 2 rounds)
    assert report["mode"] == "in turn" and report["order"] == "A B B A" and report["rounds"] == 2
    assert report["workload"]["input_len"] == 16 and report["workload"]["seed"] == 1
    runs = report["runs"]
    assert [r["max_concurrency"] for r in runs] == [1, 2]
    for run in runs:
        # the paired speedup of each round, and its median
        a_tps = run["a"]["spread"]["output_throughput"]["values"]
        b_tps = run["b"]["spread"]["output_throughput"]["values"]
        assert run["speedup_spread"]["values"] == pytest.approx([b / a for a, b in zip(a_tps, b_tps)])
        assert run["speedup"] == pytest.approx(sum(run["speedup_spread"]["values"]) / 2)
        assert run["a"]["completed"] == run["b"]["completed"] == 4 * 2
        assert abs(run["b"]["accept_length"] - accept) <= 0.3, run["b"]
        assert run["b"]["accept_source"].startswith("log")
        assert 0.0 <= run["b"]["accept_rate"] <= 1.0
    single = runs[0]
    # the modelled break-even: 1.1 + 3 x 0.3 = 2.0 plain steps per verify step
    assert single["break_even_accept_length"] == pytest.approx(2.0, rel=0.25)
    if accept < 2:
        assert single["speedup"] < 0.9
        assert re.match(r"B is 0\.\d\d× A at concurrency 1 \(0\.\d\d–0\.\d\d over 2 rounds\): the drafter slows "
                        r"decoding \(accept length 1\.\d\d of 4 draft tokens; break-even needs about \d\.\d\d\)",
                        report["verdict"]), report["verdict"]
    else:
        assert single["speedup"] > 1.2
        assert "the drafter speeds decoding up" in report["verdict"]
    compares, problems = load_compares(home)
    assert problems == [] and [c["id"] for c in compares] == [Path(report["saved_to"]).stem]
    rows, _ = load_history(home)
    assert sorted(r.profile for r in rows) == ["eagle", "plain"]  # both sides kept as bench results

    def history(*argv: str) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "app", "bench", "history", *argv], env=cli_env,
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        return out

    listed = json.loads(history("--compare", "--json").stdout)
    assert [(c["id"], c["a"], c["b"], c["verdict"]) for c in listed] == [
        (Path(report["saved_to"]).stem, "plain", "eagle", report["verdict"])]
    assert listed[0]["speedup"] == {"1": runs[0]["speedup"], "2": runs[1]["speedup"]}
    text = history("--compare", "eagle").stdout
    assert "A=plain  B=eagle  speedup c=1 " in text and report["verdict"] in text
    assert "1 A/B compare report(s): eagle3-tui bench history --compare" in history().stderr
    assert "no compare reports with profile other" in history("--compare", "other").stderr


def test_compare_refuses_bad_input_by_name(cli_env, home):
    out = subprocess.run([sys.executable, "-m", "app", "bench", "compare", "only-one"], env=cli_env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "needs two arguments A B" in out.stderr
    out = subprocess.run([sys.executable, "-m", "app", "bench", "compare", "nope", "nada"], env=cli_env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "nope: not a profile" in out.stderr


@pytest.mark.slow
def test_demo_compare_of_tiny_llama_against_its_drafter_at_low_acceptance(home, cli_env, launched, seed_demo_models):
    pytest.importorskip("torch")
    from sessions.demo import EAGLE3_PROFILE, PLAIN_PROFILE, ensure_demo_home
    from sessions.home import resolve_home
    from sessions.profiles import load_profile, save_profile
    from sessions.server import list_sessions

    seed_demo_models()  # the tiny model written once per worker (conftest), not once per test
    demo = ensure_demo_home(resolve_home(demo=True))
    for name, extra in ((PLAIN_PROFILE, {}), (EAGLE3_PROFILE, {"spec_accept_length": 1.3})):
        profile = load_profile(name, demo)
        save_profile(profile.with_changes(server={"port": get_free_port()},
                                          emulator={"time_scale": 0.004, **extra}))
    report, said = _compare_said(cli_env, "--demo", "bench", "compare", PLAIN_PROFILE, EAGLE3_PROFILE,
                                 "--output-len", "48", "--num-prompts", "2", "--concurrency", "1", "--rounds", "2")
    # On GPUs of their own both are launched before A is waited for: the two starts overlap.
    b_launched = next(n for n, line in enumerate(said) if line.startswith(f"{EAGLE3_PROFILE}: launched session"))
    a_waits = next(n for n, line in enumerate(said) if line.startswith(f"{PLAIN_PROFILE}: session ")
                   and "waiting for ready" in line)
    assert b_launched < a_waits, said
    for session in list_sessions(demo):
        launched.track(session)
        assert session.status(probe_http=False).state == "stopped"
    run = report["runs"][0]
    # the demo's own real-text prompts by default, and its two profiles on GPUs 0 and 1: each launched once
    assert report["workload"]["dataset"].endswith("bench_prompts.jsonl") and report["workload"]["dataset_prompts"] == 52
    assert report["mode"] == "together" and report["order"] == "A B A B"
    assert run["speedup"] < 0.9 and "the drafter slows decoding" in report["verdict"], report["verdict"]
    assert abs(run["b"]["accept_length"] - 1.3) <= 0.3
    assert report["b"]["speculative"]["num_draft_tokens"] == 4


def test_the_bench_screen_starts_a_compare_from_typed_names_or_two_marked_rows(
        make_emulator_profile, llama, home, launched, monkeypatch):
    from app.screens.bench import BenchScreen
    from app.tui import Eagle3App
    from sessions.bench.session_bench import BenchOptions
    from sessions.server import list_sessions
    from tests._tui_support import first_poll, run, screen_text, wait_until

    _profiles(make_emulator_profile, llama, 1.3)
    monkeypatch.setattr(BenchScreen, "default_options",
                        BenchOptions(input_len=16, output_len=40, num_prompts=4, concurrency=(1,)))
    monkeypatch.setattr(BenchScreen, "rounds", 1)  # the CLI's compare tests cover rounds

    async def scenario() -> None:
        app = Eagle3App(home, refresh_s=0.2)
        async with app.run_test(size=(160, 45)) as pilot:
            await first_poll(pilot, app)
            screen = BenchScreen(home)
            await app.push_screen(screen)
            await pilot.press("c")
            box = screen.query_one("#compare-input")
            await wait_until(pilot, lambda: app.focused is box, "the A B box has the focus", 30)
            for key in "plain eagle":
                await pilot.press("space" if key == " " else key)
            await pilot.press("enter")
            assert screen.running or screen.last_compare is not None, screen_text(app)
            await wait_until(pilot, lambda: screen.last_compare is not None or not screen.running and
                             "failed" in screen_text(app).lower(), "the compare finishes", 300)
            text = screen_text(app)
            assert screen.last_compare is not None, text
            assert "the drafter slows decoding" in text and "speedup" in text and "accept len" in text
            # two rows marked (A first): c compares their profiles
            started: list[tuple[str, str]] = []
            monkeypatch.setattr(screen, "start_compare", lambda a, b: started.append((a, b)))
            await pilot.press("space")
            await pilot.press("down")
            await pilot.press("space")
            await pilot.press("c")
            assert started == [("eagle", "plain")]  # newest row first: B's result, then A's

    try:
        run(scenario)
    finally:
        for session in list_sessions(home):
            launched.track(session)
