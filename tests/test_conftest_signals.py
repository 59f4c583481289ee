"""A test run started with SIGHUP and SIGINT ignored (``nohup``, a script's background job) still starts the
processes of its tests with those signals at their defaults, so the signal tests of the CLI mean what they
say (tests/conftest.py's ``pytest_configure``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

CHILD_TEST = '''
import signal
import subprocess
import sys


def test_a_started_process_has_the_default_signals():
    probe = ("import signal; print(signal.getsignal(signal.SIGHUP) == signal.SIG_DFL, "
             "signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"], out


def test_the_run_itself_still_ignores_them():
    assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, None)
'''

# What nohup and a non-interactive shell's `&` do, then the run, in the same process (exec keeps SIG_IGN).
LAUNCHER = (
    "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
    "signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
)


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["plain", "xdist"])
def test_a_run_started_with_signals_ignored_gives_its_tests_default_signals(tmp_path: Path, workers) -> None:
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    result = subprocess.run(
        [sys.executable, "-c", LAUNCHER, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), *workers, str(tmp_path / "test_child.py")],
        check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
