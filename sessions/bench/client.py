"""One benchmark request, sent and read exactly as ``bench_serving --backend sglang`` does.

Payload: ``{"input_ids", "sampling_params": {"temperature": 0.0, "max_new_tokens", "ignore_eos": true},
"stream": true}`` to ``<base>/generate``.  Reading (benchmark/serving.py:744-800): line by line, a leading
``data: `` removed, ``[DONE]`` ignored; every line moves the end time (so E2E ends at ``[DONE]``); only a
chunk with non-empty ``text`` counts: the first sets TTFT, each later one adds ``n`` ITL entries of
``gap / n`` where ``n`` is the growth of ``meta_info.completion_tokens``.  ``prompt_tokens`` from the server
overrides the prompt length.  A non-200 status is a failure with its reason and body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sessions.bench.prompts import Prompt


@dataclass
class RequestOutput:
    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0  # perf_counter when the request was sent
    error: str = ""
    accept_length: float | None = None
    # the final response's spec_num_correct_drafts / spec_num_proposed_drafts (speculative decoding only)
    correct_drafts: int | None = None
    proposed_drafts: int | None = None


def payload(prompt: Prompt, output_len: int | None = None) -> dict[str, Any]:
    return {
        "input_ids": list(prompt.input_ids),
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": prompt.output_len if output_len is None else output_len,
            "ignore_eos": True,
        },
        "stream": True,
    }


def send_request(client: Any, base_url: str, prompt: Prompt, output_len: int | None = None,
                 headers: dict[str, str] | None = None,
                 before_clock: Callable[[], object] | None = None) -> RequestOutput:
    """Send one streaming request with a (blocking) ``httpx.Client``; never raises for a failed request.

    The request (URL, headers, JSON body) is built before the clock starts, as bench_serving builds its
    payload before ``st``; the clock covers sending it and reading the answer.  Each chunk is timed in
    the calling thread the moment its line is read, so one stream's parsing never delays another's
    timestamps (see `sessions.bench.runner` for why each request in flight has its own thread)."""
    out = RequestOutput(prompt_len=prompt.prompt_len)
    wanted = prompt.output_len if output_len is None else output_len
    request = None
    try:
        request = client.build_request("POST", f"{base_url}/generate", json=payload(prompt, output_len),
                                       headers=headers)
    except Exception as exc:  # noqa: BLE001 - a bad URL or header is this request's error
        out.error = f"{type(exc).__name__}: {exc}"
    if before_clock is not None:  # the run's start line: every slot's first request is built, then all go
        before_clock()
    if request is None:
        return out
    st = time.perf_counter()
    out.start = st
    most_recent = st
    last_tokens = 0
    try:
        response = client.send(request, stream=True)
        try:
            if response.status_code != 200:
                body = response.read().decode("utf-8", "replace")
                out.error = f"{response.reason_phrase}: {body}"
                return out
            for raw in response.iter_lines():
                line = raw.strip()
                if not line:
                    continue
                line = line.removeprefix("data: ")
                now = time.perf_counter()
                out.latency = now - st
                if line == "[DONE]":
                    continue
                data = json.loads(line)
                if isinstance(data, dict) and data.get("error") is not None:
                    # SGLang streams a refusal after its 200 headers as one error chunk (a prompt over the
                    # context length, a server shutting down).  bench_serving counts such a request as a
                    # success with the requested length; that is a record of a run that never happened.
                    error = data["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    out.error = f"error chunk: {message}"
                    return out
                meta = data.get("meta_info") or {}
                if meta.get("spec_accept_length") is not None:
                    out.accept_length = float(meta["spec_accept_length"])
                if meta.get("spec_num_proposed_drafts") is not None:
                    out.correct_drafts = int(meta.get("spec_num_correct_drafts") or 0)
                    out.proposed_drafts = int(meta["spec_num_proposed_drafts"])
                if meta.get("prompt_tokens") is not None:
                    out.prompt_len = int(meta["prompt_tokens"])
                if data.get("text"):
                    tokens = int(meta.get("completion_tokens", last_tokens))
                    if out.ttft == 0.0:
                        out.ttft = now - st
                    else:
                        n = tokens - last_tokens
                        if n == 0:
                            continue
                        out.itl.extend([(now - most_recent) / n] * n)
                    most_recent = now
                    last_tokens = tokens
                    out.output_len = tokens
        finally:
            response.close()
        out.success = True
        if out.output_len == 0:
            out.output_len = wanted  # bench_serving keeps the requested length when no text came
    except Exception as exc:  # noqa: BLE001 - one failed request is a result, not a crash
        out.error = f"{type(exc).__name__}: {exc}"
    return out
