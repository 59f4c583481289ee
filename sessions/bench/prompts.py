"""Seeded random-id prompts, shaped like ``bench_serving --dataset-name random-ids`` with range ratio 1.

bench_serving draws one offset per prompt and uses ids ``(offset + i + j) % vocab_size`` (datasets/random.py);
the same rule here, from Python's own seeded generator, so every concurrency and every profile of one bench
gets exactly the same prompts for one seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    input_ids: tuple[int, ...]
    output_len: int

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
