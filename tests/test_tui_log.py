"""The log pane: the feed that reads the file in a thread, and the LogView that draws a window of it."""

from __future__ import annotations

import asyncio
import os

from textual.app import App, ComposeResult

from app.feed import LogFeed
from sessions.logs import MAIN_RANK, LogFilter, tagged_rank
from widgets.log_view import LogView

LINE = "[2026-11-01 10:00:{s:02d} TP{r}] Load weight begin. avail mem=138.42 GB"


def _write(path, lines, mode="a"):
    with open(path, mode) as fh:
        fh.write("".join(line + "\n" for line in lines))


def test_feed_reads_new_lines_only_and_keeps_a_partial_line_for_later(tmp_path):
    path = tmp_path / "server.log"
    _write(path, ["one", "two"])
    feed = LogFeed(path)
    chunk = feed.poll(None)
    assert chunk.total_lines == 2 and chunk.lines == ((0, "one"), (1, "two"))
    with open(path, "a") as fh:
        fh.write("three\nfou")
    chunk = feed.poll(None)
    assert chunk.total_lines == 3 and chunk.lines == ((2, "three"),)
    with open(path, "a") as fh:
        fh.write("r\n")
    assert feed.poll(None).lines == ((3, "four"),)
    assert feed.read([0, 3, 99]) == {0: "one", 3: "four"}
    feed.close()


def test_feed_collapses_tqdm_bars_strips_ansi_and_redacts_secrets(tmp_path):
    path = tmp_path / "server.log"
    with open(path, "w") as fh:
        fh.write(
            "\rMulti-thread loading shards:  10% Completed | 1/10\rMulti-thread loading shards: 100%"
            " Completed | 10/10\n"
        )
        fh.write("\x1b[1;33mWARNING deprecated\x1b[0m\n")
        fh.write("token is hf_abcdefghijklmnopqrstuvwxyz1234 and sekrit-value-123\n")
    feed = LogFeed(path, known_secrets=["sekrit-value-123"])
    lines = dict(feed.poll(None).lines)
    assert lines[0].endswith("10/10") and "\r" not in lines[0]
    assert lines[1] == "WARNING deprecated"
    assert "hf_abc" not in lines[2] and "sekrit" not in lines[2] and "***" in lines[2]
    feed.close()


def test_feed_starts_over_after_truncation_or_rotation(tmp_path):
    path = tmp_path / "server.log"
    _write(path, ["a", "b", "c"])
    feed = LogFeed(path)
    first = feed.poll(None)
    _write(path, ["x"], mode="w")  # truncated and rewritten
    second = feed.poll(None)
    assert second.file_id != first.file_id and second.lines == ((0, "x"),)
    os.rename(path, tmp_path / "server.log.1")  # rotated
    _write(path, ["new one", "new two"])
    third = feed.poll(None)
    assert third.file_id != second.file_id and third.total_lines == 2
    feed.close()


def test_filter_by_text_regex_and_rank(tmp_path):
    path = tmp_path / "server.log"
    lines = [LINE.format(s=i, r=i % 4) for i in range(8)] + ["uvicorn INFO: Started server process [12]"]
    _write(path, lines)
    feed = LogFeed(path)
    feed.poll(None)  # a scan covers the lines the view has been given
    rank2 = LogFilter.parse("", rank=2)
    assert feed.scan(rank2, lambda: False) == ([2, 6], 9)
    assert feed.scan(LogFilter.parse("/TP[13]\\]/"), lambda: False)[0] == [1, 3, 5, 7]
    assert feed.scan(LogFilter.parse("", rank=MAIN_RANK), lambda: False)[0] == [8]
    assert feed.scan(LogFilter.parse("STARTED"), lambda: False)[0] == [8]  # case-insensitive text
    # after a scan, polls report only the matches among new lines
    _write(path, [LINE.format(s=9, r=2), LINE.format(s=10, r=3)])
    chunk = feed.poll(rank2)
    assert chunk.matches == (9,)
    assert tagged_rank(lines[3]) == 3 and tagged_rank(lines[8]) is None
    feed.close()


