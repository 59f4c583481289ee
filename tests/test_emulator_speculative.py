"""The emulator's EAGLE3 flags as SGLang 0.5.23 resolves and refuses them, the draft's start-up lines and
failures (real emulator processes), the demo's EAGLE-3 draft dir and profile, and the `[emulator] spec_*`
settings.  Capture-only mode (EAGLE3 named without a draft) must stay as it was."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, get_free_port

from sessions.emulator.args import parse_args, resolve_server_args
from sessions.emulator.model_config import load_model_config
from sessions.emulator.speculative import auto_choose

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
                "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                "max_position_embeddings": 4096, "intermediate_size": 128, "torch_dtype": "bfloat16"}
DRAFT_CONFIG = dict(LLAMA_CONFIG, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
                    draft_vocab_size=256)


@pytest.fixture
def llama_dirs(tmp_path: Path) -> tuple[Path, Path]:
    target, draft = tmp_path / "llama", tmp_path / "llama-eagle3"
    for path, config in ((target, LLAMA_CONFIG), (draft, DRAFT_CONFIG)):
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
    return target, draft


def resolve(model_dir: Path, *flags: str) -> tuple[dict, list[str]]:
    ns, _ = parse_args(["--model-path", str(model_dir), *flags])
    warnings: list[str] = []
    args = resolve_server_args(ns, load_model_config(model_dir), rng=lambda a, b: a, warn=warnings.append)
    return args, warnings


def spec(args: dict) -> tuple:
    return args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]


def test_auto_choice_follows_the_target_architecture(llama_dirs, emulator_model_dir):
    target, draft = llama_dirs
    args, warnings = resolve(target, "--speculative-algorithm", "eagle3", "--speculative-draft-model", str(draft))
    assert args["speculative_algorithm"] == "EAGLE3" and spec(args) == (5, 4, 8)
    assert args["max_running_requests"] == 48 and args["speculative_draft_model_revision"] == "main"
    assert warnings == [("Max running requests is reset to 48 for speculative decoding. You can override this "
                        "by explicitly setting --max-running-requests.")]
    args, _ = resolve(emulator_model_dir, "--speculative-algorithm", "EAGLE3",
                      "--speculative-draft-model-path", str(draft), "--max-running-requests", "8")
    assert spec(args) == (3, 1, 4) == auto_choose("EAGLE3", "KimiK25ForConditionalGeneration")
    assert args["max_running_requests"] == 8


def test_topk_one_forces_draft_tokens_to_steps_plus_one(llama_dirs):
    target, draft = llama_dirs
    args, warnings = resolve(target, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                             str(draft), "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                             "--speculative-num-draft-tokens", "8")
    assert spec(args) == (3, 1, 4)
    assert ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            "speculative_eagle_topk == 1") in warnings


@pytest.mark.parametrize(("flags", "error", "message"), [
    (["--speculative-eagle-topk", "4"], AssertionError, r"^$"),
    (["--speculative-num-draft-tokens", "4"], AssertionError, r"^$"),
    (["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--attention-backend", "trtllm_mha"],
     ValueError, r"^trtllm_mha backend only supports topk = 1 for speculative decoding\.$"),
    (["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--page-size", "64",
      "--attention-backend", "flashmla"], ValueError,
     (r"^speculative_eagle_topk > 1 with page_size > 1 is only supported on \('flashinfer', 'fa3', 'triton'\); "
     r"got attention_backend='flashmla'\. Use page_size == 1 or one of those backends\.$")),
    (["--speculative-num-steps", "3"], TypeError, r"'>' not supported between instances of 'NoneType'"),
])
def test_rejected_combinations_fail_with_sglangs_errors(llama_dirs, flags, error, message):
    target, draft = llama_dirs
    with pytest.raises(error, match=message):
        resolve(target, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft), *flags)


def test_unknown_algorithm_and_unreadable_draft_paths(llama_dirs, tmp_path):
    target, _draft = llama_dirs
    with pytest.raises(ValueError, match=r"^Unknown speculative algorithm name: MEDUSA$"):
        resolve(target, "--speculative-algorithm", "medusa")
    missing = tmp_path / "no" / "such-draft"
    with pytest.raises(OSError, match=r"Repo id must be in the form 'repo_name' or 'namespace/repo_name': "):
        resolve(target, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"Should have a `model_type` key in its config.json"):
        resolve(target, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(empty))
    (empty / "config.json").write_text("{not json")
    with pytest.raises(OSError, match=r"is not a valid JSON file"):
        resolve(target, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(empty))


def test_capture_only_mode_is_unchanged(llama_dirs):
    target, _ = llama_dirs
    args, warnings = resolve(target, "--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3")
    assert args["speculative_algorithm"] is None and args["aux_hidden_state_capture"] == "eagle3"
    assert args["max_running_requests"] is None and args["speculative_num_steps"] is None and warnings == []


def _emulator(model: Path, *flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(model.parent)}
    return subprocess.run(
        [sys.executable, "-m", "sessions.emulator", "--model-path", str(model), "--port", str(get_free_port()),
         "--time-scale", "0.003", "--speculative-algorithm", "EAGLE3", *flags],
        cwd=model.parent, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_a_missing_draft_dir_fails_before_server_args(llama_dirs, tmp_path):
    target, _ = llama_dirs
    proc = _emulator(target, "--speculative-draft-model-path", str(tmp_path / "gone"))
    assert proc.returncode == 1
    assert "OSError: Repo id must be in the form" in proc.stderr and "Traceback" in proc.stderr
    assert "server_args=" not in proc.stderr


def test_a_full_model_as_draft_fails_in_every_scheduler_like_sglang(llama_dirs):
    target, _ = llama_dirs
    proc = _emulator(target, "--speculative-draft-model-path", str(target), "--tp-size", "2")
    assert proc.returncode != 0
    err = proc.stderr
    assert "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=8" in err
    assert "Scheduler hit an exception" in err and "ValueError: EAGLE3 currently only supports 1 layer" in err
    assert "Received sigquit from a child process. It usually means the child failed." in err


def _safetensors_header(path: Path) -> dict:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + size])


def test_demo_has_an_eagle3_draft_and_a_profile_that_serves_with_it(tmp_path, monkeypatch):
    from sessions.demo import (
        EAGLE3_PROFILE,
        capture_demo_missing,
        ensure_demo_home,
        tiny_draft_dir,
        tiny_model_dir,
    )
    from sessions.home import HOME_ENV, resolve_home
    from sessions.profiles import build_command, load_profile, validate_profile

    if capture_demo_missing():
        pytest.skip(f"the tiny demo model needs {', '.join(capture_demo_missing())}")
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    home = ensure_demo_home(resolve_home(demo=True))
    draft = tiny_draft_dir(home)
    assert draft == tiny_model_dir(home).parent / "tiny-llama-eagle3"
    config = json.loads((draft / "config.json").read_text())
    target = json.loads((tiny_model_dir(home) / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["hidden_size"] == target["hidden_size"] and config["vocab_size"] == target["vocab_size"]
    assert 0 < config["draft_vocab_size"] < config["vocab_size"]
    header = _safetensors_header(draft / "model.safetensors")
    h = config["hidden_size"]
    assert header["fc.weight"]["shape"] == [h, 3 * h]
    assert header["midlayer.self_attn.q_proj.weight"]["shape"][1] == 2 * h
    assert header["lm_head.weight"]["shape"] == [config["draft_vocab_size"], h]
    assert header["d2t"]["shape"] == [config["draft_vocab_size"]] and header["t2d"]["dtype"] == "BOOL"
    assert not any(k.startswith("model.layers.") for k in header)
    profile = load_profile(EAGLE3_PROFILE, home)
    assert not [p for p in validate_profile(profile) if p.is_error]
    argv = build_command(profile).argv
    assert argv[argv.index("--speculative-draft-model-path") + 1] == str(draft)
    assert argv[argv.index("--emulate-spec-accept-length") + 1] == "3"


def test_spec_settings_are_validated_in_the_profile(make_emulator_profile):
    from sessions.profiles import ProfileError, validate_profile

    def problems(**emulator):
        try:
            profile = make_emulator_profile("spec", tp=1, emulator=emulator, extra_args=[
                "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "1"])
        except ProfileError as exc:  # refused on load, each problem naming its key and line
            return {p.field: p.message for p in exc.problems if p.is_error}
        return {p.field: p.message for p in validate_profile(profile) if p.is_error}

    assert problems(spec_accept_length=3.0, spec_draft_cost=0.1, spec_verify_cost=1.2) == {}
    bad = problems(spec_accept_length=4.5, spec_draft_cost=1.5, spec_verify_cost=0.5)
    assert "between 1 and the number of draft tokens (4)" in bad["emulator.spec_accept_length"]
    assert "(0, 1]" in bad["emulator.spec_draft_cost"] and "at least 1" in bad["emulator.spec_verify_cost"]
    assert "between 1" in problems(spec_accept_length=0.5)["emulator.spec_accept_length"]
