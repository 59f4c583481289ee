"""The bench client against a real emulator: a wave of requests reaches the server together, as
bench_serving's does, and no request pays for hidden per-request work (an import attempt per lock)."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from _emulator_support import Emulator

from sessions.bench.client import send_request
from sessions.bench.prompts import random_id_prompts
from sessions.bench.runner import BenchPlan, _clients, run_bench

PREFILL_SEQS = re.compile(r"Prefill batch, #new-seq: (\d+),")


@pytest.fixture
def slow_server(tmp_path, models):
    # 25 tok/s: every forward lasts at least 40 ms, the window in which a wave's requests must all arrive
    # to share the next prefill forward (at 20 ms a loaded 2-core CI machine spread a wave over three).
    emu = Emulator(tmp_path / "run", models["small"], "--emulate-decode-tokens-per-s", "25", tp=2)
    try:
        emu.wait_ready()
        yield emu
    finally:
        emu.kill()


def test_each_wave_of_requests_reaches_the_server_within_one_forward(slow_server):
    """bench_serving's wave of ``c`` requests lands in (at most) two prefill forwards: the first request
    alone, as an idle scheduler takes it at once, and the rest together in the next.  So must ours, the
    second wave too, which starts while the client is busiest (eight streams ending at once).  Requests
    that the client sends late land one forward after the other, and their wait counts as TTFT."""
    prompts = random_id_prompts(16, 16, 24, vocab_size=1024, seed=11)
    plan = BenchPlan(slow_server.url("").rstrip("/"), tuple(prompts), (8,), num_prompts=16, settle_s=0.1)
    outcome = run_bench(plan)
    assert outcome["runs"][0]["completed"] == 16
    seqs = [int(m.group(1)) for m in PREFILL_SEQS.finditer(slow_server.stderr)]
    waves: list[list[int]] = [[], []]  # the last prefill forwards, back to the 16 requests of the run
    for wave in reversed(waves):
        while sum(wave) < 8:
            wave.insert(0, seqs.pop())
    assert [sum(w) for w in waves] == [8, 8] and seqs[-1] == 1  # before them, our warm-up alone
    assert all(len(w) <= 2 for w in waves), f"the two waves of 8 came in these prefill forwards: {waves}"


@contextmanager
def _import_attempts() -> Iterator[list[str]]:
    """Every module lookup that reaches the import machinery (a cached import never does)."""
    seen: list[str] = []

    class Recorder:
        @staticmethod
        def find_spec(name: str, path: Any = None, target: Any = None) -> None:
            seen.append(name)

    sys.meta_path.insert(0, Recorder)  # type: ignore[arg-type]
    try:
        yield seen
    finally:
        sys.meta_path.remove(Recorder)  # type: ignore[arg-type]


def test_a_request_costs_no_import_attempt_with_either_httpx_client(slow_server):
    """httpcore looks up ``sniffio`` whenever it sets up an async lock; when sniffio is missing, every
    lookup walks sys.path again (a failed import is never cached), doubling a request's CPU.  Neither the
    bench's blocking client nor the asyncio one (the extraction client) may touch the import system once
    warm."""
    base = slow_server.url("").rstrip("/")
    prompt = random_id_prompts(1, 8, 2, vocab_size=1024, seed=5)[0]
    client = _clients(1)[0]
    try:
        assert send_request(client, base, prompt).success  # warm: first-use imports happen here
        with _import_attempts() as seen:
            for _ in range(3):
                assert send_request(client, base, prompt).success
        assert seen == [], f"the bench client imports per request: {sorted(set(seen))}"
    finally:
        client.close()

    async def async_requests() -> list[str]:
        async with httpx.AsyncClient(trust_env=False, timeout=30.0) as http:
            (await http.get(f"{base}/v1/models")).raise_for_status()
            with _import_attempts() as seen:
                for _ in range(3):
                    (await http.get(f"{base}/v1/models")).raise_for_status()
                    async with http.stream("POST", f"{base}/generate", json={
                            "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2},
                            "stream": True}) as response:
                        async for _line in response.aiter_lines():
                            pass
            return list(seen)

    seen = asyncio.run(async_requests())
    assert seen == [], f"httpx's asyncio client imports per request: {sorted(set(seen))}"


PREFILL_CACHED = re.compile(r"Prefill batch, #new-seq: \d+, #new-token: (\d+), #cached-token: (\d+),")


def _prefills_since(emu: Emulator, offset: int) -> list[tuple[int, int]]:
    return [(int(m.group(1)), int(m.group(2))) for m in PREFILL_CACHED.finditer(emu.stderr[offset:])]


def test_each_concurrency_starts_on_a_flushed_prefix_cache(slow_server):
    """Every concurrency sends the same seeded prompts; without a flush the second run (and the first
    request of the first, the warm-up's prompt) would time prefills of prompts the radix cache already
    holds.  With the default flush, no prefill of a run finds a cached token; with it off, they do."""
    base = slow_server.url("").rstrip("/")
    prompts = tuple(random_id_prompts(4, 24, 3, vocab_size=1024, seed=3))
    start = len(slow_server.stderr)
    outcome = run_bench(BenchPlan(base, prompts, (1, 2), num_prompts=4, settle_s=0.05))
    assert [r["cache_flushed"] for r in outcome["runs"]] == [True, True]
    assert slow_server.stderr[start:].count("Cache flushed successfully!") == 2
    prefills = _prefills_since(slow_server, start)
    assert prefills[0] == (24, 0)  # the warm-up, on a cache that held none of these prompts
    assert sum(new for new, _ in prefills) == 24 * 9 and all(cached == 0 for _, cached in prefills), prefills

    start = len(slow_server.stderr)
    outcome = run_bench(BenchPlan(base, prompts, (1, 2), num_prompts=4, settle_s=0.05, flush_cache=False))
    assert [r["cache_flushed"] for r in outcome["runs"]] == [None, None]
    assert "Cache flushed" not in slow_server.stderr[start:]
    assert all(cached > 0 for _, cached in _prefills_since(slow_server, start)[1:])


def test_a_flush_the_busy_server_refuses_is_the_runs_note_and_the_run_goes_on(slow_server):
    """Another client's long request keeps the server busy past the flush's timeout: SGLang answers 400
    "Timed out waiting for idle state.", and the run is measured anyway, on a warm cache, saying so."""
    import threading

    base = slow_server.url("").rstrip("/")
    answers: list[httpx.Response] = []
    other = threading.Thread(target=lambda: answers.append(httpx.post(f"{base}/generate", timeout=60.0, json={
        "input_ids": [1, 2, 3], "rid": "other-client",
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}})), daemon=True)
    other.start()
    try:
        slow_server.wait_for("Prefill batch, #new-seq: 1, #new-token: 3,")
        prompts = tuple(random_id_prompts(2, 8, 2, vocab_size=1024, seed=4))
        plan = BenchPlan(base, prompts, (1,), num_prompts=2, settle_s=0.05, flush_timeout_s=0.3)
        run = run_bench(plan)["runs"][0]
        assert run["completed"] == 2 and run["cache_flushed"] is False
        assert run["cache_note"] == "prefix cache not flushed (HTTP 400: Timed out waiting for idle state.)"
        assert "Deferred flush_cache timed out while waiting for idle state." in slow_server.stderr
    finally:
        httpx.post(f"{base}/abort_request", json={"rid": "other-client"}, timeout=10.0)
        other.join(30)
    assert not other.is_alive()  # the aborted request is answered (scheduler.py: FINISH_ABORT)
    meta = answers[0].json()["meta_info"]
    assert answers[0].status_code == 200 and meta["finish_reason"]["type"] == "abort"
    assert 0 < meta["completion_tokens"] < 2000


def test_flush_cache_waits_for_idle_within_its_timeout_and_checks_the_timeout(slow_server):
    """/flush_cache?timeout=T waits for running requests to end (flush_wrapper.py); with no timeout a busy
    server refuses at once ("Flush cache failed."); a timeout that is not a number >= 0 is a 422."""
    import threading

    base = slow_server.url("").rstrip("/")
    assert httpx.post(f"{base}/flush_cache", params={"timeout": "-1"}).status_code == 422
    assert httpx.post(f"{base}/flush_cache", params={"timeout": "soon"}).status_code == 422
    other = threading.Thread(target=lambda: httpx.post(f"{base}/generate", timeout=60.0, json={
        "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}), daemon=True)
    other.start()
    slow_server.wait_for("Prefill batch, #new-seq: 1, #new-token: 3,")
    busy = httpx.post(f"{base}/flush_cache")
    assert (busy.status_code, busy.text) == (400, "Flush cache failed.\n")
    waited = httpx.post(f"{base}/flush_cache", params={"timeout": "30"}, timeout=60.0)
    assert waited.status_code == 200 and waited.text.startswith("Cache flushed.")
    other.join(30)
    assert not other.is_alive()


class _RecordingClient:
    """Stands in for one slot's httpx.Client: records when each request's clock started (``send``) and
    streams its answer 0.3 s later."""

    def __init__(self, sent: list[float]) -> None:
        self.sent = sent

    def build_request(self, method: str, url: str, **kwargs: Any) -> tuple[str, str]:
        return method, url

    def send(self, request: Any, stream: bool = False) -> Any:
        self.sent.append(time.perf_counter())
        lines = ['data: {"text":"a","meta_info":{"completion_tokens":1}}', "data: [DONE]"]

        def iter_raw(_self: Any) -> Iterator[bytes]:
            time.sleep(0.3)  # a stream in flight: its slot is busy, the next prompt waits for a free one
            yield from (line.encode() + b"\n\n" for line in lines)

        return type("Response", (), {"status_code": 200, "iter_raw": iter_raw, "close": lambda self: None})()

    def get(self, url: str, **kwargs: Any) -> Any:
        return type("Response", (), {"status_code": 404})()


def test_a_waves_requests_leave_together_however_slowly_threads_start(monkeypatch):
    """The run's first wave leaves together, as bench_serving's tasks do: no slot's clock starts before
    every slot is running.  Thread starts are made slow here (5 ms each, 155 ms for 32); without the
    start line the first request left as soon as its thread ran, long before the 32nd thread started."""
    from sessions.bench import runner

    real_start = threading.Thread.start
    started: list[float] = []

    def slow_start(self: threading.Thread) -> None:
        real_start(self)
        time.sleep(0.005)
        started.append(time.perf_counter())

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    sent: list[float] = []
    prompts = tuple(random_id_prompts(32, 4, 1, vocab_size=64, seed=2))
    plan = BenchPlan("http://127.0.0.1:9", prompts, (32,), num_prompts=32)
    run = runner._one_run([_RecordingClient(sent) for _ in range(32)], plan, 32, None)
    assert run["completed"] == 32 and len(sent) == 32 and len(started) == 32
    early = [t for t in sent if t < started[-1]]
    assert not early, f"{len(early)} requests left before the last slot's thread had started"


def test_an_error_chunk_after_the_200_headers_is_a_failed_request_not_a_result():
    """SGLang answers a refusal it finds after its headers (a prompt over the context length, a server
    shutting down) as one ``data: {"error": ...}`` chunk; bench_serving would count it as a success with
    the requested length, 0 ms TTFT and a huge input throughput, and it would be kept as the best run."""
    from sessions.bench.metrics import calculate_metrics, run_notes
    from sessions.bench.store import best_row, row_of

    class ErrorChunkClient(_RecordingClient):
        def send(self, request: Any, stream: bool = False) -> Any:
            lines = ['data: {"error":{"message":"The server is shutting down.","code":503}}', "data: [DONE]"]
            return type("Response", (), {"status_code": 200,
                                         "iter_raw": lambda _self: iter(ln.encode() + b"\n\n" for ln in lines),
                                         "close": lambda _self: None})()

    prompt = random_id_prompts(1, 8, 100, vocab_size=64, seed=1)[0]
    out = send_request(ErrorChunkClient([]), "http://127.0.0.1:9", prompt)
    assert not out.success and out.error == "error chunk: The server is shutting down."
    run = calculate_metrics([out], [prompt.prompt_len], 1.0, 1) | {"max_concurrency": 1}
    assert (run["completed"], run["failed"], run["input_throughput"], run["output_throughput"]) == (0, 1, 0, 0)
    assert run_notes([run]) == [("concurrency 1: 1 of 1 requests failed, e.g. error chunk: The server is "
                                 "shutting down.")]
    good = {"profile": "p", "runs": [{"max_concurrency": 1, "output_throughput": 90.0, "failed": 0}]}
    bad = {"profile": "p", "runs": [{"max_concurrency": 1, "output_throughput": 900.0, "failed": 1}]}
    assert best_row([row_of(bad, "bad"), row_of(good, "good")]).id == "good"
