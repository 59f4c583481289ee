"""`eagle3-tui inspect-log FILE [--json]` as a real process: the DESIGN §3 contract, on any input."""
from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.phases import StartupPhase
from tests._logs_support import SGLANG_LOGS, LogBuilder

FIXTURES = SGLANG_LOGS
REPO = Path(__file__).resolve().parents[1]
# the DESIGN §3 contract, plus the serving figures of the log's last stats lines (issue 15)
CONTRACT_KEYS = {"phase", "outcome", "error", "error_line", "ranks_loaded", "ranks_expected", "hints", "serving"}


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, check=False)


_EXIT_OF_OUTCOME = {"ready": 0, "crashed": 3, "incomplete": 4}  # documented in --help and the README


def _inspect(path: Path) -> dict:
    proc = _run("inspect-log", str(path), "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == _EXIT_OF_OUTCOME[out["outcome"]], proc.stderr
    return out


def _labels() -> list[dict[str, str]]:
    with open(FIXTURES / "index.tsv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


@pytest.mark.parametrize("row", _labels(), ids=lambda r: r["file"][:40])
def test_json_output_keeps_the_contract_on_every_fixture(row):
    path = FIXTURES / row["file"]
    out = _inspect(path)
    assert set(out) == CONTRACT_KEYS
    assert out["outcome"] == row["outcome"] and out["phase"] == row["last_phase"]
    assert all(isinstance(r, int) for r in out["ranks_loaded"])
    assert out["ranks_expected"] is None or isinstance(out["ranks_expected"], int)
    assert all(set(h) == {"id", "title", "detail"} for h in out["hints"])
    if row["outcome"] == "crashed" and row["key_line"]:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        # the error is the exception that ended the key line's traceback (or the key line itself)
        assert lines[out["error_line"] - 1].rstrip().endswith(out["error"])
        key_at = next(i for i, line in enumerate(lines, start=1) if line.rstrip() == row["key_line"].rstrip())
        assert out["error_line"] >= key_at
        assert "Traceback (most recent call last)" not in out["error"]
    elif row["outcome"] != "crashed":
        assert out["error"] is None and out["error_line"] is None


def test_without_json_it_prints_a_short_summary_for_people():
    path = FIXTURES / "08-mistral7b-warmup-502-killed.log"
    proc = _run("inspect-log", str(path))
    assert proc.returncode == 3  # crashed
    assert "crashed" in proc.stdout and "warmup" in proc.stdout and "line 11" in proc.stdout
    assert "http-proxy-intercepts-warmup" in proc.stdout


def test_a_missing_file_is_bad_input_with_a_clear_message(tmp_path):
    proc = _run("inspect-log", str(tmp_path / "nope.log"), "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "nope.log" in proc.stderr and "no such file" in proc.stderr
    proc = _run("inspect-log", str(tmp_path))
    assert proc.returncode == 2 and "directory" in proc.stderr


def test_an_empty_file_is_an_incomplete_launch(tmp_path):
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    out = _inspect(path)
    assert (out["phase"], out["outcome"], out["error"], out["ranks_loaded"]) == ("launching", "incomplete", None, [])


def test_binary_junk_is_read_without_crashing(tmp_path):
    path = tmp_path / "junk.log"
    path.write_bytes(random.Random(3).randbytes(300_000))
    assert set(_inspect(path)) == CONTRACT_KEYS
    assert _run("inspect-log", str(path)).returncode in (0, 3, 4)


def test_invalid_utf8_inside_a_real_log_changes_nothing_else(tmp_path):
    built = LogBuilder(tp=4).startup(stop_after=StartupPhase.KV_CACHE).build()
    lines = built.text.encode().split(b"\n")
    lines.insert(3, b"\xff\xfe\xc3 broken \xe2\x82 bytes \x00\x1b[31m")
    path = tmp_path / "server.log"
    path.write_bytes(b"\n".join(lines))
    out = _inspect(path)
    assert out["phase"] == "kv_cache" and out["ranks_loaded"] == [0, 1, 2, 3] and out["ranks_expected"] == 4


def test_one_50_mb_line_is_streamed_and_the_line_numbers_stay_right(tmp_path):
    path = tmp_path / "big-line.log"
    with open(path, "wb") as fh:
        fh.write(b"[2026-11-01 10:00:00 TP0] Load weight begin. avail mem=80.00 GB\n")
        fh.writelines(b"z" * (1 << 20) for _ in range(50))
        fh.write(b"\n[2026-11-01 10:01:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n")
        fh.write(b"RuntimeError: boom\n")
    out = _inspect(path)
    assert out["outcome"] == "crashed" and out["error_line"] == 4
    assert out["error"] == "RuntimeError: boom"  # the exception under "Scheduler hit an exception" (line 3)


def test_serving_figures_come_from_the_end_of_the_log(tmp_path):
    """Any log, not only ours: DP-attention lines of two ranks, the latest of each summed."""
    path = tmp_path / "dp.log"
    lines = []
    for i, (dp, gen) in enumerate([(0, 100.0), (1, 40.0), (0, 110.0)]):
        lines.append(f"[2026-05-01 10:00:0{i} DP{dp} TP{dp * 4}] Decode batch, #running-req: 3, #token: 10, "
                     f"token usage: 0.10, cuda graph: True, gen throughput (token/s): {gen:.2f}, #queue-req: 1")
    path.write_text("\n".join(lines) + "\n")
    serving = _inspect(path)["serving"]
    assert serving["gen_throughput"] == 150.0
    assert (serving["running_reqs"], serving["queue_reqs"]) == (6, 2)
    assert [r["dp_rank"] for r in serving["ranks"]] == [0, 1]
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert _inspect(empty)["serving"] is None


@pytest.mark.parametrize("outcome", ["ready", "crashed", "incomplete"])
def test_the_exit_status_says_the_outcome_with_and_without_json(tmp_path, outcome):
    row = next(r for r in _labels() if r["outcome"] == outcome)
    for args in ((), ("--json",)):
        proc = _run("inspect-log", str(FIXTURES / row["file"]), *args)
        assert proc.returncode == _EXIT_OF_OUTCOME[outcome], (args, proc.stderr)
        assert outcome in proc.stdout  # the report is printed in every outcome


def test_the_exit_statuses_are_in_the_help_and_the_readme():
    text = _run("inspect-log", "--help").stdout
    assert "0 the log reached ready, 3 it crashed, 4 incomplete" in " ".join(text.split())
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "exits by its outcome: 0 ready, 3 crashed, 4 incomplete" in readme
