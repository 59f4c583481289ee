"""The client's retry rules: response classification, backoff, and the pause when the server is down
(against a real local port that refuses connections)."""
from __future__ import annotations

import asyncio
import random
import socket

import pytest

from sessions.extraction.client import (
    AttemptFailed,
    ExtractionClient,
    JobAborted,
    RetryPolicy,
    ServerDown,
    classify_response,
    generate_payload,
)


def refused_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_request_is_a_prefill_of_the_token_ids_under_the_job_rid() -> None:
    payload = generate_payload("eagle3-job-7", [1, 2, 3])
    assert payload["input_ids"] == [1, 2, 3] and payload["rid"] == "eagle3-job-7"
    assert payload["sampling_params"]["max_new_tokens"] == 1


def test_responses_are_classified_by_what_a_retry_can_fix() -> None:
    ok = {"text": "", "meta_info": {"prompt_tokens": 3, "cached_tokens": 0, "finish_reason": {"type": "length"}}}
    assert classify_response(200, ok, 3)["prompt_tokens"] == 3
    with pytest.raises(ServerDown):
        classify_response(503, "starting", 3)
    for status, body, retryable, words in (
        (500, "boom", True, "server error 500"),
        (400, "Duplicate request ID detected: eagle3-j-1", True, "still holds this rid"),
        (400, "input is longer than the context", False, "refused the request"),
        (200, {"meta_info": {"finish_reason": {"type": "abort", "message": "oom"}}}, True, "aborted"),
        (200, {"meta_info": {"prompt_tokens": 2}}, False, "counted 2 prompt tokens"),
        (200, {"meta_info": {"prompt_tokens": 3, "cached_tokens": 2}}, False, "--disable-radix-cache"),
    ):
        with pytest.raises(AttemptFailed, match=words) as info:
            classify_response(status, body, 3)
        assert info.value.retryable is retryable, (status, body)


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    policy = RetryPolicy(max_retries=6, backoff_s=0.5, backoff_max_s=4.0)
    rng = random.Random(1)
    delays = [policy.delay_s(n, rng) for n in range(1, 7)]
    for n, delay in enumerate(delays, start=1):
        base = min(4.0, 0.5 * 2 ** (n - 1))
        assert 0.8 * base <= delay <= min(4.0, 1.2 * base)
    assert delays[-1] <= 4.0 and delays[0] < delays[2]


def test_a_refusing_server_pauses_the_client_without_spending_retries_then_aborts() -> None:
    url = f"http://127.0.0.1:{refused_port()}"
    events: list[tuple[bool, str | None]] = []

    async def scenario() -> None:
        client = ExtractionClient(url, concurrency=2, retry=RetryPolicy(max_retries=1, backoff_s=0.01),
                                  server_down_timeout_s=0.3, probe_interval_s=0.05,
                                  on_server_state=lambda up, why: events.append((up, why)))

        async def never(_meta):  # the request never gets this far
            raise AssertionError("collect called without a response")

        try:
            with pytest.raises(JobAborted, match="stayed down"):
                await asyncio.wait_for(client.extract("eagle3-j-0", [1, 2], never), timeout=10)
            assert client.consecutive_failures == 0 and client.retries == 0  # pausing is not failing
            assert client.attempts >= 1
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert events and events[0][0] is False
    assert url in events[0][1] and "ConnectError" in events[0][1]


# -- the /generate connection (GenerateConnection), against the real emulator and raw sockets ---------------
def _ready_emulator(make_emulator_profile, launched):
    import time

    session = launched.launch(make_emulator_profile("client-http", tp=1, radix_cache=False))
    deadline = time.monotonic() + 120
    status = session.status()
    while status.state != "ready":
        assert status.state not in ("crashed", "exited"), session.log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, session.log_path.read_text()[-3000:]
        time.sleep(0.1)
        status = session.status()
    return session, f"http://127.0.0.1:{status.port}"


