"""Run a bench against one server: ``/v1/models`` ready check, warm-up, then each concurrency in turn.

Like bench_serving: the warm-up sends one request with ``max_new_tokens = min(output_len, 32)``; a short
pause lets the server settle; each run dispatches its prompts in order with at most ``max_concurrency`` in
flight (the next starts as soon as one ends) and its duration ends after a ``GET /server_info`` (which
bench_serving reads for the accept length).  Before each concurrency the prefix cache is flushed, as
bench_serving's ``--flush-cache`` does after its warm-up, so that no run times prefills cached by an
earlier one (`BenchPlan.flush_cache`).  Every concurrency uses the same seeded prompts; by default
concurrency ``c`` sends the first ``max(4, 2c)`` of them (enough to keep ``c`` requests in flight twice
over), with ``num_prompts`` given it sends all of them every time.

Each request in flight has its own thread and its own blocking ``httpx.Client``.  Like bench_serving,
which makes a new aiohttp session per request, every request opens its own connection inside its clock
and closes it after (no keep-alive pool): TTFT counts the same connect that bench_serving's does.  bench_serving runs all its streams on one asyncio loop,
which works because aiohttp's C parser costs little per chunk.  httpx's asyncio stack (httpcore over
anyio: a checkpoint and a cancel scope per read or write) costs about twice the CPU, and every step of
a request waits behind every other stream's parsing: at concurrency 8 the second half of a wave reached
the server one prefill forward after the other, not in one batch, and the client's own queueing was
counted as TTFT (61 ms against bench_serving's 30).  Blocking reads in threads have no such queue: a
thread sleeps in ``recv`` and times its chunk as soon as it wakes.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sessions.bench.bounded import AnswerError, finite, get_json_object
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
    flush_cache: bool = True  # empty the prefix cache before each concurrency (bench_serving --flush-cache)
    flush_timeout_s: float = 60.0  # how long the server may take to go idle for it (bench_serving's default)

    def prompts_for(self, concurrency: int) -> tuple[Prompt, ...]:
        if self.num_prompts is not None:
            return self.prompts[: self.num_prompts]
        return self.prompts[: max(4, 2 * concurrency)]


def prompts_needed(concurrencies: Sequence[int], num_prompts: int | None) -> int:
    return num_prompts if num_prompts is not None else max(4, 2 * max(concurrencies))


def wait_ready(client: Any, plan: BenchPlan) -> dict[str, Any]:
    """``GET /v1/models`` until it answers 200 with a JSON object (read with a size cap); that object."""
    deadline = time.monotonic() + plan.ready_timeout_s
    last = "no answer"
    while True:
        try:
            return get_json_object(client, f"{plan.base_url}/v1/models", _headers(plan))
        except AnswerError as exc:
            last = str(exc)
        except Exception as exc:  # noqa: BLE001 - polled until the deadline
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise BenchError(f"{plan.base_url}/v1/models did not answer 200 within "
                             f"{plan.ready_timeout_s:g} s ({last})")
        time.sleep(1.0)


def _headers(plan: BenchPlan) -> dict[str, str] | None:
    return {"authorization": f"Bearer {plan.api_key}"} if plan.api_key else None


def _clients(count: int) -> list[Any]:
    """One blocking client per request slot, with one connection at a time and none kept alive: each
    request connects anew, as bench_serving's fresh session per request does.  TCP_NODELAY, as aiohttp
    (bench_serving's client) sets by default: a small request body must not wait for the server's delayed
    ACK of the headers.  One TLS context for all: building one per client costs more than a request."""
    import httpx

    context = httpx.create_ssl_context()
    timeout = httpx.Timeout(6 * 3600.0, connect=10.0)  # bench_serving's 6-hour total
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=0)
    return [httpx.Client(timeout=timeout, trust_env=False, transport=httpx.HTTPTransport(
        verify=context, limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]))
        for _ in range(count)]


def run_bench(plan: BenchPlan, progress: Progress | None = None, on_run: RunHook | None = None,
              on_result: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The runs (one metrics dict per concurrency) and the server's ``/server_info`` facts."""
    # one client per request that can be in flight: never more than the prompts a run sends
    in_flight = max(min(c, len(plan.prompts_for(c))) for c in plan.concurrencies)
    clients = _clients(max(1, in_flight))
    try:
        first = clients[0]
        wait_ready(first, plan)
        warm = send_request(first, plan.base_url, plan.prompts[0],
                            output_len=min(plan.prompts[0].output_len, 32), headers=_headers(plan))
        if not warm.success:
            raise BenchError(f"Warmup failed - {warm.error}")
        info, _ = _server_info(first, plan)  # each run reports its own read's problem
        runs = []
        for concurrency in plan.concurrencies:
            flushed, note = _flush_cache(first, plan) if plan.flush_cache else (None, "")
            time.sleep(plan.settle_s)
            if on_run is not None:
                on_run("start", concurrency)
            run = _one_run(clients[:concurrency], plan, concurrency, progress)
            run["cache_flushed"] = flushed
            if note:
                run["cache_note"] = note
            runs.append(run)
            if on_run is not None:
                on_run("end", concurrency)
            if on_result is not None:  # each concurrency's figures as soon as they are known
                on_result(run)
        return {"runs": runs, "server_info": info}
    finally:
        for client in clients:
            client.close()


def _flush_cache(client: Any, plan: BenchPlan) -> tuple[bool, str]:
    """``POST /flush_cache?timeout=T``, as bench_serving's ``--flush-cache`` sends it after its warm-up.
    Without it every concurrency after the first (and the first request of each, the warm-up's prompt)
    would hit the prompts that an earlier run left in the radix cache, and its TTFT would time a cached
    prefill.  A refusal (other clients' requests still running past T) is kept as the run's note; the run
    goes on, on a warm cache."""
    try:
        response = client.post(f"{plan.base_url}/flush_cache", params={"timeout": plan.flush_timeout_s},
                               headers=_headers(plan))
    except Exception as exc:  # noqa: BLE001 - the bench still runs, and says the cache was warm
        return False, f"prefix cache not flushed: {type(exc).__name__}: {exc}"
    if response.status_code == 200:
        return True, ""
    reason = " ".join(response.text.split())[:200] or response.reason_phrase
    return False, f"prefix cache not flushed (HTTP {response.status_code}: {reason})"


def _server_info(client: Any, plan: BenchPlan) -> tuple[dict[str, Any], str]:
    """(``/server_info``, problem): read with a size cap; an answer that is not a JSON object, or whose
    ``internal_states`` are not objects, gives no facts and a problem that the run reports as a failed
    request (`metrics.failure_notes`), never an exception out of the bench."""
    try:
        info = get_json_object(client, f"{plan.base_url}/server_info", _headers(plan))
    except AnswerError as exc:
        return {}, f"GET /server_info: {exc}"
    except Exception as exc:  # noqa: BLE001 - optional facts (the version), not the bench
        return {}, f"GET /server_info: {type(exc).__name__}: {exc}"
    states = info.get("internal_states")
    if states is not None and (not isinstance(states, list) or not all(isinstance(x, dict) for x in states)):
        return {k: v for k, v in info.items() if k != "internal_states"}, \
            "GET /server_info: internal_states is not a list of objects"
    return info, ""


def server_accept_length(info: dict[str, Any]) -> tuple[float | None, str]:
    """``internal_states[0].avg_spec_accept_length`` if it is a finite number in 0..1000."""
    states = info.get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length") if states and isinstance(states[0], dict) else None
    if value is None:
        return None, ""
    try:
        return finite(value, "avg_spec_accept_length", 0.0, 1000.0), ""
    except AnswerError as exc:
        return None, f"GET /server_info: {exc}"


def _one_run(clients: Sequence[Any], plan: BenchPlan, concurrency: int,
             progress: Progress | None) -> dict[str, Any]:
    prompts = plan.prompts_for(concurrency)
    slots = clients[: min(concurrency, len(prompts))]
    todo: queue.SimpleQueue[tuple[int, Prompt]] = queue.SimpleQueue()
    for item in enumerate(prompts):
        todo.put(item)
    finished: queue.SimpleQueue[tuple[int, RequestOutput]] = queue.SimpleQueue()
    headers = _headers(plan)

    # bench_serving creates all its tasks at once and each sends as soon as the loop runs it, so a wave of c
    # requests leaves within a few milliseconds.  Starting a thread costs more than that: started one by
    # one, the 32nd thread's request left tens of ms after the first, and the server prefilled the wave in
    # two forwards.  So every slot builds its first request, waits at this line, and all go together.
    start_line = threading.Barrier(len(slots) + 1, timeout=60.0)

    def at_start_line() -> None:
        try:
            start_line.wait()
        except threading.BrokenBarrierError:  # a slot that never came: the others go anyway
            pass

    def slot(client: Any) -> None:
        # FCFS like bench_serving's semaphore: a slot that frees takes the next prompt in order.
        first: Callable[[], None] | None = at_start_line
        while True:
            try:
                index, prompt = todo.get_nowait()
            except queue.Empty:
                if first is not None:
                    first()
                return
            finished.put((index, send_request(client, plan.base_url, prompt, headers=headers,
                                              before_clock=first)))
            first = None

    if progress is not None:
        progress(concurrency, 0, len(prompts))
    outputs: list[RequestOutput] = [RequestOutput() for _ in prompts]
    threads = [threading.Thread(target=slot, args=(client,), name=f"bench-c{concurrency}-{i}", daemon=True)
               for i, client in enumerate(slots)]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    at_start_line()
    for done in range(1, len(prompts) + 1):
        index, out = finished.get()
        outputs[index] = out
        if progress is not None:  # called on the caller's thread, as before
            progress(concurrency, done, len(prompts))
    info, problem = _server_info(slots[0], plan)  # inside the duration, as bench_serving reads it
    duration = time.perf_counter() - started
    for thread in threads:
        thread.join()
    # the server's count of a text prompt's tokens (a random-id prompt's is its length either way)
    lens = [o.prompt_len if o.success and p.text is not None else p.prompt_len for o, p in zip(outputs, prompts)]
    result = calculate_metrics(outputs, lens, duration, concurrency)
    server_accept, accept_problem = server_accept_length(info)
    if server_accept is not None:
        result["accept_length"] = server_accept
    if problem or accept_problem:
        result["server_info_error"] = problem or accept_problem
    result["num_prompts"] = len(prompts)
    return result
