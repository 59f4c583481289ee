"""Every file the app reads goes through `sessions.safe_files` (issue 22): a scan of the tree's syntax
fails when a module reads a file another way.

What counts as reading a file: ``Path.read_text`` / ``read_bytes``, builtin ``open()`` (or ``X.open()``)
in a read mode, ``os.open`` with ``O_RDONLY``/``O_RDWR`` (not a folder, not a lock or a file it creates),
``json.load`` and ``tomllib.load`` on an open file.  Each exception is listed below with its reason; an
entry that no longer matches anything fails too, so the list stays short and true.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("sessions", "app", "widgets")
THE_READER = "sessions/safe_files.py"

# (module or folder, function or "*") -> why it may read files itself
ALLOWED: dict[tuple[str, str], str] = {
    ("sessions/capture/plugin/", "*"): "the capture plugin runs inside SGLang's own process and imports nothing "
    "of eagle3-tui; its writer reads its own chunks back with O_NOFOLLOW relative to a held folder fd",
    ("sessions/emulator/", "*"): "the SGLang stand-in reads its model folder and HTTP bodies the way SGLang "
    "does (it must behave like SGLang 0.5.23, not like eagle3-tui)",
    ("sessions/probes.py", "*"): "kernel pseudo-files under /proc (/proc/net/tcp, /proc/<pid>/stat), read on "
    "the hot path of every status; nobody can plant a FIFO or a link there",
    ("sessions/stacks.py", "ptrace_scope"): "/proc/sys/kernel/yama/ptrace_scope, a kernel setting",
    ("sessions/extraction/output.py", "make_durable"): "reopens a file the job itself just wrote, with "
    "O_NOFOLLOW, to fsync it (its bytes are not read)",
}

_READ_ATTRS = {"read_text", "read_bytes"}


def _mode_reads(call: ast.Call, mode_index: int) -> bool:
    mode: ast.expr | None = call.args[mode_index] if len(call.args) > mode_index else None
    for kw in call.keywords:
        if kw.arg == "mode":
            mode = kw.value
    if mode is None:
        return True
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return not any(c in mode.value for c in "wax")
    return True  # a mode computed at run time: assume it reads


def _flag_names(node: ast.expr) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} | \
           {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


# Libraries that open a file by the name they are given (adv22: a FIFO planted as ``model.safetensors`` or
# ``data_3.ckpt`` made ``extract verify --lm-head-check`` and the job's vocab count wait for good).  They may
# be given only a name bound by ``with safe_files.opened_path(...) as NAME`` (or a ``safe_files`` handle).
_BY_NAME_LOADERS = {("torch", "load"), ("np", "load"), ("numpy", "load"), ("mmap", "mmap"), ("shutil", "copyfile"),
                    ("shutil", "copy"), ("shutil", "copy2"), ("shutil", "copyfileobj"), ("zipfile", "ZipFile"),
                    ("safetensors", "safe_open"), ("tarfile", "open")}
_BY_NAME_FUNCTIONS = {"safe_open", "load_file", "ZipFile"}


def _vetted_names(tree: ast.AST) -> set[str]:
    """Names bound by ``with safe_files.<reader>(...) as NAME``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                call = item.context_expr
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and isinstance(call.func.value, ast.Name) and call.func.value.id == "safe_files"
                        and isinstance(item.optional_vars, ast.Name)):
                    names.add(item.optional_vars.id)
    return names


def _by_name_load(call: ast.Call, vetted: set[str]) -> str | None:
    fn = call.func
    if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and (fn.value.id, fn.attr) in _BY_NAME_LOADERS:
        what = f"{fn.value.id}.{fn.attr}()"
    elif isinstance(fn, ast.Name) and fn.id in _BY_NAME_FUNCTIONS:
        what = f"{fn.id}()"
    else:
        return None
    if what == "tarfile.open()" and not _tar_reads(call):
        return None
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Name) and first.id in vetted:
        return None
    return f"{what} of a file it opens by name"


def _tar_reads(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and mode.value[:1] in "wax")