def test_a_bad_regex_is_an_error_naming_the_filter():
    try:
        LogFilter.parse("/[unclosed/")
    except ValueError as exc:
        assert "[unclosed" in str(exc) and "regular expression" in str(exc)
    else:
        raise AssertionError("a bad regex must be refused")


class _LogApp(App):
    def compose(self) -> ComposeResult:
        yield LogView(id="log")


def _feed_into(view: LogView, feed: LogFeed, log_filter=None) -> None:
    view.apply_chunk(feed.poll(log_filter))


def test_follow_pauses_on_scroll_up_counts_pending_lines_and_resumes_at_the_end(tmp_path):
    path = tmp_path / "server.log"
    _write(path, [f"line {i}" for i in range(100)])
    feed = LogFeed(path)

    async def scenario() -> None:
        app = _LogApp()
        async with app.run_test(size=(60, 12)) as pilot:
            view = app.query_one(LogView)
            view.show_file(str(path))
            _feed_into(view, feed)
            view.focus()
            await pilot.pause()
            assert view.follow
            assert "line 99" in _visible(view)
            await pilot.press("up", "up", "up")
            assert not view.follow and view.pending == 0
            _write(path, [f"more {i}" for i in range(7)])
            _feed_into(view, feed)
            await pilot.pause()
            assert view.pending == 7
            assert "more 6" not in _visible(view)  # paused: the window did not move
            await pilot.press("end")
            await pilot.pause()
            assert view.follow and view.pending == 0
            assert "more 6" in _visible(view)
            # scrolling back down to the end follows again, without `end`
            await pilot.press("pageup")
            assert not view.follow
            await pilot.press("pagedown", "pagedown")
            assert view.follow

    asyncio.run(scenario())
    feed.close()


def test_the_view_renders_only_its_window_and_asks_for_missing_lines(tmp_path):
    path = tmp_path / "server.log"
    _write(path, [f"line {i}" for i in range(5000)])
    feed = LogFeed(path)
    asked: list[tuple[int, ...]] = []

    async def scenario() -> None:
        app = _LogApp()
        async with app.run_test(
            size=(60, 12),
            message_hook=lambda m: asked.append(m.line_numbers) if isinstance(m, LogView.NeedLines) else None,
        ) as pilot:
            view = app.query_one(LogView)
            view.show_file(str(path))
            _feed_into(view, feed)  # the poll brings only the tail
            view.focus()
            await pilot.press("home")
            await pilot.pause()
            assert asked and min(asked[-1]) == 0 and len(asked[-1]) <= 12
            view.add_lines(str(path), feed.read(asked[-1]))
            await pilot.pause()
            assert "line 0" in _visible(view)

    asyncio.run(scenario())
    feed.close()


def test_wrap_and_timestamps_change_what_is_drawn(tmp_path):
    path = tmp_path / "server.log"
    long_line = "[2026-11-01 10:00:05 TP3] " + "x" * 150
    _write(path, [long_line, "[2026-11-01 10:00:06] Traceback (most recent call last):"])
    feed = LogFeed(path)

    async def scenario() -> None:
        app = _LogApp()
        async with app.run_test(size=(60, 12)) as pilot:
            view = app.query_one(LogView)
            view.show_file(str(path))
            _feed_into(view, feed)
            await pilot.pause()
            rows = _visible(view).splitlines()
            assert any("2026-11-01 10:00:05 TP3" in r for r in rows)
            assert any(r.startswith("! ") and "Traceback" in r for r in rows)  # error lines are marked
            view.show_timestamps = False
            await pilot.pause()
            assert "[TP3] xxx" in _visible(view) and "2026-11-01" not in _visible(view)
            assert len(_visible(view).splitlines()) == 2
            view.wrap = True
            await pilot.pause()
            assert len(_visible(view).splitlines()) >= 4  # the long line now takes 3 rows

    asyncio.run(scenario())
    feed.close()


def _visible(view: LogView) -> str:
    return view.visible_text()


