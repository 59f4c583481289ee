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
