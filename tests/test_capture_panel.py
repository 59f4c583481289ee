"""CapturePanel renders a CaptureStatus; the capture CLI (status, toggle, demo-model) works headless."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from textual.app import App, ComposeResult

from sessions.profiles.capture_toggle import CUDA_GRAPH_NOTE, CaptureStatus
from tests._tui_support import run, screen_text, wait_until
from widgets.capture_panel import CapturePanel

REPO = Path(__file__).resolve().parent.parent


def _status(**changes) -> CaptureStatus:
    base = dict(  # noqa: C408 - keyword form reads like the dataclass
        profile_name="kimi", enabled=True, dir="/dev/shm/eagle3-capture-me", dir_exists=True, dir_problem=None,
        file_count=12, rid_count=4, size_bytes=3 * 1024**3, fs_total_bytes=100 * 1024**3,
        fs_used_bytes=95 * 1024**3, fs_free_bytes=5 * 1024**3, rid_prefix="eagle3-",
        architecture="KimiK25ForConditionalGeneration", num_layers=61, points=(3, 31, 59), draft_ids=(3, 31, 59),
        explicit_layers=True, standard_points=(2, 30, 58),
        warnings=("layers [3, 31, 59] are not the standard EAGLE-3 set [2, 30, 58] for L=61",), errors=(),
    )
    base.update(changes)
    return CaptureStatus(**base)


class _PanelApp(App):
    def compose(self) -> ComposeResult:
        yield CapturePanel(id="capture")


def _render(status, server_layers=None, size=(140, 12)) -> str:
    out: dict[str, str] = {}

    async def scenario() -> None:
        app = _PanelApp()
        async with app.run_test(size=size) as pilot:
            panel = app.query_one(CapturePanel)
            panel.update_status(status, server_layers=server_layers)
            marker = "CUDA graphs" if status is not None else "No profile selected."
            await wait_until(pilot, lambda: marker in screen_text(app), "the panel drawn in full")
            out["text"] = screen_text(app)

    run(scenario)
    return out["text"]


def test_panel_shows_both_conventions_warning_dir_fill_and_the_graph_note():
    text = _render(_status())
    assert "CAPTURE ON" in text
    assert "capture points [3, 31, 59]" in text and "draft-config ids [3, 31, 59]" in text
    assert "not the standard [2, 30, 58] for L=61" in text
    assert "dir /dev/shm/eagle3-capture-me" in text and "12 files" in text and "3.0G" in text
    assert "fs 95% full (5.0G free)" in text
    assert CUDA_GRAPH_NOTE in text


def test_panel_confirms_or_flags_what_the_server_logged():
    assert "✓ capture active" in _render(_status(points=(2, 30, 58), draft_ids=(1, 29, 57), warnings=()),
                                         server_layers=[2, 30, 58])
    assert "differs from the profile's [2, 30, 58]" in _render(
        _status(points=(2, 30, 58), draft_ids=(1, 29, 57), warnings=()), server_layers=[3, 31, 59])


def test_panel_off_and_empty():
    text = _render(_status(enabled=False, points=(2, 30, 58), draft_ids=(1, 29, 57), explicit_layers=False,
                           warnings=(), dir_exists=False))
    assert "capture off" in text and "(c toggles)" in text and "(SGLang default)" in text
    assert "✓ EAGLE-3 standard" in text and "(created on first capture)" in text
    assert "No profile selected." in _render(None)


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, check=False, env=env,
                          cwd=REPO, timeout=300)


def test_cli_toggle_and_status(make_emulator_profile, cli_env, tmp_path):
    profile = make_emulator_profile("cap-cli", capture={"dir": str(tmp_path / "cap"), "layers": [2, 30, 58]})
    toggled = _cli("capture", "toggle", "cap-cli", env=cli_env)
    assert toggled.returncode == 0, toggled.stderr
    assert toggled.stdout.strip() == "on"
    status = _cli("capture", "status", "cap-cli", "--json", env=cli_env)
    assert status.returncode == 0, status.stderr
    obj = json.loads(status.stdout)
    assert obj["enabled"] is True and obj["points"] == [2, 30, 58] and obj["draft_ids"] == [1, 29, 57]
    assert obj["dir"] == str(tmp_path / "cap") and obj["file_count"] == 0
    assert _cli("capture", "toggle", str(profile.path), env=cli_env).stdout.strip() == "off"
    missing = _cli("capture", "status", "no-such-profile", env=cli_env)
    assert missing.returncode == 2 and "no-such-profile" in missing.stderr


def test_cli_demo_model_writes_a_loadable_model_and_refuses_a_full_dir(tmp_path, cli_env):
    target = tmp_path / "demo"
    made = _cli("demo-model", str(target), env=cli_env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(target)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(target))
    again = _cli("demo-model", str(target), env=cli_env)
    assert again.returncode == 2 and "is not empty" in again.stderr
    bad = _cli("demo-model", str(tmp_path / "x"), "--layers", "4", env=cli_env)
    assert bad.returncode == 2 and "num_layers must be >= 8" in bad.stderr


def test_the_capture_toggle_panel_and_check_never_import_torch_or_sglang(make_emulator_profile, tmp_path,
                                                                         cli_env):
    """What the TUI loads for capture (toggle, status, panel, the static check) stays light."""
    from tests._capture_support import sglang_root

    make_emulator_profile("light", capture={"enabled": True, "dir": str(tmp_path / "cap")})
    code = f"""
import json, sys
from sessions.profiles import load_profile, build_command, validate_profile
from sessions.profiles.capture_toggle import capture_status
from sessions.capture.compat import check_sglang
import widgets.capture_panel
profile = load_profile("light")
capture_status(profile)
build_command(profile)
validate_profile(profile, check_port=False)
assert check_sglang({str(sglang_root())!r}).ok
print(json.dumps({{name: name in sys.modules for name in ("torch", "transformers", "sglang", "safetensors")}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env=cli_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "torch": False, "transformers": False, "sglang": False, "safetensors": False}
