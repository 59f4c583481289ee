"""`eagle3-tui inspect-log FILE [--json]`: where a static SGLang log stopped, and why (DESIGN §3 contract).

`--json` prints exactly one JSON object: phase, outcome, error, error_line, ranks_loaded, ranks_expected,
hints, and ``serving`` (the figures of the last Decode/Prefill batch lines, or null).  Without it, a short summary for people.  Any file content is accepted (binary junk, invalid
UTF-8, one huge line, an empty file); a missing or unreadable file is bad input (exit 2).
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
_HINT_LINE_CHARS = 8192


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "inspect-log",
        help="read a static SGLang log: phase reached, outcome, first fatal error, ranks, hints",
        description="Read FILE (an SGLang server log, any version from 0.4 to 0.5.23) and report the "
        "furthest startup phase, the outcome (ready, crashed or incomplete: a static file cannot tell a "
        "hang from a start still running), the first fatal error with its line number, which TP ranks "
        "logged 'Load weight end', the TP size from the server_args line, and hints from the catalogue "
        "of known causes.",
    )
    p.add_argument("file", metavar="FILE", help="the log file")
    p.add_argument("--json", action="store_true", help="print one JSON object (the DESIGN §3 contract)")
    p.set_defaults(func=_inspect_log)


def _open_checked(path: str):
    from app.cli import EXIT_BAD_INPUT, CliError

    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise CliError(f"{path}: no such file", EXIT_BAD_INPUT) from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory, not a log file", EXIT_BAD_INPUT) from None
    except PermissionError:
        raise CliError(f"{path}: permission denied", EXIT_BAD_INPUT) from None
    except OSError as exc:
        raise CliError(f"{path}: cannot open: {exc.strerror or exc}", EXIT_BAD_INPUT) from None


def _hint_lines(fh, size: int) -> list[str]:
    """The lines hints look at: the whole file when small, else its head and tail; each line bounded."""
    if size <= _HINT_WHOLE_FILE_BYTES:
        fh.seek(0)
        blobs = [fh.read(_HINT_WHOLE_FILE_BYTES)]
    else:
        fh.seek(0)
        head = fh.read(_HINT_HEAD_BYTES)
        fh.seek(max(0, size - _HINT_TAIL_BYTES))
        blobs = [head, fh.read(_HINT_TAIL_BYTES)]
    lines: list[str] = []
    half = _HINT_LINE_CHARS // 2
    for blob in blobs:
        for raw in blob.split(b"\n"):
            if len(raw) > _HINT_LINE_CHARS:
                raw = raw[:half] + b" ... " + raw[-half:]
            lines.append(raw.decode("utf-8", "replace"))
    return lines


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
        out.append(f"  error:    line {summary.error_line}: {_printable(summary.error)[:300]}")
        first = next((e for e in summary.errors if e.fatal), None)
        if first is not None and first.detail:
            out.append(f"            {_printable(first.detail)[:300]}")
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
    import os

    from app.cli import EXIT_FAILED, CliError
    from sessions.hints import KnownCausesError, hints_for_log
    from sessions.phases import READ_CHUNK_BYTES, StartupTracker
    from sessions.serving import ServingTracker

    path = args.file
    with _open_checked(path) as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            tracker = StartupTracker()
            serving = ServingTracker()
            while True:
                chunk = fh.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                tracker.feed_bytes(chunk)
                serving.feed_bytes(chunk)
            tracker.flush()
            serving.feed_bytes(b"\n")
            served = serving.snapshot()
            summary = tracker.summary()
            lines = _hint_lines(fh, size)
        except OSError as exc:
            raise CliError(f"{path}: read failed: {exc.strerror or exc}", EXIT_FAILED) from None
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
    return 0


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
