"""`bench compare A B`: is B faster than A, and why?  The speculative A/B the seeds did by hand.

A and B are each a session (id or unique prefix) or a profile.  A profile with a running session uses that
session; otherwise it is launched, benched once ready and stopped again, A first, then B, because the two
usually need the same GPUs.  Both sides get the same seeded random-id prompts and concurrencies (the bench
of `session_bench.bench_session`), and each side's result is kept in the bench history as usual.

Per concurrency the comparison reports both sides' figures, ``speedup`` = B's output throughput / A's,
``itl_ratio`` = B's median ITL / A's, and B's ``accept_length`` / ``accept_rate`` as B's server reported
them during that run: the mean of the ``Decode batch`` lines its log got while the run went on (SGLang's
own per-interval figures, read with the serving parser), else its ``/metrics`` gauges, else the lifetime
``avg_spec_accept_length`` of ``/server_info``.

**Break-even.**  Per request, one of B's verify steps takes ``accept_length x B's time per token`` and
yields ``accept_length`` tokens, so B matches A when ``accept_length`` reaches
``B's step time / A's time per token`` = ``accept_length x B's TPOT / A's TPOT`` (median TPOT: decode only,
no prefill).  That is the number the verdict calls "break-even needs about N", computed from the measured
step costs, not from the emulator's settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.bench.runner import BenchError, Progress
from sessions.bench.session_bench import BenchOptions, bench_session
from sessions.serving import fetch_metrics, parse_batch_line

SAME_BAND = 0.03  # within 3 %: "about the same"
READY_TIMEOUT_S = 600.0
_LOG_WINDOW_LIMIT = 64 << 20

Say = Callable[[str], None]  # progress notes for people ("launching tiny-llama ...")


@dataclass
class _Side:
    """One side of the comparison while it runs: the session, and whether we launched it."""

    ref: str
    session: Any
    launched: bool


def resolve_side(ref: str, home: Any, say: Say) -> _Side:
    """``ref`` as a ready session.  A profile name comes first (session ids begin with their profile's
    name, so ``tiny-llama`` would prefix-match ``tiny-llama-eagle3-...``): its running session, or a new
    one launched and waited for.  Otherwise a session id or unique prefix, which must be running."""
    from sessions.profiles import ProfileError, load_profile, profile_path
    from sessions.server import AlreadyRunning, LaunchError, ServerSession, SessionError, find_session

    profile = None
    if profile_path(ref, home).is_file():
        try:
            profile = load_profile(ref, home)
        except ProfileError as exc:
            raise BenchError(f"{ref}: profile does not load: {exc}") from None
    if profile is None:
        try:
            session = find_session(ref, home)
        except SessionError as exc:
            raise BenchError(f"{ref}: not a profile, and {exc}") from None
        if session.status(probe_http=False).state not in ("starting", "ready", "stalled"):
            raise BenchError(f"{ref}: session {session.session_id} is not running (launch its profile, or "
                             "pass the profile name to have it launched)")
        return _Side(ref, _wait_ready(session, ref, say), launched=False)
    try:
        session = ServerSession.launch(profile, home)
        say(f"{ref}: launched session {session.session_id}")
        launched = True
    except AlreadyRunning as exc:
        session = ServerSession.load(exc.session_id, home)
        launched = False
    except LaunchError as exc:
        raise BenchError(f"{ref}: launch failed: {exc}") from None
    try:
        return _Side(ref, _wait_ready(session, ref, say), launched)
    except BenchError:
        if launched:
            session.stop()
        raise


def _wait_ready(session: Any, ref: str, say: Say, timeout_s: float = READY_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    shown = None
    while True:
        state = session.status(probe_http=True).state
        if state == "ready":
            return session
        if state in ("crashed", "exited", "stopped"):
            raise BenchError(f"{ref}: session {session.session_id} {state} before it was ready "
                             f"(see eagle3-tui diagnose {session.session_id})")
        if state != shown:
            say(f"{ref}: session {session.session_id} is {state}, waiting for ready ...")
            shown = state
        if time.monotonic() > deadline:
            raise BenchError(f"{ref}: session {session.session_id} not ready within {timeout_s:g} s ({state})")
        time.sleep(0.5)  # the state is a file and a log the session process writes: polled


class _AcceptWatch:
    """B's accept figures per run: the ``Decode batch`` lines its log got during the run."""

    def __init__(self, log_path: Path, base_url: str | None) -> None:
        self.log_path = log_path
        self.base_url = base_url
        self._start = 0
        self.by_concurrency: dict[int, dict[str, Any]] = {}

    def __call__(self, event: str, concurrency: int) -> None:
        size = self._size()
        if event == "start":
            self._start = size
            return
        self.by_concurrency[concurrency] = self._read(self._start, size)

    def _size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _read(self, start: int, end: int) -> dict[str, Any]:
        lengths: list[float] = []
        rates: list[float] = []
        try:
            with safe_files.open_file(self.log_path, safe_files.SERVER_LOG) as handle:
                handle.seek(max(start, end - _LOG_WINDOW_LIMIT))
                chunk = handle.read(max(0, end - start))
        except OSError:
            chunk = b""
        for raw in chunk.decode("utf-8", "replace").splitlines():
            line = parse_batch_line(raw)
            if line is None or line.kind != "decode" or line.accept_length is None:
                continue
            lengths.append(line.accept_length)
            if line.accept_rate is not None:
                rates.append(line.accept_rate)
        if lengths:
            return {"accept_length": sum(lengths) / len(lengths),
                    "accept_rate": sum(rates) / len(rates) if rates else None,
                    "accept_source": f"log ({len(lengths)} Decode batch line{'s' if len(lengths) != 1 else ''})"}
        metrics = fetch_metrics(self.base_url) if self.base_url else None
        if metrics and metrics.get("accept_length", 0.0) > 0:
            return {"accept_length": metrics["accept_length"], "accept_rate": metrics.get("accept_rate"),
                    "accept_source": "/metrics"}
        return {}