def reads_in(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, enclosing function, what) of every file read in ``tree``."""
    found: list[tuple[int, str, str]] = []
    vetted = _vetted_names(tree)

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                what = _read_call(child) or _by_name_load(child, vetted)
                if what:
                    found.append((child.lineno, name, what))
            visit(child, name)

    visit(tree, "<module>")
    return found


def _read_call(call: ast.Call) -> str | None:
    fn = call.func
    if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "safe_files":
        return None  # the one reader
    if isinstance(fn, ast.Attribute) and fn.attr in _READ_ATTRS:
        return f".{fn.attr}()"
    if isinstance(fn, ast.Name) and fn.id == "open" and _mode_reads(call, 1):
        return "open() for reading"
    if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
        owner, attr = fn.value.id, fn.attr
        if (owner, attr) in {("json", "load"), ("tomllib", "load"), ("pickle", "load"), ("io", "open"),
                             ("codecs", "open")}:
            return f"{owner}.{attr}()"
        if owner == "os" and attr == "open" and len(call.args) > 1:
            flags = _flag_names(call.args[1])
            if flags & {"O_RDONLY", "O_RDWR"} and not flags & {"O_DIRECTORY", "O_CREAT"}:
                return "os.open() for reading"
    if isinstance(fn, ast.Attribute) and fn.attr == "open" and not (
            isinstance(fn.value, ast.Name) and fn.value.id in {"os", "tarfile", "zipfile", "webbrowser"}):
        first = call.args[0] if call.args else None
        if first is None and not call.keywords or (
                isinstance(first, ast.Constant) and isinstance(first.value, str) and _mode_reads(call, 0)):
            return ".open() for reading"
    return None


def _allowed(rel: str, func: str) -> str | None:
    for where, name in ALLOWED:
        if (rel == where or (where.endswith("/") and rel.startswith(where))) and name in ("*", func):
            return f"{where}:{name}"
    return None


def scan() -> tuple[list[str], set[str]]:
    bypasses: list[str] = []
    used: set[str] = set()
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == THE_READER:
                continue
            for line, func, what in reads_in(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
                key = _allowed(rel, func)
                if key:
                    used.add(key)
                else:
                    bypasses.append(f"{rel}:{line} in {func}: {what}")
    return bypasses, used


def test_no_module_reads_a_file_bypassing_safe_files() -> None:
    bypasses, _used = scan()
    assert not bypasses, ("these read files without sessions.safe_files (FIFOs wait, /dev/zero never ends, "
                          "hard links leak, deep JSON recurses): use safe_files.read_json/read_text/read_bytes/"
                          "open_file with a Kind, or add a reasoned entry to ALLOWED:\n  " + "\n  ".join(bypasses))


def test_every_allowed_exception_is_still_needed() -> None:
    _bypasses, used = scan()
    stale = {f"{w}:{n}" for (w, n) in ALLOWED} - used
    assert not stale, f"ALLOWED entries that match no read any more (remove them): {sorted(stale)}"


@pytest.mark.parametrize("source", [
    "Path('x').read_text()", "p.read_bytes()", "open(p)", "open(p, 'rb')", "open(p, mode='r')", "p.open()",
    "p.open('rb')", "json.load(fh)", "tomllib.load(fh)", "os.open(p, os.O_RDONLY | os.O_NONBLOCK)",
    "io.open(p)", "open(p, m)", "torch.load(p, weights_only=True, mmap=True)", "safe_open(str(p), 'pt')",
    "np.load(p)", "mmap.mmap(fd, 0)", "shutil.copyfileobj(a, b)", "zipfile.ZipFile(p)", "tarfile.open(p)",
    "shutil.copy(a, b)",
])
def test_the_scan_sees_each_way_of_reading(source: str) -> None:
    assert reads_in(ast.parse(f"def f():\n    {source}\n")), source


@pytest.mark.parametrize("source", [
    "open(p, 'w')", "open(p, 'ab')", "p.open('w')", "os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)",
    "os.open(d, os.O_RDONLY | os.O_DIRECTORY)", "tarfile.open(fileobj=b, mode='w:gz')", "json.loads(text)",
    "safe_files.read_json(p, safe_files.STATE)", "LogFile.open(path)", "torch.save(t, p)",
    "with safe_files.opened_path(p, safe_files.WEIGHTS) as o, safe_open(o, 'pt') as fh:\n        pass",
    "with safe_files.opened_path(p, safe_files.OUTPUT_DATA) as o:\n        torch.load(o, mmap=True)",
])
def test_the_scan_leaves_writes_and_the_reader_alone(source: str) -> None:
    assert not reads_in(ast.parse(f"def f():\n    {source}\n")), source
