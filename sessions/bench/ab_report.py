"""The A/B report of `bench compare` (pure: bench results in, report out): each figure's median and min-max
range over rounds, the paired speedup per round, the verdict with its spread, and the table's cells.

A round's ``speedup`` is B's output throughput over A's in that round; ``itl_ratio`` B's median ITL over A's.
The report's ``speedup`` is the median of the rounds' speedups and ``speedup_spread`` its range: "within
noise" when that range contains 1.0 (with one round there is no range, and the verdict says so).

**Break-even.**  Per request, one of B's verify steps takes ``accept_length x B's time per token`` and
yields ``accept_length`` tokens, so B matches A when ``accept_length`` reaches
``B's step time / A's time per token`` = ``accept_length x B's TPOT / A's TPOT`` (median TPOT: decode only,
no prefill).  That is the number the verdict calls "break-even needs about N", computed from the measured
step costs, not from the emulator's settings.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

SAME_BAND = 0.03  # one round, within 3 %: "about the same"
# the figures of a run that get a median and a range over rounds
FIGURES = ("output_throughput", "input_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
           "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2e_latency_ms", "accept_length",
           "accept_rate")
COUNTS = ("completed", "failed", "num_prompts")  # summed over rounds


def spread(values: Sequence[float | None]) -> dict[str, Any] | None:
    """``{"median", "min", "max", "values"}`` of the numbers among ``values``; None when there are none."""
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return None
    return {"median": statistics.median(numbers), "min": min(numbers), "max": max(numbers), "values": numbers}


def _median(s: dict[str, Any] | None) -> float | None:
    return None if s is None else s["median"]


def _ratio(top: Any, bottom: Any) -> float | None:
    if not isinstance(top, (int, float)) or not isinstance(bottom, (int, float)) or bottom <= 0:
        return None
    return top / bottom


def break_even(accept_length: float | None, b_tpot_ms: float | None, a_tpot_ms: float | None) -> float | None:
    """The accept length at which B's time per token equals A's (see the module docstring)."""
    if not accept_length or not b_tpot_ms or not a_tpot_ms:
        return None
    return accept_length * b_tpot_ms / a_tpot_ms


def summarise_rounds(rounds: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per concurrency: the median of each figure over ``rounds`` (bench results), ``spread`` per figure,
    the counts summed, and text fields (``accept_source``, the first errors) of the first round that has
    them."""
    by_conc: dict[int, list[dict[str, Any]]] = {}
    for result in rounds:
        for run in result.get("runs") or []:
            by_conc.setdefault(run["max_concurrency"], []).append(run)
    out: dict[int, dict[str, Any]] = {}
    for conc, runs in by_conc.items():
        merged: dict[str, Any] = {"max_concurrency": conc, "rounds": len(runs), "spread": {}}
        for key in FIGURES:
            s = spread([r.get(key) for r in runs])
            merged[key] = _median(s)
            if s is not None:
                merged["spread"][key] = s
        for key in COUNTS:
            merged[key] = sum(int(r.get(key) or 0) for r in runs)
        for key in ("accept_source", "cache_note", "server_info_error", "input_lens", "output_lens"):
            found = next((r[key] for r in runs if r.get(key)), None)
            if found is not None:
                merged[key] = found
        errors = [e for r in runs for e in r.get("errors") or []]
        if errors:
            merged["errors"] = errors[:5]
        merged["cache_flushed"] = all(r.get("cache_flushed") for r in runs) if runs else None
        out[conc] = merged
    return out


