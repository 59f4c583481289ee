"""The installed SGLang, read as source: where it is, its version, its flags and attention backends.

SGLang is never imported here: ``import sglang`` pulls torch (sglang-facts §3.4, ``sglang/__init__.py:21-23``)
and the TUI must stay light.  The package is located by running ``importlib.util.find_spec`` inside the
profile's own Python (which executes nothing of SGLang), or given as a ``sglang_root`` folder (the one that
holds ``srt/``).  Everything else comes from ``ast`` over its files:

* 0.5.23 derives flags from ``A[type, "help" | Arg(...)]`` class attributes in
  ``srt/arg_groups/fields/*.py`` (``sglang/srt/arg_groups/arg_utils.py:322-417``) plus a few manual
  ``parser.add_argument`` calls in ``srt/server_args.py:351-444``;
* older SGLang has one ``ServerArgs`` dataclass whose ``add_cli_args`` calls ``parser.add_argument``.

Flag matching follows argparse with ``allow_abbrev=True`` (the parser SGLang builds at
``sglang/srt/server_args.py:679``): an exact spelling wins, else a unique prefix is accepted, and a prefix
of several flags is ambiguous (``--cuda-graph-max-bs`` in 0.5.23).
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sessions import safe_files

FIND_SPEC_TIMEOUT_S = 15.0
# A lookup is a Python start-up (tens of ms); the TUI previews commands often, so keep answers briefly.
LOOKUP_CACHE_TTL_S = 30.0

_FIND_SPEC_CODE = (
    "import importlib.util,json; s=importlib.util.find_spec('sglang'); print(json.dumps(s and s.origin))"
)
_FIELDS_DIR = "srt/arg_groups/fields"
_CHOICES_FILE = "srt/arg_groups/choices.py"
_ACTIONS_FILE = "srt/arg_groups/argparse_actions.py"
_SERVER_ARGS_FILE = "srt/server_args.py"

# argparse's own actions that take no value (nargs=0).
_VALUELESS_ACTIONS = frozenset(
    {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}
)
_ANNOTATED_NAMES = frozenset({"A", "Annotated"})
_OPTIONAL_NAMES = frozenset({"Optional"})
_LIST_NAMES = frozenset({"List", "list", "Sequence", "Tuple", "tuple"})


@dataclass(frozen=True)
class FlagInfo:
    """One command-line spelling of an SGLang server flag."""

    name: str  # the spelling, e.g. "--tensor-parallel-size"
    canonical: str  # the first spelling of its argument, e.g. "--tp-size"
    takes_value: bool
    nargs: str | None = None  # "+", "*", "?" or None (exactly one value when takes_value)
    choices: tuple[str, ...] | None = None  # None: no choices, or not knowable statically


@dataclass(frozen=True)
class SglangLocation:
    """The answer of `locate_sglang`: a source, or the reason there is none."""

    source: SglangSource | None
    reason: str | None


class SglangSource:
    """One SGLang package folder (the one holding ``srt/``), read statically."""

    def __init__(self, root: Path, version: str | None = None, python: str | None = None) -> None:
        self.root = Path(root)
        self.python = python
        self.version = version if version is not None else read_version(self.root)

    def __repr__(self) -> str:
        return f"SglangSource(root={str(self.root)!r}, version={self.version!r})"

    # -- files -----------------------------------------------------------------------------------------
    def path(self, relpath: str) -> Path:
        """The path of ``relpath`` (e.g. ``"srt/server_args.py"``) inside the package."""
        return self.root / relpath

    def exists(self, relpath: str) -> bool:
        return self.path(relpath).exists()

    def parse(self, relpath: str) -> ast.Module:
        """The ``ast`` of one file, cached by (path, mtime)."""
        return _parse_cached(self.path(relpath))

    # -- facts -----------------------------------------------------------------------------------------
    def attention_backends(self) -> tuple[str, ...] | None:
        """``ATTENTION_BACKEND_CHOICES`` as written in the source (plugins may add more at run time,
        ``sglang/srt/arg_groups/choices.py:225``); None when it cannot be read statically."""
        for relpath in (_CHOICES_FILE, _SERVER_ARGS_FILE):
            if self.exists(relpath):
                value = _module_constants(self.path(relpath)).get("ATTENTION_BACKEND_CHOICES")
                if isinstance(value, (list, tuple)):
                    return tuple(str(v) for v in value)
        info = self.flags().get("--attention-backend")
        return info.choices if info else None

    def flags(self) -> dict[str, FlagInfo]:
        """Every spelling the server's argparse parser accepts (``-h``/``--help`` included)."""
        signature = self._flag_sources_signature()
        with _CACHE_LOCK:
            cached = _FLAG_CACHE.get(str(self.root))
            if cached is not None and cached[0] == signature:
                return cached[1]
        flags = _read_flags(self)
        with _CACHE_LOCK:
            _FLAG_CACHE[str(self.root)] = (signature, flags)
        return flags

    def has_flag(self, name: str) -> bool:
        return name in self.flags()

    def _flag_sources_signature(self) -> tuple:
        paths = [self.path(_SERVER_ARGS_FILE), self.path(_CHOICES_FILE), self.path(_ACTIONS_FILE)]
        fields_dir = self.path(_FIELDS_DIR)
        if fields_dir.is_dir():
            paths.extend(sorted(fields_dir.glob("*.py")))
        return tuple((str(p), _mtime_ns(p)) for p in paths)


