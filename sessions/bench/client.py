"""One benchmark request, sent and read exactly as ``bench_serving --backend sglang`` does.

Payload: ``{"input_ids", "sampling_params": {"temperature": 0.0, "max_new_tokens", "ignore_eos": true},
"stream": true}`` to ``<base>/generate``.  Reading (benchmark/serving.py:744-800): line by line, a leading
``data: `` removed, ``[DONE]`` ignored; every line moves the end time (so E2E ends at ``[DONE]``); only a
chunk with non-empty ``text`` counts: the first sets TTFT, each later one adds ``n`` ITL entries of
``gap / n`` where ``n`` is the growth of ``meta_info.completion_tokens``.  ``prompt_tokens`` from the server
overrides the prompt length.  A non-200 status is a failure with its reason and body.  A dataset's prompt is
sent as ``text`` (the server tokenizes it).  Every line and count is checked first (`sessions.bench.bounded`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sessions.bench.bounded import (
    MAX_PROMPT_TOKENS,
    AnswerError,
    count,
    finite,
    iter_lines,
    json_object,
    read_body,
)
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
    """A text prompt (a dataset's) goes as ``text``, as bench_serving sends a str prompt; ids as ``input_ids``."""
    source: dict[str, Any] = {"text": prompt.text} if prompt.text is not None else {"input_ids": list(prompt.input_ids)}
    return {
        **source,
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
    timestamps (see `sessions.bench.runner` for why each request in flight has its own thread).

    Nothing the server streams is trusted (`sessions.bench.bounded`): a line past the size cap, a chunk that
    is not a JSON object, ``completion_tokens`` that fall or pass ``max_new_tokens``, spec counts that are
    not counts: each ends the request as a failure with its reason, and its figures are not kept."""
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
    try:
        response = client.send(request, stream=True)
        try:
            if response.status_code != 200:
                body = read_body(response, 64 << 10).decode("utf-8", "replace")
                out.error = f"{response.reason_phrase}: {body}"
                return out
            _read_stream(response, out, st, wanted)
        finally:
            response.close()
    except AnswerError as exc:
        out.error = f"untrusted answer: {exc}"
        _forget_figures(out)
        return out
    except Exception as exc:  # noqa: BLE001 - one failed request is a result, not a crash
        out.error = f"{type(exc).__name__}: {exc}"
        _forget_figures(out)
        return out
    if not out.error:
        out.success = True
        if out.output_len == 0:
            out.output_len = wanted  # bench_serving keeps the requested length when no text came
    return out


def _read_stream(response: Any, out: RequestOutput, st: float, wanted: int) -> None:
    most_recent = st
    last_tokens = 0
    for raw in iter_lines(response):
        line = raw.strip().decode("utf-8", "replace")
        if not line:
            continue
        line = line.removeprefix("data: ")
        now = time.perf_counter()
        out.latency = now - st
        if line == "[DONE]":
            continue
        data = json_object(line, "a streamed chunk")
        if data.get("error") is not None:
            # SGLang streams a refusal after its 200 headers as one error chunk (a prompt over the
            # context length, a server shutting down).  bench_serving counts such a request as a
            # success with the requested length; that is a record of a run that never happened.
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else error
            out.error = f"error chunk: {str(message)[:500]}"
            return
        meta = data.get("meta_info") or {}
        if not isinstance(meta, dict):
            raise AnswerError("meta_info is not an object")
        _spec_fields(meta, out, wanted)
        if meta.get("prompt_tokens") is not None:
            out.prompt_len = count(meta["prompt_tokens"], "prompt_tokens", MAX_PROMPT_TOKENS)
        if data.get("text"):
            tokens = count(meta.get("completion_tokens", last_tokens), "completion_tokens", wanted)
            if tokens < last_tokens:
                raise AnswerError(f"completion_tokens fell from {last_tokens} to {tokens}")
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


def _spec_fields(meta: dict[str, Any], out: RequestOutput, wanted: int) -> None:
    """The speculative figures of a chunk, each checked: an accept length within 0..max_new_tokens, and
    correct drafts that are counts no larger than the proposed ones."""
    if meta.get("spec_accept_length") is not None:
        out.accept_length = finite(meta["spec_accept_length"], "spec_accept_length", 0.0, float(max(wanted, 1)))
    if meta.get("spec_num_proposed_drafts") is not None:
        limit = 1 << 40
        proposed = count(meta["spec_num_proposed_drafts"], "spec_num_proposed_drafts", limit)
        correct = count(meta.get("spec_num_correct_drafts") or 0, "spec_num_correct_drafts", proposed)
        out.correct_drafts, out.proposed_drafts = correct, proposed


def _forget_figures(out: RequestOutput) -> None:
    """A failed request keeps its reason only: no figure of an answer the bench refused."""
    out.success = False
    out.output_len = 0
    out.itl = []
    out.ttft = 0.0
    out.accept_length = None
    out.correct_drafts = out.proposed_drafts = None
