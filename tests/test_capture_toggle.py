"""The capture toggle: flags and env a capture launch gets, its refusals, the toggle, the status, injection."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.capture.plugin.eagle3_capture.spec import ENV_NAME, CaptureSpec
from sessions.profiles import build_command, load_profile, save_profile
from sessions.profiles.capture_toggle import (
    CUDA_GRAPH_NOTE,
    capture_additions,
    capture_problems,
    capture_status,
    toggle_capture,
)

KIMI_K25_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168},
}
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
                "hidden_size": 4096}


@pytest.fixture
def profile(make_emulator_profile, tmp_path):
    """An emulator profile with capture on, a private capture dir, and a model dir we can rewrite."""

    def make(config: dict | None = None, layers=None, **server):
        model = tmp_path / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps(config or KIMI_K25_CONFIG))
        capture = {"enabled": True, "dir": str(tmp_path / "cap")}
        if layers is not None:
            capture["layers"] = layers
        return make_emulator_profile(model_path=str(model), capture=capture, **server)

    return make


def _fields(problems, severity="error"):
    return {(p.field, p.message) for p in problems if p.severity == severity}


def test_capture_adds_the_capture_only_flags_and_converted_layer_ids(profile):
    argv, env = capture_additions(profile(layers=[2, 30, 58]))
    assert argv == ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
                    "--disable-radix-cache", "--return-aux-hidden-state-layer-ids", "1", "29", "57"]
    spec = CaptureSpec.from_json(env[ENV_NAME])
    assert spec.layers == (2, 30, 58) and spec.draft_layer_ids == (1, 29, 57) and spec.rid_prefix == "eagle3-"
    plugin_dir = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    assert (plugin_dir / "eagle3_capture" / "hook.py").is_file()


def test_llama_layers_are_converted_with_plus_one(profile):
    argv, _ = capture_additions(profile(LLAMA_CONFIG, layers=[2, 16, 29]))
    assert argv[-4:] == ["--return-aux-hidden-state-layer-ids", "1", "15", "28"]


def test_no_layer_flag_without_layers_and_nothing_when_off(profile):
    p = profile()
    argv, env = capture_additions(p)
    assert "--return-aux-hidden-state-layer-ids" not in argv
    assert CaptureSpec.from_json(env[ENV_NAME]).layers == (2, 30, 58)  # SGLang's own default, recorded
    off = p.with_changes(capture={"enabled": False})
    assert capture_additions(off) == ([], {})
    assert capture_problems(off) == []


def test_build_command_carries_capture_once_and_keeps_the_users_pythonpath(profile):
    p = profile(layers=[2, 30, 58], radix_cache=False, env={"PYTHONPATH": "/opt/mine"})
    cmd = build_command(p)
    assert cmd.argv.count("--disable-radix-cache") == 1
    assert cmd.argv[cmd.argv.index("--return-aux-hidden-state-layer-ids") + 1:][:3] == ["1", "29", "57"]
    entries = cmd.env_changes["PYTHONPATH"].split(os.pathsep)
    assert entries[0].endswith(Path(entries[0]).name) and "eagle3_capture" in entries[0]
    assert entries[1:] == ["/opt/mine"]
    assert json.loads(cmd.env_changes[ENV_NAME])["dir"].endswith("cap")


def test_inherited_pythonpath_is_kept_when_the_profile_sets_none(profile, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    _, env = capture_additions(profile())
    assert env["PYTHONPATH"].split(os.pathsep)[1:] == ["/inherited"]


def test_sglang_plugins_whitelist_gets_our_plugin(profile):
    _, env = capture_additions(profile(env={"SGLANG_PLUGINS": "other_plugin"}))
    assert env["SGLANG_PLUGINS"] == "other_plugin,eagle3_capture"


def test_explicit_radix_cache_true_is_refused_with_the_reason(profile):
    problems = capture_problems(profile(radix_cache=True))
    assert any(f == "server.radix_cache" and "not recomputed" in m for f, m in _fields(problems))
    assert not any(f == "server.radix_cache" for f, _ in _fields(capture_problems(profile())))


@pytest.mark.parametrize("extra,needle", [
    (["--pp-size", "2"], "pipeline parallelism (PP 2)"),
    (["--pipeline-parallel-size=4"], "PP 4"),
    (["--speculative-draft-model-path", "/d"], "draft model"),
    (["--speculative-algorithm", "NEXTN"], "conflicts"),
])
def test_incompatible_extra_args_are_refused(profile, extra, needle):
    problems = capture_problems(profile(extra_args=extra))
    assert any(f == "server.extra_args" and needle in m for f, m in _fields(problems)), problems


def test_architecture_without_eagle3_capture_is_refused(profile):
    problems = capture_problems(profile({"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 61,
                                         "hidden_size": 7168}))
    assert any("DeepseekV4ForCausalLM has no set_eagle3_layers_to_capture" in m for _, m in _fields(problems))


def test_architecture_is_checked_against_the_real_sglang_source(profile, tmp_path):
    """With launcher = sglang and an SGLang found in the profile's Python, its models are read statically."""
    from tests._capture_support import sglang_root

    site = sglang_root().parent
    p = profile({"architectures": ["Phi3ForCausalLM"], "num_hidden_layers": 32, "hidden_size": 3072},
                launcher="sglang", env={"PYTHONPATH": str(site)})
    assert not [m for _, m in _fields(capture_problems(p)) if "set_eagle3_layers_to_capture" in m]
    p = profile({"architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 26, "hidden_size": 2304},
                launcher="sglang", env={"PYTHONPATH": str(site)})
    messages = [m for _, m in _fields(capture_problems(p))]
    assert any("Gemma2ForCausalLM has no set_eagle3_layers_to_capture (SGLang 0.5.23 at" in m for m in messages)


def test_layers_out_of_range_use_the_nested_text_config(profile):
    problems = capture_problems(profile(layers=[2, 30, 61]))
    assert any(f == "capture.layers" and "num_hidden_layers = 61" in m for f, m in _fields(problems))


def test_unreachable_point_and_non_standard_warning(profile):
    problems = capture_problems(profile(layers=[1, 30, 58]))
    assert any("capture point 1 cannot be reached" in m for _, m in _fields(problems))
    warnings = _fields(capture_problems(profile(layers=[3, 31, 59])), "warning")
    assert any("not the standard EAGLE-3 set [2, 30, 58] for L=61" in m for _, m in warnings)
    assert not _fields(capture_problems(profile(layers=[3, 31, 59])))


def test_unsafe_capture_dir_is_refused(profile, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "cap").symlink_to(real)
    problems = capture_problems(profile())
    assert any(f == "capture.dir" and "refused: it is a symlink" in m for f, m in _fields(problems))


def test_validate_profile_includes_capture_problems(profile):
    from sessions.profiles import validate_profile

    problems = validate_profile(profile(radix_cache=True), check_port=False)
    assert any(p.field == "server.radix_cache" and p.is_error for p in problems)


def test_toggle_flips_saves_and_drops_an_explicit_radix_true(profile):
    p = profile(radix_cache=True).with_changes(capture={"enabled": False})
    save_profile(p)
    on = toggle_capture(load_profile(p.path))
    assert on.capture.enabled
    reloaded = load_profile(p.path)
    assert reloaded.capture.enabled and not reloaded.is_explicit("server.radix_cache")
    assert not [x for x in capture_problems(reloaded) if x.field == "server.radix_cache"]
    off = toggle_capture(reloaded)
    assert not off.capture.enabled and not load_profile(p.path).capture.enabled


def test_status_shows_both_conventions_dir_contents_and_fill(profile, tmp_path):
    import torch

    from sessions.capture.writer import write_chunks

    p = profile(layers=[3, 31, 59])
    write_chunks(tmp_path / "cap", ["eagle3-a", "eagle3-b"], [0, 0], [2, 3], torch.zeros(5, 12),
                 torch.zeros(5, 4), torch.arange(5), {"layers": [3, 31, 59]}, fsync=False)
    status = capture_status(p)
    assert status.enabled and status.points == (3, 31, 59) and status.draft_ids == (3, 31, 59)
    assert status.standard_points == (2, 30, 58) and status.is_standard is False
    assert status.file_count == 2 and status.rid_count == 2
    assert status.size_bytes == sum(f.stat().st_size for f in (tmp_path / "cap").glob("*/*.safetensors"))
    assert status.fs_total_bytes and 0 <= status.fs_fill_percent <= 100
    assert status.cuda_graph_note == CUDA_GRAPH_NOTE
    assert any("not the standard" in w for w in status.warnings)
    assert json.loads(json.dumps(status.to_json()))["draft_ids"] == [3, 31, 59]


def test_generated_plugin_dir_is_found_by_importlib_metadata(home):
    from sessions.capture.inject import plugin_path

    folder = plugin_path(home)
    assert plugin_path(home) == folder  # content-addressed: stable
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps([(e.name, e.value, e.dist.name) for e in m.entry_points(group='sglang.srt.plugins')]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(folder)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert ["eagle3_capture", "eagle3_capture:register", "eagle3_capture"] in json.loads(out.stdout)
    # only the plugin goes onto SGLang's path
    assert sorted(p.name for p in folder.iterdir()) == ["eagle3_capture", "eagle3_capture-0.1.0.dist-info"]
    (folder / "eagle3_capture" / "hook.py").write_text("tampered = True\n")
    assert plugin_path(home) == folder
    assert "tampered" not in (folder / "eagle3_capture" / "hook.py").read_text()
