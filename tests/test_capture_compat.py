"""`eagle3-tui capture check` against the real SGLang 0.5.23 source, and against broken copies of it."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.capture.compat import (
    FORWARD_BATCH_FILE,
    MODEL_RUNNER_FILE,
    architecture_support,
    check_sglang,
)
from tests._capture_support import sglang_root

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def real_root() -> Path:
    return sglang_root()


@pytest.fixture
def copy_root(real_root, tmp_path):
    """A copy of the sglang package (without the model zoo and benchmarks, which the check does not read)."""
    dest = tmp_path / "site" / "sglang"
    shutil.copytree(real_root, dest, ignore=shutil.ignore_patterns("multimodal_gen", "benchmark", "test", "models"))
    return dest


def _remove(path: Path, predicate) -> None:
    """Rewrite ``path`` without the top-level (or class-level) definitions matching ``predicate``."""
    tree = ast.parse(path.read_text())

    class Strip(ast.NodeTransformer):
        def generic_visit(self, node):
            super().generic_visit(node)
            if hasattr(node, "body") and isinstance(node.body, list):
                kept = [child for child in node.body if not predicate(node, child)]
                node.body = kept or [ast.Pass()]
            return node

    path.write_text(ast.unparse(Strip().visit(tree)))


def test_real_sglang_0_5_23_is_compatible(real_root):
    report = check_sglang(real_root)
    assert report.ok, report.text()
    assert report.version == "0.5.23"
    names = {c.symbol for c in report.checks}
    assert {"ModelRunner.forward", "ForwardBatch.rids", "ForwardBatch.extend_prefix_lens_cpu",
            "ForwardBatch.extend_seq_lens_cpu", "get_parallel", "get_parallel().attn_tp_rank",
            "LogitsProcessorOutput.hidden_states", "LogitsProcessorOutput.last_hidden_states",
            "--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids",
            "GENERAL_PLUGINS_GROUP", "HookRegistry.register"} <= names
    assert report.text().startswith("compatible (SGLang 0.5.23")


def test_removed_hook_target_is_named_with_its_file(copy_root):
    _remove(copy_root / MODEL_RUNNER_FILE,
            lambda parent, child: isinstance(parent, ast.ClassDef) and parent.name == "ModelRunner"
            and isinstance(child, ast.FunctionDef) and child.name == "forward")
    report = check_sglang(copy_root)
    assert not report.ok
    failed = {c.symbol: c for c in report.failures}
    assert set(failed) == {"ModelRunner.forward"}
    assert failed["ModelRunner.forward"].problem == "missing"
    assert failed["ModelRunner.forward"].path == str(copy_root / MODEL_RUNNER_FILE)
    assert f"missing: ModelRunner.forward (hook target (AFTER)) -- looked in {copy_root / MODEL_RUNNER_FILE}" \
        in report.text()


def test_changed_hook_signature_is_reported(copy_root):
    path = copy_root / MODEL_RUNNER_FILE
    text = path.read_text()
    assert "    def forward(\n        self,\n        forward_batch: ForwardBatch," in text
    path.write_text(text.replace("    def forward(\n        self,\n        forward_batch: ForwardBatch,",
                                 "    def forward(\n        self,\n        batch: ForwardBatch,", 1))
    failed = {c.symbol: c for c in check_sglang(copy_root).failures}
    assert "expected ['self', 'forward_batch']" in failed["ModelRunner.forward"].problem


def test_removed_forward_batch_field_is_named(copy_root):
    _remove(copy_root / FORWARD_BATCH_FILE,
            lambda parent, child: isinstance(parent, ast.ClassDef) and parent.name == "ForwardBatch"
            and isinstance(child, ast.AnnAssign) and getattr(child.target, "id", "") == "extend_prefix_lens_cpu")
    report = check_sglang(copy_root)
    assert [c.symbol for c in report.failures] == ["ForwardBatch.extend_prefix_lens_cpu"]
    assert report.failures[0].path == str(copy_root / FORWARD_BATCH_FILE)


def test_missing_plugin_framework_and_flags_are_listed(copy_root):
    (copy_root / "srt" / "plugins" / "__init__.py").unlink()
    fields = copy_root / "srt" / "arg_groups" / "fields" / "exec_.py"
    fields.write_text(fields.read_text().replace("enable_return_aux_hidden_states:", "enable_other_thing:"))
    report = check_sglang(copy_root)
    failed = {c.symbol: c for c in report.failures}
    assert failed["GENERAL_PLUGINS_GROUP"].problem == "missing file"
    assert failed["load_plugins"].problem == "missing file"
    # without the capture-only flag, the draft route SGLang still has is named instead (as on 0.5.14)
    limited = {c.symbol: c for c in report.limits}
    assert limited["--enable-return-aux-hidden-states"].problem == "missing"
    assert "--speculative-draft-model-path" in limited["--enable-return-aux-hidden-states"].instead


def test_model_architecture_check(real_root, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLM"],
                                                   "num_hidden_layers": 61, "hidden_size": 7168}))
    report = check_sglang(real_root, model_path=model)
    assert [c.symbol for c in report.failures] == ["DeepseekV4ForCausalLM.set_eagle3_layers_to_capture"]
    assert architecture_support(real_root, "DeepseekV3ForCausalLM").supported is True
    assert "inherits it from DeepseekV2ForCausalLM" in architecture_support(real_root, "DeepseekV3ForCausalLM").detail
    assert architecture_support(real_root, "KimiK25ForConditionalGeneration").supported is True


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    run_env = dict(os.environ if env is None else env)
    run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), run_env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, check=False, env=run_env,
                          cwd=REPO, timeout=120)


def test_cli_check_exit_codes(real_root, copy_root, tmp_path):
    ok = _cli("capture", "check", "--sglang-root", str(real_root))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("compatible (SGLang 0.5.23")
    _remove(copy_root / FORWARD_BATCH_FILE,
            lambda parent, child: isinstance(parent, ast.ClassDef) and parent.name == "ForwardBatch"
            and isinstance(child, ast.AnnAssign) and getattr(child.target, "id", "") == "rids")
    bad = _cli("capture", "check", "--sglang-root", str(copy_root))
    assert bad.returncode == 1
    assert "ForwardBatch.rids" in bad.stdout and str(copy_root / FORWARD_BATCH_FILE) in bad.stdout
    missing = _cli("capture", "check", "--sglang-root", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "SGLang not found" in missing.stderr


def test_cli_check_finds_sglang_through_a_python(real_root, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(real_root.parent)  # the unpacked wheel acts as site-packages
    found = _cli("capture", "check", "--python", sys.executable, "--json", env=env)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["compatible"] is True
    env["PYTHONPATH"] = ""
    none = _cli("capture", "check", "--python", sys.executable, env={k: v for k, v in env.items()
                                                                     if k != "PYTHONPATH"})
    assert none.returncode == 2 and "sglang is not installed" in none.stderr
