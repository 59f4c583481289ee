"""Each architecture's layer rule, read from the installed SGLang's own ``set_eagle3_layers_to_capture``.

The rule differs between families *and between SGLang versions* (GPT-OSS adds 1 unconditionally in
0.5.14, ``models/gpt_oss.py``, but keeps ids whose largest is L verbatim from 0.5.18 on), so the table in
`sessions.capture.layers` is only the fallback.  The method body is classified statically with ``ast``:

* ``layers_to_capture = [v + 1 for v in ids]`` and nothing verbatim → `LayerRule.PLUS_ONE`;
* a verbatim store (``list(ids)`` / ``ids``) under ``ids[0] == 1`` → `LayerRule.FIRST_ID_ONE`;
* a verbatim store under ``max(ids) == <num layers>`` → `LayerRule.KEEP_IF_MAX_IS_L`;
* ``if ids is None: ids = [...]`` followed by the unconditional ``+ 1`` → `LayerRule.PLUS_ONE_SHIFTED_DEFAULT`;
* ``self.X.set_eagle3_layers_to_capture(ids)`` → the rule of the class ``__init__`` assigns to ``self.X``
  (Kimi-K2.5's ``language_model = DeepseekV3ForCausalLM(...)``); ``self.model.set_...([v + 1 for v in ids])``
  → `LayerRule.PLUS_ONE` (the inner model stores what it is given).

Anything else reads as unknown (None), and callers fall back to the table.  This module also owns the model
zoo's class index (`find_method_class`, `supporting_architectures`), which ``capture check`` uses too.
"""
from __future__ import annotations

import ast
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sessions import safe_files
from sessions.capture.layers import LayerRule, rule_for

METHOD = "set_eagle3_layers_to_capture"
MODELS_DIR = "srt/models"


# -- the model zoo --------------------------------------------------------------------------------------
class ModelFiles:
    """Parsed files of one ``srt/models`` folder; a missing or unparsable file reads as None."""

    def __init__(self, models_dir: Path) -> None:
        self.models_dir = models_dir
        self._trees: dict[str, ast.Module | None] = {}

    def tree(self, name: str) -> ast.Module | None:
        if name not in self._trees:
            path = self.models_dir / name
            try:
                self._trees[name] = ast.parse(safe_files.read_text(path, safe_files.SOURCE), filename=str(path))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                self._trees[name] = None
        return self._trees[name]

    def top_class(self, name: str, class_name: str) -> ast.ClassDef | None:
        tree = self.tree(name)
        if tree is None:
            return None
        return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)


_CLASS_RE = re.compile(r"^class\s+(\w+)\s*[(:]", re.MULTILINE)
_WORD_RE = re.compile(r"\w+")
_INDEX_CACHE: dict[str, tuple[int, dict[str, list[str]]]] = {}
_INDEX_LOCK = threading.Lock()


def class_index(models_dir: Path) -> dict[str, list[str]]:
    """Class name -> model files defining it (text scan, cached by the folder's mtime)."""
    try:
        mtime = models_dir.stat().st_mtime_ns
    except OSError:
        return {}
    with _INDEX_LOCK:
        hit = _INDEX_CACHE.get(str(models_dir))
    if hit is not None and hit[0] == mtime:
        return hit[1]
    index: dict[str, list[str]] = {}
    for path in sorted(models_dir.glob("*.py")):
        try:
            text = safe_files.read_text(path, safe_files.SOURCE)
        except (OSError, UnicodeDecodeError):
            continue
        for name in _CLASS_RE.findall(text):
            index.setdefault(name, []).append(str(path))
    with _INDEX_LOCK:
        _INDEX_CACHE[str(models_dir)] = (mtime, index)
    return index


def _base_names(cls: ast.ClassDef) -> Iterable[str]:
    for base in cls.bases:
        if isinstance(base, ast.Name):
            yield base.id
        elif isinstance(base, ast.Attribute):
            yield base.attr


