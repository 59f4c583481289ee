"""LogFile: tail without indexing, lazy line index, follow with truncation and rotation, filters (sessions/logs.py)."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions.logs import LogFile, LogFilter, clean, tagged_rank


def _write(path: Path, data: str | bytes, mode: str = "a") -> None:
    if isinstance(data, str):
        data = data.encode()
    with open(path, mode + "b") as fh:
        fh.write(data)


def _numbered_lines(n: int, start: int = 1) -> list[str]:
    return [f"[2026-11-01 10:00:{i % 60:02d} TP{i % 4}] line {i} " + "x" * (i % 37) for i in range(start, start + n)]


@pytest.fixture
def big_log(tmp_path):
    path = tmp_path / "server.log"
    lines = _numbered_lines(120_000)
    path.write_text("\n".join(lines) + "\n")
    return path, lines


# --- tail and random access -----------------------------------------------------------------------------


def test_the_tail_is_read_from_the_end_without_indexing_the_file(big_log):
    path, lines = big_log
    with LogFile.open(path) as log:
        tail = log.tail_lines(1000)
        assert [t.text for t in tail] == lines[-1000:]
        assert not log.indexed  # nothing was counted from the start
        assert all(t.number is None for t in tail)  # numbers come with the index
        estimate = log.line_count
        assert abs(estimate - len(lines)) < len(lines) * 0.2  # approximate until indexed
        log.build_index(background=False)
        assert log.indexed and log.line_count == len(lines)
        assert [t.number for t in log.tail_lines(3)] == [len(lines) - 2, len(lines) - 1, len(lines)]


def test_the_background_index_gives_exact_numbers_once_done(big_log):
    path, lines = big_log
    with LogFile.open(path) as log:
        log.build_index()
        deadline = time.monotonic() + 60
        while not log.indexed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert log.indexed
        assert log.line_count == len(lines)


@pytest.mark.parametrize("first, count", [(1, 5), (54_321, 10), (119_998, 10), (120_001, 3)])
def test_any_window_of_lines_is_read_by_number(big_log, first, count):
    path, lines = big_log
    with LogFile.open(path) as log:
        got = log.lines(first, count)
        assert [g.text for g in got] == lines[first - 1: first - 1 + count]
        assert [g.number for g in got] == list(range(first, first + len(got)))
        if got:
            assert log.line(first).text == lines[first - 1]
    assert LogFile(path).line(len(lines) + 1) is None


def test_a_huge_line_is_shown_cut_and_memory_stays_bounded(tmp_path):
    path = tmp_path / "huge.log"
    _write(path, "first\n" + "y" * (50 << 20) + "\nlast\n", "w")
    with LogFile.open(path) as log:
        tail = log.tail_lines(3)
        assert [t.text[:5] for t in tail] == ["first", "yyyyy", "last"]
        assert len(tail[1].raw) < 64 * 1024 and "\u2026" in tail[1].raw
        assert log.line(3).text == "last"
    with LogFile.open(path, follow_from="start") as log:
        got = []
        while True:
            result = log.poll()
            got += result.lines
            if not result.more:
                break
        assert [g.number for g in got] == [1, 2, 3] and len(got[1].raw) < 64 * 1024


# --- display -------------------------------------------------------------------------------------------


def test_the_shown_text_strips_ansi_and_collapses_carriage_returns():
    raw = "\rCapturing batches (bs=8):  50%|#####     | 1/2\r\x1b[32mCapturing batches (bs=4): 100%|##########| 2/2\x1b[0m"
    assert clean(raw) == "Capturing batches (bs=4): 100%|##########| 2/2"
    assert tagged_rank("[2026-11-01 10:00:00 DP1 TP3 EP3] x") == 3
    assert tagged_rank("[2026-11-01 10:00:00] x") is None


# --- following -----------------------------------------------------------------------------------------


def test_poll_returns_new_lines_and_the_bar_being_drawn(tmp_path):
    path = tmp_path / "server.log"
    _write(path, "old 1\nold 2\n", "w")
    with LogFile.open(path) as log:
        assert log.poll().lines == ()
        _write(path, "new 1\n\rLoading: 10%")
        result = log.poll()
        assert [line.text for line in result.lines] == ["new 1"]
        assert result.partial == "Loading: 10%"
        _write(path, "\rLoading: 100%\nnext\n")
        result = log.poll()
        assert [(line.raw, line.text) for line in result.lines] == [
            ("\rLoading: 10%\rLoading: 100%", "Loading: 100%"), ("next", "next")]
        assert result.partial is None
        log.build_index(background=False)
        _write(path, "numbered\n")
        assert log.poll().lines[0].number == 6


def test_truncation_restarts_from_the_top_and_says_so(tmp_path):
    path = tmp_path / "server.log"
    _write(path, "a\nb\nc\n", "w")
    with LogFile.open(path, follow_from="start") as log:
        assert [x.text for x in log.poll().lines] == ["a", "b", "c"]
        _write(path, "z\n", "w")
        result = log.poll()
        assert result.truncated and [(x.number, x.text) for x in result.lines] == [(1, "z")]


def test_a_copytruncate_refilled_past_the_offset_is_still_noticed(tmp_path):
    path = tmp_path / "server.log"
    _write(path, "aaaa\nbbbb\n", "w")
    with LogFile.open(path, follow_from="start") as log:
        log.poll()
        with open(path, "r+b") as fh:  # same inode, new content longer than what was read
            fh.truncate(0)
            fh.write(b"xxxxxxxxxxxxxxxxxxxx\n")
        result = log.poll()
        assert result.truncated and [x.text for x in result.lines] == ["xxxxxxxxxxxxxxxxxxxx"]


def test_rotation_drains_the_old_file_then_reads_the_new_one(tmp_path):
    path = tmp_path / "server.log"
    _write(path, "one\n", "w")
    with LogFile.open(path, follow_from="start") as log:
        assert [x.text for x in log.poll().lines] == ["one"]
        _write(path, "two\nunfinished")
        os.rename(path, tmp_path / "server.log.1")
        _write(path, "fresh 1\nfresh 2\n", "w")
        result = log.poll()
        assert result.rotated and not result.truncated
        assert [(x.number, x.text) for x in result.lines] == [
            (2, "two"), (3, "unfinished"), (1, "fresh 1"), (2, "fresh 2")]


def test_a_log_that_does_not_exist_yet_is_read_from_its_start_once_it_appears(tmp_path):
    path = tmp_path / "later.log"
    with LogFile.open(path) as log:
        assert log.poll().exists is False
        assert log.tail_lines(10) == [] and log.line_count == 0
        _write(path, "hello\nworld\n", "w")
        assert [(x.number, x.text) for x in log.poll().lines] == [(1, "hello"), (2, "world")]


def test_a_large_backlog_comes_in_bounded_polls(tmp_path):
    path = tmp_path / "server.log"
    lines = _numbered_lines(5000)
    _write(path, "\n".join(lines) + "\n", "w")
    with LogFile.open(path, follow_from="start") as log:
        got, polls = [], 0
        while True:
            result = log.poll(max_bytes=16 * 1024)
            polls += 1
            got += result.lines
            if not result.more:
                break
        assert polls > 5
        assert [g.text for g in got] == lines and [g.number for g in got] == list(range(1, 5001))


# --- filters ---------------------------------------------------------------------------------------------

_FILTER_LOG = [
    "[2026-11-01 10:00:01 TP0] Load weight begin. avail mem=80.00 GB",
    "[2026-11-01 10:00:01 TP3] Load weight begin. avail mem=80.00 GB",
    "\rMulti-thread loading shards:  50% Completed | 4/8 [00:04<00:04,  1.00it/s]",
    "[2026-11-01 10:00:09 TP3] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl/sglang/srt/model_loader/loader.py", line 3, in load_model',
    "    raise RuntimeError('shard')",
    "RuntimeError: \x1b[31mshard\x1b[0m broken",
    "[2026-11-01 10:00:09] Received sigquit from a child process. It usually means the child failed.",
    "[2026-11-01 10:00:10 DP1 TP1 EP1] Load weight end. elapsed=9.00 s",
]


@pytest.mark.parametrize(
    "text, rank, start_line, expected",
    [
        ("Load weight", None, 1, [1, 2, 9]),
        ("load WEIGHT", None, 1, [1, 2, 9]),  # case-insensitive
        (r"/TP[13]\b/", None, 1, [2, 4, 9]),
        (r"re:TP[13]\b", None, 1, [2, 4, 9]),  # the README's spelling of a regex
        ("shard broken", None, 1, [7]),  # matched on the shown text, colours stripped
        ("", 3, 1, [2, 4, 5, 6, 7]),  # the traceback belongs to TP3
        ("", 0, 1, [1, 3]),  # tqdm bars are TP0's
        ("end", 1, 1, [9]),
        ("Load weight", None, 2, [2, 9]),
    ],
)
def test_filters_by_substring_regex_and_rank(tmp_path, text, rank, start_line, expected):
    path = tmp_path / "server.log"
    _write(path, "\n".join(_FILTER_LOG) + "\npartial Load weight", "w")
    with LogFile.open(path) as log:
        got = log.iter_filtered(LogFilter.parse(text, rank), start_line=start_line)
        assert [line.number for line in got] == expected


def test_the_substring_filter_agrees_with_a_plain_scan_on_a_big_file(big_log):
    path, lines = big_log
    with LogFile.open(path) as log:
        got = [(x.number, x.text) for x in log.iter_filtered(LogFilter.parse("line 7777"), chunk_bytes=64 * 1024)]
    assert got == [(i, text) for i, text in enumerate(lines, start=1) if "line 7777" in text]
    with LogFile.open(path) as log:
        got = [x.number for x in log.iter_filtered(LogFilter.parse(r"/line 1234\d /"))]
    assert got == [i for i, text in enumerate(lines, start=1) if re.search(r"line 1234\d ", text)]


# --- fuzzing: what poll() returns equals the file's lines -------------------------------------------------

_line_text = st.text(alphabet="ab \r\x1b[m1", max_size=12)
_chunk = st.lists(_line_text, max_size=4).map(lambda xs: "\n".join(xs)) | st.just("\n")
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), _chunk),
        st.tuples(st.just("truncate"), st.just("")),
        st.tuples(st.just("rotate"), _chunk),
    ),
    max_size=14,
)


def _complete(data: bytes) -> list[str]:
    return [_as_raw(x) for x in data.split(b"\n")[:-1]]


def _as_raw(x: bytes) -> str:
    raw = x.decode("utf-8", "replace")
    return raw.rstrip("\r") if raw.endswith("\r") else raw


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, budget=st.sampled_from([7, 64, 1 << 20]))
def test_poll_delivers_exactly_the_lines_of_the_file_through_truncation_and_rotation(tmp_path, ops, budget):
    folder = tmp_path / f"f{time.monotonic_ns()}"
    folder.mkdir()
    path = folder / "server.log"
    path.write_bytes(b"")
    done: list[str] = []  # lines of earlier files (rotated away), since the last truncation
    current = b""
    delivered: list[str] = []
    with LogFile.open(path, follow_from="start") as log:
        for rotation, (op, text) in enumerate(ops):
            data = text.encode()
            expect_truncated = expect_rotated = False
            if op == "append":
                _write(path, data)
                current += data
            elif op == "truncate":
                expect_truncated = bool(current)  # emptying an empty file is not observable
                _write(path, b"", "w")
                if expect_truncated:
                    current, done = b"", []
            else:
                os.rename(path, folder / f"server.log.{rotation}")
                _write(path, data, "w")
                tail = current.split(b"\n")[-1]
                done = done + _complete(current) + ([_as_raw(tail)] if tail else [])
                current = data
                expect_rotated = True
            seen_truncated = seen_rotated = False
            while True:
                result = log.poll(max_bytes=budget)
                seen_truncated |= result.truncated
                seen_rotated |= result.rotated
                if result.truncated:
                    delivered = []
                delivered += [line.raw for line in result.lines]
                if not result.more:
                    break
            assert seen_truncated == expect_truncated
            assert seen_rotated == expect_rotated
            assert delivered == done + _complete(current)


def test_follow_yields_what_a_writer_appends_until_stopped(tmp_path):
    import threading

    path = tmp_path / "server.log"
    _write(path, "before\n", "w")
    lines = _numbered_lines(3000)

    def writer() -> None:
        for i in range(0, len(lines), 100):
            _write(path, "".join(line + "\n" for line in lines[i:i + 100]))
            time.sleep(0.002)

    stop = threading.Event()
    got: list[str] = []
    with LogFile.open(path) as log:
        thread = threading.Thread(target=writer)
        thread.start()
        deadline = time.monotonic() + 60
        for result in log.follow(interval_s=0.01, stop=stop):
            got += [line.text for line in result.lines]
            if len(got) >= len(lines) or time.monotonic() > deadline:
                stop.set()
        thread.join()
    assert got == lines
