"""The text of an extraction job on the jobs screen, fitted to the width it is drawn at: its counts, rates
and storage as items that wrap only between items (a figure and its unit never part), and its servers as
aligned rows whose names keep what tells them apart.

`FitLines` draws what a builder makes for its width; the builders here take a `JobProgress`-like snapshot
(`sessions.extraction.progress`) and read nothing.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.text import Text
from textual.widget import Widget

from sessions.extraction.progress import server_row_text

ITEM_SEP = " · "
_SERVER_STYLE = {"live": "green", "down": "yellow"}  # any other state (left out, refused) is red


def fit_items(items: Sequence[str], width: int, sep: str = ITEM_SEP) -> list[str]:
    """``items`` joined by ``sep`` into lines of at most ``width`` cells, broken only between items (an item
    longer than the width stands alone on its line)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        else:
            lines.append(item)
    return lines


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "ETA n/a"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"ETA {seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"ETA {seconds // 60}m{seconds % 60:02d}s"


def extraction_items(p: Any) -> list[str]:
    """An extraction job's counts, rates and storage (what is written against the estimate, so a disk that
    cannot hold the job shows early), one item each."""
    errors = f"{p.failed_lines} error{'' if p.failed_lines == 1 else 's'}"
    written = human_bytes(p.bytes) + (f" of ~{human_bytes(p.estimated_output_bytes)} est."
                                      if p.estimated_output_bytes else "")
    items = [f"{p.done}/{p.total} samples", errors, f"{p.tokens:,} tokens", written,
             f"{p.samples_per_s:.1f} samples/s", f"{p.tokens_per_s:,.0f} tok/s", f"{p.gb_per_s:.3f} GB/s"]
    if p.state == "running":
        items.append(eta_text(p.eta_s))
    if p.capture_fill is not None:
        items.append(f"capture fs {p.capture_fill:.0%}")
    return items


def server_lines(rows: Sequence[dict[str, Any]], width: int) -> Text:
    """A job's servers, one line each: `server_row_text` (as `extract status` prints it) where every line
    fits ``width``; else a table whose names lose the prefix they share (a group's members differ only at
    the end of their session ids), named once above it."""
    text = Text()
    full = [server_row_text(row) for row in rows]
    if all(len(line) <= width for line in full):
        for row, line in zip(rows, full, strict=True):
            text.append(("\n" if text else "") + line, style=_SERVER_STYLE.get(str(row.get("state")), "red"))
        return text
    names = [str(row.get("name")) for row in rows]
    # The prefix every name shares (string work only: a widget never touches os or the filesystem).
    common = next((i for i, chars in enumerate(zip(*names)) if len(set(chars)) > 1), min(map(len, names)))
    prefix = names[0][:common] if len(names) > 1 else ""
    prefix = prefix[: max(prefix.rfind(c) for c in "-/:_.") + 1]  # cut at a separator: whole name parts
    shown = [name[len(prefix):] or name for name in names]
    name_w = max(len("server"), *(len(s) for s in shown))
    state_w = max(len("state"), *(len(str(row.get("state"))) for row in rows))
    if prefix:
        text.append(f"{len(rows)} servers, named {prefix}…", style="dim")
    text.append(("\n" if text else "") + f"{'server':<{name_w}}  {'state':<{state_w}}  {'done':>6}  samples/s"
                "  failures  in flight", style="dim")
    for row, name in zip(rows, shown, strict=True):
        line = (f"{name:<{name_w}}  {row.get('state')!s:<{state_w}}  {row.get('done', 0):>6}"
                f"  {float(row.get('samples_per_s') or 0):>9.1f}  {row.get('failures', 0):>8}"
                f"  {row.get('in_flight', 0)}/{row.get('window', 0)}")
        style = _SERVER_STYLE.get(str(row.get("state")), "red")
        text.append("\n" + line, style=style)
        if row.get("reason"):
            text.append(f"\n  {row['reason']}", style=style)
    return text


def extraction_text(p: Any, errors: Sequence[tuple[str, int]], width: int) -> Text:
    """Everything an extraction job's row shows below its bar, fitted to ``width``: counts and rates,
    storage that will not fit (`--allow-partial`), a line per server, and why samples failed."""
    text = Text("\n".join(fit_items(extraction_items(p), width)))
    for fs in (fs for fs in ((p.storage or {}).get("filesystems") or []) if not fs.get("fits")):
        text.append(f"\nstorage: {', '.join(fs.get('folders', []))} needs "
                    f"{human_bytes(fs.get('needed_bytes', 0))}, {human_bytes(fs.get('free_bytes', 0))} free",
                    style="yellow")
    if p.servers and len(p.servers) > 1:  # a one-server job's one row says nothing its title does not
        text.append("\n")
        text.append_text(server_lines(p.servers, width))
    if errors:  # why the samples failed (the job's errors.jsonl), most common first
        text.append("\nwhy: " + " · ".join(f"{reason} ({count})" if count > 1 else reason
                                           for reason, count in errors), style="red")
    return text


class FitLines(Widget):
    """Text made for the width it is drawn at (``build(width)``): redrawn, and measured again, at every size."""

    DEFAULT_CSS = "FitLines { height: auto; }"

    def __init__(self, build: Callable[[int], Text] | None = None, *, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._build = build or (lambda _width: Text())

    def show(self, build: Callable[[int], Text]) -> None:
        self._build = build
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return len(self._build(width).wrap(self.app.console, max(1, width)))

    def render(self) -> Text:
        return self._build(max(1, self.content_size.width))
