"""The async ``/generate`` client: one sample in, its collected dumps out, with retries and pauses.

Each request carries ``input_ids``, ``rid = <rid_prefix><job>-<index>`` and ``sampling_params.max_new_tokens
= 1`` (a prefill; sglang-facts §2.1).  Concurrency is bounded by a semaphore.  Outcomes are classified:

* the server is unreachable (connection refused or dropped, 503 while starting or draining): the client
  pauses every worker and probes ``/ready`` (never ``/health``, which injects a generation; sglang-facts §2)
  until the server answers again, without spending the sample's retries;
* a transient failure (timeout, 5xx, an aborted request, a duplicate rid still in flight from a killed run,
  a capture that did not arrive): retried with exponential backoff and jitter;
* a permanent failure (400 for a bad request, NaN in the states): the sample is recorded as failed.

Every failed attempt counts toward ``max_consecutive_failures``; any success resets it.  Passing it
aborts the job: when every request fails, something is wrong with the setup, not with the data.
"""
from __future__ import annotations

import asyncio
import importlib.util
import random
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

# httpcore runs `import sniffio` on every lock it takes (httpcore/_synchronization.py:22), several per
# request; without sniffio installed each of those is a failed search of sys.path, which cost ~5 ms of
# CPU per request and capped the client near 150 requests/s.  A None entry makes the import fail at once,
# and httpcore then assumes asyncio, which is what this client runs on.
if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]


class ServerDown(Exception):
    """The server did not answer at all (or said it is not serving)."""


