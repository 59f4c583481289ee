"""PhaseTimeline: launching → … → ready, with time per phase, progress inside it and per-rank arrival.

The phase of a log is the furthest any rank reached (DESIGN §3); a lagging rank shows up in the arrival
line instead ("Load weight end 7/8 (missing TP7)"), which is the classic signature of a hang.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text

from sessions.phases import StartupPhase
from sessions.server import FINAL_STATES
from widgets import units
from widgets.text_lines import TextLines

if TYPE_CHECKING:
    from sessions.server import SessionStatus

PHASE_SHORT = {
    StartupPhase.LAUNCHING: "launch",
    StartupPhase.DIST_INIT: "dist",
    StartupPhase.LOADING_WEIGHTS: "weights",
    StartupPhase.WEIGHTS_LOADED: "loaded",
    StartupPhase.KV_CACHE: "kv",
    StartupPhase.CUDA_GRAPH: "graphs",
    StartupPhase.WARMUP: "warmup",
    StartupPhase.READY: "ready",
}
# rank_arrival marker -> how the log says it (sglang-facts §1.4)
MARKER_TEXT = {
    "init_parallel_begin": "Init parallel begin",
    "init_parallel_end": "Init parallel ends",
    "load_weight_begin": "Load weight begin",
    "load_weight_end": "Load weight end",
    "kv_cache_allocated": "KV Cache is allocated",
    "memory_pool_end": "Memory pool end",
    "cuda_graph_begin": "CUDA graph begin",
    "cuda_graph_end": "CUDA graph end",
    "capture_active": "capture active",
}
_PROGRESS_LABELS = {"cuda graph bs": "graph bs"}


def _phase(value: Any) -> StartupPhase | None:
    try:
        return StartupPhase(str(value))
    except ValueError:
        return None


class PhaseTimeline(TextLines):
    """Draws the startup timeline of a `SessionStatus`."""

    DEFAULT_CSS = """
    PhaseTimeline { height: auto; }
    PhaseTimeline > .phase--done { color: $success; }
    PhaseTimeline > .phase--current { color: $warning; text-style: bold reverse; }
    PhaseTimeline > .phase--failed { color: $error; text-style: bold reverse; }
    PhaseTimeline > .phase--pending { color: $text-muted; }
    PhaseTimeline > .phase--bad { color: $error; text-style: bold; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "phase--done",
        "phase--current",
        "phase--failed",
        "phase--pending",
        "phase--bad",
    }

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.status: SessionStatus | None = None
        self.now: float | None = None

    def update_status(self, status: SessionStatus | None) -> None:
        self.status = status
        self._refresh_for_content()

    def _lines(self, width: int) -> list[Text]:
        status = self.status
        if status is None:
            return [self._chain(None, width)]
        lines = [self._chain(status, width)]
        detail = self._detail(status, width)
        if detail.plain:
            lines.append(detail)
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        return lines

    # -- the chain of phases ----------------------------------------------------------------------------

    def _chain(self, status: SessionStatus | None, width: int) -> Text:
        phases = list(StartupPhase)
        if status is None:
            return Text(
                " › ".join(PHASE_SHORT[p] for p in phases),
                style=self.get_component_rich_style("phase--pending"),
            )
        now = self.now if self.now is not None else time.time()
        current = _phase(status.phase) or StartupPhase.LAUNCHING
        entered = {p: status.phase_entered_at[p.value] for p in phases if p.value in status.phase_entered_at}
        seen = set(entered) | {e.phase for e in getattr(status.summary, "events", ())}
        # Seconds spent in each phase: until the next phase that was entered.
        spent: dict[StartupPhase, float] = {}
        ordered = sorted(entered, key=lambda p: p.order)
        for i, phase in enumerate(ordered):
            end = (
                entered[ordered[i + 1]]
                if i + 1 < len(ordered)
                else (now if phase == current and status.alive else None)
            )
            if end is not None and phase != StartupPhase.READY:  # ready's own clock is in the state line
                spent[phase] = max(0.0, end - entered[phase])
        marks: list[tuple[str, str]] = []
        for phase in phases:
            if phase.order < current.order:
                marks.append(("✓", "phase--done") if phase in seen else ("–", "phase--pending"))
            elif phase == current:
                if status.state == "crashed":
                    marks.append(("✖", "phase--failed"))
                elif status.state == "stalled":
                    marks.append(("⚠", "phase--failed"))
                elif phase == StartupPhase.READY:
                    marks.append(("✓", "phase--done"))
                elif status.alive:
                    marks.append(("▶", "phase--current"))
                else:
                    marks.append(("■", "phase--pending"))
            else:
                marks.append(("·", "phase--pending"))
        # From the most to the least detailed, the first rendering that fits the width wins.
        layouts = [
            (lambda p: p.value, set(spent), " › "),
            (lambda p: PHASE_SHORT[p], set(spent), " › "),
            (lambda p: PHASE_SHORT[p], {current} & set(spent), " › "),
            (lambda p: PHASE_SHORT[p], {current} & set(spent), " "),
        ]
        for name_of, timed, separator in layouts:
            labels = [
                f"{mark}{name_of(phase)}" + (f" {units.duration(spent[phase])}" if phase in timed else "")
                for phase, (mark, _) in zip(phases, marks, strict=True)
            ]
            if sum(len(label) for label in labels) + len(separator) * (len(labels) - 1) <= width:
                break
        text = Text()
        for i, (label, (_, klass)) in enumerate(zip(labels, marks, strict=True)):
            if i:
                text.append(separator, style=self.get_component_rich_style("phase--pending"))
            text.append(label, style=self.get_component_rich_style(klass))
        return text

    # -- progress and arrival -----------------------------------------------------------------------------

    def _detail(self, status: SessionStatus, width: int) -> Text:
        summary = status.summary
        text = Text()
        ready_at = status.phase_entered_at.get(StartupPhase.READY.value)
        if status.state == "ready" and ready_at and status.started_at:
            took = units.duration(ready_at - status.started_at)
            return Text(
                f"ready {took} after launch · {summary.line_count:,} log lines",
                style=self.get_component_rich_style("phase--done"),
            )
        progress = getattr(summary, "progress", None)
        if progress is not None and status.state not in ("ready",):
            label = _PROGRESS_LABELS.get(progress.label, progress.label)
            total = progress.total
            text.append(f"{label} {progress.done}/{total if total is not None else '?'}")
            if total:
                text.append(" ")
                text.append(
                    units.bar(progress.done / total, 10), style=self.get_component_rich_style("phase--done")
                )
        arrival = self._arrival_text(status)
        if arrival.plain:
            if text.plain:
                text.append("  · ")
            text.append_text(arrival)
        return text

    def _arrival_text(self, status: SessionStatus) -> Text:
        summary = status.summary
        arrival: dict[str, tuple[int, ...]] = dict(getattr(summary, "rank_arrival", {}) or {})
        expected = getattr(summary, "ranks_expected", None)
        if not arrival or not expected:
            return Text()
        # Show the markers that some rank reached but not all; else the furthest complete one.
        incomplete = [(name, ranks) for name, ranks in arrival.items() if 0 < len(set(ranks)) < expected]
        shown = incomplete or list(arrival.items())[-1:]
        text = Text()
        for i, (name, ranks) in enumerate(shown):
            if i:
                text.append("  · ")
            missing = sorted(set(range(expected)) - set(ranks))
            label = MARKER_TEXT.get(name, name.replace("_", " "))
            if name == "capture_active" and status.state in FINAL_STATES:
                label = f"capture was active until {status.state}:"  # the past: nothing captures now
            text.append(f"{label} {len(set(ranks))}/{expected}")
            if missing:
                names = ", ".join(summary.rank_name(r) for r in missing[:4]) + (", …" if len(missing) > 4 else "")
                if status.state == "starting":  # still on its way: not a verdict yet
                    text.append(f" (waiting for {names})")
                else:
                    text.append(f" (missing {names})", style=self.get_component_rich_style("phase--bad"))
        return text
