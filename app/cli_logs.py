"""`eagle3-tui inspect-log FILE [--json]`: where a static SGLang log stopped, and why (DESIGN §3 contract).

`--json` prints exactly one JSON object: phase, outcome, error, error_line, ranks_loaded, ranks_expected,
hints, and ``serving`` (the figures of the last Decode/Prefill batch lines, or null).  Without it, a short
summary for people.  Any file content is accepted (binary junk, invalid UTF-8, one huge line, an empty
file); a missing or unreadable file, a directory, a FIFO, a device or a
socket is bad input (exit 2), answered at once (the log core never waits on a special file).  The exit
status says the outcome: 0 ready, 3 crashed, 4 incomplete.
Only argparse is imported here; the engine is imported inside the handler (fast `--help`).
"""
from __future__ import annotations

import argparse
import sys

# Hints read the whole file when it is small, else its head and its tail (startup is at the head, the
# failure at the tail).  Each line is cut to a bounded length first.
_HINT_WHOLE_FILE_BYTES = 8 << 20
_HINT_HEAD_BYTES = 4 << 20
_HINT_TAIL_BYTES = 4 << 20

# Exit status by outcome, so that a script can branch on it without parsing (1 and 2 are the CLI's own:
# an internal failure, bad input).
EXIT_READY = 0
EXIT_CRASHED = 3
EXIT_INCOMPLETE = 4
_EXIT_OF_OUTCOME = {"ready": EXIT_READY, "crashed": EXIT_CRASHED, "incomplete": EXIT_INCOMPLETE}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "inspect-log",
        help="read a static SGLang log: phase reached, outcome, first fatal error, ranks, hints",
        description="Read FILE (an SGLang server log, any version from 0.4 to 0.5.23) and report the "
        "furthest startup phase, the outcome (ready, crashed or incomplete: a static file cannot tell a "
        "hang from a start still running), the first fatal error with its line number, which TP ranks "
        "logged 'Load weight end', the TP size from the server_args line, and hints from the catalogue "
        "of known causes.",
        epilog="exit status: 0 the log reached ready, 3 it crashed, 4 incomplete (it stops before ready "
        "without a fatal error, an empty log too), 2 bad input (a missing or unreadable file, a directory, "
        "a FIFO, a device or a socket), 1 an internal failure.  With --json the report is printed first "
        "in every one of these outcomes.",
    )
    p.add_argument("file", metavar="FILE", help="the log file")
    p.add_argument("--json", action="store_true", help="print one JSON object: outcome, last phase, error line, ranks and hints")
    p.set_defaults(func=_inspect_log)


def _bad_log(path: str, exc: OSError):
    """The CliError (exit 2) for a log that cannot be read: missing, a directory, a FIFO, a device..."""
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.logs import LogFileError

    if isinstance(exc, LogFileError):
        return CliError(str(exc), EXIT_BAD_INPUT)
    if isinstance(exc, FileNotFoundError):
        return CliError(f"{path}: no such file", EXIT_BAD_INPUT)
    return CliError(f"{path}: cannot read: {exc.strerror or exc}", EXIT_BAD_INPUT)


def _printable(text: str) -> str:
    """Control characters (from binary junk) made visible, so the terminal is not disturbed."""
    return "".join(ch if ch.isprintable() or ch == "\t" else "\ufffd" for ch in text)