def find_method_class(root: str | os.PathLike, architecture: str, method: str,
                      files: ModelFiles | None = None) -> tuple[ast.ClassDef, str] | None:
    """The model class (``architecture`` or a base class) whose body defines ``method``, with its file.

    ``files``: parsed model files to share between calls (parsing the model zoo dominates the cost)."""
    models_dir = Path(root) / MODELS_DIR
    index = class_index(models_dir)
    files = files if files is not None else ModelFiles(models_dir)
    seen: set[str] = set()

    def search(name: str, depth: int) -> tuple[ast.ClassDef, str] | None:
        if name in seen or depth > 12:
            return None
        seen.add(name)
        for path in index.get(name, []):
            cls = files.top_class(os.path.basename(path), name)
            if cls is None:
                continue
            if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == method for n in cls.body):
                return cls, path
            for base in _base_names(cls):
                found = search(base, depth + 1)
                if found is not None:
                    return found
        return None

    return search(architecture, 0)


def supporting_architectures(root: str | os.PathLike) -> list[str]:
    """Every model class in ``root``'s model zoo that has set_eagle3_layers_to_capture (itself or inherited).

    Found from the method outwards, so that only the files that can matter are parsed (parsing is the cost:
    asking `find_method_class` of every class parses the whole zoo, 200+ files).  A class defines the method
    only in a file whose text names it; a class inherits it only from a base it names, so a file whose text
    names no class known to have it defines no subclass of one.  Each round parses the files that name a
    newly found class (a word match: conservative, the parse decides), until no class is added; every class
    found is then confirmed by `find_method_class` over the same parsed files."""
    models_dir = Path(root) / MODELS_DIR
    index = class_index(models_dir)
    files = ModelFiles(models_dir)
    words: dict[str, frozenset[str]] = {}  # path -> the identifiers its text has
    for paths in index.values():
        for path in paths:
            if path not in words:
                try:
                    words[path] = frozenset(_WORD_RE.findall(safe_files.read_text(Path(path), safe_files.SOURCE)))
                except (OSError, UnicodeDecodeError, ValueError):
                    words[path] = frozenset()
    classes_in: dict[str, list[str]] = {}
    for name, paths in index.items():
        for path in paths:
            classes_in.setdefault(path, []).append(name)
    found: set[str] = set()
    checked: set[str] = set()  # find_method_class's answer for a name does not change between rounds
    names: set[str] = {METHOD}
    while names:
        candidates = {name for path, have in words.items() if not have.isdisjoint(names) for name in classes_in[path]}
        candidates -= checked
        checked |= candidates
        names = {name for name in candidates if find_method_class(root, name, METHOD, files) is not None}
        found |= names
    return sorted(found)


@dataclass(frozen=True)
class SourceRule:
    """The rule of one architecture in one SGLang, and where it was read (or why it was not)."""

    architecture: str
    rule: LayerRule | None
    from_source: bool  # False: the table's rule (or None), the source gave no answer
    detail: str
    path: str | None = None
    line: int | None = None


def _stores_layers(node: ast.AST) -> list[tuple[ast.Assign, list[ast.expr]]]:
    """Every ``<x>.layers_to_capture = value`` below ``node``, with the If tests enclosing it."""
    return [(a, tests) for a, tests in _assignments(node) if any(
        isinstance(t, ast.Attribute) and t.attr == "layers_to_capture" for t in a.targets)]


def _assignments(node: ast.AST) -> list[tuple[ast.Assign, list[ast.expr]]]:
    """Every assignment below ``node``, with the If tests enclosing it (an ``else`` as ``not test``)."""
    out: list[tuple[ast.Assign, list[ast.expr]]] = []

    def visit(n: ast.AST, tests: list[ast.expr]) -> None:
        if isinstance(n, ast.Assign):
            out.append((n, tests))
        if isinstance(n, ast.If):
            for child in n.body:
                visit(child, [*tests, n.test])
            for child in n.orelse:
                visit(child, [*tests, ast.UnaryOp(op=ast.Not(), operand=n.test)])
            return
        for sub in ast.iter_child_nodes(n):
            visit(sub, tests)

    visit(node, [])
    return out


