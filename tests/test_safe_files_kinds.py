"""One way to read a file: every reader in `sessions.safe_files` takes a `Kind` (the file's name in messages,
its cap, whether it is private), so a bounded read is spelled once; and the tail read refuses what the
others refuse without waiting on it."""
from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

from sessions import safe_files


def test_every_reader_takes_a_kind():
    readers = {name: fn for name, fn in vars(safe_files).items()
               if inspect.isfunction(fn) and fn.__module__ == safe_files.__name__
               and name.startswith(("open", "read", "check")) and not name.startswith("_")}
    assert {"open_fd", "open_file", "read_bytes", "read_text", "read_json", "read_file_tail", "check_file"} <= set(readers)
    takes_no_kind = [name for name, fn in readers.items()
                     if "Kind" not in [str(p.annotation) for p in inspect.signature(fn).parameters.values()]]
    assert takes_no_kind == []


def test_the_tail_read_returns_the_end_and_its_offset_and_refuses_a_fifo_and_a_link(tmp_path: Path):
    path = tmp_path / "errors.jsonl"
    path.write_bytes(b"x" * 100 + b"\nlast line\n")
    assert safe_files.read_file_tail(path, safe_files.OUTPUT_DATA, 10) == (b"last line\n", 101)
    assert safe_files.read_file_tail(path, safe_files.OUTPUT_DATA, 1000) == (path.read_bytes(), 0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(safe_files.SpecialFileError, match="is a FIFO"):  # at once: no writer is waited for
        safe_files.read_file_tail(fifo, safe_files.OUTPUT_DATA, 10)
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(safe_files.SpecialFileError, match="symlink"):
        safe_files.read_file_tail(link, safe_files.Kind("log", None, private=True), 10)
    assert safe_files.read_file_tail(link, safe_files.Kind("log", None, private=True, nofollow=False), 5)[0] == b"line\n"
