"""What the TUI loads from the extraction package never pulls torch or transformers (checked in a fresh
interpreter), and `extract --help` stays an argparse-only import."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_jobs_screen_and_job_control_import_no_torch(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "import app.screens.jobs, app.cli_extract\n"
        "import sessions.extraction.job, sessions.extraction.progress, sessions.extraction.spec\n"
        "from sessions.extraction.progress import list_jobs\n"
        "from sessions.home import resolve_home\n"
        "list_jobs(resolve_home())\n"
        "print(json.dumps({m: m in sys.modules for m in ('torch', 'transformers', 'sglang')}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False,
                            env={"PYTHONPATH": str(REPO_ROOT), "EAGLE3_TUI_HOME": str(tmp_path / "home"),
                                 "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"torch": False, "transformers": False, "sglang": False}
