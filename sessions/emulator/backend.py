"""`FixedBackend`: answers ``/generate`` without a model (a config-only model dir), with SGLang's shapes.

The backend contract (shared with the capture engineer's ``model_backend.ModelBackend``):
``Backend(model_dir, server_flags)`` and ``generate(request) -> response``, where ``request`` is one
SGLang ``/generate`` request (``text`` or ``input_ids``, ``rid``, ``sampling_params``,
``return_hidden_states``; a batch is split before it gets here) and the response is SGLang's
``{"text", "output_ids", "meta_info"}`` (sglang-facts §2.2).  ``flush_cache()`` clears the prefix cache.
A bad request raises `RequestError`, which the HTTP layer answers with 400.

The fixed backend tokenizes bytewise (one token per UTF-8 byte, id = byte + 3) and continues with a
fixed phrase whose starting point is a hash of the prompt, so the output is a deterministic function of
the input.  It keeps a radix-like prefix cache (``cached_tokens``), honours ``--disable-radix-cache``,
and returns deterministic hidden states (hidden_size wide, or K x hidden_size with aux capture) in
SGLang's layout when asked.  ``generate_steps`` yields one token per forward so that the emulator's
scheduler can batch requests and time each step (``cost_model``); ``generate`` runs one to its end.
"""

from __future__ import annotations

import collections
import uuid
import zlib
from collections.abc import Generator
from typing import Any, TypeVar

from sessions.emulator.model_config import load_model_config

_CONTINUATION = (
    b" Paris. This answer comes from the eagle3-tui emulator, which stands in for SGLang and has no "
    b"model weights, so every reply is a fixed continuation of the same sentence."
)
# With --emulate-thinking the model "thinks" first, as Qwen3 does with thinking on: its think block, then the
# answer.  A prompt that already closed the block (Qwen3's template with enable_thinking=false ends the
# generation prompt with an empty one) gets the answer only.
_THOUGHT = (b"<think>\nThe user asked something; the emulator has no weights, so it thinks this fixed "
            b"thought before it answers.\n</think>\n\n")
_CLOSED_THINK = b"</think>\n\n"
_BYTE_TOKEN_OFFSET = 3  # ids 0-2 are the usual special tokens
DEFAULT_MAX_NEW_TOKENS = 128  # sampling_params.py:149


_T = TypeVar("_T")


def drain(steps: Generator[int, None, _T]) -> _T:
    """Run a ``generate_steps`` generator to its end and return its final response."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


class RequestError(ValueError):
    """A request SGLang would refuse; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_context_length(input_tokens: int, max_new_tokens: int | None, context_len: int) -> None:
    """SGLang's two length checks, with its texts (tokenizer_manager.py:1333-1378, no auto-truncate): the
    prompt must be shorter than the context, and prompt + max_new_tokens must fit in it."""
    if input_tokens >= context_len:
        raise RequestError(f"The input ({input_tokens} tokens) is longer than the model's context length "
                           f"({context_len} tokens).")
    if max_new_tokens is not None and input_tokens + max_new_tokens > context_len:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {input_tokens + max_new_tokens} tokens: {input_tokens} tokens from the "
            f"input messages and {max_new_tokens} tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit.")


class PrefixCache:
    """Longest cached prefix of a prompt, like SGLang's radix cache (at least one token is recomputed).

    Every prefix of an inserted prompt is stored as a rolling hash, so "is ids[:k] cached" is monotonic
    in k and a binary search finds the match in O(len) hashing.  Oldest prompts are evicted past
    ``capacity_tokens``.
    """

    _MOD = (1 << 61) - 1
    _BASE = 1_000_003

    def __init__(self, enabled: bool, capacity_tokens: int = 2_000_000) -> None:
        self.enabled = enabled
        self.capacity_tokens = capacity_tokens
        self._counts: collections.Counter[int] = collections.Counter()
        self._order: collections.deque[list[int]] = collections.deque()
        self._size = 0

    def _hashes(self, ids: list[int]) -> list[int]:
        out, h = [], 0
        for token in ids:
            h = (h * self._BASE + token + 1) % self._MOD
            out.append(h)
        return out

    def match(self, ids: list[int]) -> int:
        if not self.enabled or len(ids) < 2:
            return 0
        hashes = self._hashes(ids)
        lo, hi = 0, len(ids) - 1  # schedule_batch.py:1766-1785: max_prefix_len = input_len - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._counts.get(hashes[mid - 1]):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def insert(self, ids: list[int]) -> None:
        if not self.enabled or not ids:
            return
        hashes = self._hashes(ids)
        self._counts.update(hashes)
        self._order.append(hashes)
        self._size += len(hashes)
        while self._size > self.capacity_tokens and len(self._order) > 1:
            old = self._order.popleft()
            self._counts.subtract(old)
            for h in old:
                if self._counts[h] <= 0:
                    del self._counts[h]
            self._size -= len(old)

    def clear(self) -> None:
        self._counts.clear()
        self._order.clear()
        self._size = 0


