"""The jobs screen's text at the widths people use (80x24 and up): counts and rates wrap only between their
items, a job over a group's replicas shows a row per server whose names still tell them apart, and the
done part of the bar shows on the highlighted row (issue 24's screenshot of a job over four replicas)."""
from __future__ import annotations

import asyncio

from _tui_support import wait_until
from textual.app import App
from textual.widgets import ListView

from app.screens.jobs import JobRow
from sessions.extraction.progress import JobProgress, server_row_text
from widgets.job_lines import extraction_items, fit_items, server_lines

GROUP = "tiny-llama-replicas-20261202-0523"
MEMBERS = [f"{GROUP}{tail}" for tail in ("33-b034", "34-27c7", "34-f8d8", "35-57dc")]


def _rows(reason: str | None = None) -> list[dict]:
    return [{"name": name, "url": f"http://127.0.0.1:{29468 + i}", "state": "live" if i != 3 else "left out",
             "reason": reason if i == 3 else None, "done": 14 - i, "samples_per_s": 3.8 - i / 2,
             "failures": 20 if i == 3 else 0, "in_flight": 4 if i != 3 else 0, "window": 4}
            for i, name in enumerate(MEMBERS)]


def _progress() -> JobProgress:
    return JobProgress(job_id="demo-replicas-20261202-052449-9eeb", state="running", name="demo-replicas",
                       total=721, done=44, failed_lines=1, tokens=3628, bytes=2_000_000,
                       estimated_output_bytes=32_900_000, samples_per_s=10.7, tokens_per_s=882.0, gb_per_s=0.001,
                       eta_s=53.0, capture_fill=0.14, servers=_rows("20 straight failures; last: timed out"))


def test_items_wrap_only_between_items_and_join_as_one_line_where_they_fit():
    items = extraction_items(_progress())
    for width in (40, 60, 80, 120):
        lines = fit_items(items, width)
        assert all(len(line) <= width for line in lines)
        assert [item for line in lines for item in line.split(" · ")] == items  # no item cut in two
    assert fit_items(items, 500) == [" · ".join(items)]


def test_servers_are_full_lines_where_they_fit_else_a_table_whose_names_keep_their_differences():
    rows = _rows("20 straight failures; last: timed out")
    assert server_lines(rows, 200).plain.split("\n") == [server_row_text(row) for row in rows]
    lines = server_lines(rows, 76).plain.split("\n")
    assert all(len(line) <= 76 for line in lines), lines
    assert lines[0] == "4 servers, named tiny-llama-replicas-20261202-…"  # the shared part, once
    assert lines[1].split() == ["server", "state", "done", "samples/s", "failures", "in", "flight"]
    table = [line for line in lines[2:] if not line.startswith("  ")]
    shown = [line.split()[0] for line in table]
    assert shown == [name.removeprefix("tiny-llama-replicas-20261202-") for name in MEMBERS]
    assert table[0].split() == [shown[0], "live", "14", "3.8", "0", "4/4"]
    assert table[3].split() == [shown[3], "left", "out", "11", "2.3", "20", "0/4"]
    assert "  20 straight failures; last: timed out" in lines  # why it was left out, under its row


def test_a_job_over_four_replicas_fits_80_columns_and_its_bar_shows_on_the_highlighted_row():
    progress = _progress()

    class _RowApp(App):
        def compose(self):
            yield ListView(JobRow(progress))

    async def scenario() -> None:
        app = _RowApp()
        async with app.run_test(size=(80, 24)) as pilot:
            row = app.query_one(JobRow)
            await wait_until(pilot, lambda: "servers, named" in str(row.query_one("#rates").render()), "drawn")
            width = row.query_one("#rates").content_size.width
            lines = str(row.query_one("#rates").render()).split("\n")
            body = [line for line in lines if not line.startswith("why:")]
            assert all(len(line) <= width for line in body), (width, lines)
            for item in extraction_items(progress):  # each figure whole on one line, its unit with it
                assert any(item in line for line in lines), item
            assert row.has_class("-highlight")
            bar = row.query_one("Bar")
            done = bar.get_component_rich_style("bar--bar").color
            assert done is not None and done != row.styles.background.rich_color

    asyncio.run(scenario())
