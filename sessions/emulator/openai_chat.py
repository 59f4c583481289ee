"""``POST /v1/chat/completions`` as SGLang 0.5.23 serves it (``srt/entrypoints/openai/serving_chat.py``).

What is modelled, with the places in the 0.5.23 wheel it follows:

* The server applies the model's own chat template: ``tokenizer.apply_chat_template(messages, tokenize=True,
  add_generation_prompt=True, **chat_template_kwargs)`` (serving_chat.py:799-806), then generates from those
  ids.  The tokenizer is the model dir's (transformers, loaded on first use).  A config-only model dir (no
  tokenizer files, the fixed backend) is rendered as ChatML text instead: an emulator-only fallback.
* Sampling: ``max_completion_tokens or max_tokens`` -> ``max_new_tokens``, ``temperature``/``top_p``/``top_k``
  /``min_p``/``repetition_penalty``/``stop``/``stop_token_ids``/``ignore_eos``, ``seed`` -> ``sampling_seed``
  (protocol.py:1213-1235).  Without a max, the rest of the context is allowed, as the scheduler does.
* Non-streaming body: ``{"id","object":"chat.completion","created","model","choices":[{"index","message":
  {"role":"assistant","content","reasoning_content"},"logprobs","finish_reason","matched_stop"}],"usage":
  {...},"metadata":{"weight_version":...}}`` (protocol.py:1293-1352, serving_chat.py:2993-3050).
* Streaming: a first chunk with ``role``, one chunk per content delta, a chunk with ``finish_reason`` and
  ``matched_stop``, a usage chunk with empty ``choices`` when ``stream_options.include_usage``, then
  ``data: [DONE]`` (serving_chat.py:2441-2805, sse_utils.py: ``reasoning_content`` is always present in a
  delta, ``role``/``content`` only when set).
* Errors: the request is checked before any byte is sent, so a bad one gets an HTTP status with SGLang's
  ``ErrorResponse`` at the top level: ``{"object":"error","message","type","param":null,"code"}``.  A body
  that does not validate is 400 ``"Bad Request"`` (http_server.py:635-692, FastAPI's 422 replaced); an
  empty ``messages`` is 400 ``"Messages cannot be empty."`` (serving_chat.py:1103-1106); a refusal of the
  generation (context length) is 400 ``"BadRequestError"`` (serving_base.py:205-221).
* ``--reasoning-parser``: ``<think>...</think>`` is split into ``reasoning_content`` unless the request sets
  ``separate_reasoning: false``.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.emulator.args import context_len
from sessions.emulator.backend import RequestError
from sessions.emulator.model_config import ModelConfig

_FALLBACK_IM_START, _FALLBACK_IM_END = "<|im_start|>", "<|im_end|>"
_ROLES = ("system", "user", "assistant", "tool", "developer", "function")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


class ChatError(Exception):
    """A request SGLang answers with an ``ErrorResponse`` (top-level, not nested under ``error``)."""

    def __init__(self, message: str, err_type: str = "BadRequestError", status: int = 400) -> None:
        super().__init__(message)
        self.err_type = err_type
        self.status = status

    def body(self) -> dict[str, Any]:
        return {"object": "error", "message": str(self), "type": self.err_type, "param": None,
                "code": self.status}


def _invalid(loc: str, msg: str, value: Any) -> ChatError:
    """A pydantic validation failure, worded like ``str(RequestValidationError)`` + its error list."""
    text = (f"1 validation error for ChatCompletionRequest\n{loc}\n  {msg} "
            f"[type=value_error, input_value={value!r:.80}] "
            f"[{{'type': 'value_error', 'loc': ('body', {loc!r}), 'msg': {msg!r}}}]")
    return ChatError(text, "Bad Request", 400)


@dataclass
class ChatRequest:
    """One checked chat request, ready to become a /generate request."""

    messages: list[dict[str, Any]]
    model: str
    stream: bool
    include_usage: bool
    sampling: dict[str, Any]
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    separate_reasoning: bool = True
    rid: str | None = None


_NUMBER_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "top_k", "seed", "n", "min_tokens")


def parse_chat_request(body: Any) -> ChatRequest:
    """The JSON body -> `ChatRequest`; `ChatError` with SGLang's status and shape for what it refuses."""
    if not isinstance(body, dict):
        raise _invalid("body", "Input should be a valid dictionary or object", body)
    if "messages" not in body:
        raise _invalid("messages", "Field required", body)
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _invalid("messages", "Input should be a valid list", messages)
    checked: list[dict[str, Any]] = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise _invalid(f"messages.{n}", "Input should be a message object with a known role", message)
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: the text parts, joined
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if content is not None and not isinstance(content, str):
            raise _invalid(f"messages.{n}.content", "Input should be a valid string", content)
        checked.append({**message, "content": content or ""})
    if not checked:
        raise ChatError("Messages cannot be empty.")
    for key in _NUMBER_FIELDS:
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise _invalid(key, "Input should be a valid number", value)
    for key in _INT_FIELDS:
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise _invalid(key, "Input should be a valid integer", value)
    if body.get("n", 1) != 1:
        raise ChatError("n > 1 is not supported by this emulator", "BadRequestError", 400)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _invalid("stream", "Input should be a valid boolean", stream)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _invalid("chat_template_kwargs", "Input should be a valid dictionary", kwargs)
    if "chat_template" in kwargs:
        raise ChatError("Request-supplied chat_template is not allowed. Start the server "
                        "with --trust-request-chat-template to permit it.")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    options = body.get("stream_options") or {}
    max_new = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_new is not None and max_new < 0:
        raise ChatError("max_new_tokens must be at least 0, got " + str(max_new))
    temperature = body.get("temperature")
    sampling = {
        "temperature": 1.0 if temperature is None else float(temperature),
        "max_new_tokens": max_new,
        "stop": stop,
        "stop_token_ids": body.get("stop_token_ids"),
        "top_p": 1.0 if body.get("top_p") is None else float(body["top_p"]),
        "top_k": -1 if body.get("top_k") is None else body["top_k"],
        "min_p": 0.0 if body.get("min_p") is None else float(body["min_p"]),
        "repetition_penalty": body.get("repetition_penalty") or 1.0,
        "presence_penalty": float(body.get("presence_penalty") or 0.0),
        "ignore_eos": bool(body.get("ignore_eos", False)),
        "sampling_seed": body.get("seed"),
    }
    rid = body.get("rid")
    return ChatRequest(
        messages=checked, model=str(body.get("model") or "default"), stream=stream,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        sampling={k: v for k, v in sampling.items() if v is not None}, chat_template_kwargs=dict(kwargs),
        separate_reasoning=bool(body.get("separate_reasoning", True)), rid=rid if isinstance(rid, str) else None,
    )