def _is_none_test(test: ast.expr, param: str) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == param
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None)


def _plus_one_of(value: ast.expr, param: str, names: frozenset[str] = frozenset()) -> bool:
    """``[v + 1 for v in param]``, or a local name bound to it (``names``)."""
    if isinstance(value, ast.Name) and value.id in names:
        return True
    if not (isinstance(value, ast.ListComp) and len(value.generators) == 1):
        return False
    gen = value.generators[0]
    elt = value.elt
    return (isinstance(gen.iter, ast.Name) and gen.iter.id == param and isinstance(gen.target, ast.Name)
            and isinstance(elt, ast.BinOp) and isinstance(elt.op, ast.Add)
            and isinstance(elt.left, ast.Name) and elt.left.id == gen.target.id
            and isinstance(elt.right, ast.Constant) and elt.right.value == 1)


def _verbatim_of(value: ast.expr, param: str) -> bool:
    """``param`` or ``list(param)``."""
    if isinstance(value, ast.Name):
        return value.id == param
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "list"
            and len(value.args) == 1 and isinstance(value.args[0], ast.Name) and value.args[0].id == param)


def _first_is_one(test: ast.expr, param: str) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript) \
                and isinstance(node.left.value, ast.Name) and node.left.value.id == param \
                and isinstance(node.left.slice, ast.Constant) and node.left.slice.value == 0 \
                and isinstance(node.ops[0], ast.Eq) and isinstance(node.comparators[0], ast.Constant) \
                and node.comparators[0].value == 1:
            return True
    return False


def _max_is_num_layers(test: ast.expr, param: str) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) \
                and isinstance(node.left.func, ast.Name) and node.left.func.id == "max" \
                and node.left.args and isinstance(node.left.args[0], ast.Name) \
                and node.left.args[0].id == param and isinstance(node.ops[0], ast.Eq):
            other = ast.unparse(node.comparators[0])
            if "num_layers" in other or "num_hidden_layers" in other:
                return True
    return False


def _reassigns_param_when_none(fn: ast.FunctionDef, param: str) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and _is_none_test(node.test, param):
            for child in node.body:
                if isinstance(child, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == param for t in child.targets):
                    return True
    return False


def _delegations(fn: ast.FunctionDef) -> list[tuple[str, ast.Call]]:
    """``self.<attr>.set_eagle3_layers_to_capture(...)`` calls: (attr, call)."""
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == METHOD:
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self":
                out.append((owner.attr, node))
    return out


