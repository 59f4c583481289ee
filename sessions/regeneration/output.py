"""SpecForge's regeneration layout, written one whole row at a time: ``<out>.jsonl`` (status success),
``<out>_error.jsonl`` and ``<out>_skipped.jsonl``.

A row is one ``os.write`` of its whole line (newline included) on an ``O_APPEND`` descriptor, made only once
its whole conversation is done, so a kill -9 leaves each file as complete lines plus at most one torn last
line.  `OutputFiles.open` on resume drops a torn tail (a last line without its newline, or one that is not
JSON) and returns the ids already written: the job skips exactly those rows and redoes every other one
(SpecForge's own resume skips as many *leading* input lines as there are output lines, while it writes in
completion order: scaleout-facts §C1).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.safe_files import Kind, open_file

STATUSES = ("success", "error", "skipped")


class OutputError(RuntimeError):
    """The output files cannot be used (a fresh job found them already there, a row id is written twice)."""


@dataclass
class OutputFiles:
    output: Path
    error: Path
    skipped: Path
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    done_ids: set[str] = field(default_factory=set)
    _fds: dict[str, int] = field(default_factory=dict)

    def paths(self) -> dict[str, Path]:
        return {"success": self.output, "error": self.error, "skipped": self.skipped}

    def open_for_append(self, resume: bool) -> None:
        """Open the three files for appending; a fresh job refuses files that exist (as SpecForge's recipe
        does), a resume reads the ids they hold."""
        self.output.parent.mkdir(parents=True, exist_ok=True)
        for status, path in self.paths().items():
            if path.exists() and not resume:
                raise OutputError(f"{path} already exists: choose a fresh output, or resume the job that wrote it")
            if path.exists():
                self._repair_and_read(status, path)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            self._fds[status] = fd

    def _repair_and_read(self, status: str, path: Path) -> None:
        with open_file(path, Kind(f"{status} output", None)) as fh:
            data = fh.read()  # whole: a torn last line is cut off and the file rewritten from it
        keep = len(data)
        lines = data.split(b"\n")
        if lines and lines[-1]:  # the last write was torn: no newline at its end
            keep -= len(lines[-1])
        lines = lines[:-1]
        for offset, raw in enumerate(lines):
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                if offset == len(lines) - 1:  # a torn line that happened to end in a newline byte
                    keep -= len(raw) + 1
                    break
                raise OutputError(f"{path}: line {offset + 1} is not JSON; the file was changed by hand") from None
            row_id = row.get("id") if isinstance(row, dict) else None
            if not isinstance(row_id, str):
                raise OutputError(f"{path}: line {offset + 1} has no string id")
            if row_id in self.done_ids:
                raise OutputError(f"{path}: row {row_id!r} is written twice")
            self.done_ids.add(row_id)
            self.counts[status] += 1
        if keep != len(data):
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)  # read above: a regular file
            try:
                os.ftruncate(fd, keep)
            finally:
                os.close(fd)

    def write(self, status: str, row: dict[str, Any]) -> None:
        """Append one whole row in a single write (never half a conversation)."""
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
        fd = self._fds[status]
        written = os.write(fd, line)
        while written < len(line):  # a short write on a regular file: finish it
            written += os.write(fd, line[written:])
        self.done_ids.add(row["id"])
        self.counts[status] += 1

    def sync(self) -> None:
        for fd in self._fds.values():
            os.fsync(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def total(self) -> int:
        return sum(self.counts.values())


def count_rows(path: Path) -> int:
    """Complete lines in one output file (what SpecForge's recipe counts with ``awk 'END {print NR}'``)."""
    if not path.exists():
        return 0
    with open_file(path, Kind("output", None)) as fh:  # in pieces: an output may be larger than memory
        return sum(piece.count(b"\n") for piece in iter(lambda: fh.read(1 << 20), b""))