def resolve_option(arg: str, flags: Mapping[str, FlagInfo]) -> tuple[str | None, list[str]]:
    """argparse's ``_parse_optional`` + ``_get_option_tuples`` for ``--long`` options (Python 3.11)."""
    if arg in flags:
        return arg, []
    option = arg.split("=", 1)[0] if "=" in arg else arg
    if option in flags:
        return option, []
    if not option.startswith("--"):
        # single-dash options: argparse matches them exactly or by their leading characters only
        return None, []
    candidates = sorted(name for name in flags if name.startswith(option))
    if len(candidates) == 1:
        return candidates[0], []
    return None, candidates


# -- locating -----------------------------------------------------------------------------------------
_LOOKUP_CACHE: dict[tuple, tuple[float, SglangLocation]] = {}
_FLAG_CACHE: dict[str, tuple[tuple, dict[str, FlagInfo]]] = {}
_PARSE_CACHE: dict[str, tuple[int, ast.Module]] = {}
_CONSTANTS_CACHE: dict[str, tuple[int, dict[str, object]]] = {}
_CACHE_LOCK = threading.Lock()


def find_sglang(
    python: str | None = None, sglang_root: str | Path | None = None, env: Mapping[str, str] | None = None
) -> SglangSource | None:
    """The SGLang that ``python`` would import (or the folder ``sglang_root``); None when there is none.

    Use `locate_sglang` for the reason when it is None.
    """
    return locate_sglang(python, sglang_root, env).source


def locate_sglang(
    python: str | None = None,
    sglang_root: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    use_cache: bool = True,
) -> SglangLocation:
    """Find SGLang without importing it.

    ``sglang_root`` wins when given.  Otherwise ``python`` (default: this interpreter) runs
    ``importlib.util.find_spec('sglang')`` with ``env`` as its whole environment (default: ours), from
    ``/`` so that a ``sglang/`` folder in our working directory cannot shadow the real one.
    """
    if sglang_root is not None:
        return _location_from_root(Path(sglang_root).expanduser(), python=None)
    import sys

    python = python or sys.executable
    resolved = resolve_python(python)
    if resolved is None:
        return SglangLocation(None, f"Python interpreter {python!r} not found")
    env_key = tuple(sorted((env if env is not None else os.environ).items()))
    key = (resolved, _mtime_ns(Path(resolved)), hash(env_key))
    now = time.monotonic()
    if use_cache:
        with _CACHE_LOCK:
            hit = _LOOKUP_CACHE.get(key)
        if hit is not None and now - hit[0] < LOOKUP_CACHE_TTL_S:
            location = hit[1]
            if location.source is None or location.source.root.is_dir():
                return location
    location = _run_find_spec(python, resolved, env)
    with _CACHE_LOCK:
        _LOOKUP_CACHE[key] = (now, location)
    return location


