"""Bench results in the state dir (``<state>/bench/*.json``) and the history across profiles.

Each result keeps what a later comparison needs: the profile name and its TOML as launched (for flag
differences), the exact command (secrets redacted), the SGLang version, the time, the request shape and
the runs.  Files are written atomically (0600) in a 0700 folder under names no two runs share
(`write_unique`), redacted, and read back as JSON only.  A `bench compare`
report is kept next to them as ``compare-<time>-<A>-vs-<B>.json`` (``"kind": "compare"``); its two sides
are kept as ordinary results too, so the history lists them.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.home import Home, write_new_file
from sessions.redaction import Redactor

RESULT_VERSION = 1
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def bench_dir(home: Home) -> Path:
    return home.state_root / "bench"


def save_result(home: Home, result: dict[str, Any]) -> Path:
    """Keep one bench result under a name no other run has (see `write_unique`); redacted."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(_when(result)))
    name = _SAFE.sub("-", str(result.get("profile") or "unknown"))[:80]
    return write_unique(bench_dir(home), f"{stamp}-{name}",
                        lambda stem: dict(result, version=RESULT_VERSION, id=stem))


def save_compare(home: Home, report: dict[str, Any]) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(_when(report)))
    a = _SAFE.sub("-", str((report.get("a") or {}).get("profile") or "a"))[:60]
    b = _SAFE.sub("-", str((report.get("b") or {}).get("profile") or "b"))[:60]
    return write_unique(bench_dir(home), f"compare-{stamp}-{a}-vs-{b}",
                        lambda stem: dict(report, kind="compare", version=RESULT_VERSION, id=stem))


def _when(record: dict[str, Any]) -> float:
    value = record.get("time")
    return value if isinstance(value, (int, float)) and 0 < value < 1e11 else time.time()


def write_unique(folder: Path, stem: str, build: Callable[[str], dict[str, Any]]) -> Path:
    """Write ``build(stem)`` as ``<folder>/<stem>[-N].json``, a name no other writer gets, atomically, 0600
    (`sessions.home.write_new_file`, the result store's one primitive).  Every string in the record goes
    through the redaction module first: results keep redacted copies only."""

    def payload(name: str) -> bytes:
        return (json.dumps(_finite(Redactor().json(build(name))), indent=2, sort_keys=True, allow_nan=False,
                           default=str) + "\n").encode()

    return write_new_file(folder, stem, payload)


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no such numbers, and a reader must never get one as a figure."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def load_compares(home: Home) -> tuple[list[dict[str, Any]], list[str]]:
    """(kept compare reports oldest first, each in the shape `compare_report` checks; problems)."""
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in _result_files(home, problems, "compare-*.json"):
        data = _read_json(path, problems)
        if data is None:
            continue
        report = compare_report(data)
        if report is None:
            problems.append(f"{path}: not a compare report (no runs list); skipped")
            continue
        out.append(report)
    out.sort(key=lambda r: r["time"] or 0.0)
    return out, problems


def compare_report(data: Any) -> dict[str, Any] | None:
    """A kept compare report with the types its readers rely on, or None when it is not one: ``time`` a
    wall clock or None, ``a``/``b`` objects whose ``profile`` is a string or None, ``verdict`` a string
    or None, ``runs`` objects with an int ``max_concurrency`` and a finite ``speedup`` (else None)."""
    if not isinstance(data, dict) or data.get("kind") != "compare" or not isinstance(data.get("runs"), list):
        return None
    sides = {}
    for side in ("a", "b"):
        value = data.get(side)
        value = dict(value) if isinstance(value, dict) else {}
        value["profile"] = safe_files.text(value.get("profile"), 255)
        sides[side] = value
    runs = [dict(run, max_concurrency=safe_files.integer(run.get("max_concurrency"), 0),
                 speedup=safe_files.finite(run.get("speedup")))
            for run in data["runs"] if isinstance(run, dict)]
    return dict(data, **sides, runs=runs, time=safe_files.epoch(data.get("time")),
                id=safe_files.text(data.get("id"), 255), verdict=safe_files.text(data.get("verdict")))


def _result_files(home: Home, problems: list[str], pattern: str = "*.json") -> list[Path]:
    """The kept files matching ``pattern``; a bench folder that is not a folder is a problem, not a crash."""
    folder = bench_dir(home)
    try:
        if folder.is_dir():
            return sorted(folder.glob(pattern))
        if os.path.lexists(folder):
            problems.append(f"{folder} is a file where the bench results folder is expected; no result is read")
    except OSError as exc:
        problems.append(safe_files.describe_os_error(exc, folder))
    return []


def _read_json(path: Path, problems: list[str]) -> Any:
    """The JSON of one kept file, or None with its problem noted: a FIFO, a device, a symlink, a hard
    link, a file over the cap, bad UTF-8 or deep JSON is skipped alone (`sessions.safe_files`)."""
    try:
        return safe_files.read_json(path, safe_files.BENCH_RESULT)
    except safe_files.FileRefused as exc:
        problems.append(f"{exc}; skipped")
    except OSError as exc:
        problems.append(f"{safe_files.describe_os_error(exc, path)}; skipped")
    return None