def test_generate_keeps_one_connection_per_slot_and_maps_the_emulators_answers(make_emulator_profile, launched):
    session, url = _ready_emulator(make_emulator_profile, launched)

    async def scenario() -> None:
        client = ExtractionClient(url, concurrency=2)
        try:
            async def send(i: int) -> dict:
                return await client.post_generate(f"eagle3-j-{i}", list(range(1, 2 + i % 7)))

            metas = await asyncio.gather(*(send(i) for i in range(30)))
            assert [m["prompt_tokens"] for m in metas] == [1 + i % 7 for i in range(30)]
            assert all(m["cached_tokens"] == 0 for m in metas)
            # keep-alive: 30 requests over the 2 slots' connections, no reconnects
            assert sorted(c.connects for c in client._all_http) == [1, 1]
            with pytest.raises(AttemptFailed, match="The input_ids is empty") as info:
                await client.post_generate("eagle3-j-empty", [])
            assert info.value.retryable is False
            assert (await client.post_generate("eagle3-j-after", [5, 6]))["prompt_tokens"] == 2  # still usable
            session.stop(grace_s=10)
            with pytest.raises(ServerDown, match="connection lost|ConnectError"):
                await client.post_generate("eagle3-j-gone", [1, 2, 3])
            with pytest.raises(ServerDown, match="ConnectError: cannot connect to 127.0.0.1"):
                await client.post_generate("eagle3-j-gone-2", [1, 2, 3])
        finally:
            await client.aclose()

    asyncio.run(scenario())


class RawServer:
    """A real listening socket that answers each request with the next canned reply (bytes; ending in
    ``<cut>``: then close the connection; None: read the request and say nothing); counts connections."""

    def __init__(self, replies: list[bytes | None]) -> None:
        import threading

        self.replies = list(replies)
        self.accepted = 0
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _read_request(self, conn: socket.socket) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lengths = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
        length = int(lengths[0])
        while len(body) < length:
            body += conn.recv(65536)
        return head + b"\r\n\r\n" + body

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set() and self.replies:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            self._held.append(conn)
            while self.replies:
                request = self._read_request(conn)
                if request is None:
                    break
                self.requests.append(request)
                reply = self.replies.pop(0)
                if reply is None:
                    continue  # say nothing: the client must time out
                cut = reply.endswith(b"<cut>")  # send this much, then close the connection
                conn.sendall(reply.removesuffix(b"<cut>"))
                if cut or b"connection: close" in reply.lower():
                    conn.close()
                    break

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        for conn in self._held:
            conn.close()
        self.sock.close()


def _ok(tokens: int, extra_headers: bytes = b"") -> bytes:
    import json

    body = json.dumps({"text": "", "meta_info": {"prompt_tokens": tokens, "cached_tokens": 0,
                                                 "finish_reason": {"type": "length"}}}).encode()
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + extra_headers
            + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_generate_refuses_responses_it_does_not_understand_and_recovers_on_a_new_connection() -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    no_length = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{}"
    garbage = b"SSH-2.0-OpenSSH_9.6\r\n\r\n"
    server = RawServer([_ok(3, b"connection: close\r\n"), _ok(3), chunked, no_length, garbage,
                        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"meta<cut>", b"<cut>", None, _ok(2)])

    async def scenario() -> None:
        client = ExtractionClient(server.url, concurrency=1, request_timeout_s=0.5)
        try:
            assert (await client.post_generate("eagle3-a", [1, 2, 3]))["prompt_tokens"] == 3
            assert (await client.post_generate("eagle3-b", [1, 2, 3]))["prompt_tokens"] == 3  # reconnected
            for words in ("Transfer-Encoding: 'chunked'", "without Content-Length", "not an HTTP/1.x status line"):
                with pytest.raises(AttemptFailed, match=words) as info:
                    await client.post_generate("eagle3-c", [1, 2, 3])
                assert info.value.retryable is False and server.url in info.value.reason
            for _ in range(2):  # cut mid-body, then closed before any byte: the server is going away
                with pytest.raises(ServerDown, match="connection lost: the server closed the connection"):
                    await client.post_generate("eagle3-d", [1, 2, 3])
            with pytest.raises(AttemptFailed, match="timed out") as info:
                await client.post_generate("eagle3-e", [1, 2, 3])
            assert info.value.retryable is True
            assert (await client.post_generate("eagle3-f", [7, 8]))["prompt_tokens"] == 2
        finally:
            await client.aclose()

    try:
        asyncio.run(scenario())
    finally:
        server.close()
    # "b" kept its connection for the chunked reply; the close after "a" and every failure cost a new one
    assert server.accepted == 8
    # the request line and body are what SGLang expects
    first = server.requests[0]
    assert first.startswith(b"POST /generate HTTP/1.1\r\n") and b'"rid":"eagle3-a"' in first
    assert b'"input_ids":[1,2,3]' in first and b'"max_new_tokens":1' in first
