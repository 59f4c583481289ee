"""``calculate_metrics`` of SGLang's bench_serving (benchmark/serving.py:1132-1313): definitions and keys.

* TPOT per request = (latency - ttft) / (output_len - 1), only for output_len > 1;
* ITL = every per-token entry of every request, pooled; E2E = latency;
* throughputs over ``duration`` (from just before the first request to after the ``/server_info`` read);
* ``concurrency`` = sum of E2E / duration; ``max_output_tokens_per_s``: tokens put in 1-s buckets by
  their arrival time (start + ttft, then + each ITL), the fullest bucket;
* failed requests add nothing to the latency lists and 0 output tokens.
Times are in milliseconds under bench_serving's key names (``median_ttft_ms``, ``p99_itl_ms``, ...).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sessions.bench.client import RequestOutput


def percentile(values: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile."""
    if not values:
        return 0.0
    data = sorted(values)
    k = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return data[int(k)]
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def _stats(prefix: str, values_s: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    return {
        f"mean_{prefix}_ms": statistics.fmean(ms) if ms else 0.0,
        f"median_{prefix}_ms": statistics.median(ms) if ms else 0.0,
        f"std_{prefix}_ms": statistics.pstdev(ms) if ms else 0.0,
        f"p90_{prefix}_ms": percentile(ms, 90),
        f"p95_{prefix}_ms": percentile(ms, 95),
        f"p99_{prefix}_ms": percentile(ms, 99),
    }


def calculate_metrics(outputs: Sequence[RequestOutput], dataset_prompt_lens: Sequence[int], duration_s: float,
                      max_concurrency: int) -> dict[str, Any]:
    ok = [o for o in outputs if o.success]
    total_output = sum(o.output_len for o in ok)
    # the prompts of successful requests only (serving.py:1159-1168): a failed one put no load on the server
    total_input = sum(n for o, n in zip(outputs, dataset_prompt_lens, strict=True) if o.success)
    ttfts = [o.ttft for o in ok]
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    itls = [gap for o in ok for gap in o.itl]
    e2es = [o.latency for o in ok]
    dur = max(duration_s, 1e-9)
    buckets: Counter[int] = Counter()
    for o in ok:
        t = o.start + o.ttft
        buckets[int(t)] += 1
        for gap in o.itl:
            t += gap
            buckets[int(t)] += 1
    accept = [o.accept_length for o in ok if o.accept_length is not None]
    result: dict[str, Any] = {
        "max_concurrency": max_concurrency,
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / dur,
        "input_throughput": total_input / dur,
        "output_throughput": total_output / dur,
        "total_throughput": (total_input + total_output) / dur,
    }
    result |= _stats("e2e_latency", e2es)
    result |= _stats("ttft", ttfts)
    result |= _stats("tpot", tpots)
    result |= _stats("itl", itls)
    result["concurrency"] = sum(e2es) / dur
    result["accept_length"] = statistics.fmean(accept) if accept else None
    # accepted over proposed drafts, pooled over the run's own requests (what the Decode lines' accept
    # rate is over their interval), from each final response's spec_* meta_info
    proposed = sum(o.proposed_drafts or 0 for o in ok)
    result["accept_rate"] = sum(o.correct_drafts or 0 for o in ok) / proposed if proposed else None
    result["max_output_tokens_per_s"] = float(max(buckets.values())) if buckets else 0.0
    # the workload as served: token lengths of the successful requests (min, median, max)
    result["input_lens"] = _spread([n for o, n in zip(outputs, dataset_prompt_lens, strict=True) if o.success])
    result["output_lens"] = _spread([o.output_len for o in ok])
    errors = [o.error for o in outputs if not o.success and o.error]
    if errors:
        result["errors"] = errors[:5]
    return result


def _spread(values: Sequence[int]) -> list[float] | None:
    return [min(values), statistics.median(values), max(values)] if values else None


# The per-concurrency result table, for both the CLI's text table and the TUI's bench screen.
RUN_HEAD = ("CONC", "DONE", "OUT tok/s", "IN tok/s", "REQ/s", "TTFT med", "TTFT p99", "TPOT med", "ITL med",
            "ITL p99", "E2E med")


def run_rows(runs: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row of cells per concurrency (latencies in ms), under `RUN_HEAD`."""
    return [
        (str(r["max_concurrency"]), str(r["completed"]), f"{r['output_throughput']:.1f}",
         f"{r['input_throughput']:.1f}", f"{r['request_throughput']:.2f}", f"{r['median_ttft_ms']:.1f}",
         f"{r['p99_ttft_ms']:.1f}", f"{r['median_tpot_ms']:.2f}", f"{r['median_itl_ms']:.2f}",
         f"{r['p99_itl_ms']:.2f}", f"{r['median_e2e_latency_ms']:.0f}")
        for r in runs
    ]


def failure_notes(runs: Sequence[dict[str, Any]]) -> list[str]:
    """One line per run with failed requests, with the first error: such figures are not the server's.  A
    ``/server_info`` answer the bench refused is a failed request too (its facts are left out)."""
    notes = [f"concurrency {r['max_concurrency']}: {r['failed']} of {r['failed'] + r['completed']} requests "
             f"failed, e.g. {(r.get('errors') or ['?'])[0]}" for r in runs if r.get("failed")]
    return notes + [f"concurrency {r['max_concurrency']}: failed request {r['server_info_error']}"
                    for r in runs if r.get("server_info_error")]


def run_notes(runs: Sequence[dict[str, Any]]) -> list[str]:
    """What the reader must know about the runs' figures: failed requests, and a prefix cache that could
    not be flushed."""
    return failure_notes(runs) + [f"concurrency {r['max_concurrency']}: {r['cache_note']}"
                                  for r in runs if r.get("cache_note")]
