"""The options several commands share are one option each (app/cli_options.py): every `--grace` waits the one
stop grace by default and says so in its help, every `--json` is a plain switch."""
from __future__ import annotations

import argparse

from app.cli import build_parser
from app.cli_options import STOP_GRACE_S


def _commands(parser: argparse.ArgumentParser, path: str = "eagle3-tui"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def test_every_grace_and_json_option_is_the_shared_one():
    graces, jsons = [], []
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if "--grace" in action.option_strings:
                graces.append(path)
                assert action.default == STOP_GRACE_S and f"({STOP_GRACE_S:g})" in (action.help or ""), path
            if "--json" in action.option_strings:
                jsons.append(path)
                assert isinstance(action, argparse._StoreTrueAction) and action.default is False, path
    assert {"eagle3-tui stop", "eagle3-tui restart", "eagle3-tui nodes"} <= set(graces)
    assert {"eagle3-tui status", "eagle3-tui hosts", "eagle3-tui nodes"} <= set(jsons)