def _run_find_spec(python: str, resolved: str, env: Mapping[str, str] | None) -> SglangLocation:
    try:
        proc = subprocess.run(
            [resolved, "-c", _FIND_SPEC_CODE],
            check=False,
            capture_output=True,
            text=True,
            timeout=FIND_SPEC_TIMEOUT_S,
            env=dict(env) if env is not None else None,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return SglangLocation(None, f"{python} did not answer find_spec('sglang') within {FIND_SPEC_TIMEOUT_S:g} s")
    except OSError as exc:
        return SglangLocation(None, f"cannot run {python}: {exc.strerror or exc}")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return SglangLocation(None, f"{python} failed to look up sglang (exit {proc.returncode}: {tail})")
    try:
        origin = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return SglangLocation(None, f"{python} gave an unreadable answer to find_spec('sglang')")
    if not origin:
        return SglangLocation(None, f"sglang is not installed for {python}")
    return _location_from_root(Path(origin).parent, python=python)


def _location_from_root(root: Path, python: str | None) -> SglangLocation:
    if not root.is_dir():
        return SglangLocation(None, f"{root} is not a folder")
    if not (root / "srt").is_dir():
        return SglangLocation(None, f"{root} does not look like the sglang package (no srt/ inside)")
    return SglangLocation(SglangSource(root, python=python), None)


def resolve_python(python: str) -> str | None:
    """The interpreter's path when it exists and is executable (a bare name is looked up on PATH)."""
    expanded = os.path.expanduser(python)
    if os.sep in expanded:
        return expanded if os.path.isfile(expanded) and os.access(expanded, os.X_OK) else None
    return shutil.which(expanded)


# -- version ------------------------------------------------------------------------------------------
def read_version(root: Path) -> str | None:
    """``__version__`` from ``_version.py`` or ``version.py`` (literals only), else the dist-info."""
    for name in ("_version.py", "version.py"):
        path = root / name
        if path.is_file():
            consts = _module_constants(path)
            for key in ("__version__", "version"):
                value = consts.get(key)
                if isinstance(value, str):
                    return value
    for dist_info in sorted(root.parent.glob("sglang-*.dist-info")):
        try:
            for line in safe_files.read_text(dist_info / "METADATA", safe_files.SOURCE).splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


# -- ast helpers --------------------------------------------------------------------------------------
def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _parse_cached(path: Path) -> ast.Module:
    mtime = _mtime_ns(path)
    with _CACHE_LOCK:
        hit = _PARSE_CACHE.get(str(path))
    if hit is not None and hit[0] == mtime:
        return hit[1]
    tree = ast.parse(safe_files.read_text(path, safe_files.SOURCE), filename=str(path))
    with _CACHE_LOCK:
        _PARSE_CACHE[str(path)] = (mtime, tree)
    return tree


def _module_constants(path: Path) -> dict[str, object]:
    """Module-level names bound to literals (lists may be concatenated: ``A + ["x"]``)."""
    mtime = _mtime_ns(path)
    with _CACHE_LOCK:
        hit = _CONSTANTS_CACHE.get(str(path))
    if hit is not None and hit[0] == mtime:
        return hit[1]
    consts: dict[str, object] = {}
    for node in _parse_cached(path).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        literal = _literal(value, consts)
        if literal is None:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                consts[target.id] = literal
    with _CACHE_LOCK:
        _CONSTANTS_CACHE[str(path)] = (mtime, consts)
    return consts


def _literal(node: ast.expr, names: Mapping[str, object]) -> object:
    """A literal value, resolving names in ``names`` and ``+`` of lists; None when not static."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, names), _literal(node.right, names)
        if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            return list(left) + list(right)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _name_of(node: ast.expr | None) -> str | None:
    """``Foo`` for ``Foo`` and ``mod.Foo``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _choices_tuple(value) -> tuple[str, ...] | None:
    if isinstance(value, (list, tuple, set, frozenset)) and value:
        return tuple(str(v) for v in value)
    return None


# -- flag extraction ----------------------------------------------------------------------------------
@dataclass
class _ArgSpec:
    """What one ``add_argument`` registers, before expansion into spellings."""

    names: list[str]
    takes_value: bool
    nargs: str | None = None
    choices: tuple[str, ...] | None = None
    boolean_optional: bool = False
    extra: dict = field(default_factory=dict)


def _read_flags(src: SglangSource) -> dict[str, FlagInfo]:
    action_nargs = _custom_action_nargs(src)
    names: dict[str, object] = {}
    if src.exists(_CHOICES_FILE):
        names.update(_module_constants(src.path(_CHOICES_FILE)))
    specs: list[_ArgSpec] = [_ArgSpec(["-h", "--help"], takes_value=False)]
    fields_dir = src.path(_FIELDS_DIR)
    if fields_dir.is_dir():
        for path in sorted(fields_dir.glob("*.py")):
            local = dict(names)
            local.update(_module_constants(path))
            for node in _parse_cached(path).body:
                if isinstance(node, ast.ClassDef):
                    specs.extend(_specs_from_fields_class(node, local, action_nargs))
    if src.exists(_SERVER_ARGS_FILE):
        tree = src.parse(_SERVER_ARGS_FILE)
        local = dict(names)
        local.update(_module_constants(src.path(_SERVER_ARGS_FILE)))
        for node in tree.body:
            # 0.5.23's ServerArgs keeps a few annotations next to the collected namespaces
            # (server_args.py:545); 0.5.14 and 0.5.18 keep every ``A[T, Arg(...)]`` field on ServerArgs itself
            # (0.5.14 server_args.py:373, registered by add_cli_args_from_dataclass at :6257).  Plain
            # dataclass fields of older SGLang carry no ``A[...]`` and are skipped here.
            if isinstance(node, ast.ClassDef):
                specs.extend(_specs_from_fields_class(node, local, action_nargs))
        specs.extend(_specs_from_add_argument_calls(tree, local, action_nargs))
    return _expand(specs)


def _expand(specs: Iterable[_ArgSpec]) -> dict[str, FlagInfo]:
    flags: dict[str, FlagInfo] = {}
    for spec in specs:
        spellings = list(spec.names)
        if spec.boolean_optional:  # argparse.BooleanOptionalAction adds --no-<name> for each --<name>
            spellings += ["--no-" + n[2:] for n in spec.names if n.startswith("--")]
        canonical = spec.names[0]
        for spelling in spellings:
            flags.setdefault(
                spelling,
                FlagInfo(
                    name=spelling,
                    canonical=canonical,
                    takes_value=spec.takes_value,
                    nargs=spec.nargs,
                    choices=spec.choices,
                ),
            )
    return flags


def _custom_action_nargs(src: SglangSource) -> dict[str, object]:
    """The default ``nargs`` of each custom ``argparse.Action`` subclass (``_MISSING`` when not set)."""
    out: dict[str, object] = {}
    if not src.exists(_ACTIONS_FILE):
        return out
    for node in src.parse(_ACTIONS_FILE).body:
        if not isinstance(node, ast.ClassDef):
            continue
        nargs: object = _MISSING
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                args = item.args
                positional = args.args[len(args.args) - len(args.defaults):]
                for arg, default in zip(positional, args.defaults):
                    if arg.arg == "nargs":
                        nargs = _literal(default, {})
                for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults):
                    if arg.arg == "nargs" and kw_default is not None:
                        nargs = _literal(kw_default, {})
        out[node.name] = nargs
    return out


