"""Chat rendering and the loss mask: the target model's own tokenizer and Jinja chat template, local files only.

The mask covers what the model produces when it is served: for each assistant turn, everything after the
generation-prompt render of the conversation so far, up to and including the end-of-turn marker.  So a
template whose generation prompt already holds boilerplate (Qwen3's ``<think>\\n\\n</think>`` with thinking
off) leaves that boilerplate unsupervised, as serving does (SpecForge PR #870 supervised it by mistake).

Where a template re-renders history differently (Qwen3 strips old reasoning), the generation-prompt render
is no longer a prefix of the full render; the turn is then found by its content and the template's own
end-of-turn suffix (probed once, with a sentinel).  No system prompt is added unless the job asks
(SpecForge injects one by default, SF PR #181); thinking mode is pinned: a template that reads
``enable_thinking`` needs the job to say ``thinking = true|false`` (SF #296, dflash #60).
"""
from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.extraction.datasets import DatasetRecord

_SENTINEL = "\u2063EAGLE3SENTINEL\u2063"
_THINKING_RE = re.compile(r"\benable_thinking\b|\bthinking\b")


class RenderError(ValueError):
    """This record cannot become a sample (the reason goes to errors.jsonl)."""

    status = "error"


class SkippedSample(RenderError):
    """Dropped on purpose (too long under ``on_too_long = "skip"``, nothing left to supervise)."""

    status = "skipped"


class RendererSetupError(RuntimeError):
    """The tokenizer or template cannot be used at all (the job fails before sending anything)."""


@dataclass(frozen=True)
class RenderedSample:
    index: int
    line: int
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    original_length: int  # tokens before truncation

    @property
    def truncated(self) -> bool:
        return self.original_length > len(self.input_ids)

    @property
    def supervised_tokens(self) -> int:
        return sum(self.loss_mask)


