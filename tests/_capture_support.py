"""Test support for the capture tests: the real SGLang 0.5.23 plugin framework, and fake SGLang objects.

* `load_real_hook_registry` loads ``srt/plugins/hook_registry.py`` of the real wheel by path (it imports
  only the standard library) under its own module name, with bare parent packages.
* `fake_sglang_tree` builds a throwaway ``sglang`` package for child processes: the REAL
  ``srt/plugins/__init__.py`` (``load_plugins``), ``srt/plugins/hook_registry.py`` and ``srt/environ.py``
  copied from the wheel, plus stand-ins for what needs a GPU (``ModelRunner``, ``get_parallel``) and a
  ``run_scheduler_process`` that runs ``load_plugins()`` first, as 0.5.23's does (``scheduler.py:6323``).
* `FakeForwardBatch`, `FakeResult`, `FakeMode` carry real torch tensors into the hook.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REAL_FILES = ("srt/plugins/__init__.py", "srt/plugins/hook_registry.py", "srt/environ.py")


def sglang_root() -> Path:
    from tests._sglang_wheel import sglang_0_5_23_root

    return sglang_0_5_23_root()


def load_real_hook_registry(root: Path) -> types.ModuleType:
    """``sglang.srt.plugins.hook_registry`` from ``root`` by path, registered in ``sys.modules`` (so the
    plugin's own ``from sglang.srt.plugins.hook_registry import ...`` gets this very module)."""
    name = "sglang.srt.plugins.hook_registry"
    for parent in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        if parent not in sys.modules:
            module = types.ModuleType(parent)
            module.__path__ = []  # a bare package: nothing else of SGLang gets imported
            sys.modules[parent] = module
    spec = importlib.util.spec_from_file_location(name, root / "srt" / "plugins" / "hook_registry.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def unload_fake_sglang() -> None:
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


_MODEL_RUNNER_STUB = '''
"""Stand-in for sglang.srt.model_executor.model_runner (the real one needs CUDA): same names, same call."""
from dataclasses import dataclass


@dataclass
class ModelRunnerOutput:
    logits_output: object
    can_run_graph: bool = False


class ModelRunner:
    def __init__(self, model, compute):
        self.model = model
        self.is_draft_worker = False
        self._compute = compute

    def init_attention_backends(self):
        return None

    def forward(self, forward_batch, skip_attn_backend_init=None, pp_proxy_tensors=None):
        return ModelRunnerOutput(logits_output=self._compute(forward_batch))
'''

_RUNTIME_CONTEXT_STUB = '''
"""Stand-in for sglang.srt.runtime_context.get_parallel (ranks come from the test)."""
import os


class _Group:
    def __init__(self, last):
        self.is_last_rank = last


class _Parallel:
    def __init__(self):
        self.attn_tp_rank = int(os.environ.get("FAKE_ATTN_TP_RANK", "0"))
        self.pp_rank = 0
        self.pp_size = 1
        self.pp_group = _Group(True)


def get_parallel():
    return _Parallel()
'''

_SCHEDULER_STUB = '''
"""Stand-in for sglang.srt.managers.scheduler: like 0.5.23, load_plugins() runs first (scheduler.py:6323),
then (scenario "forward") one extend forward of a batch through the patched ModelRunner."""
from sglang.srt.plugins import load_plugins


class _Mode:
    def __init__(self, extend):
        self.extend = extend

    def is_extend_without_speculative(self):
        return self.extend


class _Batch:
    def __init__(self, torch, rids, prefix_lens, seq_lens, extend=True):
        total = sum(seq_lens)
        self.forward_mode = _Mode(extend)
        self.rids = rids
        self.extend_prefix_lens_cpu = prefix_lens
        self.extend_seq_lens_cpu = seq_lens
        self.input_ids = torch.arange(100, 100 + total)


class _Logits:
    def __init__(self, hidden_states, last_hidden_states):
        self.hidden_states = hidden_states
        self.last_hidden_states = last_hidden_states


class _Inner:
    layers_to_capture = [2, 4, 5]


class _Model:
    model = _Inner()


def _compute(forward_batch):
    import torch

    total = sum(forward_batch.extend_seq_lens_cpu)
    aux = torch.arange(total * 12, dtype=torch.float32).reshape(total, 12).to(torch.bfloat16)
    last = -torch.arange(total * 4, dtype=torch.float32).reshape(total, 4).to(torch.bfloat16)
    return _Logits(aux, last)


def run_scheduler_process(queue, scenario):
    load_plugins()
    from sglang.srt.plugins.hook_registry import HookRegistry

    report = {"targets": sorted(HookRegistry._hooks)}
    if scenario == "forward":
        import torch
        from sglang.srt.model_executor import model_runner

        runner = model_runner.ModelRunner(_Model(), _compute)
        runner.init_attention_backends()
        runner.forward(_Batch(torch, ["eagle3-a", "HEALTH_CHECK_x", "eagle3-b"], [0, 0, 4], [3, 1, 2]))
        runner.forward(_Batch(torch, ["eagle3-c"], [5], [1], extend=False))  # a decode: not dumped
        import eagle3_capture.hook as hook

        hook._registered_state.flush()
        report["patched"] = hasattr(model_runner.ModelRunner.forward, "__wrapped__")
    queue.put(report)
'''


def fake_sglang_tree(root: Path, dest: Path) -> Path:
    """A site folder holding a fake ``sglang`` package with the real plugin framework (see module doc)."""
    pkg = dest / "sglang"
    for rel in REAL_FILES:
        target = pkg / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
    stubs = {
        "__init__.py": '"""fake sglang package for tests"""\n',
        "version.py": '__version__ = "0.5.23"\n',
        "srt/model_executor/__init__.py": "",
        "srt/model_executor/model_runner.py": _MODEL_RUNNER_STUB,
        "srt/runtime_context.py": _RUNTIME_CONTEXT_STUB,
        "srt/managers/__init__.py": "",
        "srt/managers/scheduler.py": _SCHEDULER_STUB,
    }
    for rel, text in stubs.items():
        target = pkg / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return dest


# -- fake forward objects with real tensors -------------------------------------------------------------
class FakeMode:
    """ForwardMode's two predicates the hook uses."""

    def __init__(self, name: str) -> None:
        self.name = name

    def is_extend_without_speculative(self) -> bool:
        return self.name in ("EXTEND", "MIXED")


@dataclass
class FakeForwardBatch:
    forward_mode: FakeMode
    input_ids: Any
    rids: list[str] | None
    extend_prefix_lens_cpu: list[int] | None
    extend_seq_lens_cpu: list[int] | None


@dataclass
class FakeLogitsOutput:
    hidden_states: Any
    last_hidden_states: Any = None


@dataclass
class FakeResult:
    logits_output: FakeLogitsOutput


@dataclass
class FakeInnerModel:
    layers_to_capture: list[int] = field(default_factory=lambda: [2, 4, 5])


@dataclass
class FakeModel:
    model: FakeInnerModel = field(default_factory=FakeInnerModel)


@dataclass
class FakeRunner:
    model: FakeModel = field(default_factory=FakeModel)
    is_draft_worker: bool = False
