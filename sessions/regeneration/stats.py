"""What the regenerated data looks like, kept as the job runs: answer lengths before and after, finish
reasons (``length`` means cut by ``max_tokens``: bad training data), the share of empty answers, and one
line per server.  Every finished row also goes to ``<job dir>/rows.jsonl`` (one line each), so a resumed
job's statistics cover the rows of earlier runs too.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.safe_files import Kind, open_file

ROWS_FILE = "rows.jsonl"
ROW_STATISTICS = Kind("row statistics", None)  # read a line at a time


@dataclass
class RowStats:
    """One finished row: its status, its answers (chars of the old and new ones), tokens and finishes."""

    row_id: str
    status: str
    server: str | None = None
    before_chars: list[int] = field(default_factory=list)
    after_chars: list[int] = field(default_factory=list)
    after_tokens: int = 0
    finish: dict[str, int] = field(default_factory=dict)
    empty: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.row_id, "status": self.status, "server": self.server, "before_chars": self.before_chars,
                "after_chars": self.after_chars, "after_tokens": self.after_tokens, "finish": self.finish,
                "empty": self.empty}


class RegenStats:
    """Totals over every row finished so far (this run and the ones before it)."""

    def __init__(self, job_dir: Path) -> None:
        self.path = job_dir / ROWS_FILE
        self._lock = threading.Lock()
        self.before_n = self.before_sum = 0
        self.after_n = self.after_sum = 0
        self.tokens = 0
        self.finish: dict[str, int] = {}
        self.empty = 0
        self.servers: dict[str, dict[str, int]] = {}
        self._fd: int | None = None

    def load(self, ids: set[str]) -> None:
        """Add the rows of earlier runs that are in ``ids`` (the rows the output files hold)."""
        if not self.path.exists():
            return
        with open_file(self.path, ROW_STATISTICS) as fh:  # a line at a time: never the whole file at once
            for raw in fh:
                try:
                    data = json.loads(raw)
                except json.JSONDecodeError:
                    continue  # a torn last line: that row's statistics are lost, not its data
                if isinstance(data, dict) and data.get("id") in ids:
                    self._add(RowStats(data["id"], data.get("status", ""), data.get("server"),
                                       list(data.get("before_chars") or []), list(data.get("after_chars") or []),
                                       int(data.get("after_tokens") or 0), dict(data.get("finish") or {}),
                                       int(data.get("empty") or 0)))
                    ids.discard(data["id"])

    def open_for_append(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def record(self, row: RowStats) -> None:
        with self._lock:
            self._add(row)
            if self._fd is not None:
                os.write(self._fd, (json.dumps(row.to_json()) + "\n").encode())

    def _add(self, row: RowStats) -> None:
        self.before_n += len(row.before_chars)
        self.before_sum += sum(row.before_chars)
        if row.status == "success":
            self.after_n += len(row.after_chars)
            self.after_sum += sum(row.after_chars)
        self.tokens += row.after_tokens
        for reason, n in row.finish.items():
            self.finish[reason] = self.finish.get(reason, 0) + n
        self.empty += row.empty
        if row.server:
            line = self.servers.setdefault(row.server, {"rows": 0, "success": 0, "error": 0, "skipped": 0,
                                                        "tokens": 0})
            line["rows"] += 1
            line[row.status] = line.get(row.status, 0) + 1
            line["tokens"] += row.after_tokens

    def snapshot(self) -> dict[str, Any]:
        """The ``stats`` object of the progress file (and of ``regenerate status --json``)."""
        with self._lock:
            answers = sum(self.finish.values())
            return {
                "answers": answers,
                "mean_answer_chars_before": round(self.before_sum / self.before_n, 1) if self.before_n else None,
                "mean_answer_chars_after": round(self.after_sum / self.after_n, 1) if self.after_n else None,
                "mean_answer_tokens_after": round(self.tokens / answers, 1) if answers else None,
                "finish_reasons": dict(self.finish),
                "length_share": round(self.finish.get("length", 0) / answers, 4) if answers else None,
                "empty_answers": self.empty,
                "empty_share": round(self.empty / answers, 4) if answers else None,
                "servers": {url: dict(line) for url, line in self.servers.items()},
            }


def shape_lines(stats: dict[str, Any] | None) -> list[str]:
    """The data's shape in words, for ``regenerate status`` and the jobs screen: one line, plus one line per
    server when there are several."""
    s = stats or {}
    if not s.get("answers"):
        return []
    finish = ", ".join(f"{k} {v}" for k, v in sorted((s.get("finish_reasons") or {}).items()))
    lines = [(f"answers: {s['answers']} ({finish}; {100 * (s.get('length_share') or 0):.0f}% cut by max_tokens) · "
             f"mean chars {s.get('mean_answer_chars_before')} before → {s.get('mean_answer_chars_after')} after · "
             f"{s.get('mean_answer_tokens_after')} tokens · {100 * (s.get('empty_share') or 0):.1f}% empty")]
    servers = s.get("servers") or {}
    if len(servers) > 1:
        lines += [f"{url}: {row['rows']} rows, {row.get('error', 0)} error, {row['tokens']:,} tokens"
                  for url, row in servers.items()]
    return lines
