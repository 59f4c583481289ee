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
* ``--reasoning-parser`` (the ``<think>``/``</think>`` parsers): the answer is split as
  ``BaseReasoningFormatDetector.detect_and_parse`` does (parser/reasoning_parser.py:160-204) with the
  ``force_reasoning`` serving_chat.py:2931-2944 passes.  Reasoning is forced for ``deepseek-r1``-like
  parsers always, for ``qwen3``-like ones unless ``chat_template_kwargs.enable_thinking`` is false, for
  ``kimi_k2`` unless ``thinking`` is false (`_get_reasoning_from_request`'s parser defaults; the template
  rules of template_detection.py are not modelled).  Forced or with ``<think>`` in the text: everything up
  to the first ``</think>`` is ``reasoning_content`` (all of it when there is no ``</think>``: cut by
  max_tokens), the rest is ``content``, neither stripped; an empty reasoning is ``null``.  Not split when
  the request sets ``separate_reasoning: false``.
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
        text += f"{_FALLBACK_IM_START}assistant\n"
        if request.chat_template_kwargs.get("enable_thinking") is False:
            text += f"{_THINK_OPEN}\n\n{_THINK_CLOSE}\n\n"  # Qwen3's template closes the think block
        return "text", text


def generate_request(request: ChatRequest, template: ChatTemplate, args: dict[str, Any],
                     model: ModelConfig) -> dict[str, Any]:
    """The /generate request SGLang's adapter builds from a chat request."""
    key, prompt = template.prompt(request)
    sampling = dict(request.sampling)
    if sampling.get("max_new_tokens") is None and key == "input_ids":
        sampling["max_new_tokens"] = max(0, context_len(args, model) - len(prompt) - 1)
    return {key: prompt, "rid": request.rid or uuid.uuid4().hex, "sampling_params": sampling,
            "return_hidden_states": False, "stream": request.stream}


# SGLang 0.5.23's <think>/</think> detectors (reasoning_parser.py DetectorMap), by how they force reasoning.
_ALWAYS_THINKS = ("deepseek-r1", "step3", "step3p5", "gigachat35", "qwen3-thinking", "minimax")
_THINKS_UNLESS_DISABLED = {"qwen3": "enable_thinking", "dots": "enable_thinking", "nanbeige": "enable_thinking",
                           "interns1": "enable_thinking", "glm45": "enable_thinking", "kimi_k2": "thinking"}
_TOOL_START = {"qwen3": "<tool_call>", "kimi_k2": "<|tool_calls_section_begin|>"}
REASONING_PARSERS = (*_ALWAYS_THINKS, *_THINKS_UNLESS_DISABLED)


def reasoning_forced(parser: str, kwargs: dict[str, Any]) -> bool:
    """Whether the parser reads the answer as reasoning from its first token (no ``<think>`` needed)."""
    if parser in _ALWAYS_THINKS:
        return True
    toggle = _THINKS_UNLESS_DISABLED.get(parser)
    return toggle is not None and kwargs.get(toggle) is not False


def split_reasoning(text: str, parser: str | None, separate: bool,
                    kwargs: dict[str, Any] | None = None) -> tuple[str, str | None]:
    """(content, reasoning_content) of a whole answer, as SGLang's reasoning parser splits it."""
    if not parser or not separate or parser not in REASONING_PARSERS:
        return text, None
    if not (reasoning_forced(parser, kwargs or {}) or _THINK_OPEN in text):
        return text, None
    while text.startswith(_THINK_OPEN):
        text = text[len(_THINK_OPEN):]
    if _THINK_CLOSE not in text:
        tool = _TOOL_START.get(parser)
        at = text.find(tool) if tool else -1
        if at != -1:  # a tool call ends the reasoning without </think>
            return text[at:], text[:at] or None
        return "", text or None  # still thinking: cut by max_tokens
    reasoning, _, content = text.partition(_THINK_CLOSE)
    return content, reasoning or None


def _partial_marker(text: str, parser: str | None) -> int:
    """The length of the longest tail of ``text`` that is a proper prefix of a marker of the parser."""
    if not parser or parser not in REASONING_PARSERS:
        return 0
    markers = [m for m in (_THINK_OPEN, _THINK_CLOSE, _TOOL_START.get(parser)) if m]
    return max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)


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
    content, reasoning = split_reasoning(response.get("text") or "", parser, request.separate_reasoning,
                                         request.chat_template_kwargs)
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
    sent = {"content": "", "reasoning_content": ""}
    meta: dict[str, Any] = {}
    first = True
    text = ""

    def delta_of(shown: str) -> dict[str, Any]:
        """What ``shown`` (the text so far) adds to what was sent, split by the reasoning parser."""
        content, reasoning = split_reasoning(shown, parser, request.separate_reasoning, request.chat_template_kwargs)
        delta: dict[str, Any] = {}
        for key, now in (("reasoning_content", reasoning or ""), ("content", content)):
            if now.startswith(sent[key]) and len(now) > len(sent[key]):
                delta[key] = now[len(sent[key]):]
                sent[key] = now
        return delta

    for response in responses:
        meta = response.get("meta_info") or {}
        rid = str(meta.get("id"))
        if first:
            first = False
            yield _chunk(rid, created, request.model, {"role": "assistant", "content": ""})
        text = response.get("text") or ""
        # The detector holds back a tail that may be the start of a marker (reasoning_parser.py:226-290):
        # "<thi" is not sent as reasoning before the next tokens say whether it is "<think>".
        delta = delta_of(text[: len(text) - _partial_marker(text, parser)])
        if delta:
            yield _chunk(rid, created, request.model, delta)
    delta = delta_of(text)  # the generation ended: nothing more can complete a held-back marker
    rid = str(meta.get("id"))
    if delta:
        yield _chunk(rid, created, request.model, delta)
    finish, matched = _finish(meta)
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
