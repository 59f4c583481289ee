"""Import hygiene: the TUI process never loads torch, transformers or sglang; `sessions/` never loads textual.

Each check runs in a fresh interpreter, so what the test process imported itself cannot hide a leak.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import sessions

REPO_ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "sglang")


def _run(code: str, tmp_path: Path) -> dict:
    env = os.environ | {"EAGLE3_TUI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("EAGLE3_TUI_DEMO", None)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_tui_and_its_screens_never_import_torch_transformers_or_sglang(tmp_path):
    code = """
import json, sys
from sessions.home import resolve_home
from sessions.demo import ensure_demo_home
import app.tui, app.feed, app.screens.dashboard, app.screens.profile_editor, app.screens.help
import widgets.gpu_panel, widgets.log_view, widgets.lists, widgets.env_table, widgets.confirm_modal
from app.tui import Eagle3App
home = ensure_demo_home(resolve_home(demo=True))
app = Eagle3App(home, demo=True)
print(json.dumps({name: name in sys.modules for name in HEAVY}))
""".replace("HEAVY", repr(HEAVY))
    loaded = _run(code, tmp_path)
    assert loaded == {name: False for name in HEAVY}, loaded


def test_a_running_dashboard_poll_never_imports_them_either(tmp_path, monkeypatch, seed_demo_models):
    # The first poll imports the engine modules the dashboard uses (server, profiles, phases, probes...).
    # The demo's tiny model is copied in (conftest): the test above already checks that writing it on a
    # first start keeps torch out of this process.
    monkeypatch.setenv("EAGLE3_TUI_HOME", str(tmp_path / "home"))
    seed_demo_models()
    code = """
import json, sys
from sessions.home import resolve_home
from sessions.demo import ensure_demo_home
from sessions.gpus import default_gpu_source
from app.feed import DashboardFeed, PollRequest
home = ensure_demo_home(resolve_home(demo=True))
feed = DashboardFeed(home, default_gpu_source(home, demo=True))
snapshot = feed.poll(PollRequest(None, None))
print(json.dumps({name: name in sys.modules for name in HEAVY}))
""".replace("HEAVY", repr(HEAVY))
    loaded = _run(code, tmp_path)
    assert loaded == {name: False for name in HEAVY}, loaded


def _session_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(sessions.__path__, prefix="sessions."):
        if info.name.startswith(("sessions.capture.plugin", "sessions.emulator.__main__")):
            continue  # runs inside the SGLang server / as a program, not imported by the engine
        names.append(info.name)
    return names


def test_no_sessions_module_imports_textual(tmp_path):
    # One fresh interpreter imports every module in turn and looks after each: the module after whose import
    # textual first shows up is the one that pulls it in (one interpreter per module cost ~125 starts).
    modules = _session_modules()
    assert len(modules) > 50, modules  # the walk found the package
    code = f"""
import importlib, json, sys
def textual_loaded():
    return any(m == "textual" or m.startswith("textual.") for m in sys.modules)
assert not textual_loaded()
culprit = None
for module in {modules!r}:
    try:
        importlib.import_module(module)
    except ImportError:  # an optional dependency of that module (torch) may be missing here
        pass
    if textual_loaded():
        culprit = module
        break