_MISSING = object()


def _action_takes_value(action: ast.expr | None, nargs_kw: object, action_nargs: Mapping[str, object]) -> bool:
    """Whether an option with this ``action=`` (and explicit ``nargs=``) consumes a value."""
    if nargs_kw is not _MISSING:
        return nargs_kw != 0
    if action is None:
        return True
    if isinstance(action, ast.Constant) and isinstance(action.value, str):
        return action.value not in _VALUELESS_ACTIONS
    name = _name_of(action)
    if name == "BooleanOptionalAction":
        return False
    default = action_nargs.get(name or "", _MISSING)
    if default is _MISSING:
        return True  # argparse.Action's own default: one value
    return default != 0


def _nargs_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _specs_from_fields_class(
    cls: ast.ClassDef, names: Mapping[str, object], action_nargs: Mapping[str, object]
) -> list[_ArgSpec]:
    """``name: A[T, "help" | Arg(...)] = default`` → one argument (``arg_utils.py:322-417``)."""
    specs = []
    for item in cls.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        ann = item.annotation
        if not (isinstance(ann, ast.Subscript) and _name_of(ann.value) in _ANNOTATED_NAMES):
            continue
        elements = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if len(elements) < 2:
            continue
        inner, metadata = elements[0], elements[1:]
        arg_call = None
        for meta in metadata:
            if isinstance(meta, ast.Call) and _name_of(meta.func) == "Arg":
                arg_call = meta
                break
            if _is_help_string(meta):
                break
        else:
            continue  # no Arg and no help string: not a CLI field (e.g. Derived(...))
        kw = {k.arg: k.value for k in arg_call.keywords if k.arg} if arg_call is not None else {}
        if "no_cli" in kw and _literal(kw["no_cli"], {}) is True:
            continue
        cli_name = _literal(kw["cli_name"], names) if "cli_name" in kw else None
        primary = cli_name if isinstance(cli_name, str) else "--" + item.target.id.replace("_", "-")
        aliases = _literal(kw["aliases"], names) if "aliases" in kw else None
        alias_list = aliases if isinstance(aliases, (list, tuple)) else []
        spell = [primary] + [a for a in alias_list if isinstance(a, str)]
        explicit_choices = _choices_tuple(_literal(kw["choices"], names)) if "choices" in kw else None
        choices_unknown = "choices" in kw and explicit_choices is None
        nargs_kw = _literal(kw["nargs"], {}) if "nargs" in kw else _MISSING
        type_parser = "type_parser" in kw
        base, _optional = _unwrap_optional(inner)
        literal_values = _literal_values(base)

        if "action" in kw:
            action = kw["action"]
            action_kwargs = _literal_dict_keys(kw.get("action_kwargs"))
            a_nargs = action_kwargs.get("nargs", _MISSING)
            specs.append(
                _ArgSpec(
                    spell,
                    takes_value=_action_takes_value(action, a_nargs, action_nargs),
                    nargs=_nargs_str(a_nargs),
                    boolean_optional=_name_of(action) == "BooleanOptionalAction",
                )
            )
            continue
        if literal_values is not None:
            choices = explicit_choices or (None if choices_unknown else _choices_tuple(literal_values))
            specs.append(_ArgSpec(spell, takes_value=True, choices=choices))
            continue
        if _is_list(base) and not type_parser:
            nargs = nargs_kw if isinstance(nargs_kw, str) else "+"
            specs.append(_ArgSpec(spell, takes_value=True, nargs=nargs, choices=explicit_choices))
            continue
        if _name_of(base) == "bool":
            specs.append(_ArgSpec(spell, takes_value=False))
            continue
        specs.append(
            _ArgSpec(spell, takes_value=True, nargs=_nargs_str(nargs_kw), choices=explicit_choices)
        )
    return specs


