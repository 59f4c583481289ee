"""GpuPanel: memory bars, utilisation and history per GPU, with each process named by its rank.

It draws a `GpuSnapshot` (from `sessions.gpus`) and keeps a short history per GPU for the sparklines.
Processes are labelled with the selected session's ranks (pid -> "TP3"), so "TP3 76.0G on GPU 3"
reads directly; a process of no known session shows its pid.  Wide terminals get one GPU per row with
name, temperature and power; narrow ones pack two or three GPUs per row.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable
from typing import ClassVar

from rich.text import Text

from sessions.gpus import GpuSample, GpuSnapshot
from widgets import units
from widgets.text_lines import TextLines

HISTORY_SAMPLES = 120
OVERSUBSCRIBED = "oversubscribed (emulated)"
_WIDE_MIN_WIDTH = 96
_CELL_MIN_WIDTH = 26


class GpuPanel(TextLines):
    """Draws the latest GPU snapshot; `update_snapshot` feeds it."""

    DEFAULT_CSS = """
    GpuPanel { height: auto; }
    GpuPanel > .gpu--high { color: $error; }
    GpuPanel > .gpu--mid { color: $warning; }
    GpuPanel > .gpu--low { color: $success; }
    GpuPanel > .gpu--dim { color: $text-muted; }
    GpuPanel > .gpu--lost { color: $error; text-style: bold; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"gpu--high", "gpu--mid", "gpu--low", "gpu--dim", "gpu--lost"}

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.snapshot: GpuSnapshot | None = None
        self.owners: dict[int, str] = {}
        self._memory_history: dict[int, deque[float | None]] = {}
        self._util_history: dict[int, deque[float | None]] = {}

    def update_snapshot(self, snapshot: GpuSnapshot, owners: dict[int, str] | None = None) -> None:
        """Show ``snapshot``; ``owners`` maps pid -> label ("TP3", "detok") for the selected session."""
        self.snapshot = snapshot
        self.owners = owners or {}
        if not snapshot.stale:
            for sample in snapshot.samples:
                fraction = _memory_fraction(sample)
                self._memory_history.setdefault(sample.index, deque(maxlen=HISTORY_SAMPLES)).append(
                    None if fraction is None else fraction * 100
                )
                self._util_history.setdefault(sample.index, deque(maxlen=HISTORY_SAMPLES)).append(
                    sample.utilization_percent
                )
        self._refresh_for_content()

    def title(self) -> str:
        """ "GPUs · emulated" / "GPUs · NVML" / "GPUs · NVML not available" for the pane border."""
        snapshot = self.snapshot
        if snapshot is None:
            return "GPUs"
        if snapshot.source == "emulated":
            label = "emulated"
        elif not snapshot.available:
            label = "NVML not available"
        else:
            label = "NVML"
        if any(s.oversubscribed for s in snapshot.samples):
            label += f" · {OVERSUBSCRIBED}"
        if snapshot.stale:
            label += f" · stale {units.duration(time.time() - snapshot.taken_at)}"
        return f"GPUs · {label}"

    # -- layout -----------------------------------------------------------------------------------------

    def _content_key(self, width: int) -> Hashable | None:
        # The same readings, owners and sparkline tails draw the same rows: skip building them (a stale
        # snapshot's row says its age, so that one is always redrawn).
        snapshot = self.snapshot
        if snapshot is None or snapshot.stale:
            return None
        tails = tuple(tuple(list(h)[-12:]) for _, h in sorted(self._util_history.items()))
        return (snapshot.samples, snapshot.available, snapshot.message, snapshot.source,
                tuple(sorted(self.owners.items())), width, tails)

    def get_content_height(self, container, viewport, width: int) -> int:
        return max(1, len(self._lines_at(width)))

    @property
    def _has_sensors(self) -> bool:
        snapshot = self.snapshot
        return snapshot is not None and any(
            s.temperature_c is not None or s.power_w is not None for s in snapshot.samples
        )

    def _lines(self, width: int) -> list[Text]:
        snapshot = self.snapshot
        dim = self.get_component_rich_style("gpu--dim")
        if snapshot is None:
            return [Text("reading GPUs…", style=dim)]
        rows: list[Text] = []
        if not snapshot.available and snapshot.message:
            rows.append(Text(f"✖ {snapshot.message}", style=self.get_component_rich_style("gpu--lost")))
        if snapshot.stale:
            age = units.duration(time.time() - snapshot.taken_at)
            rows.append(
                Text(
                    f"⚠ stale: the last GPU reading is {age} old (the driver is not answering)",
                    style=self.get_component_rich_style("gpu--mid"),
                )
            )
        samples = snapshot.samples
        if not samples:
            if snapshot.available:
                rows.append(Text(snapshot.message or "no GPUs", style=dim))
            return rows
        if width >= _WIDE_MIN_WIDTH:
            rows.extend(self._wide_row(sample, width) for sample in samples)
            return rows
        columns = max(1, width // _CELL_MIN_WIDTH)
        cell_width = width // columns
        for start in range(0, len(samples), columns):
            row = Text()
            for sample in samples[start : start + columns]:
                row.append_text(self._cell(sample, cell_width - 1))
                row.append(" ")
            rows.append(row)
        return rows

    # -- one GPU ----------------------------------------------------------------------------------------

    def _lost(self, sample: GpuSample, width: int, compact: bool = False) -> Text:
        name = (sample.name or "lost").removeprefix("ERROR: ")
        label = f"{sample.index} ✖ {name}" if compact else f"GPU{sample.index} ✖ {sample.name or 'lost'}"
        text = Text(label, style=self.get_component_rich_style("gpu--lost"))
        text.truncate(width, pad=True)
        return text

    def _level_style(self, fraction: float | None):
        if fraction is None:
            return self.get_component_rich_style("gpu--dim")
        if fraction >= 0.9:
            return self.get_component_rich_style("gpu--high")
        if fraction >= 0.6:
            return self.get_component_rich_style("gpu--mid")
        return self.get_component_rich_style("gpu--low")

    def _append_bar(self, text: Text, fraction: float | None, width: int) -> None:
        bar = units.bar(fraction, width)
        used = len(bar.rstrip("░"))
        text.append(bar[:used], style=self._level_style(fraction))
        text.append(bar[used:], style=self.get_component_rich_style("gpu--dim"))

    def _processes(self, sample: GpuSample, limit: int) -> str:
        parts = []
        for proc in sample.processes:
            label = self.owners.get(proc.pid, f"pid {proc.pid}")
            parts.append(f"{label} {units.size(proc.used_bytes)}")
        text = ", ".join(parts)
        return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"

    def _wide_row(self, sample: GpuSample, width: int) -> Text:
        if sample.lost:
            return self._lost(sample, width)
        fraction = _memory_fraction(sample)
        name = (sample.name or units.NA).replace("NVIDIA ", "")[:14]
        memory = f"{units.gib(sample.memory_used_bytes)}/{units.gib(sample.memory_total_bytes)} GiB"
        util = f"util {units.percent(sample.utilization_percent):>4}"
        extras = ""
        if width >= 140 and self._has_sensors:
            temp = units.NA if sample.temperature_c is None else f"{sample.temperature_c:.0f}°C"
            power = units.NA if sample.power_w is None else f"{sample.power_w:.0f}W"
            extras = f" {temp:>5} {power:>5}"
        spark_width = 12 if width >= 120 else 8
        bar_width = max(8, min(30, width // 5))
        fixed = 5 + 15 + bar_width + 1 + len(memory) + 2 + len(util) + 1 + spark_width + len(extras) + 2
        procs = self._processes(sample, max(0, width - fixed))
        text = Text()
        text.append(f"GPU{sample.index:<2}", style="bold")
        text.append(f"{name:<15}")
        self._append_bar(text, fraction, bar_width)
        text.append(f" {memory:>17}  {util} ")
        if sample.oversubscribed:
            text.append(f"{OVERSUBSCRIBED} ", style=self.get_component_rich_style("gpu--high"))
        util_history = list(self._util_history.get(sample.index, ()))
        text.append(
            units.sparkline(util_history, spark_width),
            style=self._level_style(
                None if sample.utilization_percent is None else sample.utilization_percent / 100
            ),
        )
        text.append(extras)
        text.append("  ")
        text.append(procs, style="bold" if any(p.pid in self.owners for p in sample.processes) else "")
        text.truncate(width)
        return text

    def _cell(self, sample: GpuSample, width: int) -> Text:
        if sample.lost:
            return self._lost(sample, width, compact=True)
        fraction = _memory_fraction(sample)
        memory = f"{units.gib(sample.memory_used_bytes, 0)}/{units.gib(sample.memory_total_bytes, 0)}G"
        util = units.percent(sample.utilization_percent)
        owner = ",".join(sorted({self.owners[p.pid] for p in sample.processes if p.pid in self.owners}))
        if not owner and sample.processes:
            owner = f"{len(sample.processes)}p"
        if sample.oversubscribed:
            memory += "!"  # the wide row spells it out; the pane title says it too
        tail = f" {memory:>8} {util:>4} {owner}"
        if owner and 2 + 3 + len(tail) > width:
            # A narrow cell keeps whose GPU it is ("DP1 TP0", "r2 TP1") before the utilisation figure.
            tail = f" {memory:>8} {owner}"
        bar_width = max(3, width - 2 - len(tail))
        text = Text()
        text.append(f"{sample.index}", style="bold")
        text.append(" ")
        self._append_bar(text, fraction, bar_width)
        text.append(tail)
        text.truncate(width, pad=True)
        return text


def _memory_fraction(sample: GpuSample) -> float | None:
    if sample.memory_used_bytes is None or not sample.memory_total_bytes:
        return None
    return sample.memory_used_bytes / sample.memory_total_bytes
