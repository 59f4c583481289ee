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

The ``/generate`` POST itself goes through `GenerateConnection`, a minimal HTTP/1.1 keep-alive client on an
asyncio Protocol (one connection per concurrency slot, never pipelined).  httpx spent ~1 ms of CPU per
request in its anyio/httpcore/h11 layers (profiled), capping one core near 1,000 requests/s; this path
does one write and one parse per request.  It understands exactly what SGLang's uvicorn answers to a
non-streaming ``/generate`` (a status line, headers, a ``Content-Length`` body) and refuses anything else
with an error that says what it got.  ``https://`` servers, the ``/ready`` probe and everything else use
httpx.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

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


def answer_body(status: int, raw: bytes) -> Any:
    """A ``/generate`` answer's body: its JSON read by `sessions.server_answers.parse_json` (finite numbers,
    bounded nesting; adv22: a 100,000-deep array raised RecursionError out of the request), an error's
    text, or AttemptFailed naming what is wrong with a 200 answer."""
    from sessions.server_answers import parse_json

    body, why = parse_json(raw, expect=None)
    if why is not None:
        if status == 200:
            raise AttemptFailed(f"the /generate answer {why}", retryable=False)
        return raw.decode("utf-8", "replace")
    if status != 200 and isinstance(body, dict) and isinstance(body.get("error"), (str, dict)):
        return str(body["error"])
    return body


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


_MAX_HEAD_BYTES = 64 << 10
PROBE_DEADLINE_S = 5.0  # one /ready probe while the server is down, in all
_MAX_BODY_BYTES = 256 << 20


class HttpResponseError(Exception):
    """The server's answer is not an HTTP/1.1 response this client understands (the message says why)."""


class _ConnectionLost(Exception):
    """The connection closed (or failed) before the whole response arrived."""


