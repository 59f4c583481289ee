"""``eagle3-tui capture check``: does this SGLang have every symbol the capture plugin relies on?

Read statically with ``ast`` (SGLang is never imported, so torch is not needed): the plugin framework and
its AFTER-hook convention, the scheduler process that loads plugins, the hook target
``ModelRunner.forward`` and its signature, the ``ForwardBatch`` fields and ``ForwardMode`` method the
hook reads, ``get_parallel`` and the rank fields it uses, ``LogitsProcessorOutput.hidden_states`` /
``last_hidden_states``, and the capture-only flags.  With a model dir it also checks that the model's
architecture has ``set_eagle3_layers_to_capture``.  Every finding names the file it looked in.
"""
from __future__ import annotations

import ast
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions import safe_files

PLUGINS_FILE = "srt/plugins/__init__.py"
HOOK_REGISTRY_FILE = "srt/plugins/hook_registry.py"
SCHEDULER_FILE = "srt/managers/scheduler.py"
MODEL_RUNNER_FILE = "srt/model_executor/model_runner.py"
FORWARD_BATCH_FILE = "srt/model_executor/forward_batch_info.py"
LOGITS_FILE = "srt/layers/logits_processor.py"
RUNTIME_CONTEXT_FILE = "srt/runtime_context.py"
PARALLEL_FIELDS_FILE = "srt/arg_groups/fields/parallel.py"
PARALLEL_STATE_FILE = "srt/distributed/parallel_state.py"
MODELS_DIR = "srt/models"
FLAG_FILES = "srt/arg_groups/fields/*.py, srt/server_args.py"
FIELDS_DIR = "srt/arg_groups/fields"
SPEC_AUX_FILE = "srt/model_executor/model_runner_components/spec_aux_hidden_state.py"
# The flags of 0.5.23's capture-only mode; older SGLang captures only for a draft (see _draft_capture_mode).
CAPTURE_ONLY_FLAGS = frozenset({"--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids"})

FORWARD_BATCH_FIELDS = ("forward_mode", "input_ids", "rids", "extend_prefix_lens_cpu", "extend_seq_lens_cpu")
PARALLEL_FIELDS = ("attn_tp_rank", "pp_group", "pp_rank", "pp_size")
# flag -> whether it takes a value
CAPTURE_FLAGS = {
    "--enable-return-aux-hidden-states": False,
    "--speculative-algorithm": True,
    "--return-aux-hidden-state-layer-ids": True,
    "--disable-radix-cache": False,
}


@dataclass(frozen=True)
class SymbolCheck:
    """One symbol the plugin relies on, and what was found."""

    symbol: str  # e.g. "ModelRunner.forward"
    role: str  # why the plugin needs it
    path: str  # the file (or files) looked in
    ok: bool
    problem: str = ""  # "missing" or "changed: ..."
    # What works on this SGLang instead (read from its source); a check with one limits capture, not blocks it.
    instead: str = ""


@dataclass(frozen=True)
class CompatReport:
    sglang_root: str
    version: str | None
    checks: tuple[SymbolCheck, ...]

    @property
    def ok(self) -> bool:
        """The plugin can capture on this SGLang: every symbol is there, or what works instead is known."""
        return not self.failures

    @property
    def failures(self) -> list[SymbolCheck]:
        return [c for c in self.checks if not c.ok and not c.instead]

    @property
    def limits(self) -> list[SymbolCheck]:
        """Missing symbols with a known way around them (e.g. no capture-only mode before 0.5.23)."""
        return [c for c in self.checks if not c.ok and c.instead]

    def to_json(self) -> dict:
        return {
            "compatible": self.ok,
            "sglang_root": self.sglang_root,
            "version": self.version,
            "limits": [c.__dict__ for c in self.limits],
            "checks": [c.__dict__ for c in self.checks],
        }

    def text(self) -> str:
        version = f"SGLang {self.version or '(version unknown)'} at {self.sglang_root}"
        if self.ok and not self.limits:
            return f"compatible ({version}; {len(self.checks)} symbols checked)"
        if self.ok:
            head = (f"compatible with limits ({version}; {len(self.checks)} symbols checked, "
                    f"{len(self.limits)} missing with a way around)")
            lines = [head]
        else:
            lines = [f"incompatible ({version}): {len(self.failures)} of {len(self.checks)} symbols"]
        for c in self.failures:
            lines.append(f"  {c.problem}: {c.symbol} ({c.role}) -- looked in {c.path}")
        for c in self.limits:
            lines.append(f"  {c.problem}: {c.symbol} ({c.role}) -- looked in {c.path}")
            lines.append(f"    instead: {c.instead}")
        return "\n".join(lines)


