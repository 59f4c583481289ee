"""The bench's prompts: seeded random ids (as ``bench_serving --dataset-name random-ids``, range ratio 1), or a
dataset's real text (`dataset_prompts`).

bench_serving draws one offset per prompt and uses ids ``(offset + i + j) % vocab_size`` (datasets/random.py);
the same rule here, from Python's own seeded generator, so every concurrency and every profile of one bench
gets exactly the same prompts for one seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    """Random ids (``input_ids``), or a dataset's text (``text``; the server tokenizes it and reports its
    length as ``meta_info.prompt_tokens``, which then counts)."""

    input_ids: tuple[int, ...]
    output_len: int
    text: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)


def random_id_prompts(num: int, input_len: int, output_len: int, vocab_size: int, seed: int) -> list[Prompt]:
    """``num`` prompts of ``input_len`` ids each (ids in [0, vocab_size)), each asking for ``output_len``."""
    if num < 1 or input_len < 1 or output_len < 1:
        raise ValueError(f"num, input_len and output_len must be >= 1, not {num}, {input_len}, {output_len}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, not {vocab_size}")
    rng = random.Random(seed)
    offsets = [rng.randrange(vocab_size) for _ in range(num)]
    return [
        Prompt(tuple((offsets[i] + i + j) % vocab_size for j in range(input_len)), output_len)
        for i in range(num)
    ]


# The demo's A/B prompts: 52 short real-text chats (questions and their replies) written for this project,
# in ShareGPT form; `eagle3-tui --demo bench compare` uses them unless --dataset says otherwise.
DEMO_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "bench_prompts.jsonl"
MAX_DATASET_LINES = 100_000  # lines read from a --dataset file; a bench uses a few hundred prompts
MAX_PROMPT_BYTES = 64 << 10  # a longer first turn is skipped, named
BYTES_PER_TOKEN = 4  # the common rule of thumb for BPE tokenizers on English text


@dataclass(frozen=True)
class DatasetPrompts:
    prompts: tuple[Prompt, ...]
    usable: int  # prompts the file gave, before taking ``num``
    kind: str  # "sharegpt" | "openai" | "tokenized" (of the first usable line)
    problems: tuple[str, ...]  # "line N: reason" of the lines that gave no prompt (the first few)


def dataset_prompts(path: str, num: int, output_len: int, seed: int) -> DatasetPrompts:
    """Real prompts from a ShareGPT or OpenAI-messages JSONL (the readers of extraction,
    `sessions.extraction.datasets`): each line's first user turn, sent as text as bench_serving's sharegpt
    dataset sends it (no chat template); a pre-tokenized line's ``input_ids`` as they are.  The output
    length is that of the reference reply (the turn after it), capped at ``output_len``; without a tokenizer
    (the TUI loads none) it is estimated as the reply's UTF-8 bytes / 4, and it is ``output_len`` when the
    line has no reply.  The usable prompts are shuffled with ``seed`` (bench_serving samples its dataset
    too) and the first ``num`` taken, so one seed gives both sides of an A/B the same prompts."""
    from sessions.extraction.datasets import DatasetLineError, iter_dataset

    usable: list[Prompt] = []
    problems: list[str] = []
    kind = ""
    for item in iter_dataset(Path(path).expanduser(), limit=MAX_DATASET_LINES):
        if isinstance(item, DatasetLineError):
            problems.append(f"line {item.line}: {item.reason}")
            continue
        prompt, problem = _prompt_of(item, output_len)
        if prompt is None:
            problems.append(f"line {item.line}: {problem}")
            continue
        kind = kind or item.kind
        usable.append(prompt)
    if not usable:
        first = f" ({problems[0]})" if problems else " (the file has no non-blank line)"
        raise ValueError(f"--dataset {path}: no usable prompt{first}")
    random.Random(seed).shuffle(usable)
    return DatasetPrompts(tuple(usable[:num]), len(usable), kind, tuple(problems[:5]))


def _prompt_of(record: object, output_len: int) -> tuple[Prompt | None, str]:
    ids = getattr(record, "input_ids", None)
    if ids is not None:
        if not ids:
            return None, "empty input_ids"
        return Prompt(tuple(ids), output_len), ""
    messages = list(getattr(record, "messages", ()) or ())
    for i, message in enumerate(messages):
        if message.get("role") != "user" or not str(message.get("content") or "").strip():
            continue
        text = str(message["content"])
        size = len(text.encode("utf-8"))
        if size > MAX_PROMPT_BYTES:
            return None, f"first user turn of {size} bytes, more than {MAX_PROMPT_BYTES}"
        reply = next((str(m.get("content") or "") for m in messages[i + 1:] if m.get("role") == "assistant"), "")
        wanted = output_len
        if reply:
            wanted = min(output_len, max(1, -(-len(reply.encode("utf-8")) // BYTES_PER_TOKEN)))
        return Prompt((), wanted, text=text), ""
    return None, "no user turn with text"
