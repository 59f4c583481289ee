"""The emulator serves like SGLang 0.5.23: SSE per forward, stats lines, /metrics, modelled decode time,
and the panel's bench against it (a real emulator process tree, real HTTP, stopped by pid)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from _emulator_support import Emulator, http, http_json

from sessions.bench.metrics import calculate_metrics
from sessions.bench.prompts import random_id_prompts
from sessions.bench.runner import BenchPlan, run_bench
from sessions.emulator.cost_model import DecodeCostModel
from sessions.serving import ServingTracker, parse_metrics

# metrics_reporter.py:1039-1043 (0.5.23): the exact field order, ending in #queue-req with no comma
DECODE_RE = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Decode batch, #running-req: \d+, #token: \d+, "
    r"token usage: \d+\.\d\d, cuda graph: (True|False), gen throughput \(token/s\): \d+\.\d\d, "
    r"#queue-req: \d+$"
)
PREFILL_RE = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Prefill batch, #new-seq: \d+, #new-token: \d+, "
    r"#cached-token: \d+, token usage: \d+\.\d\d, #running-req: \d+, #queue-req: \d+, #pending-token: \d+, "
    r"cuda graph: (True|False), input throughput \(token/s\): \d+\.\d\d$"
)
META_KEYS = ["id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens",
             "completion_tokens", "cached_tokens", "cached_tokens_details", "dp_rank"]


@pytest.fixture
def served(tmp_path, models):
    emu = Emulator(tmp_path / "run", models["small"], "--enable-metrics", "--decode-log-interval", "10",
                   "--emulate-decode-tokens-per-s", "100", tp=2)
    try:
        emu.wait_ready()
        yield emu
    finally:
        emu.kill()


def _sse(emu: Emulator, body: dict) -> list[bytes]:
    status, raw = http("POST", emu.url("/generate"), body)
    assert status == 200
    assert raw.endswith(b"data: [DONE]\n\n")
    return [part for part in raw.split(b"\n\n") if part]


def test_streaming_is_sglangs_sse_one_chunk_per_step_with_its_meta_info(served):
    parts = _sse(served, {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 7}, "stream": True})
    assert parts[-1] == b"data: [DONE]"
    chunks = [json.loads(p[len(b"data: "):]) for p in parts[:-1]]
    assert all(p.startswith(b'data: {"text":') and b": " not in p[6:40] for p in parts[:-1])  # compact JSON
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5, 6, 7]  # cumulative, one per forward
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5, 6, 7]
    first, last = chunks[0]["meta_info"], chunks[-1]["meta_info"]
    assert list(first)[: len(META_KEYS)] == META_KEYS and "response_sent_to_client_ts" in first
    assert "response_sent_to_client_ts" not in chunks[1]["meta_info"]
    assert first["finish_reason"] is None and last["finish_reason"] == {"type": "length", "length": 7}
    assert "e2e_latency" in last and "e2e_latency" not in first
    assert chunks[-1]["text"].startswith(chunks[-2]["text"])  # text is cumulative too
    # --stream-interval per request: the first token at once, then every 3, and the final one
    parts = _sse(served, {"input_ids": [5, 6, 7], "stream": True,
                          "sampling_params": {"max_new_tokens": 8, "stream_interval": 3}})
    counts = [json.loads(p[6:])["meta_info"]["completion_tokens"] for p in parts[:-1]]
    assert counts == [1, 4, 7, 8]
    # non-streaming: one object, the whole output
    status, whole = http_json("POST", served.url("/generate"), {"input_ids": [5, 6, 7],
                                                                "sampling_params": {"max_new_tokens": 7}})
    assert status == 200 and len(whole["output_ids"]) == 7 and whole["meta_info"]["completion_tokens"] == 7
    # a refusal after the stream began is one error chunk, then [DONE]
    parts = _sse(served, {"input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": -1}})
    error = json.loads(parts[0][6:])["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and parts[1] == b"data: [DONE]"


def test_decode_time_is_modelled_and_batches_log_sglangs_lines(served):
    began = time.monotonic()
    http("POST", served.url("/generate"), {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 41}})
    elapsed = time.monotonic() - began
    assert elapsed >= 40 / 100 * 0.95  # 40 decode steps at 100 tok/s cannot take less
    status, models_list = http_json("GET", served.url("/v1/models"))
    assert status == 200 and models_list["object"] == "list" and models_list["data"][0]["owned_by"] == "sglang"
    lines = served.stderr.splitlines()
    decode = [ln for ln in lines if "Decode batch" in ln]
    prefill = [ln for ln in lines if "Prefill batch" in ln]
    assert len(decode) >= 4 and all(DECODE_RE.match(ln) for ln in decode), decode
    assert prefill and all(PREFILL_RE.match(ln) for ln in prefill), prefill
    tracker = ServingTracker()
    tracker.feed_lines(lines)
    snap = tracker.snapshot()
    assert snap is not None and snap.running_reqs == 1
    assert 70 <= snap.gen_throughput <= 101  # the single-stream rate, as the line reports it
    status, raw = http("GET", served.url("/metrics"))
    text = raw.decode()
    assert status == 200
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:token_usage",
                 "sglang:realtime_tokens_total", "sglang:generation_tokens_total",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_count",
                 "sglang:e2e_request_latency_seconds_sum"):
        assert name in text
    assert 'model_name="' in text and 'tp_rank="0"' in text
    assert set(parse_metrics(text)) >= {"gen_throughput", "running_reqs", "queue_reqs", "token_usage"}


def test_the_bench_reports_bench_servings_figures_and_concurrency_helps(served):
    prompts = random_id_prompts(8, 16, 20, vocab_size=1024, seed=3)
    assert prompts == random_id_prompts(8, 16, 20, vocab_size=1024, seed=3)  # seeded: the same every time
    plan = BenchPlan(served.url("").rstrip("/"), tuple(prompts), (1, 4), num_prompts=4, settle_s=0.1)
    progress: list[tuple[int, int, int]] = []
    outcome = run_bench(plan, lambda c, d, t: progress.append((c, d, t)))
    one, four = outcome["runs"]
    assert outcome["server_info"]["version"] == "0.5.23"
    for run in (one, four):
        assert run["completed"] == 4 and run["total_output_tokens"] == 80
        for key in ("output_throughput", "input_throughput", "request_throughput", "median_ttft_ms",
                    "median_itl_ms", "median_tpot_ms", "p99_itl_ms", "mean_e2e_latency_ms"):
            assert run[key] > 0, key
    assert one["median_itl_ms"] >= 1000 / 100 * 0.95  # one step per token at 100 tok/s
    assert four["output_throughput"] > 1.5 * one["output_throughput"]  # a batch step serves four
    assert (4, 4, 4) in progress and (1, 0, 4) in progress


def test_metrics_follow_bench_servings_definitions():
    from sessions.bench.client import RequestOutput

    outputs = [RequestOutput(True, 10, 5, ttft=0.1, latency=0.5, itl=[0.1] * 4, start=100.0),
               RequestOutput(True, 10, 1, ttft=0.2, latency=0.2, itl=[], start=100.0),
               RequestOutput(False, 10, 0, error="Bad Request: x")]
    m = calculate_metrics(outputs, [10, 10, 10], duration_s=2.0, max_concurrency=2)
    # the failed request's prompt is not input the server took (serving.py:1159-1168)
    assert (m["completed"], m["total_output_tokens"], m["total_input_tokens"]) == (2, 6, 20)
    assert m["input_throughput"] == 10.0 and m["failed"] == 1
    assert m["output_throughput"] == 3.0 and m["request_throughput"] == 1.0
    assert m["median_tpot_ms"] == pytest.approx(100.0)  # only the request with more than one token
    assert m["median_itl_ms"] == pytest.approx(100.0) and m["median_ttft_ms"] == pytest.approx(150.0)
    assert m["errors"] == ["Bad Request: x"]


def test_cost_model_grows_with_batch_and_prompt():
    cost = DecodeCostModel(decode_tokens_per_s=90.0)
    assert cost.decode_step_s(1) == pytest.approx(1 / 90)
    assert cost.decode_step_s(1) < cost.decode_step_s(8) < cost.decode_step_s(32)
    assert 32 / cost.decode_step_s(32) > 8 / cost.decode_step_s(8)  # throughput still grows
    assert cost.prefill_s(4096) > cost.prefill_s(128) > cost.decode_step_s(1)
    with pytest.raises(ValueError, match="decode_tokens_per_s"):
        DecodeCostModel(decode_tokens_per_s=0)


def test_streaming_client_that_goes_away_is_aborted(served):
    async def go() -> None:
        import httpx

        body = {"input_ids": [1, 2], "stream": True, "sampling_params": {"max_new_tokens": 500}}
        async with httpx.AsyncClient(trust_env=False) as client, client.stream(
            "POST", served.url("/generate"), json=body
        ) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    break

    asyncio.run(go())
    from _emulator_support import wait_until

    wait_until(lambda: "Client disconnected" in served.stderr, 30, "the disconnect is logged")
    # the server keeps serving others
    status, whole = http_json("POST", served.url("/generate"), {"input_ids": [3], "sampling_params":
                                                                {"max_new_tokens": 2}})
    assert status == 200 and len(whole["output_ids"]) == 2


def test_abort_request_answers_the_waiting_client_queued_or_running(tmp_path, models):
    """/abort_request (scheduler.py:5675-5812): the rid of a request in flight, or abort_all; a queued
    request is answered at once with "Abort in waiting queue" and no tokens, a running one after one more
    forward with what it has; either way the waiting client gets a 200 whose finish_reason is abort."""
    from concurrent.futures import ThreadPoolExecutor

    emu = Emulator(tmp_path / "run", models["small"], "--max-running-requests", "1",
                   "--emulate-decode-tokens-per-s", "50", tp=1)
    try:
        emu.wait_ready()
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(http_json, "POST", emu.url("/generate"), dict(body, rid="job-running"))
            emu.wait_for("Prefill batch, #new-seq: 1, #new-token: 3,")
            queued = pool.submit(http_json, "POST", emu.url("/generate"), dict(body, rid="job-queued"))
            emu.wait_for(re.compile(r"Decode batch, #running-req: 1, .*#queue-req: 1"))
            # a rid not in flight is ignored by the tokenizer manager, a prefix too (tokenizer_manager.py)
            assert http_json("POST", emu.url("/abort_request"), {"rid": "job-q"})[0] == 200
            time.sleep(0.3)
            assert not queued.done()
            assert http_json("POST", emu.url("/abort_request"), {"rid": "job-queued"})[0] == 200
            status, reply = queued.result(timeout=30)
            assert status == 200 and reply["meta_info"]["finish_reason"] == {
                "type": "abort", "message": "Abort in waiting queue"}
            assert list(reply["meta_info"]) == ["id", "finish_reason", "weight_version", "e2e_latency",
                                                "completion_tokens"]  # no prompt_tokens
            assert reply["meta_info"]["completion_tokens"] == 0 and not running.done()
            assert http_json("POST", emu.url("/abort_request"), {"abort_all": True})[0] == 200
            status, reply = running.result(timeout=30)
            assert status == 200 and reply["meta_info"]["finish_reason"]["message"] == "Aborted"
            assert 0 < reply["meta_info"]["completion_tokens"] < 3000
            assert len(reply["output_ids"]) == reply["meta_info"]["completion_tokens"]
    finally:
        emu.kill()
