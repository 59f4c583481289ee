"""`eagle3-tui bench SESSION [...]` and `eagle3-tui bench history [PROFILE]`: the serving bench.

`bench SESSION` runs a warm-up, then each concurrency over the same seeded random-id prompts against the
session's `/generate` (streaming, as SGLang's bench_serving sends them), prints one table (or with `--json`
one object `{"runs": [...], "session", "profile", ...}` with bench_serving's key names) and keeps the
result in the state dir.  `bench history` lists the kept results side by side, best marked.
`bench compare A B` benches A and B --rounds times each, interleaved (profiles are launched as few times as
their GPUs allow and stopped after, also on SIGTERM, SIGHUP and Ctrl-C; sessions are used as they are), on
the same prompts, and reports B against A per concurrency: medians with their min-max range over rounds
and a verdict that says "within noise" when B's range of speedups contains 1.0 (`sessions.bench.compare`).
Only argparse is imported here; the engine is imported inside the handlers (fast `--help`).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessions.bench.session_bench import BenchOptions


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark a ready session like SGLang's bench_serving; 'bench history' lists kept results",
        description="Benchmark SESSION (a ready server): warm-up, then each concurrency over the same seeded "
        "random-id prompts against /generate with streaming. Reports output/input/request throughput, TTFT, "
        "TPOT, ITL and E2E latency (mean, median, p99) with bench_serving's definitions, and keeps the result. "
        "'eagle3-tui bench history [PROFILE]' lists the kept results. 'eagle3-tui bench compare A B' benches "
        "A and B --rounds times each, alternating (each a profile or a session; a profile that is not running is "
        "launched and stopped when the compare ends or is interrupted; profiles on disjoint GPUs are both "
        "launched once, profiles sharing GPUs one at a time in the order A B, B A, ...), every run on a "
        "flushed prefix cache, on the same prompts (--dataset: a ShareGPT or OpenAI-messages JSONL of real "
        "prompts), and reports per concurrency B's speedup (output throughput B/A, paired per round), ITL "
        "ratio and B's accept length and rate as medians with their min-max range over the rounds, the "
        "workload, and a verdict ('within noise' when B's range of speedups contains 1.0). With --demo, "
        "compare defaults to the demo's own prompt set, --output-len 32 and --concurrency 1,4.",
    )
    p.add_argument("session", metavar="SESSION|history|compare",
                   help="a session id or unique prefix, 'history' or 'compare'")
    p.add_argument("rest", nargs="*", metavar="ARG",
                   help="with 'history': PROFILE (only its results); with 'compare': A B (profiles or sessions)")
    p.add_argument("--input-len", type=int, default=None, metavar="N",
                   help="random-id prompt length in tokens (256)")
    p.add_argument("--output-len", type=int, default=None, metavar="M",
                   help="output tokens per request (128); with --dataset the cap of each prompt's reply length")
    p.add_argument("--num-prompts", type=int, default=None, metavar="K",
                   help="requests per concurrency (default: max(4, 2 x concurrency))")
    p.add_argument("--concurrency", default=None, metavar="C,C,...",
                   help="max requests in flight, one run each (1,8,32)")
    p.add_argument("--dataset", default=None, metavar="PATH",
                   help="bench on real prompts: a ShareGPT (conversations) or OpenAI (messages) JSONL, as "
                   "extraction reads them; each line's first user turn is sent as text")
    p.add_argument("--rounds", type=int, default=3, metavar="N",
                   help="with 'compare': bench each side N times, alternating, for the spread (3)")
    p.add_argument("--force", action="store_true",
                   help="with 'compare': launch a profile even when other processes hold memory on its GPUs")
    p.add_argument("--seed", type=int, default=1, metavar="S", help="prompt seed (1)")
    p.add_argument("--no-flush-cache", dest="flush_cache", action="store_false",
                   help="keep the server's prefix cache between runs (default: flush it before each "
                   "concurrency, as bench_serving --flush-cache does, so no run times a cached prefill)")
    p.add_argument("--compare", action="store_true",
                   help="with 'history': list the kept A/B compare reports instead (PROFILE: as A or B)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    if args.session == "history":
        return _history(args)
    if args.session == "compare":
        return _compare(args)
    import json

    from app.cli import EXIT_BAD_INPUT, EXIT_FAILED, CliError
    from app.cli_server import _find
    from sessions.bench.runner import BenchError
    from sessions.bench.session_bench import bench_session
    from sessions.bench.store import save_result

    if args.rest:
        raise CliError(f"bench {args.session}: unexpected argument {args.rest[0]!r} (PROFILE goes with "
                       "'bench history', A B with 'bench compare')", EXIT_BAD_INPUT)
    if args.force:
        raise CliError("'bench SESSION' launches nothing: --force is for eagle3-tui bench compare A B --force, "
                       "which launches profiles", EXIT_BAD_INPUT)
    options = _options(args)
    session = _find(args.session)
    progress = _progress_printer()
    try:
        result = bench_session(session, options, progress, bench_argv=["eagle3-tui", "bench", *sys.argv[2:]])
    except BenchError as exc:
        raise CliError(str(exc), EXIT_FAILED) from None
    from sessions.home import resolve_home

    path = save_result(resolve_home(), result)
    if args.json:
        print(json.dumps(result | {"saved_to": str(path)}, indent=2))
    else:
        from sessions.bench.ab_report import workload_text

        print(runs_table(result["runs"]))
        print(workload_text({"workload": result["request"]}))
        print(f"kept as {path}", file=sys.stderr)
    from sessions.bench.metrics import failure_notes

    failures = failure_notes(result["runs"])
    if args.json:  # the table's footer names them otherwise
        for note in failures:
            print(f"eagle3-tui: {note}", file=sys.stderr)
    return EXIT_FAILED if failures else 0  # figures of a run with failed requests are not the server's


def _options(args: argparse.Namespace, demo_ab: bool = False) -> BenchOptions:
    """The bench's options from the flags; ``demo_ab``: the demo's A/B defaults (its real-text prompt set,
    short outputs and two concurrencies, so that three rounds on the CPU-bound tiny model stay short)."""
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.bench.runner import BenchError
    from sessions.bench.session_bench import (
        BenchOptions,
        demo_compare_options,
        make_prompts,
        parse_concurrency,
    )

    # an explicit --input-len asks for random ids, also in the demo
    base = demo_compare_options() if demo_ab and args.input_len is None else BenchOptions()
    dataset = args.dataset if args.dataset is not None else base.dataset
    output_len = args.output_len if args.output_len is not None else base.output_len
    concurrency = args.concurrency or ",".join(str(c) for c in base.concurrency)
    if dataset is not None and args.input_len is not None:
        raise CliError(f"--input-len {args.input_len} goes with random-id prompts, not with --dataset {dataset} "
                       "(a dataset's prompts have their own lengths)", EXIT_BAD_INPUT)
    try:
        options = BenchOptions(args.input_len or 256, output_len, args.num_prompts,
                               parse_concurrency(concurrency), args.seed, args.flush_cache, dataset)
        options.check()
        if dataset is not None:
            make_prompts(options, "")  # read once here: a bad file is bad input, named before anything runs
    except BenchError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    return options


def _progress_printer() -> Callable[[int, int, int], None]:
    tty = sys.stderr.isatty()

    def progress(concurrency: int, done: int, total: int) -> None:
        if tty:  # one line redrawn in place
            print(f"\rconcurrency {concurrency}: {done}/{total} requests", end="" if done < total else "\n",
                  file=sys.stderr, flush=True)
        elif done == total:
            print(f"concurrency {concurrency}: {done}/{total} requests", file=sys.stderr, flush=True)

    return progress


def _compare(args: argparse.Namespace) -> int:
    import json

    from app.cli import EXIT_BAD_INPUT, EXIT_FAILED, CliError
    from sessions.bench.compare import run_compare
    from sessions.bench.runner import BenchError
    from sessions.home import resolve_home

    if len(args.rest) != 2:
        raise CliError(f"bench compare needs two arguments A B (profiles or sessions), got {len(args.rest)}"
                       + (f": {' '.join(args.rest)}" if args.rest else ""), EXIT_BAD_INPUT)
    from sessions.bench.compare import MAX_ROUNDS

    if not 1 <= args.rounds <= MAX_ROUNDS:
        raise CliError(f"--rounds must be 1..{MAX_ROUNDS}, not {args.rounds}", EXIT_BAD_INPUT)
    home = resolve_home()
    options = _options(args, demo_ab=home.demo)
    a, b = args.rest

    def say(note: str) -> None:
        print(note, file=sys.stderr, flush=True)

    try:
        with stop_on_signals():
            report = run_compare(a, b, options, home, say, _progress_printer(),
                                 argv=["eagle3-tui", "bench", *sys.argv[2:]], rounds=args.rounds, force=args.force)
    except BenchError as exc:
        raise CliError(str(exc), EXIT_FAILED) from None
    except Interrupted as exc:
        print(f"eagle3-tui: bench compare stopped by {exc.name}; what it launched is stopped", file=sys.stderr)
        return 128 + exc.signum
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(compare_table(report))
        print(report["verdict"])
        print(f"kept as {report['saved_to']}", file=sys.stderr)
    from sessions.bench.metrics import failure_notes

    failures = [f"{side}: {note}" for run in report["runs"] for side in ("a", "b")
                for note in failure_notes([run[side]])]
    for note in failures:
        print(f"eagle3-tui: {note}", file=sys.stderr)
    return EXIT_FAILED if failures else 0


class Interrupted(Exception):
    """SIGTERM, SIGHUP or SIGINT during `bench compare`: unwinds it so that its cleanup stops what it
    launched (a KeyboardInterrupt would do for Ctrl-C alone; SIGTERM and SIGHUP, an SSH drop, kill the
    process outright by default and left the launched server running)."""

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """The first SIGTERM/SIGHUP/SIGINT raises `Interrupted` in the main thread; later ones are ignored so
    that the cleanup (stopping servers, which takes seconds) runs to its end.  Old handlers come back after."""
    import signal

    wanted = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if fired:
            return  # already unwinding: let the cleanup finish
        fired.append(signum)
        raise Interrupted(signum)

    old = {sig: signal.signal(sig, handler) for sig in wanted}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def compare_table(report: dict) -> str:
    """B against A per concurrency, with the workload (people's output; the TUI shows the same cells)."""
    from sessions.bench.ab_report import COMPARE_HEAD, compare_rows, workload_text

    head = COMPARE_HEAD
    rows = [head, *compare_rows(report, times="x")]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    title = f"A = {report['a'].get('profile')} ({report['a'].get('session')}), " \
            f"B = {report['b'].get('profile')} ({report['b'].get('session')})"
    return title + "\n" + workload_text(report) + "\n" + \
        "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows) + \
        "\n(each cell: median over the rounds, then min–max; ITL in ms; break-even: the accept length at " \
        "which B's time per token equals A's)"


def runs_table(runs: list[dict]) -> str:
    """The per-concurrency table (people's output; the TUI shows the same cells)."""
    from sessions.bench.metrics import RUN_HEAD, run_notes, run_rows

    rows = [RUN_HEAD, *run_rows(runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(RUN_HEAD))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows) + \
        "\n(latencies in ms)" + "".join("\n" + note for note in run_notes(runs))


def _history(args: argparse.Namespace) -> int:
    import json
    import time

    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.bench.store import best_row, load_history
    from sessions.home import resolve_home

    if len(args.rest) > 1:
        raise CliError(f"bench history takes at most one PROFILE, got {' '.join(args.rest)}", EXIT_BAD_INPUT)
    profile = args.rest[0] if args.rest else None
    if args.compare:
        return _history_compares(profile, args.json)
    rows, problems = load_history(resolve_home(), profile)
    for problem in problems:
        print(f"eagle3-tui: {problem}", file=sys.stderr)
    best = best_row(rows)
    if args.json:
        print(json.dumps([r.to_json() | {"best": r is best} for r in rows], indent=2))
        return 0
    if not rows:
        print("no bench results" + (f" for profile {profile}" if profile else ""), file=sys.stderr)
        return 0
    table = [("", "ID", "PROFILE", "DATE", "SGLANG", "1-STREAM tok/s", "TTFT ms", "TOP CONC", "TOP tok/s")]
    for r in rows:
        table.append((
            "*" if r is best else "", r.id, r.profile, time.strftime("%Y-%m-%d %H:%M", time.localtime(r.time)),
            r.sglang_version or "?", _num(r.single_stream_tok_s, ".1f"), _num(r.ttft_ms, ".1f"),
            _num(r.top_concurrency, "d"), _num(r.top_throughput, ".1f"),
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table))
    print("* best single-stream tok/s", file=sys.stderr)
    compares = _compares_of(profile)
    if compares:
        print(f"{len(compares)} A/B compare report(s): eagle3-tui bench history --compare"
              + (f" {profile}" if profile else ""), file=sys.stderr)
    return 0


def _compares_of(profile: str | None) -> list[dict]:
    from sessions.bench.store import load_compares
    from sessions.home import resolve_home

    reports, problems = load_compares(resolve_home())
    for problem in problems:
        print(f"eagle3-tui: {problem}", file=sys.stderr)
    return [r for r in reports if profile is None
            or profile in ((r.get("a") or {}).get("profile"), (r.get("b") or {}).get("profile"))]


def _history_compares(profile: str | None, as_json: bool) -> int:
    """The kept `bench compare` reports, oldest first: A, B, B's speedup per concurrency and the verdict."""
    import json
    import time

    reports = _compares_of(profile)
    if as_json:
        print(json.dumps([{
            "id": r.get("id"), "time": r.get("time"), "a": (r.get("a") or {}).get("profile"),
            "b": (r.get("b") or {}).get("profile"),
            "speedup": {str(run.get("max_concurrency")): run.get("speedup") for run in r["runs"]},
            "verdict": r.get("verdict")} for r in reports], indent=2))
        return 0
    if not reports:
        print("no compare reports" + (f" with profile {profile}" if profile else ""), file=sys.stderr)
        return 0
    for r in reports:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.get("time") or 0))
        speedups = ", ".join(f"c={run.get('max_concurrency')} {_num(run.get('speedup'), '.2f')}x"
                             for run in r["runs"])
        print(f"{r.get('id')}  {when}  A={(r.get('a') or {}).get('profile')}  "
              f"B={(r.get('b') or {}).get('profile')}  speedup {speedups or '-'}")
        print(f"    {r.get('verdict') or ''}")
    return 0


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)
