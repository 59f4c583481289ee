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
CONTRACT_KEYS = {"phase", "outcome", "error", "error_line", "ranks_loaded", "ranks_expected", "hints"}


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, check=False)


def _inspect(path: Path) -> dict:
    proc = _run("inspect-log", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


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
        assert out["error"] == row["key_line"].rstrip()
        assert lines[out["error_line"] - 1].rstrip() == row["key_line"].rstrip()
    elif row["outcome"] != "crashed":
        assert out["error"] is None and out["error_line"] is None


def test_without_json_it_prints_a_short_summary_for_people():
    path = FIXTURES / "08-mistral7b-warmup-502-killed.log"
    proc = _run("inspect-log", str(path))
    assert proc.returncode == 0
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
    assert _run("inspect-log", str(path)).returncode == 0


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
    assert out["outcome"] == "crashed" and out["error_line"] == 3
    assert out["error"].startswith("[2026-11-01 10:01:00 TP0] Scheduler hit an exception")
