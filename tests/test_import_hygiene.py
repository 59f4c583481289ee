"""Import hygiene: the TUI process never loads torch, transformers or sglang; `sessions/` never loads textual.

Each check runs in a fresh interpreter, so what the test process imported itself cannot hide a leak.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import sessions

REPO_ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "sglang")


def _run(code: str, tmp_path: Path) -> dict:
    env = os.environ | {"EAGLE3_TUI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("EAGLE3_TUI_DEMO", None)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_tui_and_its_screens_never_import_torch_transformers_or_sglang(tmp_path):
    code = """
import json, sys
from sessions.home import resolve_home
from sessions.demo import ensure_demo_home
import app.tui, app.feed, app.screens.dashboard, app.screens.profile_editor, app.screens.help
import widgets.gpu_panel, widgets.log_view, widgets.lists, widgets.env_table, widgets.confirm_modal
from app.tui import Eagle3App
home = ensure_demo_home(resolve_home(demo=True))
app = Eagle3App(home, demo=True)
print(json.dumps({name: name in sys.modules for name in HEAVY}))
""".replace("HEAVY", repr(HEAVY))
    loaded = _run(code, tmp_path)
    assert loaded == {name: False for name in HEAVY}, loaded


def test_a_running_dashboard_poll_never_imports_them_either(tmp_path):
    # The first poll imports the engine modules the dashboard uses (server, profiles, phases, probes...).
    code = """
import json, sys
from sessions.home import resolve_home
from sessions.demo import ensure_demo_home
from sessions.gpus import default_gpu_source
from app.feed import DashboardFeed, PollRequest
home = ensure_demo_home(resolve_home(demo=True))
feed = DashboardFeed(home, default_gpu_source(home, demo=True))
snapshot = feed.poll(PollRequest(None, None))
print(json.dumps({name: name in sys.modules for name in HEAVY}))
""".replace("HEAVY", repr(HEAVY))
    loaded = _run(code, tmp_path)
    assert loaded == {name: False for name in HEAVY}, loaded


def _session_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(sessions.__path__, prefix="sessions."):
        if info.name.startswith(("sessions.capture.plugin", "sessions.emulator.__main__")):
            continue  # runs inside the SGLang server / as a program, not imported by the engine
        names.append(info.name)
    return names


@pytest.mark.parametrize("module", _session_modules())
def test_no_sessions_module_imports_textual(module, tmp_path):
    code = f"""
import json, sys
try:
    import {module}
    error = None
except ImportError as exc:  # an optional dependency of that module (torch) may be missing here
    error = str(exc)
print(json.dumps({{"textual": any(m == "textual" or m.startswith("textual.") for m in sys.modules),
                  "error": error}}))
"""
    result = _run(code, tmp_path)
    assert result["textual"] is False, f"{module} imports textual"
