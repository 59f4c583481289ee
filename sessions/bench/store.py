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
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.home import Home, ensure_private_dir
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
    """Write ``build(stem)`` as ``<folder>/<stem>[-N].json``, a name no other writer gets, atomically, 0600.

    The content goes to a temp file made with O_EXCL (mkstemp, 0600) and fsynced, then ``link``ed to the
    final name: a link never replaces an existing file (EEXIST), so two benches saving in the same second
    can never share a path, and a reader sees either no file or the whole one (never a partial or an
    empty reserved one, as with creating the final name with O_EXCL and filling it later).  The temp name
    is then removed, so the kept file has one link.  Every string in the record goes through the
    redaction module first: results keep redacted copies only."""
    folder = ensure_private_dir(folder)
    for n in range(1, 10_000):
        name = stem if n == 1 else f"{stem}-{n}"
        path = folder / f"{name}.json"
        if path.exists() or path.is_symlink():
            continue
        data = (json.dumps(_finite(Redactor().json(build(name))), indent=2, sort_keys=True, allow_nan=False,
                           default=str) + "\n").encode()
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                continue  # another run took this name between our check and the link: the next one
        finally:
            os.unlink(tmp)
        _sync_dir(folder)
        return path
    raise OSError(f"{folder}: no free result name for {stem} after 10000 tries")


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no such numbers, and a reader must never get one as a figure."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _sync_dir(folder: Path) -> None:
    try:  # make the new name itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def load_compares(home: Home) -> tuple[list[dict[str, Any]], list[str]]:
    """(kept compare reports oldest first, problems)."""
    folder = bench_dir(home)
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    if not folder.is_dir():
        return out, problems
    for path in sorted(folder.glob("compare-*.json")):
        data = _read_json(path, problems)
        if isinstance(data, dict) and data.get("kind") == "compare" and isinstance(data.get("runs"), list):
            out.append(data)
    out.sort(key=lambda r: r.get("time") or 0.0)
    return out, problems


def _read_json(path: Path, problems: list[str]) -> Any:
    if path.is_symlink():
        problems.append(f"{path}: is a symlink; skipped")
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"{path}: not a readable bench result ({exc})")
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


def row_of(result: dict[str, Any], fallback_id: str = "") -> HistoryRow:
    runs = sorted((r for r in result.get("runs") or [] if isinstance(r, dict)),
                  key=lambda r: r.get("max_concurrency") or 0)
    single = next((r for r in runs if r.get("max_concurrency") == 1), None)
    top = runs[-1] if runs else None
    return HistoryRow(
        id=str(result.get("id") or fallback_id),
        profile=str(result.get("profile") or "?"),
        time=float(result.get("time") or 0.0),
        sglang_version=result.get("sglang_version"),
        single_stream_tok_s=single.get("output_throughput") if single else None,
        ttft_ms=runs[0].get("median_ttft_ms") if runs else None,
        top_concurrency=top.get("max_concurrency") if top else None,
        top_throughput=top.get("output_throughput") if top else None,
        command=tuple(str(a) for a in result.get("command") or ()),
        profile_toml=result.get("profile_toml"),
        result=result,
    )


def load_history(home: Home, profile: str | None = None) -> tuple[list[HistoryRow], list[str]]:
    """(rows oldest first, problems): a file that is not a bench result is named, not fatal."""
    folder = bench_dir(home)
    rows: list[HistoryRow] = []
    problems: list[str] = []
    if not folder.is_dir():
        return rows, problems
    for path in sorted(folder.glob("*.json")):
        if path.is_symlink():
            problems.append(f"{path}: is a symlink; skipped")
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: not a readable bench result ({exc})")
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