def _is_help_string(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_help_string(node.left) or _is_help_string(node.right)
    return False


def _literal_dict_keys(node: ast.expr | None) -> dict[str, object]:
    if not isinstance(node, ast.Dict):
        return {}
    out: dict[str, object] = {}
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            lit = _literal(value, {})
            out[key.value] = lit if lit is not None or _is_none(value) else _MISSING
    return out


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _unwrap_optional(node: ast.expr) -> tuple[ast.expr, bool]:
    """``Optional[X]`` / ``Union[X, None]`` / ``X | None`` → (X, True)."""
    if isinstance(node, ast.Subscript):
        name = _name_of(node.value)
        if name in _OPTIONAL_NAMES:
            return node.slice, True
        if name == "Union" and isinstance(node.slice, ast.Tuple):
            rest = [e for e in node.slice.elts if not _is_none(e)]
            if len(rest) == 1:
                return rest[0], True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if _is_none(node.right):
            return node.left, True
        if _is_none(node.left):
            return node.right, True
    return node, False


def _literal_values(node: ast.expr) -> list | None:
    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        values = [_literal(e, {}) for e in elts]
        return [v for v in values if v is not None]
    return None


def _is_list(node: ast.expr) -> bool:
    return isinstance(node, ast.Subscript) and _name_of(node.value) in _LIST_NAMES


def _specs_from_add_argument_calls(
    tree: ast.Module, names: Mapping[str, object], action_nargs: Mapping[str, object]
) -> list[_ArgSpec]:
    """Every ``<x>.add_argument("--flag", ...)`` call in a module (older SGLang keeps all flags here)."""
    specs = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _name_of(node.func) == "add_argument"):
            continue
        if not isinstance(node.func, ast.Attribute):
            continue
        spell = [
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            and a.value.startswith("-")
        ]
        if not spell:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        nargs_kw = _literal(kw["nargs"], {}) if "nargs" in kw else _MISSING
        action = kw.get("action")
        choices = _choices_tuple(_literal(kw["choices"], names)) if "choices" in kw else None
        specs.append(
            _ArgSpec(
                spell,
                takes_value=_action_takes_value(action, nargs_kw, action_nargs),
                nargs=_nargs_str(nargs_kw),
                choices=choices,
                boolean_optional=_name_of(action) == "BooleanOptionalAction",
            )
        )
    return specs

