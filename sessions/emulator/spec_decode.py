"""EAGLE/EAGLE3 speculative decoding while serving: how many tokens each verify step yields, and its cost.

SGLang 0.5.23's EAGLE worker replaces the plain decode step with one cycle per running batch: the draft
model runs ``--speculative-num-steps`` forwards to propose tokens, then the target runs one **verify**
forward over ``--speculative-num-draft-tokens`` positions per request and keeps the longest prefix that
matches its own greedy choice, plus the **bonus** token it samples after that prefix.  So each request gets
between 1 and ``num_steps + 1`` tokens per cycle (never more than num-draft-tokens); SGLang calls that the
*accept length* (``accept_lens`` = accepted drafts + 1, managers/utils.py).

The emulator cannot know what an untrained demo draft would propose, so acceptance is a setting and the
cost is modelled (`SpecDecoding`):

* **Accept length.**  ``[emulator] spec_accept_length`` (``--emulate-spec-accept-length``) is the mean
  accept length, from 1 to the most a step can yield.  Each request's accepted length in each step is drawn
  as a draft chain: after the bonus position, each next draft is accepted with probability ``p`` if the
  previous one was, so the length is truncated-geometric, ``mean = (1 - p**K) / (1 - p)`` with ``K`` the
  most a step can yield; ``p`` is solved from the mean.  The draws come from ``random.Random(random_seed)``
  (SGLang's ``--random-seed``), so a server started with the same seed accepts the same lengths.  Unset,
  the mean is that of ``p = 0.5``.
* **Cost of a cycle** = ``verify_cost x step(bs) + num_steps x draft_cost x step(bs)``, where ``step(bs)`` is
  the plain decode step of the same batch (`cost_model.DecodeCostModel.decode_step_s`).  ``verify_cost``
  (``[emulator] spec_verify_cost``, default 1.1) says a verify forward over a few positions costs a little
  more than a one-token step (decode is memory-bound: the weights are read once either way).
  ``draft_cost`` (``[emulator] spec_draft_cost``) defaults to `speculative.draft_step_cost` of the draft's
  config: the ratio of weights the draft reads to the target's, plus the fixed cost of any forward (kernel
  launches, sampling), a tenth of a target step.
* **Break-even.**  Per token a cycle costs ``(verify_cost + num_steps x draft_cost) / accept_length`` plain
  steps, so the drafter helps only when the accept length exceeds ``verify_cost + num_steps x draft_cost``.
  With the demo's tiny-llama drafter (3 steps, draft cost 0.28) that is about 1.94: an accept length of
  1.3 serves at about 0.67x, 3.0 at about 1.55x.

The tokens stay the target's greedy tokens: an accepted length of ``n`` means ``n`` more of the target's
own tokens in this step (the real tiny model computes each one inside the step's modelled time), truncated
at ``max_new_tokens`` or a stop as SGLang truncates spec overshoot.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from sessions.emulator.args import DEFAULT_SPEC_VERIFY_COST

DEFAULT_CHAIN_ACCEPT_P = 0.5


def chain_mean(p: float, most: int) -> float:
    """Mean accept length when each further draft is accepted with probability ``p`` (at most ``most``)."""
    if p >= 1.0:
        return float(most)
    return (1.0 - p**most) / (1.0 - p)


def solve_chain_p(mean: float, most: int) -> float:
    """The per-draft acceptance probability whose chain mean is ``mean`` (bisection; the mean is monotone)."""
    if most <= 1 or mean <= 1.0:
        return 0.0
    if mean >= most:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if chain_mean(mid, most) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


_DRAW_BLOCK = 16  # draws per stratified block (see SpecDecoding.draw)


@dataclass
class SpecDecoding:
    """One server's speculative-decoding model (see the module docstring)."""

    num_steps: int
    num_draft_tokens: int
    accept_length: float
    verify_cost: float
    draft_cost: float
    seed: int = 0
    _p: float = field(init=False)
    _rng: random.Random = field(init=False)
    _block: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.accept_length = min(max(1.0, self.accept_length), float(self.most))
        self._p = solve_chain_p(self.accept_length, self.most)
        self._rng = random.Random(self.seed)

    @property
    def most(self) -> int:
        """The most tokens one verify step can yield per request: the draft chain's depth + the bonus."""
        return max(1, min(self.num_draft_tokens, self.num_steps + 1))

    @property
    def cycle_cost(self) -> float:
        """One draft + verify cycle, in plain decode steps of the same batch."""
        return self.verify_cost + self.num_steps * self.draft_cost

    @property
    def break_even_accept_length(self) -> float:
        return self.cycle_cost

    def draw(self) -> int:
        """One request's accept length in one verify step (accepted drafts + the bonus token).

        Draws come in shuffled blocks that cover the distribution stratum by stratum (a Latin-hypercube
        sample of the chain's inverse CDF): each single draw still has the chain's distribution, but the
        mean over a few dozen steps lands close to the setting, as a real drafter's long-run accept length
        does, instead of wandering by +-0.4 over a short bench."""
        if not self._block:
            size = _DRAW_BLOCK
            strata = [(i + self._rng.random()) / size for i in range(size)]
            self._rng.shuffle(strata)
            self._block = [self._inverse_cdf(u) for u in strata]
        return self._block.pop()

    def _inverse_cdf(self, u: float) -> int:
        # P(length >= k) = p**(k-1): the length is the largest k whose tail probability exceeds u.
        n = 1
        while n < self.most and u < self._p ** n:
            n += 1
        return n

    @classmethod
    def from_server(cls, args: dict[str, Any], options: Any, target_params: int,
                    draft_config: dict[str, Any] | None) -> SpecDecoding:
        """From the resolved server args, the emulator options and the draft's config."""
        from sessions.emulator.speculative import draft_step_cost

        steps = int(args["speculative_num_steps"])
        tokens = int(args["speculative_num_draft_tokens"] or steps + 1)
        most = max(1, min(tokens, steps + 1))
        accept = options.spec_accept_length
        if accept is None:
            accept = chain_mean(DEFAULT_CHAIN_ACCEPT_P, most)
        draft = options.spec_draft_cost
        if draft is None:
            draft = draft_step_cost(target_params, draft_config or {})
        verify = options.spec_verify_cost if options.spec_verify_cost is not None else DEFAULT_SPEC_VERIFY_COST
        seed = args.get("random_seed")
        return cls(steps, tokens, float(accept), float(verify), float(draft), int(seed or 0))
