"""`bench compare --rounds N`: medians with their min-max range, paired speedups, "within noise", the
workload shown, the launch plan (each side once when the GPUs allow, else A B, B A, ...), the bench screen's
tables reachable at 80x24, and every "--force" advice in the tree pointing at a command that has it."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from sessions.bench.ab_report import compare_results, compare_rows, workload_text
from sessions.bench.compare import schedule

REPO = Path(__file__).resolve().parent.parent


def _result(throughputs: dict[int, float], itl: float = 10.0, accept: float | None = None) -> dict:
    runs = [{"max_concurrency": c, "output_throughput": t, "input_throughput": 2 * t, "request_throughput": 1.0,
             "median_ttft_ms": 30.0, "p99_ttft_ms": 40.0, "median_tpot_ms": itl, "median_itl_ms": itl,
             "p99_itl_ms": 2 * itl, "median_e2e_latency_ms": 900.0, "accept_length": accept, "accept_rate": None,
             "completed": 4, "failed": 0, "num_prompts": 4, "input_lens": [8, 20, 61], "output_lens": [12, 32, 32]}
            for c, t in throughputs.items()]
    return {"runs": runs, "profile": "p", "speculative": {"num_draft_tokens": 4} if accept else None,
            "request": {"input_len": None, "output_len": 32, "num_prompts": None, "concurrency": list(throughputs),
                        "seed": 1, "dataset": "bench_prompts.jsonl", "flush_cache": True,
                        "dataset_kind": "sharegpt", "dataset_prompts": 52}}


def test_each_figure_is_the_median_with_its_range_and_the_speedup_is_paired_per_round():
    # a machine that slows down in round 2 for both sides: the paired ratio stays put
    a = [_result({1: 80.0}), _result({1: 40.0}), _result({1: 82.0})]
    b = [_result({1: 120.0}, accept=2.9), _result({1: 62.0}, accept=3.1), _result({1: 121.0}, accept=3.0)]
    report = compare_results(a, b)
    run = report["runs"][0]
    assert run["rounds"] == 3 and report["rounds"] == 3
    assert run["a"]["output_throughput"] == 80.0 and run["a"]["spread"]["output_throughput"]["min"] == 40.0
    assert run["b"]["accept_length"] == 3.0
    ratios = sorted([120 / 80, 62 / 40, 121 / 82])
    assert run["speedup_spread"]["values"] == pytest.approx([120 / 80, 62 / 40, 121 / 82])
    assert (run["speedup_spread"]["min"], run["speedup"], run["speedup_spread"]["max"]) == pytest.approx(ratios)
    assert run["within_noise"] is False
    assert report["verdict"].startswith(f"B is {ratios[1]:.2f}× A at concurrency 1 ({ratios[0]:.2f}–"
                                        f"{ratios[2]:.2f} over 3 rounds): the drafter speeds decoding up")
    cells = compare_rows(report, times="x")[0]
    assert cells[1] == "80.0 40.0–82.0" and cells[3] == f"{ratios[1]:.2f}x {ratios[0]:.2f}–{ratios[2]:.2f}"
    assert cells[-1] == "B faster"


def test_the_verdict_says_within_noise_when_the_speedup_range_contains_one():
    a = [_result({1: 80.0, 4: 200.0}), _result({1: 84.0, 4: 210.0}), _result({1: 81.0, 4: 190.0})]
    b = [_result({1: 82.0, 4: 260.0}), _result({1: 80.0, 4: 270.0}), _result({1: 83.0, 4: 250.0})]
    report = compare_results(a, b)
    low, high = report["runs"]
    assert low["within_noise"] and not high["within_noise"]
    assert "at concurrency 1 (0.95–1.02 over 3 rounds): within noise" in report["verdict"]
    assert "at concurrency 4: 1.30× (1.29–1.32 over 3 rounds)." in report["verdict"]
    assert [row[-1] for row in compare_rows(report)] == ["noise", "B faster"]


def test_one_round_has_no_spread_and_says_so():
    report = compare_results(_result({1: 80.0}), _result({1: 80.5}))
    assert report["runs"][0]["within_noise"] is False  # no range to contain anything
    assert report["verdict"].endswith("; one round, so no spread (use --rounds 3 or more).")
    assert compare_rows(report)[0][1] == "80.0"  # a single value has no range


def test_the_workload_is_named():
    report = compare_results([_result({1: 80.0})] * 2, [_result({1: 90.0})] * 2)
    report.update(rounds=2, order="A B A B", workload=dict(_result({1: 1})["request"], input_lens=[8, 20, 61],
                                                             output_lens=[12, 32, 32]))
    text = workload_text(report)
    assert text.startswith("workload: 52 prompts from bench_prompts.jsonl (sharegpt), output ≤ 32 tokens, seed 1, "
                           "concurrency 1; prompts per run: max(4, 2 x concurrency); input 8–61 tokens (median "
                           "20), output 12–32 (median 32); 2 rounds (A B A B)")


def test_launches_are_as_few_as_the_gpus_allow():
    assert schedule(3, "together") == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    order = schedule(3, "in turn")
    assert [side for _, side in order] == [0, 1, 1, 0, 0, 1]
    launches = 1 + sum(1 for x, y in itertools.pairwise(order) if x[1] != y[1])
    assert launches == 4  # N + 1, not 2N
    assert [r for r, _ in order] == [0, 0, 1, 1, 2, 2]  # every round has both sides


def test_launch_mode_follows_the_profiles_gpus(make_emulator_profile):
    from sessions.bench.compare import _Side, launch_mode

    zero = make_emulator_profile("zero", tp=1)
    one = make_emulator_profile("one", tp=1, extra_args=["--base-gpu-id", "1"])
    both = make_emulator_profile("both", tp=2)
    assert launch_mode(_Side("zero", zero), _Side("one", one)) == "together"
    assert launch_mode(_Side("zero", zero), _Side("both", both)) == "in turn"
    assert launch_mode(_Side("x", None, session=object()), _Side("y", None, session=object())) == "running"


# -- every "--force" advice names a command that has --force -----------------------------------------------

def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    pieces = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = []
    for node in ast.walk(tree):
        if id(node) in pieces:
            continue  # a part of an f-string: checked as the whole string
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        else:
            continue
        out.append((node.lineno, text))
    return out


def _commands_with_force() -> set[str]:
    """Every CLI command path ("launch", "profile new", ...) whose parser accepts --force."""
    import argparse

    from app.cli import build_parser

    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if "--force" in action.option_strings:
                found.add(" ".join(path))
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))

    walk(build_parser(), ())
    return found


def test_every_force_hint_in_the_tree_points_at_a_command_that_has_force():
    commands = _commands_with_force()
    assert {"launch", "bench", "profile new", "demo-model"} <= commands, commands
    problems = []
    for root in ("sessions", "app", "widgets"):
        for path in sorted((REPO / root).rglob("*.py")):
            for line, text in _strings(ast.parse(path.read_text())):
                if "--force" not in text or text.strip() == "--force":
                    continue
                if "help=" in path.read_text().splitlines()[line - 1] or text.startswith(("with 'compare'", "launch even")):
                    continue  # the flag's own help text
                named = re.findall(r"eagle3-tui ([a-z][a-z-]*(?: [a-z][a-z-]*)?)[^\n]*?--force", text)
                if not named:
                    problems.append(f"{path.relative_to(REPO)}:{line}: {text!r} names no command")
                    continue
                for words in named:
                    command = next((c for c in (words, words.split()[0]) if c in commands), None)
                    if command is None:
                        problems.append(f"{path.relative_to(REPO)}:{line}: 'eagle3-tui {words}' has no --force")
    assert problems == []


def test_busy_gpus_advice_names_the_sessions_to_stop_and_the_commands_own_retry():
    from sessions.gpus import BusyGpu, GpuHolder, format_busy

    busy = [BusyGpu(0, 70 << 30, 80 << 30, (GpuHolder(123, "session tiny-llama-20260101-1", 70 << 30),))]
    text = format_busy("tiny-llama-eagle3", busy, retry="run the compare with --force (eagle3-tui bench compare "
                                                        "a b --force)")
    assert "eagle3-tui stop tiny-llama-20260101-1" in text and "eagle3-tui bench compare a b --force" in text
    assert "eagle3-tui launch tiny-llama-eagle3 --force" in format_busy("tiny-llama-eagle3", busy)


# -- the bench screen at 80x24 -----------------------------------------------------------------------------

def test_the_compare_tables_scroll_into_view_at_80x24(home):
    from textual.widgets import DataTable

    from app.screens.bench import BenchScreen
    from app.tui import Eagle3App
    from tests._tui_support import first_poll, run, screen_text, wait_until

    a = [_result({1: 80.0, 8: 400.0, 32: 900.0}), _result({1: 79.0, 8: 410.0, 32: 880.0})] * 2
    b = [_result({1: 110.0, 8: 430.0, 32: 860.0}, accept=3.0), _result({1: 112.0, 8: 420.0, 32: 870.0}, accept=3.1)] * 2
    report = compare_results(a[:3], b[:3])
    report.update(rounds=3, order="A B A B A B", saved_to=str(home.state_root / "bench" / "compare-x.json"),
                  workload=dict(_result({1: 1})["request"], concurrency=[1, 8, 32]))

    async def scenario() -> None:
        app = Eagle3App(home, refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            screen = BenchScreen(home)
            await app.push_screen(screen)
            screen.running = True
            screen._compared(report)
            await pilot.pause()
            pane = screen.query_one("#run-pane")
            for _ in range(4):  # tab, as a user would, until the top pane has the focus
                if app.focused is pane:
                    break
                await pilot.press("tab")
            assert app.focused is pane
            seen = screen_text(app)
            for _ in range(30):
                await pilot.press("down")
                seen += screen_text(app)
            await wait_until(pilot, lambda: pane.scroll_y >= pane.max_scroll_y, "the pane scrolls to its end", 10)
            seen += screen_text(app)
            for _ in range(300):  # a column per key, as far as the table is wide
                if pane.scroll_x >= pane.max_scroll_x:
                    break
                await pilot.press("right")
                seen += screen_text(app)
            assert pane.max_scroll_x > 0 and pane.scroll_x >= pane.max_scroll_x
            assert "workload: 52 prompts" in seen and "within noise" not in report["verdict"]
            for row in compare_rows(report):
                assert row[0] in seen and row[3].split()[0] in seen
            assert "B slower" in seen and "B faster" in seen, f"the verdict column is out of reach:\n{seen}"
            assert screen.query_one("#compare", DataTable).row_count == 3

    run(scenario)


# -- --dataset ---------------------------------------------------------------------------------------------

def test_a_dataset_gives_real_prompts_capped_and_seeded_and_names_its_bad_lines(tmp_path):
    import json

    from sessions.bench.prompts import DEMO_PROMPTS, dataset_prompts

    path = tmp_path / "chats.jsonl"
    lines = [json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": f"question {i}"},
                                      {"role": "assistant", "content": "word " * (5 * i)}]}) for i in range(1, 7)]
    lines += ['{"messages": [{"role": "assistant", "content": "no question"}]}', "not json", ""]
    path.write_text("\n".join(lines) + "\n")
    found = dataset_prompts(str(path), 4, 16, seed=3)
    assert found.usable == 6 and found.kind == "openai" and len(found.prompts) == 4
    # the dataset reader's own words: line, column and file (sessions.extraction.datasets)
    assert found.problems == ("line 7: no user turn with text",
                              f"line 8: not JSON: Expecting value at line 8, column 1 of {path}")
    by_text = {p.text: p.output_len for p in dataset_prompts(str(path), 6, 16, seed=3).prompts}
    # the reply's bytes / 4, capped at 16
    assert by_text == {f"question {i}": min(16, -(-len("word " * (5 * i)) // 4)) for i in range(1, 7)}
    assert sorted(by_text.values()) == [7, 13, 16, 16, 16, 16]
    assert [p.text for p in found.prompts] == [p.text for p in dataset_prompts(str(path), 4, 16, seed=3).prompts]
    assert [p.text for p in found.prompts] != [p.text for p in dataset_prompts(str(path), 4, 16, seed=4).prompts]
    demo = dataset_prompts(str(DEMO_PROMPTS), 100, 32, seed=1)
    assert demo.usable == 52 and demo.kind == "sharegpt" and demo.problems == ()
    assert len({p.text for p in demo.prompts}) == 52 and all(p.text and " " in p.text for p in demo.prompts)


def test_a_bad_dataset_is_refused_by_name_before_anything_runs(tmp_path, cli_env):
    import subprocess
    import sys

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversations": "not a list"}\n')
    for path, words in ((bad, "no usable prompt (line 1:"), (tmp_path / "missing.jsonl", "No such file")):
        out = subprocess.run([sys.executable, "-m", "app", "bench", "compare", "a", "b", "--dataset", str(path)],
                             env=cli_env, capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 2 and f"--dataset {path}" in out.stderr and words in out.stderr, out.stderr
