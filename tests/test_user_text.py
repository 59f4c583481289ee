"""What a user reads cites nothing outside the repository: hints, `--help` of every command, the TUI's help.

Hints may cite SGLang's own source (file, function) and its issues; they must not cite our research notes
("sglang-facts §1.6", "catalog #3", "DESIGN §3"), which a user of the installed panel cannot open.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import build_parser
from sessions.hints import load_causes

# Citations of documents that are not shipped with the panel.
FOREIGN_CITATION = re.compile(r"sglang-facts|serving-facts|hang-catalog|\bcatalog #|\bDESIGN\b|anchors §|"
                              r"shared/|research/|fixtures/|§")


def test_no_hint_cites_a_document_outside_the_repository() -> None:
    causes = load_causes()
    assert causes
    for cause in causes:
        for text in (cause.title, cause.detail):
            assert not FOREIGN_CITATION.search(text), (cause.id, text)


def _subcommands(parser) -> list[list[str]]:
    found: list[list[str]] = [[]]
    for action in parser._actions:  # argparse has no public walk of subparsers
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):
            for name, sub in choices.items():
                found += [[name, *rest] for rest in _subcommands(sub)]
    return found


@pytest.mark.parametrize("words", _subcommands(build_parser()), ids=lambda w: " ".join(w) or "eagle3-tui")
def test_no_help_text_cites_a_document_outside_the_repository(words: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "app", *words, "--help"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert not FOREIGN_CITATION.search(done.stdout), done.stdout


def test_the_tui_help_screen_cites_no_outside_document() -> None:
    from app.screens import help as help_screen

    source = Path(help_screen.__file__).read_text(encoding="utf-8")
    shown = re.findall(r'"([^"\n]*)"', source)  # the strings the screen renders
    assert shown
    for text in shown:
        assert not FOREIGN_CITATION.search(text), text
