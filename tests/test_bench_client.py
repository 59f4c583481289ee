"""The bench client against a real emulator: a wave of requests reaches the server together, as
bench_serving's does, and no request pays for hidden per-request work (an import attempt per lock)."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from test_emulator import Emulator, models  # noqa: F401 - models is a fixture

from sessions.bench.client import send_request
from sessions.bench.prompts import random_id_prompts
from sessions.bench.runner import BenchPlan, _clients, run_bench

PREFILL_SEQS = re.compile(r"Prefill batch, #new-seq: (\d+),")


@pytest.fixture
def slow_server(tmp_path, models):  # noqa: F811
    # 50 tok/s: every forward lasts at least 20 ms, the window in which a wave's requests must all arrive
    # to share the next prefill forward.
    emu = Emulator(tmp_path / "run", models["small"], "--emulate-decode-tokens-per-s", "50", tp=2)
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
