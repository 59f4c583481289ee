"""Rendering with the model's own tokenizer and template: the loss mask covers each assistant turn up to and
including its end-of-turn marker, and nothing else.  Templates in the style of Llama-3, Qwen3 and Kimi-K2
are written for these tests (tests/_extract_support.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from _extract_support import make_tokenizer_dir, supervised_spans

from sessions.extraction.datasets import DatasetRecord
from sessions.extraction.rendering import ChatRenderer, RenderError, SkippedSample

CHAT = (
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "I am fine, thank you."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "It is 4."},
)
END_OF_TURN = {"llama3": "<|eot_id|>", "qwen3": "<|im_end|>\n", "kimi": "<|im_end|>"}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {style: make_tokenizer_dir(root / style, style) for style in END_OF_TURN}


def renderer(model_dirs: dict[str, Path], style: str, **kwargs) -> ChatRenderer:
    kwargs.setdefault("max_length", 4096)
    if style == "qwen3":
        kwargs.setdefault("thinking", False)
    return ChatRenderer.load(model_dirs[style], **kwargs)


def record(messages=CHAT, **kwargs) -> DatasetRecord:
    return DatasetRecord(index=0, line=1, kind="openai", messages=tuple(messages), **kwargs)


@pytest.mark.parametrize("style", sorted(END_OF_TURN))
def test_mask_covers_each_assistant_turn_and_its_end_of_turn_token(model_dirs, style: str) -> None:
    r = renderer(model_dirs, style)
    sample = r.render(record())
    eot = END_OF_TURN[style]
    assert supervised_spans(r.tokenizer, sample.input_ids, sample.loss_mask) == [
        "I am fine, thank you." + eot, "It is 4." + eot]
    # The ids are exactly what the template tokenizes to (what the server would see for this chat).
    expected = r.tokenizer.apply_chat_template(list(CHAT), tokenize=True, **r._kwargs)["input_ids"]
    assert list(sample.input_ids) == list(expected)


@pytest.mark.parametrize("style", sorted(END_OF_TURN))
def test_no_system_prompt_is_injected_unless_asked(model_dirs, style: str) -> None:
    plain = renderer(model_dirs, style)
    text = plain.tokenizer.decode(list(plain.render(record()).input_ids))
    assert "You are a helpful assistant" not in text
    asked = renderer(model_dirs, style, system_prompt="You are a helpful assistant.")
    sample = asked.render(record())
    assert "You are a helpful assistant" in asked.tokenizer.decode(list(sample.input_ids))
    assert all("helpful" not in span for span in supervised_spans(asked.tokenizer, sample.input_ids,
                                                                  sample.loss_mask))


def test_thinking_mode_must_be_pinned_when_the_template_reads_it(model_dirs) -> None:
    unpinned = ChatRenderer.load(model_dirs["qwen3"], max_length=4096)
    assert any("thinking" in p for p in unpinned.setup_problems(needs_template=True))
    assert renderer(model_dirs, "kimi").setup_problems(needs_template=True) == []


def test_qwen3_thinking_off_leaves_the_empty_think_block_unsupervised(model_dirs) -> None:
    off = renderer(model_dirs, "qwen3", thinking=False)
    sample = off.render(record())
    text = off.tokenizer.decode(list(sample.input_ids))
    assert "<think>\n\n</think>\n\nIt is 4." in text  # the block is in the prompt, as serving renders it
    assert supervised_spans(off.tokenizer, sample.input_ids, sample.loss_mask)[-1] == "It is 4.<|im_end|>\n"
    on = renderer(model_dirs, "qwen3", thinking=True)
    sample = on.render(record())
    assert supervised_spans(on.tokenizer, sample.input_ids, sample.loss_mask)[-1] == (
        "<think>\n\n</think>\n\nIt is 4.<|im_end|>\n")  # with thinking on, the model writes the block


def test_history_reasoning_stripped_by_the_template_still_masks_the_right_turns(model_dirs) -> None:
    chat = list(CHAT)
    chat[1] = {**chat[1], "reasoning_content": "the user greets"}
    chat[3] = {**chat[3], "reasoning_content": "add them"}
    r = renderer(model_dirs, "qwen3", thinking=True)
    sample = r.render(record(chat))
    text = r.tokenizer.decode(list(sample.input_ids))
    assert "the user greets" not in text  # the template strips reasoning from history turns
    assert supervised_spans(r.tokenizer, sample.input_ids, sample.loss_mask) == [
        "I am fine, thank you.<|im_end|>\n", "<think>\nadd them\n</think>\n\nIt is 4.<|im_end|>\n"]


def test_max_length_truncates_or_skips(model_dirs) -> None:
    full = renderer(model_dirs, "llama3").render(record())
    cut = renderer(model_dirs, "llama3", max_length=len(full.input_ids) - 3).render(record())
    assert cut.input_ids == full.input_ids[:-3] and cut.loss_mask == full.loss_mask[:-3]
    assert cut.truncated and cut.original_length == len(full.input_ids)
    with pytest.raises(SkippedSample, match="max_length"):
        renderer(model_dirs, "llama3", max_length=len(full.input_ids) - 1, on_too_long="skip").render(record())
    first_assistant = full.loss_mask.index(1)
    with pytest.raises(SkippedSample, match="no assistant tokens"):
        renderer(model_dirs, "llama3", max_length=first_assistant).render(record())


def test_pretokenized_records_keep_their_mask_and_are_checked_against_the_vocabulary(model_dirs) -> None:
    r = renderer(model_dirs, "kimi")
    sample = r.render(DatasetRecord(0, 1, "tokenized", input_ids=(5, 6, 7), loss_mask=(0, 1, 1)))
    assert sample.input_ids == (5, 6, 7) and sample.loss_mask == (0, 1, 1)
    assert r.render(DatasetRecord(0, 1, "tokenized", input_ids=(5, 6))).loss_mask == (1, 1)
    with pytest.raises(RenderError, match="outside the tokenizer's vocabulary"):
        r.render(DatasetRecord(0, 1, "tokenized", input_ids=(5, r.vocab_size)))


def test_a_template_that_raises_is_a_line_error(model_dirs) -> None:
    r = renderer(model_dirs, "llama3")
    r.tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(RenderError, match="roles must alternate"):
        r.render(record())
