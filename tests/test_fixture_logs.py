"""Every real SGLang log in fixtures/sglang-logs/ reads as its label in index.tsv says (DESIGN §3).

Labels: outcome and last_phase for every log; for a crashed log with a key_line, the first fatal error is
that line (text and line number).  Ranks are checked against what the log itself shows: the TP numbers
of its `Load weight end` lines (no prefix = rank 0) and the tp_size of its server_args line.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from sessions.phases import StartupTracker, summarize_file
from tests._logs_support import SGLANG_LOGS

FIXTURES = SGLANG_LOGS


def _labels() -> list[dict[str, str]]:
    with open(FIXTURES / "index.tsv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


LABELS = _labels()


def test_the_index_covers_every_log_in_the_folder():
    assert sorted(row["file"] for row in LABELS) == sorted(p.name for p in FIXTURES.glob("*.log"))


@pytest.mark.parametrize("row", LABELS, ids=[row["file"][:40] for row in LABELS])
def test_each_fixture_log_has_its_labelled_outcome_and_phase(row):
    summary = summarize_file(FIXTURES / row["file"])
    assert summary.outcome == row["outcome"]
    assert str(summary.phase) == row["last_phase"]
    if row["outcome"] != "crashed":
        assert summary.error is None and summary.error_line is None


@pytest.mark.parametrize("row", [r for r in LABELS if r["outcome"] == "crashed" and r["key_line"]],
                         ids=lambda r: r["file"][:40])
def test_a_crashed_fixture_names_its_key_line_as_the_first_fatal_error(row):
    path = FIXTURES / row["file"]
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    key = row["key_line"].rstrip()
    expected_line = next(i for i, line in enumerate(lines, start=1) if line.rstrip() == key)
    summary = summarize_file(path)
    first = next(e for e in summary.errors if e.fatal)
    assert (first.text, first.line_no) == (key, expected_line)
    # the summary's error is the exception that ended the traceback under that line, when one was printed
    assert summary.error == (first.detail or key)
    assert lines[summary.error_line - 1].endswith(summary.error)


_LOAD_END = re.compile(r"^\[([^\]]*)\] Load weight end\b")
_TP = re.compile(r"\bTP(\d+)\b")
_TP_SIZE = re.compile(r"server_args=.*?[(,{ ]'?tp_size'?[=:] ?(\d+)")


@pytest.mark.parametrize("row", LABELS, ids=[row["file"][:40] for row in LABELS])
def test_ranks_are_the_ones_the_log_shows(row):
    text = (FIXTURES / row["file"]).read_text(encoding="utf-8", errors="replace")
    prefixes = [m.group(1) for line in text.split("\n") if (m := _LOAD_END.match(line))]
    shown = sorted({int(t.group(1)) if (t := _TP.search(p)) else 0 for p in prefixes})
    tp = next((int(m.group(1)) for line in text.split("\n") if (m := _TP_SIZE.search(line))), None)
    summary = summarize_file(FIXTURES / row["file"])
    assert list(summary.ranks_loaded) == shown
    assert summary.ranks_expected == tp


@pytest.mark.parametrize("row", LABELS, ids=[row["file"][:40] for row in LABELS])
def test_a_fixture_fed_byte_by_byte_in_odd_pieces_reads_the_same(row):
    data = (FIXTURES / row["file"]).read_bytes()
    tracker = StartupTracker()
    step = 1
    pos = 0
    while pos < len(data):
        tracker.feed_bytes(data[pos: pos + step])
        pos += step
        step = step % 977 + 13
    tracker.flush()
    assert tracker.summary() == summarize_file(FIXTURES / row["file"])


# --- the emulator's own logs (a real process per fault, TP4, time scale 0.002) ----------------------------

import json
import os
import signal
import socket
import subprocess
import sys
import time

from sessions.hints import hints_for_log
from sessions.phases import StartupPhase
from tests._hang_support import wait_until_parked

TP = 4
WAIT_S = 90.0  # a generous deadline for a slow CI machine; nothing asserts on time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Emulator:
    """`python -m sessions.emulator` with one fault; stderr is the server log, as in a session dir."""

    def __init__(self, tmp_path: Path, fault: str) -> None:
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 8,
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 1000, "max_position_embeddings": 2048,
        }))
        self.log = tmp_path / "server.log"
        with open(self.log, "wb") as err, open(tmp_path / "access.log", "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sessions.emulator", "--model-path", str(model), "--tp-size", str(TP),
                 "--port", str(_free_port()), "--time-scale", "0.002", "--emulate-fault", fault],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            )

    def wait_for(self, condition) -> object:
        """The log's summary once ``condition(summary)`` holds or the process has exited."""
        deadline = time.monotonic() + WAIT_S
        while True:
            exited = self.proc.poll() is not None
            summary = summarize_file(self.log)
            if condition(summary) or exited or time.monotonic() > deadline:
                return summarize_file(self.log) if exited else summary
            time.sleep(0.1)

    def wait_parked(self, parked_in: dict[int, str], phase: StartupPhase) -> None:
        """Wait until the ranks are blocked where the fault hangs them and nothing can move the log on
        (tests/_hang_support.py); fails at once if the log goes past ``phase``."""
        def moved_on() -> str | None:
            summary = summarize_file(self.log)
            return None if summary.phase == phase else f"phase {summary.phase}\n{self.tail()}"

        wait_until_parked(self.proc, parked_in, moved_on)

    def tail(self, n: int = 15) -> str:
        """The end of the log, for a failure message."""
        return "\n".join(self.log.read_bytes().decode("utf-8", "replace").split("\n")[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # our own process group, by its leader's pid
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)


@pytest.fixture
def emulator(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_TUI_HOME", str(tmp_path / "home"))
    started: list[_Emulator] = []

    def start(fault: str) -> _Emulator:
        emu = _Emulator(tmp_path, fault)
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.stop()


def _hint_ids(path: Path, summary) -> set[str]:
    return {h.id for h in hints_for_log(summary, path.read_bytes().decode("utf-8", "replace").split("\n"))}


@pytest.mark.parametrize("fault", ["none", "slow-weights"])
def test_an_emulated_start_reads_as_ready_through_every_phase(emulator, fault):
    emu = emulator(fault)
    summary = emu.wait_for(lambda s: s.outcome != "incomplete")
    assert summary.outcome == "ready" and summary.phase == StartupPhase.READY, emu.tail()
    assert [e.phase for e in summary.events] == list(StartupPhase)[1:]
    assert summary.ranks_loaded == tuple(range(TP)) and summary.ranks_expected == TP
    for marker in ("init_parallel_end", "load_weight_end", "kv_cache_allocated", "cuda_graph_end"):
        assert summary.rank_arrival[marker] == tuple(range(TP))


def test_an_emulated_hang_after_weights_stays_in_weights_loaded(emulator):
    emu = emulator("hang-after-weights")
    summary = emu.wait_for(lambda s: len(s.ranks_loaded) == TP)
    assert summary.ranks_loaded == tuple(range(TP))
    # It must not move on: once every rank blocks in init_memory_pool's collective and the main process
    # has read their arrivals, nothing can write another line.
    emu.wait_parked({r: "init_memory_pool" for r in range(TP)}, StartupPhase.WEIGHTS_LOADED)
    summary = summarize_file(emu.log)
    assert (summary.phase, summary.outcome) == (StartupPhase.WEIGHTS_LOADED, "incomplete")
    assert "port-closed-until-graphs-done" in _hint_ids(emu.log, summary)


def test_an_emulated_missing_rank_shows_in_the_arrival_and_the_hint(emulator):
    from sessions.emulator.faults import Fault, failing_rank

    missing = failing_rank(Fault.RANK_MISSING, TP)
    emu = emulator("rank-missing")
    emu.wait_for(lambda s: len(s.ranks_loaded) == TP - 1)
    # The missing rank is stuck reading a shard, the others wait for it in the collective: final.
    emu.wait_parked({r: "block_forever" if r == missing else "init_memory_pool" for r in range(TP)},
                    StartupPhase.WEIGHTS_LOADED)
    summary = summarize_file(emu.log)
    assert summary.phase == StartupPhase.WEIGHTS_LOADED and summary.outcome == "incomplete"
    assert summary.ranks_loaded == tuple(r for r in range(TP) if r != missing)
    hint = next(h for h in hints_for_log(summary, []) if h.id == "ranks-missing-load-weight-end")
    assert f"TP{missing}" in hint.title


def test_an_emulated_hang_in_graph_capture_shows_the_batch_it_stopped_at(emulator):
    emu = emulator("hang-in-graph-capture")
    emu.wait_for(lambda s: s.progress is not None and s.progress.label == "cuda graph bs"
                 and s.progress.done >= 2)
    # Two batch sizes done means every rank passed their collectives: parked now is parked in the third.
    emu.wait_parked({r: "capture_one_batch_size" for r in range(TP)}, StartupPhase.CUDA_GRAPH)
    summary = summarize_file(emu.log)
    assert (summary.phase, summary.outcome) == (StartupPhase.CUDA_GRAPH, "incomplete")
    assert summary.progress.label == "cuda graph bs" and summary.progress.done == 2  # the third batch size
    assert summary.progress.total and summary.progress.total > 2


P = StartupPhase


@pytest.mark.parametrize(
    "fault, phases, kind, hint",
    [
        ("oom-kv-cache", {P.KV_CACHE}, "scheduler_exception", "negative-kv-budget"),
        ("address-in-use", {P.WARMUP}, "address_in_use", "address-in-use"),
        # the other ranks may or may not finish their weights before the tree is killed
        ("scheduler-exception", {P.LOADING_WEIGHTS, P.WEIGHTS_LOADED}, "scheduler_exception", None),
        ("crash-while-serving", {P.READY}, "scheduler_exception", None),
    ],
)
def test_an_emulated_crash_reads_as_crashed_at_its_first_error(emulator, fault, phases, kind, hint):
    from sessions.emulator.faults import Fault, failing_rank

    emu = emulator(fault)
    summary = emu.wait_for(lambda s: False)  # until SGLang's crash path has killed the whole tree
    assert emu.proc.poll() is not None, emu.tail()
    assert summary.outcome == "crashed", emu.tail()
    assert summary.phase in phases
    first = next(e for e in summary.errors if e.fatal)
    assert first.kind == kind and summary.error_line == first.exception_line
    assert summary.error == first.exception and "Traceback (most recent call last)" not in summary.error
    rank = failing_rank(Fault(fault), TP)
    if rank is not None:
        assert first.rank == rank
    lines = emu.log.read_bytes().decode("utf-8", "replace").split("\n")
    assert summary.error in lines[summary.error_line - 1]  # the line itself, or its piece after a bar
    if hint is not None:
        assert hint in _hint_ids(emu.log, summary)
