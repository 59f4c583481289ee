"""Run a bench against one server: ``/v1/models`` ready check, warm-up, then each concurrency in turn.

Like bench_serving: the warm-up sends one request with ``max_new_tokens = min(output_len, 32)``; a short
pause lets the server settle; each run dispatches its prompts with at most ``max_concurrency`` in flight
and its duration ends after a ``GET /server_info`` (which bench_serving reads for the accept length).
Every concurrency uses the same seeded prompts; by default concurrency ``c`` sends the first
``max(4, 2c)`` of them (enough to keep ``c`` requests in flight twice over), with ``num_prompts`` given
it sends all of them every time.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sessions.bench.client import RequestOutput, send_request
from sessions.bench.metrics import calculate_metrics
from sessions.bench.prompts import Prompt

Progress = Callable[[int, int, int], None]  # (max_concurrency, done, total)
# Called with ("start", max_concurrency) before a run's first request and ("end", max_concurrency) after its
# last response, so a caller can take what the server logged during that run (`bench compare`).
RunHook = Callable[[str, int], None]


class BenchError(Exception):
    """The bench could not run (server not ready, warm-up failed)."""


@dataclass(frozen=True)
class BenchPlan:
    base_url: str
    prompts: tuple[Prompt, ...]
    concurrencies: tuple[int, ...]
    num_prompts: int | None = None  # None: max(4, 2c) per concurrency
    api_key: str | None = None
    settle_s: float = 1.0
    ready_timeout_s: float = 60.0

    def prompts_for(self, concurrency: int) -> tuple[Prompt, ...]:
        if self.num_prompts is not None:
            return self.prompts[: self.num_prompts]
        return self.prompts[: max(4, 2 * concurrency)]


def prompts_needed(concurrencies: Sequence[int], num_prompts: int | None) -> int:
    return num_prompts if num_prompts is not None else max(4, 2 * max(concurrencies))


async def _wait_ready(client: Any, plan: BenchPlan) -> None:
    deadline = time.monotonic() + plan.ready_timeout_s
    last = "no answer"
    while True:
        try:
            response = await client.get(f"{plan.base_url}/v1/models", headers=_headers(plan))
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except Exception as exc:  # noqa: BLE001 - polled until the deadline
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise BenchError(f"{plan.base_url}/v1/models did not answer 200 within "
                             f"{plan.ready_timeout_s:g} s ({last})")
        await asyncio.sleep(1.0)


def _headers(plan: BenchPlan) -> dict[str, str] | None:
    return {"authorization": f"Bearer {plan.api_key}"} if plan.api_key else None


async def run_bench_async(plan: BenchPlan, progress: Progress | None = None,
                          on_run: RunHook | None = None) -> dict[str, Any]:
    """The runs (one metrics dict per concurrency) and the server's ``/server_info`` facts."""
    import httpx

    limits = httpx.Limits(max_connections=max(plan.concurrencies) + 4,
                          max_keepalive_connections=max(plan.concurrencies) + 4)
    timeout = httpx.Timeout(6 * 3600.0, connect=10.0)
    # TCP_NODELAY, as aiohttp (bench_serving's client) sets by default: a small request body must not wait
    # for the server's delayed ACK of the headers.
    transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=[
        (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    async with httpx.AsyncClient(timeout=timeout, transport=transport, trust_env=False) as client:
        await _wait_ready(client, plan)
        warm = await send_request(client, plan.base_url, plan.prompts[0],
                                  output_len=min(plan.prompts[0].output_len, 32), headers=_headers(plan))
        if not warm.success:
            raise BenchError(f"Warmup failed - {warm.error}")
        info = await _server_info(client, plan)
        runs = []
        for concurrency in plan.concurrencies:
            await asyncio.sleep(plan.settle_s)
            if on_run is not None:
                on_run("start", concurrency)
            runs.append(await _one_run(client, plan, concurrency, progress))
            if on_run is not None:
                on_run("end", concurrency)
        return {"runs": runs, "server_info": info}


async def _server_info(client: Any, plan: BenchPlan) -> dict[str, Any]:
    try:
        response = await client.get(f"{plan.base_url}/server_info", headers=_headers(plan))
        return response.json() if response.status_code == 200 else {}
    except Exception:  # noqa: BLE001 - optional facts (the version), not the bench
        return {}


async def _one_run(client: Any, plan: BenchPlan, concurrency: int, progress: Progress | None) -> dict[str, Any]:
    prompts = plan.prompts_for(concurrency)
    gate = asyncio.Semaphore(concurrency)
    done = 0
    if progress is not None:
        progress(concurrency, 0, len(prompts))

    async def limited(prompt: Prompt) -> RequestOutput:
        nonlocal done
        async with gate:
            out = await send_request(client, plan.base_url, prompt, headers=_headers(plan))
        done += 1
        if progress is not None:
            progress(concurrency, done, len(prompts))
        return out

    started = time.perf_counter()
    outputs = await asyncio.gather(*(limited(p) for p in prompts))
    info = await _server_info(client, plan)  # inside the duration, as bench_serving reads it
    duration = time.perf_counter() - started
    result = calculate_metrics(outputs, [p.prompt_len for p in prompts], duration, concurrency)
    states = info.get("internal_states") or [{}]
    server_accept = (states[0] or {}).get("avg_spec_accept_length") if states else None
    if server_accept is not None:
        result["accept_length"] = server_accept
    result["num_prompts"] = len(prompts)
    return result


def run_bench(plan: BenchPlan, progress: Progress | None = None,
              on_run: RunHook | None = None) -> dict[str, Any]:
    return asyncio.run(run_bench_async(plan, progress, on_run))