def classify_method(fn: ast.FunctionDef) -> tuple[LayerRule | None, str | None, str]:
    """(rule, attribute delegated to, how it was read) for one ``set_eagle3_layers_to_capture``."""
    params = [a.arg for a in fn.args.args]
    if len(params) < 2:
        return None, None, "no layer-ids parameter"
    param = params[1]
    # locals bound to [v + 1 for v in ids] in the branch given ids (qwen3_vl.py: ``layers_to_capture = ...``)
    plus_names = frozenset(
        t.id for a, tests in _assignments(fn) if not any(_is_none_test(t, param) for t in tests)
        and _plus_one_of(a.value, param) for t in a.targets if isinstance(t, ast.Name))
    stores = [(a, tests) for a, tests in _stores_layers(fn)
              if not any(_is_none_test(t, param) for t in tests)]  # the branch given ids
    plus = [a for a, _ in stores if _plus_one_of(a.value, param, plus_names)]
    verbatim = [(a, tests) for a, tests in stores if _verbatim_of(a.value, param)]
    if verbatim:
        tests = [t for _, ts in verbatim for t in ts]
        if any(_first_is_one(t, param) for t in tests) or any(
                _first_is_one(t, param) for _, ts in stores for t in ts):
            return LayerRule.FIRST_ID_ONE, None, "verbatim unless ids[0] == 1, then + 1"
        if any(_max_is_num_layers(t, param) for _, ts in stores for t in ts):
            return LayerRule.KEEP_IF_MAX_IS_L, None, "verbatim when max(ids) == num_layers, else + 1"
        return None, None, "stores the ids verbatim under a condition eagle3-tui does not know"
    if plus and len(plus) == len(stores):
        if _reassigns_param_when_none(fn, param):
            return LayerRule.PLUS_ONE_SHIFTED_DEFAULT, None, "+ 1, also to its default list"
        return LayerRule.PLUS_ONE, None, "[v + 1 for v in ids]"
    if stores:
        return None, None, "stores layers_to_capture in a form eagle3-tui does not know"
    for attr, call in _delegations(fn):
        arg = call.args[0] if call.args else None
        if arg is not None and _plus_one_of(arg, param, plus_names):
            return LayerRule.PLUS_ONE, None, f"passes [v + 1 for v in ids] to self.{attr}"
        if arg is not None and isinstance(arg, ast.Name) and arg.id == param:
            return None, attr, f"delegates to self.{attr}"
    return None, None, "sets no layers_to_capture"


def _init_class_of(cls: ast.ClassDef, attr: str) -> str | None:
    """The class ``__init__`` constructs into ``self.<attr>`` (the first such assignment)."""
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            for node in ast.walk(item):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and any(
                        isinstance(t, ast.Attribute) and t.attr == attr
                        and isinstance(t.value, ast.Name) and t.value.id == "self" for t in node.targets):
                    func = node.value.func
                    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) \
                        else None
                    if name:
                        return name
    return None


_RULE_CACHE: dict[tuple[str, str, int], SourceRule] = {}
_RULE_LOCK = threading.Lock()


def source_rule(root: str | os.PathLike, architecture: str, depth: int = 0) -> SourceRule:
    """The layer rule of ``architecture`` in the SGLang package folder ``root`` (falling back to the table).

    Cached by (root, architecture, mtime of the models folder): the capture panel asks on every poll, and
    parsing deepseek_v2.py alone takes tens of milliseconds."""
    try:
        mtime = (Path(root) / MODELS_DIR).stat().st_mtime_ns
    except OSError:
        mtime = -1
    key = (str(root), architecture, mtime)
    with _RULE_LOCK:
        hit = _RULE_CACHE.get(key)
    if hit is not None:
        return hit
    found = _source_rule(root, architecture, depth)
    with _RULE_LOCK:
        _RULE_CACHE[key] = found
    return found


def _source_rule(root: str | os.PathLike, architecture: str, depth: int) -> SourceRule:
    fallback = rule_for(architecture)
    found = find_method_class(root, architecture, METHOD)
    if found is None:
        return SourceRule(architecture, fallback, False,
                          f"{architecture} has no {METHOD} in {Path(root) / MODELS_DIR}")
    cls, path = found
    fn = next(item for item in cls.body if isinstance(item, ast.FunctionDef) and item.name == METHOD)
    rule, attr, how = classify_method(fn)
    where = f"{cls.name}.{METHOD}"
    if attr is not None and depth < 4:
        inner = _init_class_of(cls, attr)
        if inner is not None:
            sub = source_rule(root, inner, depth + 1)
            if sub.from_source:
                return SourceRule(architecture, sub.rule, True, f"{where} {how} ({inner}): {sub.detail}",
                                  sub.path, sub.line)
    if rule is None:
        return SourceRule(architecture, fallback, False, f"{where}: {how}", path, fn.lineno)
    return SourceRule(architecture, rule, True, f"{where}: {how}", path, fn.lineno)