class FixedBackend:
    """The model-free ``/generate`` of the emulator (see the module docstring)."""

    def __init__(self, model_dir: str, server_flags: dict[str, Any]) -> None:
        model = load_model_config(model_dir)
        self.vocab_size = model.vocab_size
        self.context_len = server_flags.get("context_length") or model.context_len
        self.hidden_size = model.hidden_size
        self.hidden_width = model.hidden_size
        if server_flags.get("aux_hidden_state_capture"):
            self.set_eagle3_layers_to_capture(server_flags.get("emulator_layers_to_capture"))
        self.hidden_states_mode = server_flags.get("return_hidden_states_mode")
        self.skip_tokenizer_init = bool(server_flags.get("skip_tokenizer_init"))
        self.chunked_prefill_size = server_flags.get("chunked_prefill_size") or -1
        self.time_scale = float(server_flags.get("time_scale") or 0.0)
        self.prefix_cache = PrefixCache(enabled=not server_flags.get("disable_radix_cache"))
        self.thinking = bool(server_flags.get("emulate_thinking"))

    # -- tokens ---------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return [self._byte_to_id(b) for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        data = bytes(
            (i - _BYTE_TOKEN_OFFSET) for i in ids if _BYTE_TOKEN_OFFSET <= i < 256 + _BYTE_TOKEN_OFFSET
        )
        return data.decode("utf-8", errors="replace")

    def _byte_to_id(self, byte: int) -> int:
        return (byte + _BYTE_TOKEN_OFFSET) % max(1, self.vocab_size)

    # -- the request ----------------------------------------------------------------------------------

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """The whole request at once (no pacing: the emulator's scheduler times the steps)."""
        return drain(self.generate_steps(request))

    def generate_steps(self, request: dict[str, Any]) -> Generator[int, None, dict[str, Any]]:
        """Check the request now (RequestError), then one output token per ``next()``: the first is the
        prefill's, each later one a decode step's.  The generator returns SGLang's final response."""
        rid = request.get("rid") or uuid.uuid4().hex
        params = request.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise RequestError("sampling_params must be an object")
        max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
            raise RequestError(f"max_new_tokens must be a non-negative integer, got {max_new!r}")
        if "input_ids" in request and request["input_ids"] is not None:
            input_ids = [int(i) for i in request["input_ids"]]
        else:
            if self.skip_tokenizer_init:
                raise RequestError(
                    "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
                    "Please provide input_ids or re-initialize the engine with skip_tokenizer_init=False."
                )
            input_ids = self.encode(str(request.get("text") or ""))
        if not input_ids:
            raise RequestError("The input_ids is empty.")
        check_context_length(len(input_ids), max_new, self.context_len)
        want_hidden = bool(request.get("return_hidden_states"))
        if want_hidden and self.hidden_states_mode is None:
            raise RequestError(  # tokenizer_manager.py:1394-1410
                "The server is not configured to return hidden states. Please set "
                "`--return-hidden-states-mode last`, `--return-hidden-states-mode full`, or the legacy "
                "`--enable-return-hidden-states` flag."
            )
        self.last_prompt_len = len(input_ids)
        self.last_cached = self.prefix_cache.match(input_ids)
        return self._steps(rid, input_ids, max_new, want_hidden, self.last_cached)

    def _steps(
        self, rid: str, input_ids: list[int], max_new: int, want_hidden: bool, cached: int
    ) -> Generator[int, None, dict[str, Any]]:
        output_ids = self._continuation(input_ids, max_new)
        self.prefix_cache.insert(input_ids)
        yield from output_ids
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": {"type": "length", "length": max_new},
            "prompt_tokens": len(input_ids),
            "weight_version": "default",
            "num_retractions": 0,
            "completion_tokens": len(output_ids),
            "cached_tokens": cached,
        }
        if want_hidden:
            meta["hidden_states"] = self._hidden_states(input_ids, cached, output_ids)
        response: dict[str, Any] = {"output_ids": output_ids, "meta_info": meta}
        if not self.skip_tokenizer_init:
            response = {"text": self.decode(output_ids), **response}
        return response

    def detokenize(self, ids: list[int]) -> str | None:
        """The text of ``ids`` as the detokenizer sends it (None with --skip-tokenizer-init)."""
        return None if self.skip_tokenizer_init else self.decode(ids)

    def flush_cache(self) -> None:
        self.prefix_cache.clear()

    def set_eagle3_layers_to_capture(self, layers: list[int] | None) -> None:
        """Aux capture packs K layers: hidden states become K x hidden_size wide (sglang-facts §4.11)."""
        self.hidden_width = self.hidden_size * (len(layers) if layers else 3)

    def _continuation(self, input_ids: list[int], count: int) -> list[int]:
        start = zlib.crc32(",".join(map(str, input_ids)).encode()) % len(_CONTINUATION)
        thought = b""
        if self.thinking and not self.decode(input_ids[-len(_CLOSED_THINK):]).encode().endswith(_CLOSED_THINK):
            thought = _THOUGHT
        text = thought + bytes(_CONTINUATION[(start + i) % len(_CONTINUATION)] for i in range(count))
        return [self._byte_to_id(b) for b in text[:count]]

    def _hidden_states(self, input_ids: list[int], cached: int, output_ids: list[int]) -> list[Any]:
        """SGLang's layout: [extend rows of the last prefill chunk] then one vector per decode step."""
        new = len(input_ids) - cached
        chunk = self.chunked_prefill_size
        last_chunk = new if chunk <= 0 or new <= chunk else new - chunk * ((new - 1) // chunk)
        first = len(input_ids) - last_chunk
        rows: list[Any] = [[self._row(input_ids[p], p) for p in range(first, len(input_ids))]]
        for step, token in enumerate(output_ids[:-1]):
            rows.append(self._row(token, len(input_ids) + step))
        return rows

    def _row(self, token: int, position: int) -> list[float]:
        seed = token * 131 + position * 31
        return [((seed + j * 7) % 2003) / 1001.5 - 1.0 for j in range(self.hidden_width)]