class ChatTemplate:
    """The model dir's chat template, applied by the server (the tokenizer is loaded once, on first use)."""

    def __init__(self, args: dict[str, Any], model: ModelConfig) -> None:
        self.args = args
        self.model = model
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._loaded = False

    def _load(self) -> Any:
        with self._lock:
            if not self._loaded:
                self._loaded = True
                path = Path(self.args.get("tokenizer_path") or self.args["model_path"])
                if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
                    try:
                        from transformers import AutoTokenizer
                    except ModuleNotFoundError:
                        self._tokenizer = None
                    else:
                        self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            return self._tokenizer

    def prompt(self, request: ChatRequest) -> tuple[str, str | list[int]]:
        """("input_ids", ids) from the model's template, or ("text", ChatML) without a tokenizer."""
        tokenizer = self._load()
        messages = [{k: v for k, v in m.items() if v is not None} for m in request.messages]
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            try:
                ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                    return_dict=False, **request.chat_template_kwargs)
            except Exception as exc:  # noqa: BLE001 - a template error is the request's fault: a ValueError
                raise ChatError(f"{type(exc).__name__}: {exc}") from None
            return "input_ids", [int(i) for i in ids]
        text = "".join(f"{_FALLBACK_IM_START}{m['role']}\n{m.get('content') or ''}{_FALLBACK_IM_END}\n"
                       for m in messages)
        return "text", text + f"{_FALLBACK_IM_START}assistant\n"


