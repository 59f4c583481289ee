"""Capture on every SGLang from 0.5.14 to 0.5.23, read statically from the real wheels (tests/_sglang_wheel.py).

`capture check`, the layer rules from each version's own ``set_eagle3_layers_to_capture``, and the plugin's
hooks run through each version's real ``HookRegistry`` (loaded by path: it imports only the standard
library) with stand-ins shaped like that version's ``LogitsProcessorOutput`` (its field list is read from
the wheel, so the stand-in cannot drift from it).
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from _sglang_wheel import SGLANG_VERSIONS
from _sglang_wheel import sglang_root as sglang_root_of

from sessions.capture.compat import check_sglang
from sessions.capture.layer_source import source_rule, supporting_architectures
from sessions.capture.layers import LayerRule
from sessions.capture.plugin.eagle3_capture import hook as hook_module
from sessions.capture.plugin.eagle3_capture.spec import CaptureSpec
from sessions.capture.writer import read_chunks
from tests._capture_support import FakeForwardBatch, FakeMode, load_real_hook_registry, unload_fake_sglang

REPO = Path(__file__).resolve().parent.parent
OLD_VERSIONS = ("0.5.14", "0.5.18")


@pytest.fixture(scope="module", params=SGLANG_VERSIONS)
def versioned_root(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, sglang_root_of(request.param)


# -- capture check ---------------------------------------------------------------------------------------
def test_capture_check_per_version(versioned_root) -> None:
    version, root = versioned_root
    report = check_sglang(root)
    assert report.version == version
    assert report.ok, report.text()
    by_symbol = {c.symbol: c for c in report.checks}
    # the rank names are found where each version keeps them, never reported as a missing file
    for name in ("attn_tp_rank", "pp_group", "pp_rank", "pp_size"):
        check = by_symbol[f"get_parallel().{name}"]
        assert check.ok, check
        expected = "srt/runtime_context.py" if version in OLD_VERSIONS else "srt/arg_groups/fields/parallel.py"
        assert check.path == str(root / expected)
    limits = {c.symbol: c for c in report.limits}
    if version in OLD_VERSIONS:
        assert set(limits) == {"LogitsProcessorOutput.last_hidden_states", "--enable-return-aux-hidden-states",
                               "--return-aux-hidden-state-layer-ids"}
        flag = limits["--enable-return-aux-hidden-states"]
        assert flag.path == str(root / "srt/server_args.py")  # 0.5.14/0.5.18 have no arg_groups/fields/
        assert "no capture-only mode" in flag.instead
        assert "--speculative-draft-model-path" in flag.instead
        assert "eagle_config.eagle_aux_hidden_state_layer_ids" in flag.instead
        # the line named is where that version really reads the draft's layer ids
        where, line = flag.instead.split("(read at ", 1)[1].split(";", 1)[0].rsplit(":", 1)
        assert "eagle_aux_hidden_state_layer_ids" in Path(where).read_text().splitlines()[int(line) - 1]
        assert "hidden_states argument of LogitsProcessor.forward" in \
            limits["LogitsProcessorOutput.last_hidden_states"].instead
        assert report.text().startswith(f"compatible with limits (SGLang {version}")
    else:
        assert not limits and report.text().startswith(f"compatible (SGLang {version}")


def test_capture_check_cli_per_version(versioned_root) -> None:
    version, root = versioned_root
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "app", "capture", "check", "--sglang-root", str(root), "--json"],
                          capture_output=True, text=True, check=False, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["version"] == version and data["compatible"] is True
    assert bool(data["limits"]) == (version in OLD_VERSIONS)


# -- layer rules from each version's source --------------------------------------------------------------
EXPECTED_RULES = {
    # GPT-OSS: 0.5.14 adds 1 to every id (gpt_oss.py), 0.5.18 and 0.5.23 keep ids whose max is L
    "GptOssForCausalLM": {"0.5.14": LayerRule.PLUS_ONE, "0.5.18": LayerRule.KEEP_IF_MAX_IS_L,
                          "0.5.23": LayerRule.KEEP_IF_MAX_IS_L},
    "DeepseekV3ForCausalLM": dict.fromkeys(SGLANG_VERSIONS, LayerRule.FIRST_ID_ONE),
    "KimiK25ForConditionalGeneration": dict.fromkeys(SGLANG_VERSIONS, LayerRule.FIRST_ID_ONE),
    "LlamaForCausalLM": dict.fromkeys(SGLANG_VERSIONS, LayerRule.PLUS_ONE),
    "Qwen3ForCausalLM": dict.fromkeys(SGLANG_VERSIONS, LayerRule.PLUS_ONE),
}


@pytest.mark.parametrize("architecture", sorted(EXPECTED_RULES))
def test_layer_rule_from_each_versions_source(versioned_root, architecture: str) -> None:
    version, root = versioned_root
    found = source_rule(root, architecture)
    assert found.from_source, found
    assert found.rule is EXPECTED_RULES[architecture][version], found
    # the line named holds the method the rule was read from
    assert "def set_eagle3_layers_to_capture" in Path(found.path).read_text().splitlines()[found.line - 1]


def test_kimi_rule_is_read_through_its_language_model(versioned_root) -> None:
    _version, root = versioned_root
    found = source_rule(root, "KimiK25ForConditionalGeneration")
    assert "delegates to self.language_model (DeepseekV3ForCausalLM)" in found.detail
    assert found.path.endswith("deepseek_v2.py")


@pytest.mark.slow
def test_supporting_architectures_per_version() -> None:
    lists = {v: set(supporting_architectures(sglang_root_of(v))) for v in SGLANG_VERSIONS}
    for names in lists.values():
        assert {"LlamaForCausalLM", "DeepseekV3ForCausalLM", "Qwen3ForCausalLM", "GptOssForCausalLM",
                "KimiK25ForConditionalGeneration"} <= names
        assert "DeepseekV4ForCausalLM" not in names
        # Classes that only inherit the method, from a base defined in another file (deepseek_nextn.py's
        # DeepseekV3ForCausalLMNextN -> DeepseekV3ForCausalLM -> DeepseekV2ForCausalLM in deepseek_v2.py).
        assert {"DeepseekV3ForCausalLMNextN", "Glm4MoeForCausalLMNextN", "Gemma4AssistantForCausalLM",
                "LlamaForCausalLMEagle", "Llama4ForCausalLM"} <= names
    # each release only adds: MiniMax-M3 (and its shifted default) arrives in 0.5.18, Qwen3.5's text classes
    # and GLM-5-Next in 0.5.23
    assert lists["0.5.14"] < lists["0.5.18"] < lists["0.5.23"]
    assert "MiniMaxM3SparseForConditionalGeneration" in lists["0.5.18"] - lists["0.5.14"]
    assert {"Glm5NextForConditionalGeneration", "Qwen3_5MoeForCausalLM"} <= lists["0.5.23"] - lists["0.5.18"]
    assert source_rule(sglang_root_of("0.5.18"), "MiniMaxM3SparseForConditionalGeneration").rule \
        is LayerRule.PLUS_ONE_SHIFTED_DEFAULT
    print({v: len(n) for v, n in lists.items()})


# -- the plugin's hooks on each version -------------------------------------------------------------------
def _logits_output_fields(root: Path) -> list[str]:
    tree = ast.parse((root / "srt/layers/logits_processor.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LogitsProcessorOutput")
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


@pytest.fixture
def versioned_registry(versioned_root):
    version, root = versioned_root
    unload_fake_sglang()
    module = load_real_hook_registry(root)
    module.HookRegistry.reset()
    yield version, root, module
    module.HookRegistry.reset()
    unload_fake_sglang()


def test_hooks_capture_the_final_rows_on_each_version(versioned_registry, tmp_path) -> None:
    """Model shaped like each version: its LogitsProcessorOutput fields, the processor called with the
    post-norm rows, a draft's processor call in between; the chunk's 'last' must be the target's rows."""
    version, root, registry_module = versioned_registry
    fields = _logits_output_fields(root)
    assert ("last_hidden_states" in fields) == (version not in OLD_VERSIONS)
    output_class = type("LogitsProcessorOutput", (), {"__init__": lambda self, **kw: self.__dict__.update(
        {f: kw.get(f) for f in fields})})

    class LogitsProcessor:
        def forward(self, input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states=None):
            packed = torch.cat(aux_hidden_states, dim=-1) if aux_hidden_states is not None else None
            extra = {"last_hidden_states": hidden_states} if "last_hidden_states" in fields else {}
            return output_class(next_token_logits=None, hidden_states=packed, **extra)

    class Result:
        def __init__(self, logits_output):
            self.logits_output = logits_output

    final = torch.randn(5, 4)
    aux = [torch.randn(5, 4) for _ in range(3)]

    class ModelRunner:
        is_draft_worker = False
        model = None

        def forward(self, forward_batch):
            out = LogitsProcessor().forward(forward_batch.input_ids, final, None, forward_batch, aux)
            # a draft's own processor call (no aux) must not replace the target's rows
            LogitsProcessor().forward(forward_batch.input_ids, torch.zeros(5, 4), None, forward_batch, None)
            return Result(out)

    module = types.ModuleType("capture_versions_target")
    module.LogitsProcessor, module.ModelRunner = LogitsProcessor, ModelRunner
    sys.modules[module.__name__] = module
    spec = CaptureSpec(dir=str(tmp_path / "cap"), rid_prefix="eagle3-", fsync=False)
    state = hook_module.CaptureHook(spec, writer_rank=True)
    try:
        registry = registry_module.HookRegistry
        after = registry_module.HookType.AFTER
        registry.register("capture_versions_target.ModelRunner.forward", state.after_forward, after)
        registry.register("capture_versions_target.LogitsProcessor.forward", state.after_logits, after)
        registry.apply_hooks()
        batch = FakeForwardBatch(FakeMode("EXTEND"), torch.arange(5), ["eagle3-a"], [0], [5])
        ModelRunner().forward(batch)
        state.flush()
    finally:
        del sys.modules[module.__name__]
        state.close()
    got_aux, got_last, _ids = read_chunks(tmp_path / "cap", "eagle3-a")
    assert torch.equal(got_aux, torch.cat(aux, dim=-1).bfloat16())
    assert got_last is not None and torch.equal(got_last, final.bfloat16())