def test_log_redaction_keeps_token_counts_and_hides_secrets():
    from sessions.redaction import redact_text as redact_log_line  # what LogFeed shows each line through

    counts = "[2026-11-01 10:00:05 TP0] max_total_num_tokens=861234, max_prefill_tokens=16384, #new-token: 7"
    assert redact_log_line(counts) == counts
    dump = "server_args=ServerArgs(api_key='abc123', tokenizer_path='/m', admin_api_key=\"x y\")"
    shown = redact_log_line(dump)
    assert "abc123" not in shown and "x y" not in shown and "tokenizer_path='/m'" in shown
    assert "hunter22" not in redact_log_line("password: hunter22")
    assert "abcdefghijkl" not in redact_log_line("Authorization: Bearer abcdefghijkl")
    assert "hf_abcdefghijklmnopqrstuvwxyz012" not in redact_log_line("got hf_abcdefghijklmnopqrstuvwxyz012")
    assert redact_log_line("value s3cr3tval here", ["s3cr3tval"]) == "value *** here"


def test_a_bar_interrupted_by_another_rank_shows_the_log_line(tmp_path):
    path = tmp_path / "server.log"
    path.write_text(
        "\rMulti-thread loading shards:   0% Completed | 0/64 [00:00<?, ?it/s]"
        "[2026-11-30 05:12:06 TP7] Init parallel ends. elapsed=1.31 s\n"
    )
    feed = LogFeed(path)
    assert feed.poll(None).lines == ((0, "[2026-11-30 05:12:06 TP7] Init parallel ends. elapsed=1.31 s"),)
    feed.close()


def test_rank_filter_keeps_a_traceback_with_the_rank_that_printed_it(tmp_path):
    # the log core's rank rule: untagged continuation lines belong to the rank before them.
    path = tmp_path / "server.log"
    lines = [
        "[2026-11-01 10:00:01 TP1] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sglang/srt/managers/scheduler.py", line 2912, in run_scheduler_process',
        "    scheduler.event_loop_overlap()",
        "torch.OutOfMemoryError: CUDA out of memory.",
        "[2026-11-01 10:00:02 TP2] Load weight end.",
        "[2026-11-01 10:00:03] Started server process",
    ]
    _write(path, lines[:2])
    feed = LogFeed(path)
    feed.poll(None)
    rank1 = LogFilter.parse("", rank=1)
    assert feed.scan(rank1, lambda: False) == ([0, 1], 2)
    _write(path, lines[2:])  # the rest of the traceback arrives with a later poll
    assert feed.poll(rank1).matches == (2, 3)
    assert feed.scan(rank1, lambda: False)[0] == [0, 1, 2, 3]
    assert feed.scan(LogFilter.parse("memory", rank=1), lambda: False)[0] == [3]
    assert feed.scan(LogFilter.parse("", rank=MAIN_RANK), lambda: False)[0] == [5]
    feed.close()


def test_a_big_log_shows_its_tail_first_and_the_view_shifts_into_place_once_counted(tmp_path, monkeypatch):
    import app.feed as feed_module
    from sessions.logs import LogFile

    monkeypatch.setattr(feed_module, "SYNC_INDEX_BYTES", 1024)  # this log counts as big: tail first
    count_now = LogFile.build_index
    # The count runs when the scan asks for it, not in a thread racing this test (the bench times that).
    monkeypatch.setattr(LogFile, "build_index", lambda log, background=True: None if background else count_now(log, False))
    path = tmp_path / "server.log"
    _write(path, [f"line {i}" for i in range(20_000)])
    feed = LogFeed(path)

    async def scenario() -> None:
        app = _LogApp()
        async with app.run_test(size=(60, 12)) as pilot:
            view = app.query_one(LogView)
            view.show_file(str(path))
            first = feed.poll(None, tail=50)
            assert first.counting and first.lines[0] == (0, "line 19950")  # provisional numbers
            view.apply_chunk(first)
            await pilot.pause()
            assert "line 19999" in _visible(view) and "counting" in view.position_text()
            feed.scan(LogFilter.parse("line 1"), lambda: False)  # waits for the count
            later = feed.poll(None)
            assert not later.counting and later.shift == 19_950
            view.apply_chunk(later)
            await pilot.pause()
            assert view.total_lines == 20_000 and "counting" not in view.position_text()
            assert "line 19999" in _visible(view)
            assert feed.read([19_999, 5]) == {19_999: "line 19999", 5: "line 5"}

    asyncio.run(scenario())
    feed.close()