@dataclass(frozen=True)
class HistoryRow:
    """One kept result, summarised the way the comparison table shows it."""

    id: str
    profile: str
    time: float
    sglang_version: str | None
    single_stream_tok_s: float | None  # output throughput at concurrency 1
    ttft_ms: float | None  # median TTFT at the lowest concurrency
    top_concurrency: int | None
    top_throughput: float | None  # output throughput at the highest concurrency
    command: tuple[str, ...]
    profile_toml: str | None
    result: dict[str, Any]

    @property
    def failed(self) -> int:
        """Requests of this result that failed: such a result is listed, never ranked best."""
        return sum(int(r.get("failed") or 0) for r in self.result.get("runs") or [] if isinstance(r, dict))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "profile": self.profile,
            "time": self.time,
            "sglang_version": self.sglang_version,
            "single_stream_tok_s": self.single_stream_tok_s,
            "median_ttft_ms": self.ttft_ms,
            "top_concurrency": self.top_concurrency,
            "top_output_throughput": self.top_throughput,
            "command": list(self.command),
            "failed_requests": self.failed,
        }


def _run_of(run: dict[str, Any]) -> dict[str, Any]:
    """One run of a kept result with the fields the table reads checked: a number that is not a finite
    one (a string, NaN, 1e300, a bool) is None, ``max_concurrency`` an int or None."""
    checked = {key: safe_files.finite(run.get(key), 0.0, 1e15) for key in _RUN_FIGURES}
    failed = run.get("failed")
    # A failure count that is not a count is taken as a failure: such a result is never ranked best.
    failed = 0 if failed is None else safe_files.integer(failed, 0, 1 << 31) if safe_files.integer(failed, 0) is not None else 1
    return dict(run, **checked, max_concurrency=safe_files.integer(run.get("max_concurrency"), 0, 1 << 31),
                failed=failed)


_RUN_FIGURES = ("output_throughput", "median_ttft_ms", "input_throughput", "request_throughput", "median_itl_ms",
                "median_e2e_latency_ms", "p99_ttft_ms", "p99_itl_ms", "mean_ttft_ms", "mean_itl_ms", "duration_s")


def row_of(result: dict[str, Any], fallback_id: str = "") -> HistoryRow:
    """The history row of one kept result, its fields checked (`sessions.safe_files`' typed fields): a
    result of an unexpected shape is shown with what it has, never a crash."""
    runs = [_run_of(r) for r in result.get("runs") or () if isinstance(r, dict)]
    runs.sort(key=lambda r: r["max_concurrency"] or 0)
    result = dict(result, runs=runs)
    single = next((r for r in runs if r["max_concurrency"] == 1), None)
    top = runs[-1] if runs else None
    command = safe_files.text_list(result.get("command")) or []
    return HistoryRow(
        id=safe_files.text(result.get("id"), 255) or fallback_id,
        profile=safe_files.text(result.get("profile"), 255) or "?",
        time=safe_files.epoch(result.get("time")) or 0.0,
        sglang_version=safe_files.text(result.get("sglang_version"), 64),
        single_stream_tok_s=single["output_throughput"] if single else None,
        ttft_ms=runs[0]["median_ttft_ms"] if runs else None,
        top_concurrency=top["max_concurrency"] if top else None,
        top_throughput=top["output_throughput"] if top else None,
        command=tuple(command),
        profile_toml=safe_files.text(result.get("profile_toml"), 1 << 20),
        result=result,
    )


def load_history(home: Home, profile: str | None = None) -> tuple[list[HistoryRow], list[str]]:
    """(rows oldest first, problems): a file that is not a bench result is named, not fatal."""
    rows: list[HistoryRow] = []
    problems: list[str] = []
    for path in _result_files(home, problems):
        data = _read_json(path, problems)
        if data is None:
            continue
        if isinstance(data, dict) and data.get("kind") == "compare":
            continue  # a compare report (`load_compares`); its sides are kept as results of their own
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            problems.append(f"{path}: not a bench result (no runs list)")
            continue
        row = row_of(data, path.stem)
        if profile is None or row.profile == profile:
            rows.append(row)
    rows.sort(key=lambda r: r.time)
    return rows, problems


def best_row(rows: list[HistoryRow]) -> HistoryRow | None:
    """The best result: highest single-stream tok/s, ties broken by throughput at the top concurrency."""
    scored = [r for r in rows if (r.single_stream_tok_s is not None or r.top_throughput is not None)
              and not r.failed]
    if not scored:
        return None
    return max(scored, key=lambda r: (r.single_stream_tok_s or 0.0, r.top_throughput or 0.0))


def _flags(argv: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a launch command (after the interpreter and module); a bare flag -> ""."""
    start = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
    out: dict[str, str] = {}
    i = start
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if not eq:
                values = []
                while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    values.append(argv[i + 1])
                    i += 1
                value = " ".join(values)
            out[name] = value
        i += 1
    return out


def flag_changes(before: tuple[str, ...] | list[str], after: tuple[str, ...] | list[str]) -> list[str]:
    """Lines ``+ --flag v`` (added), ``- --flag v`` (removed), ``~ --flag a -> b`` between two commands."""
    a, b = _flags(before), _flags(after)
    lines = []
    for name in sorted(a.keys() | b.keys()):
        if name not in b:
            lines.append(f"- {name} {a[name]}".rstrip())
        elif name not in a:
            lines.append(f"+ {name} {b[name]}".rstrip())
        elif a[name] != b[name]:
            lines.append(f"~ {name} {a[name]} -> {b[name]}")
    return lines


def short_changes(before: HistoryRow, after: HistoryRow, ignore: tuple[str, ...] = ("--port",)) -> str:
    """The flag differences of ``after`` against ``before`` in a few words (the history table's column)."""
    lines = [ln for ln in flag_changes(before.command, after.command)
             if ln.split()[1] not in ignore]
    if not lines:
        return "same flags"
    words = []
    for line in lines:
        parts = line.split()
        sign, name = parts[0], parts[1].lstrip("-")
        value = parts[-1] if len(parts) > 2 else ""
        words.append(f"{sign}{name} {value}".strip())
    return ", ".join(words)