class _ResponseReader(asyncio.Protocol):
    """One TCP connection: parses the responses to the requests written on it, one at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = True
        self.waiter: asyncio.Future | None = None
        self._buffer = bytearray()
        self._status: int | None = None  # set once the head of the current response is parsed
        self._body_start = 0
        self._body_length = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            self.fail(HttpResponseError(f"the server sent {len(data)} bytes while no request was waiting"))
            return
        self._buffer += data
        try:
            self._parse(waiter)
        except HttpResponseError as exc:
            self.fail(exc)

    def eof_received(self) -> bool:
        return False  # close our side too: a half-closed HTTP/1.1 connection serves no further request

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            why = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
            waiter.set_exception(_ConnectionLost(f"{why} before the whole response arrived"))

    # -- parsing ---------------------------------------------------------------------------------------
    def _parse(self, waiter: asyncio.Future) -> None:
        buffer = self._buffer
        if self._status is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD_BYTES:
                    raise HttpResponseError(f"response head longer than {_MAX_HEAD_BYTES} bytes")
                return
            self._parse_head(bytes(buffer[:end]))
            self._body_start = end + 4
        available = len(buffer) - self._body_start
        if available < self._body_length:
            return
        if available > self._body_length:
            raise HttpResponseError(f"{available - self._body_length} unexpected bytes after a response of "
                                    f"{self._body_length} bytes (this client never pipelines)")
        body = bytes(buffer[self._body_start:])
        status = self._status
        buffer.clear()
        self._status = None
        waiter.set_result((status, body))

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].isdigit():
            raise HttpResponseError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HttpResponseError(f"malformed response header line: {line[:100]!r}")
            headers[name.lower()] = value.strip()
        if 100 <= status < 200:
            raise HttpResponseError(f"unexpected interim response {status} (this client sends no Expect)")
        if "transfer-encoding" in headers:
            raise HttpResponseError(f"response with Transfer-Encoding: {headers['transfer-encoding']!r}; this "
                                    "client reads Content-Length bodies only (is the request streaming?)")
        length_text = headers.get("content-length")
        if length_text is None:
            if status not in (204, 304):
                raise HttpResponseError(f"HTTP {status} response without Content-Length")
            length = 0
        elif not length_text.isdigit():
            raise HttpResponseError(f"bad Content-Length {length_text[:40]!r}")
        else:
            length = int(length_text)
        if length > _MAX_BODY_BYTES:
            raise HttpResponseError(f"response body of {length} bytes is over the {_MAX_BODY_BYTES}-byte limit")
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection and (parts[0] == "HTTP/1.1" or "keep-alive" in connection)
        self._status = status
        self._body_length = length

    def fail(self, exc: Exception) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()  # no lingering: a half-read response must never reach a later request


class GenerateConnection:
    """One keep-alive HTTP/1.1 connection slot for ``POST <path>`` with a JSON body; one request at a time.

    `request` connects on first use (and again once the server closed the connection), writes the
    request in one call and parses the response as it arrives: status line, headers, then exactly
    ``Content-Length`` body bytes.  ``Transfer-Encoding``, a missing ``Content-Length`` on a response
    that has a body, a malformed head, a body over 256 MiB, or bytes nobody asked for raise
    HttpResponseError.  A connection that fails or times out mid-request is aborted, never reused with a
    response still to come; each TCP connection has its own reader, so a late close of an old one cannot
    touch the next.
    """

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host = host
        self.port = port
        self.path = path
        self.connects = 0
        host_header = f"[{host}]" if ":" in host else host
        self._head_prefix = (f"POST {path} HTTP/1.1\r\nHost: {host_header}:{port}\r\n"
                             "Accept: application/json\r\nContent-Type: application/json\r\n"
                             "User-Agent: eagle3-tui\r\nContent-Length: ").encode("ascii")
        self._reader: _ResponseReader | None = None

    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.abort()

    async def request(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """POST ``body`` (JSON bytes) → (status, response body).

        Raises OSError (cannot connect), _ConnectionLost, TimeoutError or HttpResponseError; after any
        of them the connection is closed and the next request opens a new one.
        """
        loop = asyncio.get_running_loop()
        reader = self._reader
        if reader is None or reader.closed:
            self.close()
            _transport, reader = await asyncio.wait_for(
                loop.create_connection(_ResponseReader, self.host, self.port), timeout=min(10.0, timeout_s))
            self._reader = reader
            self.connects += 1
        assert reader is not None and reader.transport is not None  # connection_made ran before that await
        waiter = loop.create_future()
        reader.waiter = waiter
        timer = loop.call_later(timeout_s, _expire, waiter, timeout_s)
        done = False
        try:
            reader.transport.write(self._head_prefix + str(len(body)).encode("ascii") + b"\r\n\r\n" + body)
            result = await waiter
            done = True
            return result
        finally:
            timer.cancel()
            reader.waiter = None
            if not done or not reader.keep_alive:
                reader.abort()
                if self._reader is reader:
                    self._reader = None


def _expire(waiter: asyncio.Future, timeout_s: float) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"no complete response within {timeout_s:g} s"))


class ExtractionClient:
    """Sends samples to one server with bounded concurrency; see the module docstring for the rules."""

    def __init__(self, base_url: str, *, concurrency: int = 8, retry: RetryPolicy | None = None,
                 request_timeout_s: float = 600.0, max_consecutive_failures: int = 20,
                 server_down_timeout_s: float = 0.0, probe_interval_s: float = 1.0,
                 on_server_state: Callable[[bool, str | None], None] | None = None,
                 identity_check: Callable[[], Awaitable[str | None]] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.concurrency = concurrency
        self.retry = retry or RetryPolicy()
        self.max_consecutive_failures = max_consecutive_failures
        self.server_down_timeout_s = server_down_timeout_s
        self.probe_interval_s = probe_interval_s
        self.on_server_state = on_server_state
        # Before continuing after the server was down: None when the server is the job's own, else why not.
        self.identity_check = identity_check
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
        self.request_timeout_s = request_timeout_s
        # One connection per slot, handed out by a queue (which also bounds concurrency): a shared pool
        # would re-scan queued requests on each connection event (httpcore did, ~5 ms of CPU per request
        # at 64 in flight).  Plain http:// gets GenerateConnection; https:// keeps httpx.
        url = urlsplit(self.base_url)
        self._fast = url.scheme == "http" and bool(url.hostname)
        self._generate_url = f"{self.base_url}/generate"
        self._slots: asyncio.Queue[Any] = asyncio.Queue()
        if self._fast:
            path = (url.path.rstrip("/") or "") + "/generate"
            self._all_http: list[Any] = [GenerateConnection(url.hostname or "", url.port or 80, path)
                                         for _ in range(concurrency)]
        else:
            timeout = httpx.Timeout(request_timeout_s, connect=min(10.0, request_timeout_s))
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            tls = ssl.create_default_context()  # built once: each client would load the CA bundle again
            self._all_http = [httpx.AsyncClient(timeout=timeout, limits=limits, verify=tls)
                              for _ in range(concurrency)]
        for http in self._all_http:
            self._slots.put_nowait(http)
        self._rng = random.Random()

    async def aclose(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
        for http in self._all_http:
            if isinstance(http, GenerateConnection):
                http.close()
            else:
                await http.aclose()

    # -- one request -------------------------------------------------------------------------------------
    async def post_generate(self, rid: str, input_ids: Sequence[int]) -> dict[str, Any]:
        """One ``/generate`` call → ``meta_info``; raises ServerDown or AttemptFailed."""
        http = await self._slots.get()
        if self._stopped.is_set():  # cancelled while waiting for a slot: do not send
            self._slots.put_nowait(http)
            raise Stopped()
        self.attempts += 1
        if not self._fast:
            return await self._post_with_httpx(http, rid, input_ids)
        body_bytes = json.dumps(generate_payload(rid, input_ids), separators=(",", ":")).encode()
        try:
            status, raw = await http.request(body_bytes, self.request_timeout_s)
        except TimeoutError as exc:
            raise AttemptFailed(f"request timed out ({exc or 'connect'})") from None
        except OSError as exc:  # only connecting raises it; a failure later arrives as _ConnectionLost
            raise ServerDown(f"ConnectError: cannot connect to {http.host}:{http.port}: {exc}") from None
        except _ConnectionLost as exc:
            raise ServerDown(f"connection lost: {exc}") from None
        except HttpResponseError as exc:
            raise AttemptFailed(f"unexpected response from {self._generate_url}: {exc}", retryable=False) from None
        finally:
            self._slots.put_nowait(http)
        return classify_response(status, answer_body(status, raw), len(input_ids))

    async def _post_with_httpx(self, http: httpx.AsyncClient, rid: str, input_ids: Sequence[int]) -> dict[str, Any]:
        try:
            response = await http.post(self._generate_url, json=generate_payload(rid, input_ids))
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise ServerDown(f"{type(exc).__name__}: {exc or 'connection failed'}") from None
        except httpx.TimeoutException as exc:
            raise AttemptFailed(f"request timed out ({type(exc).__name__})") from None
        finally:
            self._slots.put_nowait(http)
        return classify_response(response.status_code, answer_body(response.status_code, response.content),
                                 len(input_ids))

    async def probe_ready(self) -> bool:
        """Whether the server serves again: ``/ready`` is 200 (``/model_info`` where ``/ready`` is missing)."""
        from sessions.server_answers import JSON_MAX_BYTES, fetch

        # The one bounded reader (a total deadline and a size cap), off the event loop.
        answer = await asyncio.to_thread(fetch, f"{self.base_url}/ready", deadline_s=PROBE_DEADLINE_S,
                                         max_bytes=JSON_MAX_BYTES)
        if answer.status == 404:
            answer = await asyncio.to_thread(fetch, f"{self.base_url}/model_info", deadline_s=PROBE_DEADLINE_S,
                                             max_bytes=JSON_MAX_BYTES)
        return answer.status == 200 and answer.error is None

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

    def hold(self, reason: str) -> None:
        """Treat the server as down with ``reason`` (e.g. another server answers): nothing is sent until the
        prober finds the job's own server ready again."""
        if self._server_up.is_set():
            self._server_up.clear()
            self.server_down_since = time.monotonic()
        self.down_reason = reason
        if self.on_server_state:
            self.on_server_state(False, reason)
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            if self._stopped.is_set():
                return
            if await self.probe_ready():
                problem = await self.identity_check() if self.identity_check is not None else None
                if problem is None:
                    self.server_down_since = None
                    self.down_reason = None
                    self._server_up.set()
                    if self.on_server_state:
                        self.on_server_state(True, None)
                    return
                if problem != self.down_reason:  # up, but not the job's server: stay paused, say why
                    self.down_reason = problem
                    if self.on_server_state:
                        self.on_server_state(False, problem)
                continue
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