def _human(path: str, summary, hints) -> str:
    from sessions.phases import StartupPhase

    out = [f"{path}: {summary.outcome}, furthest phase {summary.phase}"]
    if summary.line_count == 0:
        out[0] = f"{path}: empty log (nothing started yet)"
    if summary.events:
        out.append("  phases:   " + ", ".join(f"{e.phase} (line {e.line_no})" for e in summary.events))
    if summary.error is not None:
        who = f" (TP{summary.error_rank})" if summary.error_rank is not None else ""
        out.append(f"  error:    line {summary.error_line}{who}: {_printable(summary.error)[:300]}")
        if summary.error_cause:
            out.append(f"  cause:    line {summary.error_cause_line}: {_printable(summary.error_cause)[:300]}")
        first = next((e for e in summary.errors if e.fatal), None)
        if first is not None and first.detail and first.line_no != summary.error_line:
            out.append(f"  raised:   line {first.line_no}: {_printable(first.text)[:300]}")
    expected = summary.ranks_expected
    loaded = list(summary.ranks_loaded)
    if loaded or expected:
        shown = ", ".join(str(r) for r in loaded) if loaded else "none"
        of = f" of {expected}" if expected else ""
        out.append(f"  ranks:    Load weight end from {len(loaded)}{of}: {shown}")
    if summary.progress is not None and summary.outcome == "incomplete":
        p = summary.progress
        total = f"/{p.total}" if p.total is not None else ""
        detail = f" ({p.detail})" if p.detail else ""
        out.append(f"  progress: {p.label} {p.done}{total}{detail}")
    if summary.capture_layers is not None:
        out.append(f"  capture:  layers {list(summary.capture_layers)}")
    if summary.outcome == "incomplete" and summary.phase is not StartupPhase.READY and summary.line_count:
        out.append("  (a static log cannot tell a hang from a start that is still running)")
    tail = f"  lines:    {summary.line_count}"
    if summary.last_log_time:
        tail += f", last timestamp {summary.last_log_time}"
    out.append(tail)
    for h in hints:
        out.append(f"  hint [{h.id}] {_printable(h.title)}")
        out.append(f"      {_printable(h.detail)}")
    return "\n".join(out) + "\n"


def _write(text: str) -> None:
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    sys.stdout.write(text.encode(encoding, "replace").decode(encoding, "replace"))
    sys.stdout.flush()


def _inspect_log(args: argparse.Namespace) -> int:
    import json

    from app.cli import EXIT_FAILED, CliError
    from sessions.hints import KnownCausesError, hints_for_log
    from sessions.logs import read_head_and_tail
    from sessions.phases import summarize_file
    from sessions.serving import summarize_serving

    path = args.file
    try:
        summary = summarize_file(path)  # through the log core: a FIFO or a device is refused at once
        served = summarize_serving(path)
        lines = [line.text for line in read_head_and_tail(
            path, _HINT_WHOLE_FILE_BYTES, _HINT_HEAD_BYTES, _HINT_TAIL_BYTES
        )]
    except OSError as exc:
        raise _bad_log(path, exc) from None
    try:
        hints = hints_for_log(summary, lines)
    except KnownCausesError as exc:
        raise CliError(f"the known-causes catalogue is broken: {exc}", EXIT_FAILED) from None
    if args.json:
        result = {
            "phase": str(summary.phase),
            "outcome": summary.outcome,
            "error": summary.error,
            "error_line": summary.error_line,
            "ranks_loaded": list(summary.ranks_loaded),
            "ranks_expected": summary.ranks_expected,
            "hints": [h.to_json() for h in hints],
            "serving": served.to_json() if served is not None else None,
        }
        _write(json.dumps(result) + "\n")
    else:
        _write(_human(path, summary, hints) + _human_serving(served))
    return _EXIT_OF_OUTCOME.get(summary.outcome, EXIT_INCOMPLETE)


def _human_serving(served) -> str:
    if served is None:
        return ""
    def num(value, fmt: str) -> str:
        return "?" if value is None else format(value, fmt)

    line = (f"  serving:  gen {num(served.gen_throughput, '.1f')} tok/s, running {num(served.running_reqs, 'd')}, "
            f"queued {num(served.queue_reqs, 'd')}, token usage {num(served.token_usage, '.2f')}")
    if served.accept_length is not None:
        line += f", accept len {served.accept_length:.2f}"
    return line + " (last stats lines of the log)\n"
