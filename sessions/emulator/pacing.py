"""How long each step of an emulated start takes, and the time scale that shrinks it.

The reference durations are the proportions of a Kimi-K2.5 TP8 start on H200s: interpreter and config
~15 s, NCCL init ~6 s, weights ~5 min (≈0.25 GB/s per rank), KV pool a few seconds, prefill graphs
~15 s, decode graphs (52 batch sizes) ~1 min, uvicorn and warmup a few seconds.  ``--time-scale``
multiplies all of them: 0.05 gives a ~20-30 s demo start, 0.002 a start of about a second.
The waits that SGLang itself takes on shutdown and crash (the 5 s drain poll, the 60 s coredump wait)
are scaled the same way.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

# Main process: interpreter start, config resolution, up to the server_args dump.
MAIN_RESOLVE_S = 4.0
# TokenizerManager construction in the main process (in parallel with the ranks' loading).
TOKENIZER_INIT_S = 2.0
# Each scheduler child: interpreter start and imports before "Init parallel begin."
SCHEDULER_BOOT_S = 10.0
INIT_PARALLEL_S = 6.0
# Per rank, reading its slice of the checkpoint (Kimi-K2.5 TP8: ~74 GB in ~5 minutes).
WEIGHT_LOAD_GB_PER_S = 0.25
WEIGHT_LOAD_MIN_S = 2.0
SLOW_WEIGHTS_FACTOR = 5.0
KV_CACHE_S = 3.0
PREFILL_GRAPH_S = 15.0
DECODE_GRAPH_S = 60.0
UVICORN_START_S = 1.0
WARMUP_S = 2.0
# Serving (prefill and decode forwards) is not time-scaled: see `cost_model.DecodeCostModel`.
# SGLang's own waits (sglang-facts §6, §7).
INIT_DEATH_POLL_S = 5.0  # engine.py: scheduler death during init is checked every 5 s
WATCHDOG_POLL_S = 1.0  # SubprocessWatchdog
DRAIN_POLL_S = 5.0  # sigterm_watchdog
SHUTDOWN_WAIT_S = 15.0  # schedulers still alive 15 s after ShutdownReq
CRASH_SETTLE_S = 5.0  # "Sleeping 5 seconds before crash diagnostics"
# crash-while-serving: a rank fails this long after ready when no client request came first.
CRASH_AFTER_READY_S = 60.0
CRASH_AFTER_READY_MIN_WALL_S = 2.0


@dataclass(frozen=True)
class Pacing:
    """Scaled sleeps.  ``jitter`` spreads the ranks a little, as real ranks never finish together."""

    time_scale: float
    jitter: float = 1.0

    @classmethod
    def for_rank(cls, time_scale: float, rank: int) -> Pacing:
        return cls(time_scale, random.Random(1000 + rank).uniform(0.92, 1.08))

    def scaled(self, reference_s: float) -> float:
        return max(0.0, reference_s * self.time_scale * self.jitter)

    def sleep(self, reference_s: float) -> None:
        seconds = self.scaled(reference_s)
        if seconds > 0:
            time.sleep(seconds)

    def poll_interval(self, reference_s: float, floor_s: float = 0.02) -> float:
        """A scaled polling period that never spins."""
        return max(floor_s, self.scaled(reference_s))