def generate_request(request: ChatRequest, template: ChatTemplate, args: dict[str, Any],
                     model: ModelConfig) -> dict[str, Any]:
    """The /generate request SGLang's adapter builds from a chat request."""
    key, prompt = template.prompt(request)
    sampling = dict(request.sampling)
    if sampling.get("max_new_tokens") is None and key == "input_ids":
        sampling["max_new_tokens"] = max(0, context_len(args, model) - len(prompt) - 1)
    return {key: prompt, "rid": request.rid or uuid.uuid4().hex, "sampling_params": sampling,
            "return_hidden_states": False, "stream": request.stream}


def split_reasoning(text: str, parser: str | None, separate: bool) -> tuple[str, str | None]:
    """(content, reasoning_content) as a ``<think>`` reasoning parser splits a whole text."""
    if not parser or not separate:
        return text, None
    head, sep, tail = text.partition(_THINK_CLOSE)
    if sep:
        return tail.lstrip("\n"), head.replace(_THINK_OPEN, "", 1).strip("\n")
    if text.lstrip().startswith(_THINK_OPEN):  # still thinking (or cut by max_tokens)
        return "", text.replace(_THINK_OPEN, "", 1).lstrip("\n")
    return text, None


def _usage(meta: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = int(meta.get("prompt_tokens", 0)), int(meta.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": int(meta.get("reasoning_tokens", 0) or 0),
            "completion_tokens_details": None}


def _finish(meta: dict[str, Any]) -> tuple[str | None, Any]:
    reason = meta.get("finish_reason")
    if not isinstance(reason, dict):
        return None, None
    return reason.get("type"), reason.get("matched")


def chat_response(request: ChatRequest, response: dict[str, Any], parser: str | None) -> dict[str, Any]:
    """The non-streaming body from one /generate response."""
    meta = response.get("meta_info") or {}
    content, reasoning = split_reasoning(response.get("text") or "", parser, request.separate_reasoning)
    finish, matched = _finish(meta)
    return {
        "id": meta.get("id"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content or "", "reasoning_content": reasoning or None},
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched,
        }],
        "usage": _usage(meta),
        "metadata": {"weight_version": meta.get("weight_version", "default")},
    }


def _chunk(rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None = None,
           matched: Any = None) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                         "finish_reason": finish, "matched_stop": matched}]}


def stream_chunks(request: ChatRequest, responses: Iterator[dict[str, Any]],
                  parser: str | None) -> Iterator[dict[str, Any]]:
    """The SSE objects (without ``[DONE]``) from a stream of cumulative /generate responses."""
    created = int(time.time())
    sent_content, sent_reasoning = "", ""
    meta: dict[str, Any] = {}
    first = True
    for response in responses:
        meta = response.get("meta_info") or {}
        rid = str(meta.get("id"))
        if first:
            first = False
            yield _chunk(rid, created, request.model, {"role": "assistant", "content": ""})
        content, reasoning = split_reasoning(response.get("text") or "", parser, request.separate_reasoning)
        delta: dict[str, Any] = {}
        if reasoning and reasoning.startswith(sent_reasoning) and len(reasoning) > len(sent_reasoning):
            delta["reasoning_content"] = reasoning[len(sent_reasoning):]
            sent_reasoning = reasoning
        if content.startswith(sent_content) and len(content) > len(sent_content):
            delta["content"] = content[len(sent_content):]
            sent_content = content
        if delta:
            yield _chunk(rid, created, request.model, delta)
    finish, matched = _finish(meta)
    rid = str(meta.get("id"))
    if finish is not None:
        yield _chunk(rid, created, request.model, {}, finish, matched)
    if request.include_usage:
        yield {"id": rid, "object": "chat.completion.chunk", "created": created, "model": request.model,
               "choices": [], "usage": _usage(meta)}


def refusal(exc: RequestError) -> ChatError:
    """A generation the tokenizer manager refused (a ValueError in SGLang) as the chat endpoint answers it."""
    if exc.status == 400:
        return ChatError(str(exc))
    return ChatError(str(exc), str(exc.status), exc.status)
