"""How long one forward of the emulated server takes: the decode step and the prefill.

The model is deliberately small, so a user can reason about the numbers it produces:

* **Decode step** (one token per running request).  At batch 1 a step lasts ``1 / decode_tokens_per_s``:
  the single-stream rate, which for a memory-bound MoE decode is the time to stream the active weights
  once (the seeds' Kimi-K2.5 TP8 on H200s: 90 tok/s).  Each further request in the batch adds
  ``batch_cost_per_req`` of that time (its KV reads, attention and the larger expert spread), so
  ``step(bs) = step(1) * (1 + batch_cost_per_req * (bs - 1))``.  With the default 0.04 a batch of 32 takes
  2.24x as long as a batch of 1 and yields 14x the tokens: throughput grows with concurrency, with
  diminishing returns, while each stream slows down a little, as on a real server.
* **Prefill** of ``n`` new (uncached) tokens costs one decode step (the weights are read once, as in a
  decode) plus ``n / prefill_tokens_per_s``: longer prompts take proportionally longer.
* **Speculative decoding**: one draft + verify cycle costs ``verify_cost + num_steps x draft_cost``
  decode steps of the same batch and yields a drawn accept length per request (`spec_decode`).

With a real model backend (the tiny demo model) the real forward runs inside the modelled step and the
step lasts the longer of the two (`step_deadline`).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DECODE_TOKENS_PER_S = 90.0  # the seeds' single-stream Kimi-K2.5 TP8 figure under SGLang
DEFAULT_PREFILL_TOKENS_PER_S = 20000.0
DEFAULT_BATCH_COST_PER_REQ = 0.04


@dataclass(frozen=True)
class DecodeCostModel:
    """Modelled seconds per forward (see the module docstring for the formulas)."""

    decode_tokens_per_s: float = DEFAULT_DECODE_TOKENS_PER_S
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    batch_cost_per_req: float = DEFAULT_BATCH_COST_PER_REQ

    def __post_init__(self) -> None:
        for name in ("decode_tokens_per_s", "prefill_tokens_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)}")
        for name in ("batch_cost_per_req",):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")

    def decode_step_s(self, batch_size: int) -> float:
        """One decode forward of ``batch_size`` requests (one new token each)."""
        extra = max(0, batch_size - 1)
        return (1.0 + self.batch_cost_per_req * extra) / self.decode_tokens_per_s

    def prefill_s(self, new_tokens: int) -> float:
        """One prefill (extend) forward over ``new_tokens`` uncached prompt tokens."""
        return self.decode_step_s(1) + max(0, new_tokens) / self.prefill_tokens_per_s


def step_deadline(started_at: float, modelled_s: float) -> float:
    """When a step that began at ``started_at`` ends: the modelled time, or later if the real work took
    longer (the caller sleeps until this deadline after doing the real work)."""
    return started_at + modelled_s
