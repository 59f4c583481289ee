"""The README's "On a GPU host" install, followed step by step: a wheel in its own venv, SGLang's venv untouched.

SGLang's venv is stood in for by a fresh venv that sees SGLang 0.5.23's real sources through a ``.pth`` file
(validation reads SGLang statically, so that is all it needs).  The panel is built with ``pip wheel .`` and
installed into another fresh venv, which has no torch.  Then the commands the README names are run from that
venv, and SGLang's venv must be exactly as it was.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from _sglang_wheel import sglang_0_5_23_site

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent

# Package data that the installed panel reads at run time: the hint catalogues and the capture plugin that
# the launcher puts on the server's PYTHONPATH.
WHEEL_DATA = (
    "sessions/data/known_causes.toml",
    "sessions/data/known_causes_runtime.toml",
    "sessions/capture/plugin/eagle3_capture/__init__.py",
    "sessions/capture/plugin/eagle3_capture/hook.py",
    "sessions/capture/plugin/eagle3_capture/writer.py",
    "sessions/capture/plugin/eagle3_capture/spec.py",
)


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _site_packages(venv: Path) -> Path:
    rel = Path(sysconfig.get_path("purelib", vars={"base": "", "platbase": ""}).lstrip(os.sep))
    return venv / rel


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO_ROOT)])
    (found,) = out.glob("eagle3_tui-*.whl")
    return found


def test_the_wheel_carries_the_hint_catalogues_and_the_capture_plugin(wheel) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in WHEEL_DATA if name not in names]
    assert not missing, missing
    assert not [n for n in names if n.startswith("tests/")]


def test_a_gpu_host_install_leaves_sglangs_venv_alone_and_validates_against_its_sglang(wheel, tmp_path) -> None:
    # SGLang's venv: SGLang 0.5.23 visible to its python, nothing of ours.
    sglang_venv = tmp_path / "sglang-venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(sglang_venv)])
    site = _site_packages(sglang_venv)
    (site / "sglang-src.pth").write_text(f"{sglang_0_5_23_site()}\n")
    sglang_python = sglang_venv / "bin" / "python"
    before = _tree(sglang_venv)

    # The README's steps: a venv of the panel's own, the wheel installed into it.
    # A user's shell, not this test's: no PYTHONPATH (a checkout on it holds the project's egg-info, and pip
    # then takes the panel as "already satisfied" and installs no eagle3-tui script), no demo, no venv.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EAGLE3_TUI_DEMO", "VIRTUAL_ENV")}
    tui_venv = tmp_path / "eagle3-tui-venv"
    _run([sys.executable, "-m", "venv", str(tui_venv)], env)
    _run([str(tui_venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], env)
    tui = str(tui_venv / "bin" / "eagle3-tui")
    no_torch = _run([str(tui_venv / "bin" / "python"), "-c",
                     "import importlib.util as u; print(u.find_spec('torch') is None)"], env)
    assert no_torch.stdout.strip() == "True"  # the TUI side needs no torch

    env["EAGLE3_TUI_HOME"] = str(tmp_path / "home")
    env["PATH"] = f"{tui_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    assert "launch" in _run([tui, "--help"], env).stdout
    assert "kimi-k25-tp8" in _run([tui, "--demo", "profile", "list"], env).stdout

    model = tmp_path / "Kimi-like"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                   "model_type": "deepseek_v3", "hidden_size": 7168,
                                                   "num_hidden_layers": 61, "vocab_size": 163840}))
    _run([tui, "profile", "new", "kimi", "--python", str(sglang_python), "--model", str(model)], env)
    assert "is valid" in _run([tui, "profile", "validate", "kimi"], env).stderr
    # It reads the flags of the SGLang that profile's python has: 0.5.23 takes `--cuda-graph-max-bs` as an
    # ambiguous prefix, which only its own argparse tables can tell.
    profile_path = tmp_path / "home" / "config" / "profiles" / "kimi.toml"
    if not profile_path.is_file():
        (profile_path,) = (tmp_path / "home").rglob("profiles/kimi.toml")
    text = profile_path.read_text()
    profile_path.write_text(text.replace("extra_args = []", 'extra_args = ["--cuda-graph-max-bs", "8"]', 1))
    refused = subprocess.run([tui, "profile", "validate", "kimi"], capture_output=True, text=True, env=env,
                             timeout=300, check=False)
    assert refused.returncode != 0 and "--cuda-graph-max-bs" in refused.stdout + refused.stderr, refused
    profile_path.write_text(text)
    command = _run([tui, "profile", "command", "kimi"], env).stdout
    assert command.startswith(f"{sglang_python} -m sglang.launch_server"), command

    assert _tree(sglang_venv) == before  # nothing was installed into, or written inside, SGLang's venv