# -- ast helpers ----------------------------------------------------------------------------------------
class _Files:
    """Parsed files of one SGLang root; a missing or unparsable file reads as None."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._trees: dict[str, ast.Module | None] = {}

    def path(self, relpath: str) -> str:
        return str(self.root / relpath)

    def tree(self, relpath: str) -> ast.Module | None:
        if relpath not in self._trees:
            try:
                text = safe_files.read_text(self.root / relpath, safe_files.SOURCE)
                self._trees[relpath] = ast.parse(text, filename=str(self.root / relpath))
            except (OSError, SyntaxError, UnicodeDecodeError):
                self._trees[relpath] = None
        return self._trees[relpath]


def _top_class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _top_function(tree: ast.Module | None, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    if cls is None:
        return None
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _class_field(cls: ast.ClassDef | None, name: str) -> bool:
    """A class-level ``name: T [= v]`` or ``name = v``."""
    if cls is None:
        return False
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def _assigns_self_attr(cls: ast.ClassDef | None, attr: str) -> bool:
    if cls is None:
        return False
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr == attr \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            return True
    return False


def _calls(node: ast.AST | None, name: str) -> bool:
    if node is None:
        return False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called == name:
                return True
    return False


def _module_string(tree: ast.Module | None, name: str) -> str | None:
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    return None


def _has_string_prefix(tree: ast.Module | None, prefix: str) -> bool:
    if tree is None:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(prefix):
            return True
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith(prefix):
                return True
    return False


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


# -- the checks -----------------------------------------------------------------------------------------
def check_sglang(root: str | os.PathLike, model_path: str | os.PathLike | None = None) -> CompatReport:
    """Check the SGLang package folder ``root`` (the one holding ``srt/``)."""
    from sessions.sglang_source import SglangSource

    root = Path(root)
    source = SglangSource(root)
    files = _Files(root)
    checks: list[SymbolCheck] = []

    def add(symbol: str, role: str, relpath: str, test: Callable[[], str | None],
            instead: Callable[[], str] | None = None) -> None:
        """``test`` returns None when fine, else the problem ("missing", "changed: ..."); ``instead`` says
        what works on this SGLang when the symbol is missing ("" when nothing does)."""
        if relpath == FLAG_FILES:  # flags come from many files, read by sessions.sglang_source
            path = ", ".join(str(root / p.strip()) for p in relpath.split(","))
        else:
            path = files.path(relpath)
            if files.tree(relpath) is None:
                reason = "missing file" if not (root / relpath).exists() else "unreadable file"
                checks.append(SymbolCheck(symbol, role, path, False, reason))
                return
        problem = test()
        around = instead() if problem is not None and instead is not None else ""
        checks.append(SymbolCheck(symbol, role, path, problem is None, problem or "", around))

    def exists(found: object) -> str | None:
        return None if found else "missing"

    # The plugin framework (sglang-facts §5.1).
    plugins = files.tree(PLUGINS_FILE)
    add("GENERAL_PLUGINS_GROUP", "entry-point group the plugin registers in", PLUGINS_FILE,
        lambda: None if _module_string(plugins, "GENERAL_PLUGINS_GROUP") == "sglang.srt.plugins" else (
            "missing" if _module_string(plugins, "GENERAL_PLUGINS_GROUP") is None else
            f"changed: group is {_module_string(plugins, 'GENERAL_PLUGINS_GROUP')!r}, expected 'sglang.srt.plugins'"))
    add("load_plugins", "loads entry points, then applies hooks", PLUGINS_FILE,
        lambda: exists(_top_function(plugins, "load_plugins")) or (
            None if _calls(_top_function(plugins, "load_plugins"), "apply_hooks")
            else "changed: load_plugins no longer calls HookRegistry.apply_hooks()"))
    registry = files.tree(HOOK_REGISTRY_FILE)
    hook_registry = _top_class(registry, "HookRegistry")

    def register_signature() -> str | None:
        fn = _method(hook_registry, "register")
        if fn is None:
            return "missing"
        params = _params(fn)[1:4]
        if params != ["target", "hook", "hook_type"]:
            return f"changed: parameters are {params}, expected ['target', 'hook', 'hook_type']"
        return None

    add("HookRegistry.register", "registers the AFTER hook", HOOK_REGISTRY_FILE, register_signature)
    add("HookType.AFTER", "hook type used", HOOK_REGISTRY_FILE,
        lambda: exists(_class_field(_top_class(registry, "HookType"), "AFTER")))

    def after_convention() -> str | None:
        for node in ast.walk(registry):  # type: ignore[arg-type]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hook" \
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "result" \
                    and any(isinstance(a, ast.Starred) for a in node.args[1:]):
                return None
        return "changed: no AFTER wrapper calls hook(result, *args, **kwargs)"

    add("AFTER hook calling convention", "the hook is called as hook(result, *args, **kwargs)",
        HOOK_REGISTRY_FILE, after_convention)

    # The scheduler loads plugins; the plugin recognises it by title or by this function's name.
    scheduler = files.tree(SCHEDULER_FILE)
    add("run_scheduler_process", "the scheduler process entry that runs load_plugins()", SCHEDULER_FILE,
        lambda: exists(_top_function(scheduler, "run_scheduler_process")) or (
            None if _calls(_top_function(scheduler, "run_scheduler_process"), "load_plugins")
            else "changed: run_scheduler_process no longer calls load_plugins()"))
    add("'sglang::scheduler' process title", "how the plugin recognises a scheduler", SCHEDULER_FILE,
        lambda: exists(_has_string_prefix(scheduler, "sglang::scheduler")))

    # The hook target.
    runner_tree = files.tree(MODEL_RUNNER_FILE)
    runner = _top_class(runner_tree, "ModelRunner")

    def forward_signature() -> str | None:
        if runner is None:
            return "missing (class ModelRunner)"
        fn = _method(runner, "forward")
        if fn is None:
            return "missing"
        params = _params(fn)
        if params[:2] != ["self", "forward_batch"]:
            return f"changed: parameters start {params[:2]}, expected ['self', 'forward_batch']"
        return None

    add("ModelRunner.forward", "hook target (AFTER)", MODEL_RUNNER_FILE, forward_signature)
    add("ModelRunner.init_attention_backends", "hook target (AFTER) for the capture-active line",
        MODEL_RUNNER_FILE, lambda: exists(_method(runner, "init_attention_backends")))
    add("ModelRunner.is_draft_worker", "skips draft runners", MODEL_RUNNER_FILE,
        lambda: exists(_assigns_self_attr(runner, "is_draft_worker")))
    add("ModelRunner.model", "where layers_to_capture is read", MODEL_RUNNER_FILE,
        lambda: exists(_assigns_self_attr(runner, "model")))
    add("ModelRunnerOutput.logits_output", "the forward's result", MODEL_RUNNER_FILE,
        lambda: exists(_class_field(_top_class(runner_tree, "ModelRunnerOutput"), "logits_output")))

    # ForwardBatch / ForwardMode (sglang-facts §4.6).
    batch_tree = files.tree(FORWARD_BATCH_FILE)
    forward_batch = _top_class(batch_tree, "ForwardBatch")
    for name in FORWARD_BATCH_FIELDS:
        def batch_field_test(name: str = name) -> str | None:
            return exists(_class_field(forward_batch, name))

        add(f"ForwardBatch.{name}", "field the hook reads", FORWARD_BATCH_FILE, batch_field_test)
    add("ForwardMode.is_extend_without_speculative", "selects extend forwards without speculation",
        FORWARD_BATCH_FILE, lambda: exists(_method(_top_class(batch_tree, "ForwardMode"),
                                                   "is_extend_without_speculative")))

    # The result (sglang-facts §4.5).
    output = _top_class(files.tree(LOGITS_FILE), "LogitsProcessorOutput")
    add("LogitsProcessorOutput.hidden_states", "the packed aux rows [tokens, K*H]", LOGITS_FILE,
        lambda: exists(_class_field(output, "hidden_states")))
    add("LogitsProcessorOutput.last_hidden_states", "the post-norm final rows [tokens, H]", LOGITS_FILE,
        lambda: exists(_class_field(output, "last_hidden_states")),
        instead=lambda: _last_states_instead(files))

    # Ranks (sglang-facts §4.7): 0.5.23 declares them as fields of arg_groups/fields/parallel.py's Parallel,
    # read through runtime_context.ParallelContext.__getattr__; 0.5.14/0.5.18 have no arg_groups/ and define
    # each one as a property of ParallelContext itself (0.5.14 runtime_context.py:77-185).
    add("get_parallel", "which rank writes", RUNTIME_CONTEXT_FILE,
        lambda: exists(_top_function(files.tree(RUNTIME_CONTEXT_FILE), "get_parallel")))
    context_class = _top_class(files.tree(RUNTIME_CONTEXT_FILE), "ParallelContext")
    parallel = _top_class(files.tree(PARALLEL_FIELDS_FILE), "Parallel")
    for name in PARALLEL_FIELDS:
        if _method(context_class, name) is not None:
            where = RUNTIME_CONTEXT_FILE
        elif parallel is not None or files.tree(RUNTIME_CONTEXT_FILE) is None:
            where = PARALLEL_FIELDS_FILE
        else:
            where = RUNTIME_CONTEXT_FILE

        def parallel_field_test(name: str = name, where: str = where) -> str | None:
            if where == RUNTIME_CONTEXT_FILE:
                return exists(_method(context_class, name))
            return exists(_class_field(parallel, name))

        add(f"get_parallel().{name}", "rank field the hook reads", where, parallel_field_test)
    add("GroupCoordinator.is_last_rank", "last pipeline rank test", PARALLEL_STATE_FILE,
        lambda: exists(_method(_top_class(files.tree(PARALLEL_STATE_FILE), "GroupCoordinator"), "is_last_rank")))

    # The capture-only flags (sglang-facts §4.1); before 0.5.23 aux capture comes only with an EAGLE-3 draft.
    flags = source.flags()
    flag_files = FLAG_FILES if source.exists(FIELDS_DIR) else "srt/server_args.py"
    draft_mode = _draft_capture_mode(files, flags)
    for flag, takes_value in CAPTURE_FLAGS.items():
        def flag_test(flag: str = flag, takes_value: bool = takes_value) -> str | None:
            info = flags.get(flag)
            if info is None:
                return "missing"
            if info.takes_value != takes_value:
                return f"changed: {'takes' if info.takes_value else 'takes no'} value"
            return None

        around = (lambda: draft_mode) if flag in CAPTURE_ONLY_FLAGS else None
        add(flag, "capture flag", flag_files, flag_test, instead=around)

    if model_path is not None:
        from sessions.model_config import ModelConfigError, read_model_config

        try:
            arch = read_model_config(Path(model_path)).architecture
        except ModelConfigError as exc:
            arch, error = None, str(exc)
        else:
            error = "config.json names no architecture"
        if arch is None:
            checks.append(SymbolCheck("model architecture", "the model to capture", str(model_path), False,
                                      f"unknown: {error}"))
        else:
            from sessions.capture.layer_source import source_rule

            found = architecture_support(root, arch)
            rule = source_rule(root, arch) if found.supported else None
            role = "sets the capture layers" + (
                f"; rule {rule.rule.value} ({rule.detail})" if rule is not None and rule.rule is not None else "")
            checks.append(SymbolCheck(f"{arch}.set_eagle3_layers_to_capture", role,
                                      found.path or str(root / MODELS_DIR), bool(found.supported),
                                      "" if found.supported else found.detail))
    return CompatReport(str(root), source.version, tuple(checks))


# -- what works where a symbol is missing ---------------------------------------------------------------
def _string_line(tree: ast.Module | None, text: str) -> int | None:
    """The first line where the string constant ``text`` appears (a subscript key, a get() argument)."""
    if tree is None:
        return None
    lines = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == text]
    return min(lines) if lines else None


def _draft_capture_mode(files: _Files, flags: Mapping[str, Any]) -> str:
    """How this SGLang turns aux capture on without capture-only mode, read from its source ("" if unknown).

    0.5.14 reads the draft's ``eagle_config.eagle_aux_hidden_state_layer_ids`` in ModelRunner.__init__
    (model_runner.py:458-470), 0.5.18 in resolve_spec_aux_hidden_state_config (spec_aux_hidden_state.py:82-96);
    both only for ``--speculative-algorithm EAGLE3`` with a ``--speculative-draft-model-path``.
    """
    if "--speculative-draft-model-path" not in flags or "--speculative-algorithm" not in flags:
        return ""
    for relpath in (SPEC_AUX_FILE, MODEL_RUNNER_FILE):
        line = _string_line(files.tree(relpath), "eagle_aux_hidden_state_layer_ids")
        if line is not None:
            return ("no capture-only mode here: launch with --speculative-algorithm EAGLE3 "
                    "--speculative-draft-model-path DIR, an EAGLE-3 draft whose config.json names the layers in "
                    "eagle_config.eagle_aux_hidden_state_layer_ids (read at "
                    f"{files.path(relpath)}:{line}; without them SGLang captures [2, L//2, L-3])")
    return ""


def _last_states_instead(files: _Files) -> str:
    """Where the plugin takes the post-norm final rows when LogitsProcessorOutput has no last_hidden_states:
    the ``hidden_states`` argument of ``LogitsProcessor.forward`` (what the model's norm produced)."""
    fn = _method(_top_class(files.tree(LOGITS_FILE), "LogitsProcessor"), "forward")
    if fn is None or _params(fn)[:3] != ["self", "input_ids", "hidden_states"]:
        return ""
    return (f"the plugin takes them from the hidden_states argument of LogitsProcessor.forward "
            f"({files.path(LOGITS_FILE)}:{fn.lineno}, an AFTER hook), matched to the forward's own output")


# -- architectures ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArchitectureSupport:
    supported: bool | None
    detail: str
    path: str | None = None  # the file whose class implements (or lacks) the method


def architecture_support(root: str | os.PathLike, architecture: str) -> ArchitectureSupport:
    """Whether SGLang's model class ``architecture`` (or a base class) defines set_eagle3_layers_to_capture."""
    from sessions.capture.layer_source import class_index, find_method_class

    models_dir = Path(root) / MODELS_DIR
    index = class_index(models_dir)
    if not index:
        return ArchitectureSupport(None, f"no model sources under {models_dir}")
    found = find_method_class(root, architecture, "set_eagle3_layers_to_capture")
    if found is not None:
        cls, path = found
        if cls.name == architecture:
            return ArchitectureSupport(True, f"{architecture} defines set_eagle3_layers_to_capture", path)
        return ArchitectureSupport(True, f"{architecture} inherits it from {cls.name}", path)
    if architecture not in index:
        return ArchitectureSupport(False, f"no model class {architecture} in {models_dir}")
    return ArchitectureSupport(False, f"{architecture} (nor any base class) defines set_eagle3_layers_to_capture",
                               index[architecture][0])
