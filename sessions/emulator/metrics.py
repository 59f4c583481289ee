"""``GET /metrics`` of the emulated server (``--enable-metrics``): SGLang 0.5.23's Prometheus names.

Scheduler-side gauges (``sglang:num_running_reqs``, ``sglang:gen_throughput``, ``sglang:token_usage``, ...)
carry the labels ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`` and take TP0's values from its
stats lines (metrics_collector.py:364-455).  Tokenizer-side counters and histograms
(``sglang:prompt_tokens_total``, ``sglang:time_to_first_token_seconds``, ...) carry ``model_name,
engine_type`` (+ ``is_streaming`` where SGLang has it) and are updated here as requests finish.  The text
is Prometheus' exposition format 0.0.4, as prometheus_client writes it.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

# Bucket bounds as SGLang's defaults (metrics_collector.py:1965-2072).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
                200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
               400.0, 600.0, 1200.0, 1800.0, 2400.0)

_GAUGES = (
    ("num_running_reqs", "The number of running requests."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("token_usage", "The token usage."),
    ("num_used_tokens", "The number of used tokens."),
    ("kv_used_tokens", "KV cache tokens in use."),
    ("kv_available_tokens", "KV cache tokens available."),
    ("kv_evictable_tokens", "KV cache tokens held by the radix cache and evictable."),
    ("cache_hit_rate", "The prefix cache hit rate."),
    ("spec_accept_length", "The average acceptance length of speculative decoding."),
    ("spec_accept_rate", "The average acceptance rate of speculative decoding."),
    ("spec_num_steps", "The number of speculative decoding steps."),
    ("spec_num_draft_tokens", "The number of speculative draft tokens."),
)


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(running)}')
        running += self.counts[-1]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(running)}')
        out.append(f"{name}_count{{{labels}}} {float(running)}")
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        return out


class ServingMetrics:
    """What /metrics reports; updated by the HTTP threads and TP0's reader thread."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self.gauges: dict[str, float] = {name: 0.0 for name, _ in _GAUGES}
        self.realtime = {"prefill_compute": 0, "prefill_cache": 0, "decode": 0}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.spec_verify_calls = 0
        self.requests: dict[str, int] = {"true": 0, "false": 0}
        self.ttft: dict[str, _Histogram] = {k: _Histogram(TTFT_BUCKETS) for k in ("true", "false")}
        self.e2e: dict[str, _Histogram] = {k: _Histogram(E2E_BUCKETS) for k in ("true", "false")}
        self.itl = _Histogram(ITL_BUCKETS)
        self.tpot = _Histogram(ITL_BUCKETS)

    def on_scheduler(self, rank: int, values: dict[str, Any]) -> None:
        with self._lock:
            for name in self.gauges:
                if name in values:
                    self.gauges[name] = float(values[name])
            self.realtime["decode"] = int(values.get("realtime_decode_tokens", self.realtime["decode"]))
            self.realtime["prefill_compute"] = int(
                values.get("realtime_prefill_tokens", self.realtime["prefill_compute"])
            )
            self.realtime["prefill_cache"] = int(
                values.get("realtime_cached_tokens", self.realtime["prefill_cache"])
            )

    def on_first_token(self, streaming: bool, ttft_s: float) -> None:
        with self._lock:
            self.ttft["true" if streaming else "false"].observe(ttft_s)

    def on_tokens(self, interval_s: float, new_tokens: int) -> None:
        """One output batch: ``new_tokens`` observations of interval/new_tokens (metrics_collector.py:2161)."""
        if new_tokens > 0:
            with self._lock:
                self.itl.observe(interval_s / new_tokens, new_tokens)

    def on_finish(self, streaming: bool, prompt: int, completion: int, e2e_s: float, decode_s: float,
                  spec_verify_ct: int = 0) -> None:
        key = "true" if streaming else "false"
        with self._lock:
            self.spec_verify_calls += spec_verify_ct
            self.prompt_tokens += prompt
            self.generation_tokens += completion
            self.requests[key] += 1
            self.e2e[key].observe(e2e_s)
            if completion > 1:
                self.tpot.observe(decode_s / (completion - 1))

    def render(self) -> str:
        model = self.model_name.replace("\\", "\\\\").replace('"', '\\"')
        sched = f'model_name="{model}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        tok = f'model_name="{model}",engine_type="unified"'
        out: list[str] = []
        with self._lock:
            for name, doc in _GAUGES:
                out += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} gauge",
                        f"sglang:{name}{{{sched}}} {self.gauges[name]}"]
            out += ["# HELP sglang:realtime_tokens_total Tokens processed, by mode.",
                    "# TYPE sglang:realtime_tokens_total counter"]
            for mode, value in self.realtime.items():
                out.append(f'sglang:realtime_tokens_total{{{sched},mode="{mode}"}} {float(value)}')
            out += ["# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
                    "# TYPE sglang:prompt_tokens_total counter",
                    f"sglang:prompt_tokens_total{{{tok}}} {float(self.prompt_tokens)}",
                    "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
                    "# TYPE sglang:generation_tokens_total counter",
                    f"sglang:generation_tokens_total{{{tok}}} {float(self.generation_tokens)}",
                    "# HELP sglang:spec_verify_calls_total Number of speculative verify calls.",
                    "# TYPE sglang:spec_verify_calls_total counter",
                    f"sglang:spec_verify_calls_total{{{tok}}} {float(self.spec_verify_calls)}",
                    "# HELP sglang:num_requests_total Number of requests processed.",
                    "# TYPE sglang:num_requests_total counter"]
            for key, value in self.requests.items():
                out.append(f'sglang:num_requests_total{{{tok},is_streaming="{key}"}} {float(value)}')
            out += ["# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.",
                    "# TYPE sglang:time_to_first_token_seconds histogram"]
            for key, hist in self.ttft.items():
                out += hist.lines("sglang:time_to_first_token_seconds", f'{tok},is_streaming="{key}"')
            out += ["# HELP sglang:inter_token_latency_seconds Histogram of inter-token latency in seconds.",
                    "# TYPE sglang:inter_token_latency_seconds histogram"]
            out += self.itl.lines("sglang:inter_token_latency_seconds", tok)
            out += ["# HELP sglang:request_time_per_output_token_seconds Histogram of time per output token.",
                    "# TYPE sglang:request_time_per_output_token_seconds histogram"]
            out += self.tpot.lines("sglang:request_time_per_output_token_seconds", tok)
            out += ["# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency.",
                    "# TYPE sglang:e2e_request_latency_seconds histogram"]
            for key, hist in self.e2e.items():
                out += hist.lines("sglang:e2e_request_latency_seconds", f'{tok},is_streaming="{key}"')
        return "\n".join(out) + "\n"