def bench_side(side: _Side, options: BenchOptions, progress: Progress | None,
               argv: list[str]) -> dict[str, Any]:
    """One side's bench result, with B-style accept figures per run when its server speculates."""
    session = side.session
    watch = _AcceptWatch(Path(session.log_path), None)

    def on_run(event: str, concurrency: int) -> None:
        watch(event, concurrency)

    result = bench_session(session, options, progress, bench_argv=argv, on_run=on_run)
    watch.base_url = result.get("base_url")
    for run in result["runs"]:
        figures = watch.by_concurrency.get(run["max_concurrency"]) or {}
        if not figures and watch.base_url and result.get("speculative"):
            watch.by_concurrency[run["max_concurrency"]] = figures = watch._read(0, 0)
        if figures:
            run.update(figures)
        elif run.get("accept_length") is not None:
            run["accept_source"] = "/server_info avg_spec_accept_length" + (
                "; rate from the responses' spec_* meta_info" if run.get("accept_rate") is not None else "")
    return result


def compare_results(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The comparison of two bench results over their common concurrencies (pure: figures in, report out)."""
    a_runs = {r["max_concurrency"]: r for r in a["runs"]}
    runs = []
    draft_tokens = (b.get("speculative") or {}).get("num_draft_tokens")
    for rb in b["runs"]:
        ra = a_runs.get(rb["max_concurrency"])
        if ra is None:
            continue
        entry: dict[str, Any] = {
            "max_concurrency": rb["max_concurrency"],
            "speedup": _ratio(rb.get("output_throughput"), ra.get("output_throughput")),
            "itl_ratio": _ratio(rb.get("median_itl_ms"), ra.get("median_itl_ms")),
            "a": ra,
            "b": dict(rb, accept_length=rb.get("accept_length"), accept_rate=rb.get("accept_rate")),
        }
        entry["break_even_accept_length"] = break_even(rb.get("accept_length"), rb.get("median_tpot_ms"),
                                                       ra.get("median_tpot_ms"))
        runs.append(entry)
    return {
        "a": _side_summary(a),
        "b": _side_summary(b),
        "runs": runs,
        "verdict": verdict(runs, draft_tokens, bool(b.get("speculative"))),
    }


def break_even(accept_length: float | None, b_tpot_ms: float | None, a_tpot_ms: float | None) -> float | None:
    """The accept length at which B's time per token equals A's (see the module docstring)."""
    if not accept_length or not b_tpot_ms or not a_tpot_ms:
        return None
    return accept_length * b_tpot_ms / a_tpot_ms


def verdict(runs: list[dict[str, Any]], draft_tokens: int | None, b_speculates: bool) -> str:
    """A sentence or two: how B compares with A, lowest concurrency first, and why."""
    if not runs:
        return "no common concurrency: nothing to compare"
    parts = []
    for i, run in enumerate(sorted(runs, key=lambda r: r["max_concurrency"])):
        speedup = run["speedup"]
        conc = run["max_concurrency"]
        if speedup is None:
            parts.append(f"at concurrency {conc} there are no throughput figures to compare")
            continue
        if i > 0:
            parts.append(f"at concurrency {conc}: {speedup:.2f}×")
            continue
        head = f"B is {speedup:.2f}× A at concurrency {conc}"
        accept = run["b"].get("accept_length")
        if not b_speculates or accept is None:
            why = "" if b_speculates else " (B does not use speculative decoding)"
            parts.append(head + why)
            continue
        if speedup < 1 - SAME_BAND:
            effect = "the drafter slows decoding"
        elif speedup > 1 + SAME_BAND:
            effect = "the drafter speeds decoding up"
        else:
            effect = "the drafter makes about no difference"
        of = f" of {draft_tokens} draft tokens" if draft_tokens else ""
        detail = f"accept length {accept:.2f}{of}"
        need = run.get("break_even_accept_length")
        if need is not None:
            verb = "needs" if speedup < 1 - SAME_BAND else "is"
            detail += f"; break-even {verb} about {need:.2f}"
            if draft_tokens and need > draft_tokens and speedup < 1:
                detail += f", more than {draft_tokens} draft tokens can give"
        parts.append(f"{head}: {effect} ({detail})")
    return "; ".join(parts) + "."


def _ratio(top: Any, bottom: Any) -> float | None:
    if not isinstance(top, (int, float)) or not isinstance(bottom, (int, float)) or bottom <= 0:
        return None
    return top / bottom


def _side_summary(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result.get(k) for k in ("profile", "session", "id", "time", "sglang_version", "command",
                                        "speculative", "launched", "base_url")}


def run_compare(a_ref: str, b_ref: str, options: BenchOptions, home: Any, say: Say,
                progress: Progress | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """Bench A, then B (launching and stopping profiles as needed), keep both results and the comparison."""
    from sessions.bench.store import save_compare, save_result

    options.check()
    results = []
    for ref in (a_ref, b_ref):
        side = resolve_side(ref, home, say)
        try:
            say(f"benchmarking {ref} (session {side.session.session_id}) ...")
            result = bench_side(side, options, progress, argv or ["eagle3-tui", "bench", "compare", a_ref, b_ref])
        finally:
            if side.launched:
                say(f"stopping session {side.session.session_id} ({ref}) ...")
                side.session.stop()
        result["launched"] = side.launched
        result["id"] = save_result(home, result).stem
        results.append(result)
    report = compare_results(*results)
    report.update(time=time.time(), request=results[1]["request"],
                  same_prompts=results[0]["request"] == results[1]["request"])
    report["saved_to"] = str(save_compare(home, report))
    return report


COMPARE_HEAD = ("CONC", "A tok/s", "B tok/s", "SPEEDUP", "A ITL med", "B ITL med", "ITL RATIO", "ACCEPT LEN",
                "ACCEPT RATE", "BREAK-EVEN")


def compare_rows(report: dict[str, Any], times: str = "×") -> list[tuple[str, ...]]:
    """The compare table's cells (`COMPARE_HEAD`), one row per concurrency; the CLI and the TUI both show
    these.  ``times`` ends a speedup ("x" for a plain terminal)."""
    rows: list[tuple[str, ...]] = []
    for run in report["runs"]:
        a, b = run["a"], run["b"]
        rows.append((
            str(run["max_concurrency"]), f"{a['output_throughput']:.1f}", f"{b['output_throughput']:.1f}",
            _cell(run["speedup"], ".2f") + (times if run["speedup"] is not None else ""),
            f"{a['median_itl_ms']:.2f}", f"{b['median_itl_ms']:.2f}", _cell(run["itl_ratio"], ".2f"),
            _cell(b.get("accept_length"), ".2f"), _cell(b.get("accept_rate"), ".2f"),
            _cell(run.get("break_even_accept_length"), ".2f"),
        ))
    return rows


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)
