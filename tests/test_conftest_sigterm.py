"""A pytest run ended by SIGTERM still tears down its fixtures: the emulator a test launched is killed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests._extract_support import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent

CHILD_TEST = '''
import time
from pathlib import Path

def test_hold(launched, make_emulator_profile):
    session = launched.launch(make_emulator_profile("held", tp=1, fault="hang-after-weights"))
    launched.remember(session)
    Path({pid_file!r}).write_text(str(session.state_record["pid"]))
    while True:
        time.sleep(0.1)
'''


def test_sigterm_to_pytest_runs_launched_teardown(tmp_path: Path) -> None:
    child_dir = tmp_path / "child"
    child_dir.mkdir()
    pid_file = tmp_path / "server.pid"
    (child_dir / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (child_dir / "test_hold.py").write_text(CHILD_TEST.format(pid_file=str(pid_file)))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(child_dir),
         str(child_dir / "test_hold.py")], cwd=child_dir, env=env)
    server = None
    try:
        wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip() != "", "the server pid", 60,
                 interval_s=0.1)
        server = psutil.Process(int(pid_file.read_text()))
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
        wait_for(lambda: not server.is_running() or server.status() == psutil.STATUS_ZOMBIE,
                 "the server gone after SIGTERM to pytest", 15, interval_s=0.1)
    finally:
        if child.poll() is None:
            child.kill()
        if server is not None and server.is_running():
            server.kill()