class ChatRenderer:
    """Turns dataset records into (input_ids, loss_mask) with the model's own tokenizer and template."""

    def __init__(self, tokenizer: Any, *, max_length: int, on_too_long: str = "truncate",
                 system_prompt: str | None = None, thinking: bool | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, model_path: Path | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.on_too_long = on_too_long
        self.system_prompt = system_prompt
        self.thinking = thinking
        self.model_path = model_path
        self._kwargs = dict(chat_template_kwargs or {})
        if thinking is not None:
            self._kwargs.setdefault("enable_thinking", thinking)
            self._kwargs.setdefault("thinking", thinking)
        self.template: str | None = getattr(tokenizer, "chat_template", None)
        if isinstance(self.template, dict):  # named templates: use "default"
            self.template = self.template.get("default")
        self.vocab_size = len(tokenizer)
        self._turn_suffix: str | None = None

    @classmethod
    def load(cls, model_path: Path, *, trust_remote_code: bool = False, **kwargs: Any) -> ChatRenderer:
        """Load the tokenizer from ``model_path`` without any network access."""
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(
                str(model_path), local_files_only=True, trust_remote_code=trust_remote_code
            )
        except Exception as exc:
            # AutoTokenizer also parses config.json, which fails for a model type this transformers does not
            # know; the tokenizer itself only needs tokenizer.json.
            if not (Path(model_path) / "tokenizer.json").is_file():
                raise RendererSetupError(f"cannot load the tokenizer from {model_path}: {exc}") from exc
            from transformers import PreTrainedTokenizerFast

            try:
                tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_path), local_files_only=True)
            except Exception as inner:  # noqa: BLE001 - as above
                raise RendererSetupError(f"cannot load the tokenizer from {model_path}: {inner}") from exc
        return cls(tokenizer, model_path=model_path, **kwargs)

    # -- checks ------------------------------------------------------------------------------------------
    def setup_problems(self, needs_template: bool) -> list[str]:
        """Why this renderer cannot serve the job (empty when it can)."""
        problems = []
        if needs_template and not self.template:
            problems.append(f"the tokenizer in {self.model_path} has no chat template; "
                            "chat datasets need the model's own template")
        if self.template and self.thinking is None and "thinking" not in self._kwargs \
                and _THINKING_RE.search(self.template):
            problems.append("the chat template reads a thinking switch (enable_thinking); pin the mode with "
                            "`thinking = true` or `thinking = false` in [job] so training matches serving")
        return problems

    def describe(self) -> dict[str, Any]:
        """What dataset.json records about rendering."""
        return {
            "tokenizer_class": type(self.tokenizer).__name__,
            "vocab_size": self.vocab_size,
            "chat_template_sha256": hashlib.sha256(self.template.encode()).hexdigest() if self.template else None,
            "system_prompt": self.system_prompt,
            "thinking": self.thinking,
            "chat_template_kwargs": {k: v for k, v in self._kwargs.items() if k not in ("thinking",)},
            "max_length": self.max_length,
            "on_too_long": self.on_too_long,
        }

    # -- rendering ---------------------------------------------------------------------------------------
    def render(self, record: DatasetRecord) -> RenderedSample:
        """One record → ids and mask, truncated or refused by the max-length policy."""
        if record.input_ids is not None:
            ids = list(record.input_ids)
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                raise RenderError(f"token id {bad} is outside the tokenizer's vocabulary ({self.vocab_size})")
            mask = list(record.loss_mask) if record.loss_mask is not None else [1] * len(ids)
        else:
            ids, mask = self._render_chat(list(record.messages), list(record.tools) if record.tools else None)
        original = len(ids)
        if original > self.max_length:
            if self.on_too_long == "skip":
                raise SkippedSample(f"{original} tokens > max_length {self.max_length} (on_too_long = skip)")
            ids, mask = ids[: self.max_length], mask[: self.max_length]
        if not any(mask):
            raise SkippedSample("no assistant tokens within max_length" if original > len(ids)
                                else "no supervised tokens")
        return RenderedSample(record.index, record.line, tuple(ids), tuple(mask), original)

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt, **self._kwargs
            )
        except Exception as exc:  # noqa: BLE001 - jinja2 raise_exception(), TemplateError...: the line is bad
            raise RenderError(f"chat template failed: {exc}") from None

    def _suffix(self) -> str:
        """The text a template puts after an assistant message (its end-of-turn marker)."""
        if self._turn_suffix is None:
            probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
            text = self._apply(probe, None, False)
            at = text.find(_SENTINEL)
            self._turn_suffix = text[at + len(_SENTINEL):] if at >= 0 else ""
        return self._turn_suffix

    def _render_chat(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> tuple[list[int], list[int]]:
        if not self.template:
            raise RenderError("the tokenizer has no chat template")
        if self.system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        full = self._apply(messages, tools, False)
        spans = self._assistant_spans(messages, tools, full)
        return self._tokenize_with_mask(full, spans)

    def _assistant_spans(self, messages: list[dict[str, Any]], tools: list[dict] | None,
                         full: str) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        cursor = 0
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            content = message["content"].strip()
            start = -1
            if k > 0:
                prefix = self._apply(messages[:k], tools, True)
                if full.startswith(prefix) and len(prefix) >= cursor:
                    start = len(prefix)
            if start < 0:  # history re-rendered differently: find the turn by its content
                start = full.find(content, cursor) if content else -1
                if start < 0:
                    raise RenderError(f"assistant turn {k} does not appear in the rendered conversation")
            end = -1
            upto = self._apply(messages[: k + 1], tools, False)
            if full.startswith(upto) and len(upto) > start:
                end = len(upto)
            else:
                suffix = self._suffix()
                at = full.find(content, start) if content else start
                stop = full.find(suffix, at + len(content)) if suffix and at >= 0 else -1
                if stop < 0:
                    raise RenderError(f"cannot find the end of assistant turn {k} in the rendered conversation")
                end = stop + len(suffix)
            if content and content not in full[start:end]:
                raise RenderError(f"assistant turn {k}: the template moved its text; cannot build the loss mask")
            spans.append((start, end))
            cursor = end
        return spans

    def _tokenize_with_mask(self, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        tok = self.tokenizer
        if getattr(tok, "is_fast", False):
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = list(enc["input_ids"])
            starts = [s for s, _ in spans]
            mask = []
            for char_start, _char_end in enc["offset_mapping"]:
                at = bisect.bisect_right(starts, char_start) - 1
                mask.append(1 if at >= 0 and char_start < spans[at][1] else 0)
            return ids, mask
        # Slow tokenizers have no offsets: encode the pieces between span edges, and insist that the pieces
        # join up to the whole-text encoding (true when the edges sit on special tokens, as they do).
        ids, mask, pos = [], [], 0
        for start, end in spans:
            for piece, flag in ((text[pos:start], 0), (text[start:end], 1)):
                piece_ids = tok.encode(piece, add_special_tokens=False) if piece else []
                ids.extend(piece_ids)
                mask.extend([flag] * len(piece_ids))
            pos = end
        tail = tok.encode(text[pos:], add_special_tokens=False) if text[pos:] else []
        ids.extend(tail)
        mask.extend([0] * len(tail))
        if ids != tok.encode(text, add_special_tokens=False):
            raise RenderError("tokens merge across an assistant-turn edge; this slow tokenizer needs offsets")
        return ids, mask