def compare_results(a: dict[str, Any] | Sequence[dict[str, Any]],
                    b: dict[str, Any] | Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The comparison of A's and B's bench results, one per round (a single result is one round), over
    their common concurrencies; rounds are paired in order for the per-round ratios."""
    a_rounds = [a] if isinstance(a, dict) else list(a)
    b_rounds = [b] if isinstance(b, dict) else list(b)
    a_sum, b_sum = summarise_rounds(a_rounds), summarise_rounds(b_rounds)
    b_first = b_rounds[0] if b_rounds else {}
    draft_tokens = (b_first.get("speculative") or {}).get("num_draft_tokens")
    runs = []
    for conc in sorted(set(a_sum) & set(b_sum)):
        ra, rb = a_sum[conc], b_sum[conc]
        pairs = list(zip(_runs_at(a_rounds, conc), _runs_at(b_rounds, conc), strict=False))
        speedups = spread([_ratio(y.get("output_throughput"), x.get("output_throughput")) for x, y in pairs])
        itl = spread([_ratio(y.get("median_itl_ms"), x.get("median_itl_ms")) for x, y in pairs])
        entry: dict[str, Any] = {
            "max_concurrency": conc,
            "rounds": len(pairs),
            "speedup": _median(speedups),
            "speedup_spread": speedups,
            "itl_ratio": _median(itl),
            "itl_ratio_spread": itl,
            "within_noise": bool(speedups and len(pairs) > 1 and speedups["min"] <= 1.0 <= speedups["max"]),
            "a": ra,
            "b": rb,
        }
        entry["break_even_accept_length"] = break_even(rb.get("accept_length"), rb.get("median_tpot_ms"),
                                                       ra.get("median_tpot_ms"))
        runs.append(entry)
    return {
        "a": _side_summary(a_rounds[0] if a_rounds else {}),
        "b": _side_summary(b_first),
        "rounds": min(len(a_rounds), len(b_rounds)),
        "runs": runs,
        "verdict": verdict(runs, draft_tokens, bool(b_first.get("speculative"))),
    }


def _runs_at(rounds: Sequence[dict[str, Any]], conc: int) -> list[dict[str, Any]]:
    return [r for result in rounds for r in result.get("runs") or [] if r.get("max_concurrency") == conc]


def _side_summary(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result.get(k) for k in ("profile", "session", "id", "time", "sglang_version", "command",
                                        "speculative", "launched", "base_url")}


def verdict(runs: list[dict[str, Any]], draft_tokens: int | None, b_speculates: bool) -> str:
    """A sentence or two: how B compares with A, lowest concurrency first, with the range over rounds, and
    why; "within noise" when B's range of speedups contains 1.0."""
    if not runs:
        return "no common concurrency: nothing to compare"
    parts = []
    one_round = all(int(r.get("rounds") or 1) < 2 for r in runs)
    for i, run in enumerate(sorted(runs, key=lambda r: r["max_concurrency"])):
        speedup = run["speedup"]
        conc = run["max_concurrency"]
        if speedup is None:
            parts.append(f"at concurrency {conc} there are no throughput figures to compare")
            continue
        s = run.get("speedup_spread") or {}
        rounds = int(run.get("rounds") or 1)
        interval = f" ({s['min']:.2f}–{s['max']:.2f} over {rounds} rounds)" if rounds > 1 and s else ""
        noise = bool(run.get("within_noise"))
        if i > 0:
            parts.append(f"at concurrency {conc}: {speedup:.2f}×{interval}" + (", within noise" if noise else ""))
            continue
        head = f"B is {speedup:.2f}× A at concurrency {conc}{interval}"
        accept = run["b"].get("accept_length")
        if noise:
            effect = "within noise: these rounds cannot tell B from A"
        elif rounds > 1:
            effect = "the drafter slows decoding" if speedup < 1 else "the drafter speeds decoding up"
        elif speedup < 1 - SAME_BAND:
            effect = "the drafter slows decoding"
        elif speedup > 1 + SAME_BAND:
            effect = "the drafter speeds decoding up"
        else:
            effect = "the drafter makes about no difference"
        if not b_speculates or accept is None:
            why = "" if b_speculates else " (B does not use speculative decoding)"
            parts.append(head + (f": within noise{why}" if noise else why))
            continue
        of = f" of {draft_tokens} draft tokens" if draft_tokens else ""
        detail = f"accept length {accept:.2f}{of}"
        need = run.get("break_even_accept_length")
        if need is not None:
            verb = "needs" if speedup < 1 - SAME_BAND else "is"
            detail += f"; break-even {verb} about {need:.2f}"
            if draft_tokens and need > draft_tokens and speedup < 1:
                detail += f", more than {draft_tokens} draft tokens can give"
        parts.append(f"{head}: {effect} ({detail})")
    tail = "; one round, so no spread (use --rounds 3 or more)" if one_round else ""
    return "; ".join(parts) + tail + "."


COMPARE_HEAD = ("CONC", "A tok/s", "B tok/s", "SPEEDUP", "A ITL med", "B ITL med", "ITL RATIO", "ACCEPT LEN",
                "ACCEPT RATE", "BREAK-EVEN", "VERDICT")


def compare_rows(report: dict[str, Any], times: str = "×") -> list[tuple[str, ...]]:
    """The compare table's cells (`COMPARE_HEAD`), one row per concurrency: each figure's median over the
    rounds, then its min-max range; the CLI and the TUI both show these.  ``times`` ends a speedup ("x" for
    a plain terminal)."""
    rows: list[tuple[str, ...]] = []
    for run in report["runs"]:
        a, b = run["a"], run["b"]
        speedup = run["speedup"]
        rows.append((
            str(run["max_concurrency"]),
            _with_range(a, "output_throughput", ".1f"), _with_range(b, "output_throughput", ".1f"),
            (_cell(speedup, ".2f") + (times if speedup is not None else "")
             + _range(run.get("speedup_spread"), ".2f")),
            _with_range(a, "median_itl_ms", ".2f"), _with_range(b, "median_itl_ms", ".2f"),
            _cell(run["itl_ratio"], ".2f"),
            _with_range(b, "accept_length", ".2f"), _cell(b.get("accept_rate"), ".2f"),
            _cell(run.get("break_even_accept_length"), ".2f"),
            _row_verdict(run),
        ))
    return rows


def _row_verdict(run: dict[str, Any]) -> str:
    speedup = run.get("speedup")
    if speedup is None:
        return "-"
    if run.get("within_noise"):
        return "noise"
    if int(run.get("rounds") or 1) < 2:
        return "1 round"
    return "B faster" if speedup > 1 else "B slower"


def _with_range(side: dict[str, Any], key: str, fmt: str) -> str:
    return _cell(side.get(key), fmt) + _range((side.get("spread") or {}).get(key), fmt)


def _range(s: dict[str, Any] | None, fmt: str) -> str:
    if not s or len(s.get("values") or ()) < 2:
        return ""
    return f" {format(s['min'], fmt)}–{format(s['max'], fmt)}"


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def workload_text(report: dict[str, Any]) -> str:
    """The workload in one or two lines, for the table's title (what the figures are of)."""
    w = report.get("workload") or report.get("request") or {}
    dataset = w.get("dataset") or "random-ids"
    if dataset == "random-ids":
        source = f"random-id prompts of {w.get('input_len')} tokens"
    else:
        kind = f" ({w['dataset_kind']})" if w.get("dataset_kind") else ""
        source = f"{w.get('dataset_prompts', '?')} prompts from {dataset}{kind}"
    observed = ""
    ins, outs = w.get("input_lens"), w.get("output_lens")
    if ins:
        observed += f"; input {ins[0]:.0f}–{ins[2]:.0f} tokens (median {ins[1]:.0f})"
    if outs:
        observed += f", output {outs[0]:.0f}–{outs[2]:.0f} (median {outs[1]:.0f})"
    per_run = "; prompts per run: " + (str(w["num_prompts"]) if w.get("num_prompts") else "max(4, 2 x concurrency)")
    rounds = report.get("rounds")
    order = f"; {rounds} round{'s' if rounds != 1 else ''} ({report.get('order', '')})" if rounds else ""
    return (f"workload: {source}, output ≤ {w.get('output_len')} tokens, seed {w.get('seed')}, concurrency "
            f"{','.join(str(c) for c in w.get('concurrency') or [])}{per_run}{observed}{order}, "
            f"prefix cache {'flushed before each run' if w.get('flush_cache', True) else 'kept'}")