class AttemptFailed(Exception):
    """One attempt failed; ``retryable`` says whether another attempt may succeed."""

    def __init__(self, reason: str, retryable: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


class SampleFailed(Exception):
    """The sample could not be extracted (retries spent, or a permanent failure)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JobAborted(Exception):
    """Too many consecutive failures, or the server stayed down past ``server_down_timeout_s``."""


class Stopped(Exception):
    """The job is being cancelled: a sample not yet sent is not sent."""


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Backoff before retry number ``attempt`` (1-based): exponential, capped, with ±20% jitter."""
        base = min(self.backoff_max_s, self.backoff_s * (2 ** max(0, attempt - 1)))
        jitter = (rng or random).uniform(0.8, 1.2)
        return min(self.backoff_max_s, base * jitter)


def generate_payload(rid: str, input_ids: Sequence[int]) -> dict[str, Any]:
    return {
        "input_ids": list(input_ids),
        "rid": rid,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "stream": False,
    }


def classify_response(status: int, body: Any, expected_tokens: int) -> dict[str, Any]:
    """Raise for anything but a finished prefill of exactly the tokens we sent; return ``meta_info``."""
    text = body if isinstance(body, str) else None
    if status == 503:
        raise ServerDown("the server answered 503 (starting, unhealthy or shutting down)")
    if status == 400:
        message = text or str(body)
        if "Duplicate request ID" in message:  # the same rid from a killed run is still in flight
            raise AttemptFailed(f"server still holds this rid from an earlier run: {message[:200]}")
        raise AttemptFailed(f"server refused the request (400): {message[:300]}", retryable=False)
    if status >= 500 or status in (408, 429):
        raise AttemptFailed(f"server error {status}: {(text or str(body))[:300]}")
    if status != 200:
        raise AttemptFailed(f"unexpected HTTP {status}: {(text or str(body))[:300]}", retryable=False)
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise AttemptFailed(f"response has no meta_info: {str(body)[:200]}", retryable=False)
    meta = body["meta_info"]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise AttemptFailed(f"the server aborted the request: {finish.get('message', '')}")
    prompt_tokens = meta.get("prompt_tokens")
    if isinstance(prompt_tokens, int) and prompt_tokens != expected_tokens:
        raise AttemptFailed(f"server counted {prompt_tokens} prompt tokens, we sent {expected_tokens}",
                            retryable=False)
    cached = meta.get("cached_tokens")
    if isinstance(cached, int) and cached > 0:  # sglang-facts §4.9: a cached prefix is not recomputed
        raise AttemptFailed(f"the server reused {cached} cached tokens, so their states were not computed; "
                            "launch it with --disable-radix-cache", retryable=False)
    return meta


class ExtractionClient:
    """Sends samples to one server with bounded concurrency; see the module docstring for the rules."""

    def __init__(self, base_url: str, *, concurrency: int = 8, retry: RetryPolicy | None = None,
                 request_timeout_s: float = 600.0, max_consecutive_failures: int = 20,
                 server_down_timeout_s: float = 0.0, probe_interval_s: float = 1.0,
                 on_server_state: Callable[[bool, str | None], None] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.concurrency = concurrency
        self.retry = retry or RetryPolicy()
        self.max_consecutive_failures = max_consecutive_failures
        self.server_down_timeout_s = server_down_timeout_s
        self.probe_interval_s = probe_interval_s
        self.on_server_state = on_server_state
        self.consecutive_failures = 0
        self.attempts = 0
        self.retries = 0
        self.server_down_since: float | None = None
        self.down_reason: str | None = None
        self.abort_reason: str | None = None
        self._server_up = asyncio.Event()
        self._server_up.set()
        self._stopped = asyncio.Event()
        self._prober: asyncio.Task | None = None
        # One single-connection client per slot, handed out by a queue (which also bounds concurrency):
        # a shared pool re-scans every queued request on each connection event in httpcore, which cost
        # ~5 ms of CPU per request at 64 in flight; per-slot clients stay near 1 ms at any concurrency.
        timeout = httpx.Timeout(request_timeout_s, connect=min(10.0, request_timeout_s))
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        tls = ssl.create_default_context()  # built once: each client would load the CA bundle again
        self._slots: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        self._all_http = [httpx.AsyncClient(timeout=timeout, limits=limits, verify=tls) for _ in range(concurrency)]
        for http in self._all_http:
            self._slots.put_nowait(http)
        self._probe_http = httpx.AsyncClient(timeout=5.0, verify=tls)
        self._rng = random.Random()

    async def aclose(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
        for http in (*self._all_http, self._probe_http):
            await http.aclose()

    # -- one request -------------------------------------------------------------------------------------
    async def post_generate(self, rid: str, input_ids: Sequence[int]) -> dict[str, Any]:
        """One ``/generate`` call → ``meta_info``; raises ServerDown or AttemptFailed."""
        http = await self._slots.get()
        if self._stopped.is_set():  # cancelled while waiting for a slot: do not send
            self._slots.put_nowait(http)
            raise Stopped()
        self.attempts += 1
        try:
            response = await http.post(f"{self.base_url}/generate", json=generate_payload(rid, input_ids))
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise ServerDown(f"{type(exc).__name__}: {exc or 'connection failed'}") from None
        except httpx.TimeoutException as exc:
            raise AttemptFailed(f"request timed out ({type(exc).__name__})") from None
        finally:
            self._slots.put_nowait(http)
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        if isinstance(body, dict) and isinstance(body.get("error"), (str, dict)) and response.status_code != 200:
            body = str(body["error"])
        return classify_response(response.status_code, body, len(input_ids))

    async def probe_ready(self) -> bool:
        """Whether the server serves again: ``/ready`` is 200 (``/model_info`` where ``/ready`` is missing)."""
        try:
            response = await self._probe_http.get(f"{self.base_url}/ready")
            if response.status_code == 404:
                response = await self._probe_http.get(f"{self.base_url}/model_info")
            return response.status_code == 200
        except httpx.HTTPError:
            return False

    # -- the server-down pause -------------------------------------------------------------------------
    def _mark_down(self, reason: str) -> None:
        if self._server_up.is_set():
            self._server_up.clear()
            self.server_down_since = time.monotonic()
            self.down_reason = f"server unreachable at {self.base_url}: {reason}"
            if self.on_server_state:
                self.on_server_state(False, self.down_reason)
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            if await self.probe_ready():
                self.server_down_since = None
                self.down_reason = None
                self._server_up.set()
                if self.on_server_state:
                    self.on_server_state(True, None)
                return
            down_for = time.monotonic() - (self.server_down_since or time.monotonic())
            if self.server_down_timeout_s and down_for > self.server_down_timeout_s:
                self.abort_reason = (f"the server at {self.base_url} stayed down for {down_for:.0f} s "
                                     f"(server_down_timeout_s = {self.server_down_timeout_s:g})")
                self._server_up.set()  # wake the workers so they see the abort
                return

    def stop(self) -> None:
        """Cancel: samples waiting for the server, a backoff or a slot give up; requests in flight finish."""
        self._stopped.set()
        self._server_up.set()

    def _check_abort(self) -> None:
        if self._stopped.is_set():
            raise Stopped()
        if self.abort_reason:
            raise JobAborted(self.abort_reason)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout=seconds)
        except TimeoutError:
            pass

    def _count_failure(self, reason: str) -> None:
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.max_consecutive_failures:
            self.abort_reason = (f"{self.consecutive_failures} consecutive attempts failed; last: {reason}")

    # -- one sample, with retries ---------------------------------------------------------------------
    async def extract(self, rid: str, input_ids: Sequence[int],
                      collect: Callable[[dict[str, Any]], Awaitable[Any]],
                      before_attempt: Callable[[], Awaitable[None]] | None = None) -> Any:
        """Send until ``collect(meta_info)`` succeeds; return its result.

        ``collect`` raises AttemptFailed for a capture that did not arrive (retried) or is bad (not
        retried).  ``before_attempt`` runs before each send (the runner clears stale dumps of the rid).
        """
        failures = 0
        last_reason = "no attempt made"
        while True:
            self._check_abort()
            await self._server_up.wait()
            self._check_abort()
            if before_attempt is not None:
                await before_attempt()
            try:
                meta = await self.post_generate(rid, input_ids)
                result = await collect(meta)
            except ServerDown as exc:
                if self._stopped.is_set():
                    raise Stopped() from None
                self._mark_down(str(exc))
                continue  # not the sample's fault: wait for the server, spend no retry
            except AttemptFailed as exc:
                last_reason = exc.reason
                self._count_failure(exc.reason)
                failures += 1
                if not exc.retryable:
                    raise SampleFailed(exc.reason) from None
                if failures > self.retry.max_retries:
                    raise SampleFailed(f"{failures} attempts failed; last: {last_reason}") from None
                self.retries += 1
                await self._sleep(self.retry.delay_s(failures, self._rng))
                continue
            self.consecutive_failures = 0
            return result

    @property
    def server_is_up(self) -> bool:
        return self._server_up.is_set() and not self.abort_reason