print(json.dumps({{"culprit": culprit}}))
"""
    result = _run(code, tmp_path)
    assert result["culprit"] is None, f"{result['culprit']} imports textual (itself or through a module it imports)"


# --- the import graph, read from the source (every import at any depth) ---------------------------------

LAYERS = ("sessions", "widgets", "app")  # each may import only those before it
PLUGIN = "sessions.capture.plugin.eagle3_capture"  # runs inside the SGLang server: imports nothing of ours


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for top in LAYERS for p in sorted((REPO_ROOT / top).rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, module- or function-level, relative
    or absolute; ``from pkg import mod`` counts as an import of ``pkg.mod`` when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in modules else base, node.lineno))
    return found


def _graph() -> tuple[dict[str, Path], list[tuple[str, str, int]]]:
    modules = _project_modules()
    edges = [(name, target, line) for name, path in modules.items()
             for target, line in _imports(name, path, modules)]
    return modules, edges


def _where(modules: dict[str, Path], name: str, line: int) -> str:
    return f"{modules[name].relative_to(REPO_ROOT)}:{line}"


def _layer(name: str) -> str:
    return name.split(".", 1)[0]


def test_the_graph_reader_sees_function_level_and_relative_imports(tmp_path):
    # The reader itself must be able to fail: a hidden import inside a function and a relative one count.
    pkg = tmp_path / "sessions"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    source = pkg / "a.py"
    source.write_text("def f():\n    import widgets.x\n    from . import b\n    from .b import thing\n")
    modules = {"sessions": pkg / "__init__.py", "sessions.a": source, "sessions.b": pkg / "b.py"}
    found = _imports("sessions.a", source, modules)
    assert found == [("widgets.x", 2), ("sessions.b", 3), ("sessions.b", 4)]


def test_imports_only_point_down_sessions_widgets_app():
    modules, edges = _graph()
    bad = [f"{_where(modules, src, line)}: {src} imports {dst}" for src, dst, line in edges
           if _layer(dst) in LAYERS and LAYERS.index(_layer(dst)) > LAYERS.index(_layer(src))]
    assert not bad, "imports that point up:\n" + "\n".join(bad)


def test_sessions_never_imports_textual_at_any_depth():
    modules, edges = _graph()
    bad = [f"{_where(modules, src, line)}: {src} imports {dst}" for src, dst, line in edges
           if _layer(src) == "sessions" and (dst == "textual" or dst.startswith("textual."))]
    assert not bad, "\n".join(bad)


def test_the_sglang_side_plugin_imports_nothing_of_the_project():
    modules, edges = _graph()
    bad = [f"{_where(modules, src, line)}: {src} imports {dst}" for src, dst, line in edges
           if (src == PLUGIN or src.startswith(PLUGIN + ".")) and _layer(dst) in LAYERS
           and not (dst == PLUGIN or dst.startswith(PLUGIN + "."))]
    assert not bad, "\n".join(bad)


def _cycles(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for node in nodes:
        if node not in index:
            visit(node)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles(["a", "b", "c"], {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(["a", "b"], {"a": {"b"}}) == []


def test_no_import_cycle_between_project_modules_counting_function_level_imports():
    modules, edges = _graph()
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges:
        if dst in modules and dst != src:
            graph.setdefault(src, set()).add(dst)
    cycles = _cycles(sorted(modules), graph)
    report = []
    for component in cycles:
        members = set(component)
        report.append(" <-> ".join(component))
        report.extend(sorted({f"    {_where(modules, src, line)}: {src} -> {dst}" for src, dst, line in edges
                              if src in members and dst in members and src != dst}))
    assert not cycles, "import cycles:\n" + "\n".join(report)


def test_the_profiles_package_imports_nothing_that_works_on_profiles():
    """Issue 24 item 6: `sessions.profiles` imported `sessions.capture.toggle`, which works on launch profiles
    (the one upward import).  The capture launch flags, layer plan and checks now live in
    `sessions.profiles.capture_launch`, which imports only capture's leaves; this keeps it that way: no module
    outside the package that a profiles module imports reaches the profile model or the package itself (a
    leaf reader such as `sessions.model_config`, which imports nothing of the package, may be
    shared)."""
    modules, edges = _graph()
    graph: dict[str, set[str]] = {}
    for src, dst, _line in edges:
        if dst in modules:
            graph.setdefault(src, set()).add(dst)

    def reaches_profiles(start: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == "sessions.profiles" or (node.startswith("sessions.profiles.") and graph.get(node, set())
                                               & {m for m in modules if m.startswith("sessions.profiles")}) \
                    or node == "sessions.profiles.model":
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(graph.get(node, ()))
        return False

    inside = lambda name: name == "sessions.profiles" or name.startswith("sessions.profiles.")
    bad = [f"{_where(modules, src, line)}: {src} imports {dst}, which works on profiles"
           for src, dst, line in edges if inside(src) and dst in modules and not inside(dst)
           and reaches_profiles(dst)]
    assert not bad, "\n".join(bad)


def test_capture_never_imports_profiles_the_tie_points_one_way():
    """Issue 24 item 6: profiles → capture, never back.  `sessions.capture.toggle` (the toggle, working on
    launch profiles) re-exported `sessions.profiles.capture_launch` and `sessions.capture.compat` read the
    model's config through `sessions.profiles.model_config`: capture and profiles imported each other.  The
    toggle now lives in `sessions.profiles.capture_toggle` and the config reader in `sessions.model_config`,
    a leaf both import.  Function-level and type-only imports count too."""
    modules, edges = _graph()
    in_capture = lambda name: name == "sessions.capture" or name.startswith("sessions.capture.")
    in_profiles = lambda name: name == "sessions.profiles" or name.startswith("sessions.profiles.")
    bad = [f"{_where(modules, src, line)}: {src} imports {dst}" for src, dst, line in edges
           if in_capture(src) and in_profiles(dst)]
    assert not bad, "capture imports profiles back:\n" + "\n".join(bad)
