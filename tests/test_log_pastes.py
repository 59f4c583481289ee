"""Logs as people paste them (issue 23): wrappers, excerpts, abridged and cut tracebacks, cut lines, 0.5.1x.

tests/data/sglang-pastes/ holds logs written for this project in the shapes of real pastes, one class of
issue 23 each (the file name starts with it); index.tsv says what each must read as.  Then: every such log
cut at any point reads as a prefix of the whole; and any wrapper put before every line of every real log in
tests/data/sglang-logs/ (and of these pastes) leaves phase, outcome, ranks and serving figures unchanged.
"""
from __future__ import annotations

import csv
import re
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions.hints import hints_for_log
from sessions.logs.lines import strip_wrapper
from sessions.phases import StartupPhase, StartupTracker, summarize_text
from sessions.serving import ServingTracker
from tests._logs_support import SGLANG_LOGS

PASTES = Path(__file__).resolve().parent / "data" / "sglang-pastes"


def _rows() -> list[dict[str, str]]:
    with open(PASTES / "index.tsv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


ROWS = _rows()


def _serving(text: str):
    tracker = ServingTracker()
    tracker.feed_bytes(text.encode("utf-8", "surrogatepass") + b"\n")
    return tracker.snapshot()


def test_the_index_covers_every_paste_and_every_class():
    assert sorted(r["file"] for r in ROWS) == sorted(p.name for p in PASTES.glob("*.log"))
    assert {r["class"] for r in ROWS} == {str(n) for n in range(1, 9)}


@pytest.mark.parametrize("row", ROWS, ids=[r["file"][:44] for r in ROWS])
def test_each_paste_reads_as_its_label(row):
    text = (PASTES / row["file"]).read_text(encoding="utf-8")
    summary = summarize_text(text)
    assert (summary.outcome, str(summary.phase)) == (row["outcome"], row["phase"])
    assert summary.error == (row["error"] or None)
    if row["error"]:
        assert "Traceback (most recent call last)" not in summary.error
        assert summary.error_rank == (int(row["error_rank"]) if row["error_rank"] else None)
        assert summary.error_cause == (row["error_cause"] or None)
        assert text.split("\n")[summary.error_line - 1].endswith(summary.error)
    if row["ranks_loaded"]:
        assert list(summary.ranks_loaded) == [int(r) for r in row["ranks_loaded"].split(",")]
    assert summary.ranks_expected == (int(row["ranks_expected"]) if row["ranks_expected"] else None)
    served = _serving(text)
    for key, name in (("running", "running_reqs"), ("queued", "queue_reqs"), ("gen", "gen_throughput")):
        want = row[key]
        got = getattr(served, name) if served is not None else None
        if want:
            assert got == pytest.approx(float(want)), key
        elif key == "gen":
            assert got is None
    if row["hint"]:
        assert row["hint"] in {h.id for h in hints_for_log(summary, text.split("\n"))}
    # no false "weights at 100 %, no end" story: a log past its weights is never read as loading them
    if "Load weight end" in text:
        assert summary.phase.order >= StartupPhase.WEIGHTS_LOADED.order


def test_a_wrapped_logger_line_is_read_though_it_has_no_sglang_header():
    # the fast pre-filter skipped lines starting with "[20" without "] ": Load weight end was never read
    line = "[2026-03-02 09:14:09,410][model_runner.py:1493][INFO]: Load weight end. elapsed=2.90 s, type=X"
    assert summarize_text(line + "\n").phase is StartupPhase.WEIGHTS_LOADED


@pytest.mark.parametrize("wrapper", [
    "> ", "2026-02-11T06:40:01.112334567Z stdout F ", "2026-02-11T06:40:01.112Z ", "sglang-1  | ",
    "(SGLangEngine pid=4121, ip=10.0.3.17) ", "(pid=77) ", "[2026-03-02 09:14:05,332][model_runner.py:611][INFO]: ",
    "2026-03-02 09:14:05,332 - sglang - INFO - ", "INFO:sglang.srt:", "> 2026-02-11T06:40:01Z stderr F (pid=3) ",
])
def test_each_known_wrapper_is_split_off_before_the_message(wrapper):
    for message in ("[2026-02-11 06:40:05 TP3] Load weight begin. avail mem=78.10 GB", "Load weight end. x"):
        assert strip_wrapper(wrapper + message) == (wrapper, message)


def test_an_unknown_wrapper_is_found_by_sglangs_own_header_and_learned_for_the_lines_without_one():
    lines = ["[2026-11-01 10:00:01 TP1] Load weight begin. avail mem=80.00 GB",
             "[2026-11-01 10:00:09 TP1] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/sgl/python/sglang/srt/model_loader/loader.py", line 3, in load_model',
             "RuntimeError: shard broken"]
    plain = summarize_text("\n".join(lines) + "\n")
    wrapped = summarize_text("\n".join(f"node-7 app[{i}]: {x}" for i, x in enumerate(lines)) + "\n")
    assert (wrapped.phase, wrapped.outcome, wrapped.error, wrapped.error_rank) == (
        plain.phase, plain.outcome, "RuntimeError: shard broken", 1)


# --- cut anywhere ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("row", ROWS, ids=[r["file"][:44] for r in ROWS])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_paste_cut_at_any_point_never_reads_further_than_the_whole(row, data):
    text = (PASTES / row["file"]).read_text(encoding="utf-8")
    cut = data.draw(st.integers(0, len(text)))
    part = summarize_text(text[:cut])
    whole = summarize_text(text)
    assert part.phase.order <= whole.phase.order
    if part.outcome == "crashed":
        assert whole.outcome == "crashed"
    # once the exception line of the whole log's error is printed in full, the cut log has crashed too
    if whole.error is not None and whole.error_line is not None:
        printed = text.split("\n")[: whole.error_line]
        if len("\n".join(printed)) + 1 <= cut:
            assert part.outcome == "crashed", cut


# --- any prefix before every line changes nothing (issue 23's property) ------------------------------------

_WORD = st.text(string.ascii_letters + string.digits + "_.-", min_size=1, max_size=12)
_PREFIXES = st.one_of(
    st.just("> "),
    st.builds(lambda n: f"2026-02-11T06:40:{n % 60:02d}.{n:09d}Z stdout F ", st.integers(0, 10**9 - 1)),
    st.builds(lambda n: f"2026-02-11T06:40:{n % 60:02d}.{n:06d}Z ", st.integers(0, 10**6 - 1)),
    st.builds(lambda w: f"{w}  | ", _WORD.filter(lambda w: w[0].isalnum())),
    st.builds(lambda w, n: f"({w} pid={n}) ", _WORD, st.integers(1, 99999)),
    st.builds(lambda n: f"[2026-03-02 09:14:{n % 60:02d},{n % 1000:03d}][scheduler.py:{n}][INFO]: ",
              st.integers(0, 9999)),
    # an unknown wrapper: words and a separator, with a number that may change from line to line
    st.builds(lambda a, b, sep: (a, b, sep), _WORD.filter(lambda w: w[0].isalpha()), _WORD,
              st.sampled_from([": ", " | ", " - ", "] ", " "])),
)
_LOGS = sorted(SGLANG_LOGS.glob("*.log")) + sorted(PASTES.glob("*.log"))


def _wrap(text: str, prefix, numbered: bool) -> str:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out = []
    for i, line in enumerate(lines):
        if isinstance(prefix, tuple):
            a, b, sep = prefix
            p = f"{a} {b}{i if numbered else ''}{sep}"
        else:
            p = prefix
        out.append(p + line)
    return "\n".join(out) + "\n"


def _figures(text: str) -> tuple:
    s = summarize_text(text)
    served = _serving(text)
    serving = None if served is None else (served.gen_throughput, served.running_reqs, served.queue_reqs,
                                           served.token_usage, served.accept_length)
    return (s.phase, s.outcome, s.ranks_seen, s.ranks_loaded, s.ranks_expected, s.error_rank, serving)


@pytest.mark.parametrize("path", _LOGS, ids=[p.name[:44] for p in _LOGS])
@settings(max_examples=12, deadline=None)
@given(prefix=_PREFIXES, numbered=st.booleans())
def test_any_prefix_before_every_line_leaves_the_reading_unchanged(path, prefix, numbered):
    text = path.read_bytes().decode("utf-8", "replace")
    assert _figures(_wrap(text, prefix, numbered)) == _figures(text)


def test_the_error_text_through_a_wrapper_is_the_exception_not_the_wrapper():
    text = (PASTES / "c3-crash-while-serving-tp2.log").read_text()
    wrapped = summarize_text(_wrap(text, "2026-04-09T18:30:03.000Z stderr F ", False))
    assert re.fullmatch(r"RuntimeError: CUDA error: an illegal memory access was encountered", wrapped.error)


@pytest.mark.parametrize("path", sorted(PASTES.glob("*.log")), ids=lambda p: p.name[:44])
def test_a_header_like_sglangs_before_every_line_leaves_the_error_and_its_cause(path):
    """A timestamper (``ts '[%Y-%m-%d %H:%M:%S]'``) puts a header SGLang's own regex reads before every line,
    traceback frames and exception lines too: the error was the "Traceback" line, or the header line of a
    chain's second traceback, instead of the exception and its root cause."""
    text = path.read_text()
    plain, stamped = summarize_text(text), summarize_text(_wrap(text, "[2026-04-09 18:30:03] ", False))
    assert (stamped.outcome, stamped.phase, stamped.error, stamped.error_cause, stamped.error_rank) == (
        plain.outcome, plain.phase, plain.error, plain.error_cause, plain.error_rank)


def test_feeding_a_wrapped_paste_in_odd_pieces_reads_the_same():
    text = _wrap((PASTES / "c5-chained-traceback-whole-tp1.log").read_text(), ("pod", "x", ": "), True)
    data = text.encode()
    tracker = StartupTracker()
    pos, step = 0, 1
    while pos < len(data):
        tracker.feed_bytes(data[pos: pos + step])
        pos += step
        step = step % 97 + 5
    tracker.flush()
    assert tracker.summary() == summarize_text(text)
