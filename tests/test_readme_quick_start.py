"""The README's quick start works where the system Python is externally managed (PEP 668, issue 21).

A bare `python3 -m pip install` is refused there ("externally-managed-environment"), so both commands must
make and use a virtual environment, and `.ci/run` must run the same test command (with its venv in
`.venv-ci`).  The commands themselves were run on Debian's /usr/bin/python3, which has the marker (pip
never checks it inside a venv, so a marked venv cannot stand in); the transcript is in the closing note.
Here: the commands' shape, which never reaches for the system's pip.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


def test_both_quick_start_commands_make_and_use_a_venv_and_ci_runs_the_same_test_command() -> None:
    app, tests = _quick_start()
    for command in (app, tests):
        steps = [s.strip() for s in command.split("&&")]
        assert steps[0] == "python3 -m venv .venv", command
        assert all(s.startswith(".venv/bin/") for s in steps[1:]), command  # never the system's pip
    assert app.endswith(".venv/bin/eagle3-tui --demo")
    assert tests.endswith(".venv/bin/python -m pytest -n 2 -q")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ran = [line for line in ci.splitlines() if not line.startswith("#") and "pytest" in line]
    assert ran == [tests.replace(".venv", "$venv")], ran
    assert re.search(r"^venv=\.venv-ci$", ci, re.MULTILINE)
