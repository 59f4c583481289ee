"""`bench compare A B`: is B faster than A, and why?  The speculative A/B the seeds did by hand.

A and B are each a session (id or unique prefix) or a profile.  A profile with a running session uses that
session; otherwise it is launched, and stopped again when the compare ends (or is interrupted).  Both sides
get the same prompts (seeded random ids, or ``--dataset``) and concurrencies (the bench of
`session_bench.bench_session`), and each side's result is kept in the bench history as usual.

**Rounds and spread.**  One round's noise on a real server is larger than many differences people tune
for, so ``--rounds N`` (3) benches each side N times, interleaved, every run on a flushed prefix cache, and
reports each figure as the median with its min-max range over the rounds.  The speedup of a round is B's
output throughput over A's *in that round* (a paired ratio, so a slow spell of the machine hits both); its
median and range are the verdict's, and the verdict says "within noise" when the range contains 1.0.

**Launches.**  Launching costs far more than a bench, so it is done as few times as the GPUs allow
(`schedule`):

* ``running``: both sides were running already: A B A B ...;
* ``together``: the GPUs the sides use (`sessions.gpus.launch_gpu_ids`) do not overlap, so each profile is
  launched once, both at the start (their starts overlap), and both stay up: A B A B ...; the idle side
  holds its memory and serves nothing;
* ``in turn``: they share GPUs, so only one can be up at a time: rounds go A B, B A, A B ... (ABBA), so
  each launch serves two consecutive runs and N rounds take N + 1 launches, not 2N; the order also cancels
  a linear drift of the machine.

Per concurrency the comparison reports both sides' figures, ``speedup`` = B's output throughput / A's,
``itl_ratio`` = B's median ITL / A's, and B's ``accept_length`` / ``accept_rate`` as B's server reported
them during that run: the mean of the ``Decode batch`` lines its log got while the run went on (SGLang's
own per-interval figures, read with the serving parser), else its ``/metrics`` gauges, else the lifetime
``avg_spec_accept_length`` of ``/server_info``.

The figures, the verdict and the table's cells are `sessions.bench.ab_report`'s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.bench.ab_report import (  # noqa: F401 - the report's names, re-exported for callers
    COMPARE_HEAD,
    break_even,
    compare_results,
    compare_rows,
    summarise_rounds,
    verdict,
)
from sessions.bench.runner import BenchError, Progress
from sessions.bench.session_bench import BenchOptions, bench_session, make_prompts
from sessions.serving import fetch_metrics, parse_batch_line

READY_TIMEOUT_S = 600.0
_LOG_WINDOW_LIMIT = 64 << 20

Say = Callable[[str], None]  # progress notes for people ("launching tiny-llama ...")
StopRequested = Callable[[], bool]  # True once the caller wants the compare to end (the TUI quitting)


class CompareCancelled(BenchError):
    """The caller asked the compare to end (``stop_requested``): it unwinds like a failure, so that its
    cleanup stops what it launched."""


def _check(stop_requested: StopRequested | None) -> None:
    if stop_requested is not None and stop_requested():
        raise CompareCancelled("compare cancelled; what it launched is stopped")


def _watched(progress: Progress | None, stop_requested: StopRequested) -> Progress:
    """``progress`` that first checks ``stop_requested`` (called on the bench's thread per request)."""

    def watched(concurrency: int, done: int, total: int) -> None:
        _check(stop_requested)
        if progress is not None:
            progress(concurrency, done, total)

    return watched


def _quiet(say: Say) -> Say:
    """``say`` for the cleanup: a note that cannot be shown (the TUI that asked for it is gone) must never
    keep a launched server from being stopped."""

    def note(text: str) -> None:
        try:
            say(text)
        except Exception:  # noqa: BLE001, S110 - a progress note is not worth a server left running
            pass

    return note


@dataclass
class _Side:
    """One side of the comparison: what the user named, its profile (None for a bare session), the
    session it runs on while up, and whether this compare launched that session."""

    ref: str
    profile: Any
    session: Any = None
    launched: bool = False
    existing: frozenset[str] = frozenset()  # the profile's sessions that ran before the compare

    @property
    def name(self) -> str:
        return str(getattr(self.profile, "name", None) or self.ref)


def lookup_side(ref: str, home: Any) -> _Side:
    """``ref`` as a side, launching nothing.  A profile name comes first (session ids begin with their
    profile's name, so ``tiny-llama`` would prefix-match ``tiny-llama-eagle3-...``): with a running session
    that session is used.  Otherwise a session id or unique prefix, which must be running."""
    from sessions.profiles import ProfileError, load_profile, profile_path
    from sessions.server import SessionError, find_session, running_sessions_of

    if profile_path(ref, home).is_file():
        try:
            profile = load_profile(ref, home)
        except ProfileError as exc:
            raise BenchError(f"{ref}: profile does not load: {exc}") from None
        running = running_sessions_of(profile.name, home)
        return _Side(ref, profile, running[0] if running else None,
                     existing=frozenset(s.session_id for s in running))
    try:
        session = find_session(ref, home)
    except SessionError as exc:
        raise BenchError(f"{ref}: not a profile, and {exc}") from None
    if session.status(probe_http=False).state not in ("starting", "ready", "stalled"):
        raise BenchError(f"{ref}: session {session.session_id} is not running (launch its profile, or "
                         "pass the profile name to have it launched)")
    snapshot: Any = None
    try:
        snapshot = session.profile
    except Exception:  # noqa: BLE001 - a session whose profile snapshot is damaged: its GPUs are unknown
        snapshot = None
    return _Side(ref, snapshot, session, existing=frozenset({session.session_id}))


def bring_up(side: _Side, home: Any, say: Say, force: bool, retry_hint: str,
             stop_requested: StopRequested | None = None) -> None:
    """Make ``side`` ready: its session, or a launch of its profile (``force``: even on busy GPUs)."""
    launch_side(side, home, say, force, retry_hint)
    _wait_ready(side.session, side.ref, say, stop_requested=stop_requested)


def launch_side(side: _Side, home: Any, say: Say, force: bool, retry_hint: str) -> None:
    """Start ``side``'s profile when it has no session yet (returns once launched, not once ready)."""
    from sessions.server import AlreadyRunning, GpuBusy, LaunchError, ServerSession

    if side.session is None:
        try:
            side.session = ServerSession.launch(side.profile, home, force=force)
            side.launched = True
            say(f"{side.ref}: launched session {side.session.session_id}")
        except AlreadyRunning as exc:
            side.session = ServerSession.load(exc.session_id, home)
        except GpuBusy as exc:
            from sessions.gpus import format_busy

            raise BenchError(f"{side.ref}: not launched: {format_busy(side.name, exc.busy, retry=retry_hint)}") \
                from None
        except LaunchError as exc:
            raise BenchError(f"{side.ref}: launch failed: {exc}") from None


def take_down(side: _Side, home: Any, say: Say) -> None:
    """Stop what this compare launched for ``side``: its session, and any session of its profile that
    started during the compare and was not there before (a launch interrupted before it returned)."""
    from sessions.server import running_sessions_of

    ours = [side.session] if side.launched and side.session is not None else []
    if side.profile is not None:
        known = {s.session_id for s in ours}
        ours += [s for s in running_sessions_of(side.profile.name, home)
                 if s.session_id not in side.existing and s.session_id not in known]
    for session in ours:
        say(f"stopping session {session.session_id} ({side.ref}) ...")
        session.stop()
    if side.launched:
        side.session, side.launched = None, False


def stop_all(sides: list[_Side], home: Any, say: Say) -> None:
    """`take_down` every side, even when a signal's exception lands in the middle of one stop: that side is
    tried again and the others still run; the first such exception is raised after all of them.  Notes go
    through `_quiet`: one that fails stops nothing."""
    say = _quiet(say)
    pending: BaseException | None = None
    for side in sides:
        for _ in range(2):
            try:
                take_down(side, home, say)
                break
            except BaseException as exc:  # noqa: BLE001 - an Interrupted mid-stop: finish, then re-raise
                pending = pending or exc
    if pending is not None:
        raise pending


def gpus_of(side: _Side) -> frozenset[int] | None:
    if side.profile is None:
        return None
    from sessions.gpus import launch_gpu_ids

    return frozenset(launch_gpu_ids(side.profile))


def launch_mode(a: _Side, b: _Side) -> str:
    """``running`` (nothing to launch), ``together`` (the sides' GPUs do not overlap: each launched once,
    both up), or ``in turn`` (they share GPUs, or a side's are unknown: one up at a time)."""
    if a.session is not None and b.session is not None:
        return "running"
    ga, gb = gpus_of(a), gpus_of(b)
    if ga is not None and gb is not None and not ga & gb:
        return "together"
    return "in turn"


def schedule(rounds: int, mode: str) -> list[tuple[int, int]]:
    """(round, side) in run order, side 0 = A: A B A B ..., or for ``in turn`` A B, B A, A B ... so that
    consecutive runs of one side share its launch."""
    order = []
    for r in range(rounds):
        pair = (1, 0) if mode == "in turn" and r % 2 else (0, 1)
        order += [(r, side) for side in pair]
    return order


def _wait_ready(session: Any, ref: str, say: Say, timeout_s: float = READY_TIMEOUT_S,
                stop_requested: StopRequested | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    shown = None
    while True:
        _check(stop_requested)
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


MAX_ROUNDS = 50


def run_compare(a_ref: str, b_ref: str, options: BenchOptions, home: Any, say: Say,
                progress: Progress | None = None, argv: list[str] | None = None, rounds: int = 3,
                force: bool = False, stop_requested: StopRequested | None = None) -> dict[str, Any]:
    """Bench A and B ``rounds`` times each, interleaved (`schedule`), launching profiles as few times as
    their GPUs allow and stopping what was launched when done, failed or interrupted (any exception,
    KeyboardInterrupt and the CLI's SIGTERM/SIGHUP included); keep both results and the comparison.

    ``stop_requested`` is how a caller on another thread (the TUI's worker, which no signal reaches) ends
    it: polled while waiting for ready, between runs and at each finished request, it raises
    `CompareCancelled`, and the same cleanup stops what was launched."""
    from sessions.bench.store import save_compare, save_result

    options.check()
    if not 1 <= rounds <= MAX_ROUNDS:
        raise BenchError(f"--rounds must be 1..{MAX_ROUNDS}, not {rounds}")
    argv = argv or ["eagle3-tui", "bench", "compare", a_ref, b_ref]
    if options.dataset is not None:
        make_prompts(options, "")  # a dataset with no usable prompt is refused before anything is launched
    sides = [lookup_side(a_ref, home), lookup_side(b_ref, home)]
    mode = launch_mode(*sides)
    order = schedule(rounds, mode)
    retry = f"run the compare with --force (eagle3-tui bench compare {a_ref} {b_ref} --force)"
    results: list[list[dict[str, Any]]] = [[], []]
    if stop_requested is not None:
        progress = _watched(progress, stop_requested)
    say(f"{rounds} round{'s' if rounds != 1 else ''}, {mode}: " + " ".join("AB"[i] for _, i in order))
    try:
        if mode == "together":
            # Both launched before either is waited for: on GPUs of their own the two starts (minutes each for
            # a big model) run at the same time, and the compare waits for the slower one, not for both in turn.
            for side in sides:
                launch_side(side, home, say, force, retry)
            for side in sides:
                bring_up(side, home, say, force, retry, stop_requested)
        for n, (r, i) in enumerate(order):
            _check(stop_requested)
            side, other = sides[i], sides[1 - i]
            if mode == "in turn" and other.launched:
                take_down(other, home, say)  # they share GPUs: one up at a time
            bring_up(side, home, say, force, retry, stop_requested)
            say(f"round {r + 1}/{rounds}: benchmarking {'AB'[i]} = {side.ref} (session "
                f"{side.session.session_id}) ...")
            result = bench_side(_Side(side.ref, side.profile, side.session, side.launched), options, progress,
                                argv)
            result["launched"] = side.launched
            result["round"] = r + 1
            results[i].append(result)
    finally:
        stop_all(sides, home, say)
    kept = [_kept_result(home, rs, save_result) for rs in results]
    report = compare_results(results[0], results[1])
    report["a"].update(id=kept[0], launched=any(x.get("launched") for x in results[0]))
    report["b"].update(id=kept[1], launched=any(x.get("launched") for x in results[1]))
    report.update(time=time.time(), request=results[1][0]["request"], mode=mode,
                  order=" ".join("AB"[i] for _, i in order),
                  same_prompts=results[0][0]["request"] == results[1][0]["request"])
    report["workload"] = dict(report["request"], **_observed_lengths(report))
    report["saved_to"] = str(save_compare(home, report))
    return report


def _kept_result(home: Any, rounds: list[dict[str, Any]], save: Callable[..., Path]) -> str:
    """One history result per side: each figure's median over the rounds, every round's runs kept too."""
    merged = summarise_rounds(rounds)
    result = dict(rounds[0], runs=[merged[c] for c in sorted(merged)], rounds=[r["runs"] for r in rounds])
    return save(home, result).stem


def _observed_lengths(report: dict[str, Any]) -> dict[str, Any]:
    """The token lengths the requests had (min, median of the runs' medians, max), over both sides."""
    out: dict[str, Any] = {}
    for key in ("input_lens", "output_lens"):
        spans = [run[side].get(key) for run in report["runs"] for side in ("a", "b") if run[side].get(key)]
        if spans:
            out[key] = [min(s[0] for s in spans), statistics.median(s[1] for s in spans), max(s[2] for s in spans)]
    return out
