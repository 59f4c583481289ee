"""Widgets draw immutable snapshots and never read files or sources (the layout rule; issue 21 item 10).

`widgets/state_line.py` read ``state.json`` on the UI thread to say when a session ended; a slow or odd
file there froze the whole TUI.  This scans every widget module's code: no file-reading call and no import
of the engine's readers.  What a widget needs comes in the snapshot the poll worker built.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

WIDGETS = Path(__file__).resolve().parent.parent / "widgets"
# Modules whose purpose is reading files, processes or servers (data types from elsewhere are fine).
READER_MODULES = ("sessions.home", "sessions.safe_files", "sessions.state_file", "sessions.probes", "psutil",
                  "httpx", "os", "pathlib", "io", "json", "shutil")
# Reader functions and classes, wherever they are imported from.
READER_NAMES = {"read_json", "read_state", "LogFile", "open_log", "read_increment", "iter_blocks", "capture_status",
                "list_sessions", "ServerSession", "default_gpu_source", "busy_gpus_for_launch"}
READ_CALLS = {"open", "read_text", "read_bytes", "read_json", "read_state", "iterdir", "stat", "listdir", "scandir"}


def _widget_modules() -> list[Path]:
    return sorted(p for p in WIDGETS.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", _widget_modules(), ids=lambda p: p.name)
def test_a_widget_module_reads_no_file(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only: set[int] = set()
    for node in ast.walk(tree):  # imports under `if TYPE_CHECKING:` bring types, not readers
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            type_only |= {id(n) for n in ast.walk(node)}
    problems = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = []
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in READER_MODULES):
                problems.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.ImportFrom):
            problems += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in READER_NAMES]
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in READ_CALLS:
                problems.append(f"line {node.lineno}: calls {called}()")
    assert not problems, f"{path.name} reads outside its snapshot: {problems}"