def test_final_rows_are_never_taken_from_another_output(tmp_path) -> None:
    """A forward whose output did not come through the processor hook (a graph replay) gets no 'last'."""
    state = hook_module.CaptureHook(CaptureSpec(dir=str(tmp_path / "cap"), fsync=False), writer_rank=True)
    batch = FakeForwardBatch(FakeMode("EXTEND"), torch.arange(2), ["eagle3-a"], [0], [2])
    seen = types.SimpleNamespace(hidden_states=None)
    state.after_logits(seen, None, batch.input_ids, torch.ones(2, 4), None, batch, [torch.ones(2, 4)])
    other = types.SimpleNamespace(hidden_states=torch.ones(2, 12))
    assert state._take_final_rows(other) is None
    assert state._take_final_rows(seen) is None  # the slot is cleared by the first take


# -- the toggle and profile validation on each version ---------------------------------------------------
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
                "hidden_size": 4096}
GPT_OSS_CONFIG = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 24,
                  "hidden_size": 2880}


@pytest.fixture
def sglang_profile(make_emulator_profile, tmp_path):
    """A launcher = sglang profile whose Python finds the given version's wheel (PYTHONPATH = its site)."""

    def make(version: str, config: dict = LLAMA_CONFIG, layers=None, extra_args=(), draft_ids=None):
        model = tmp_path / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps(config))
        if draft_ids is not None:
            draft = tmp_path / "draft"
            draft.mkdir(exist_ok=True)
            (draft / "config.json").write_text(json.dumps({
                "architectures": ["LlamaForCausalLMEagle3"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": draft_ids, "use_aux_hidden_state": True}}))
        capture = {"enabled": True, "dir": str(tmp_path / "cap")}
        if layers is not None:
            capture["layers"] = layers
        return make_emulator_profile(model_path=str(model), capture=capture, launcher="sglang",
                                     extra_args=list(extra_args),
                                     env={"PYTHONPATH": str(sglang_root_of(version).parent)})

    return make


def _errors(problems) -> list[str]:
    return [f"{p.field}: {p.message}" for p in problems if p.is_error]


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_old_sglang_without_a_draft_is_told_what_works_there(sglang_profile, version) -> None:
    from sessions.profiles.capture_toggle import capture_additions, capture_problems, toggle_summary, toggled

    p = sglang_profile(version, layers=[2, 16, 29])
    argv, _env = capture_additions(p)
    # never a flag this SGLang lacks
    assert "--enable-return-aux-hidden-states" not in argv and "--return-aux-hidden-state-layer-ids" not in argv
    errors = _errors(capture_problems(p))
    assert any(f"SGLang {version} has no capture-only mode" in e and "--speculative-draft-model-path" in e
               and "eagle_aux_hidden_state_layer_ids = [1, 15, 28]" in e for e in errors), errors
    off = toggled(p)
    summary = toggle_summary(off, toggled(off))
    assert any(f"SGLang {version} has no capture-only mode" in line for line in summary), summary
    assert any(line.startswith("will refuse to launch:") and "no capture-only mode" in line for line in summary)


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_old_sglang_with_a_draft_naming_the_layers_validates(sglang_profile, version, tmp_path) -> None:
    from sessions.profiles.capture_toggle import capture_additions, capture_problems
    from sessions.profiles.validation import validate_profile

    draft = str(tmp_path / "draft")
    p = sglang_profile(version, layers=[2, 16, 29], draft_ids=[1, 15, 28],
                       extra_args=["--speculative-draft-model-path", draft])
    argv, _env = capture_additions(p)
    assert argv == ["--speculative-algorithm", "EAGLE3", "--disable-radix-cache"]
    assert not _errors(capture_problems(p))
    assert not [e for e in _errors(validate_profile(p)) if "capture" in e or "extra_args" in e]
    # a draft whose ids capture other layers is refused with both sides named
    bad = sglang_profile(version, layers=[2, 16, 29], draft_ids=[2, 16, 29],
                         extra_args=["--speculative-draft-model-path", draft])
    assert any("differ from what the draft's eagle_aux_hidden_state_layer_ids [2, 16, 29] capture" in e
               and "[3, 17, 30]" in e for e in _errors(capture_problems(bad)))


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_validation_refuses_capture_only_flags_through_the_flag_reader(sglang_profile, version) -> None:
    from sessions.profiles.validation import validate_profile

    p = sglang_profile(version, extra_args=["--enable-return-aux-hidden-states"])
    errors = _errors(validate_profile(p))
    assert any(f"SGLang {version} has no flag --enable-return-aux-hidden-states" in e for e in errors), errors


def test_gpt_oss_ids_follow_each_versions_rule(sglang_profile) -> None:
    """The plan's rule comes from each version's own gpt_oss.py: unconditional +1 in 0.5.14, verbatim when
    max(ids) == L from 0.5.18 on (the table alone says the latter for every version)."""
    from sessions.profiles.capture_toggle import layer_plan, layer_rule

    rules = {v: layer_rule(sglang_profile(v, GPT_OSS_CONFIG), "GptOssForCausalLM") for v in SGLANG_VERSIONS}
    assert rules == {"0.5.14": LayerRule.PLUS_ONE, "0.5.18": LayerRule.KEEP_IF_MAX_IS_L,
                     "0.5.23": LayerRule.KEEP_IF_MAX_IS_L}
    plan = layer_plan(sglang_profile("0.5.14", GPT_OSS_CONFIG, layers=[2, 12, 21]))
    assert plan is not None and plan.rule is LayerRule.PLUS_ONE and plan.ids == (1, 11, 20)


def test_capture_only_flags_stay_on_0_5_23(sglang_profile) -> None:
    from sessions.profiles.capture_toggle import capture_additions, capture_problems

    p = sglang_profile("0.5.23", layers=[2, 16, 29])
    argv, _env = capture_additions(p)
    assert argv == ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
                    "--disable-radix-cache", "--return-aux-hidden-state-layer-ids", "1", "15", "28"]
    assert not [e for e in _errors(capture_problems(p)) if "capture-only" in e or "would pass" in e]


def test_the_logits_hook_is_registered_only_where_the_output_lacks_the_final_rows(versioned_root, tmp_path,
                                                                                  monkeypatch) -> None:
    """The plugin decides from the installed SGLang's own logits_processor.py, without importing it."""
    version, root = versioned_root
    monkeypatch.syspath_prepend(str(root.parent))
    unload_fake_sglang()
    try:
        assert hook_module.output_lacks_last_hidden_states() is (version in OLD_VERSIONS)
        assert "sglang.srt.layers.logits_processor" not in sys.modules
    finally:
        unload_fake_sglang()


def test_capture_check_with_a_model_names_that_versions_rule(versioned_root, tmp_path) -> None:
    version, root = versioned_root
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_CONFIG))
    report = check_sglang(root, model_path=tmp_path)
    check = next(c for c in report.checks if c.symbol == "GptOssForCausalLM.set_eagle3_layers_to_capture")
    assert check.ok
    expected = LayerRule.PLUS_ONE if version == "0.5.14" else LayerRule.KEEP_IF_MAX_IS_L
    assert f"rule {expected.value} (" in check.role
