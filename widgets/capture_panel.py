"""CapturePanel: one profile's hidden-state capture at a glance (DESIGN §5).

It draws a `sessions.profiles.capture_toggle.CaptureStatus`: on/off, the physical capture points next to the
draft-config ids (with a warning when they are not the EAGLE-3 standard set for L), what the running
server confirmed (the plugin's ``eagle3-capture active`` line, when the TUI passes it), the capture dir
with its file count, size and filesystem fill, and why CUDA graphs may stay on (the seed accounts turned
them off for nothing).  Render only; the TUI polls `capture_status` in a worker.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.widget import Widget

from sessions.server import FINAL_STATES
from widgets import units

if TYPE_CHECKING:
    from sessions.profiles.capture_toggle import CaptureStatus



class CapturePanel(Widget):
    """Draws a `CaptureStatus` (``None``: a hint)."""

    DEFAULT_CSS = """
    CapturePanel { height: auto; }
    CapturePanel > .capture--on { color: $success; text-style: bold; }
    CapturePanel > .capture--off { color: $text-muted; text-style: bold; }
    CapturePanel > .capture--dim { color: $text-muted; }
    CapturePanel > .capture--warn { color: $warning; }
    CapturePanel > .capture--bad { color: $error; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"capture--on", "capture--off", "capture--dim", "capture--warn", "capture--bad"}

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.status: CaptureStatus | None = None
        self.server_layers: list[int] | None = None
        self.server_state: str | None = None
        self.hint = "No profile selected."

    def update_status(self, status: CaptureStatus | None, server_layers: Sequence[int] | None = None,
                      hint: str | None = None, server_state: str | None = None) -> None:
        """Show ``status``; ``server_layers`` are the layers the session's server logged (capture active),
        ``server_state`` that session's state: once it ended, the panel says what was captured, in the
        past tense, never "capture active"."""
        self.status = status
        self.server_layers = list(server_layers) if server_layers is not None else None
        self.server_state = server_state
        if hint is not None:
            self.hint = hint
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._lines(max(1, width)))

    def render(self) -> Text:
        return Text("\n").join(self._lines(max(1, self.size.width)))

    def _style(self, name: str):
        return self.get_component_rich_style(f"capture--{name}")

    def _lines(self, width: int) -> list[Text]:
        status = self.status
        if status is None:
            return [Text(self.hint, style=self._style("dim"))]
        lines: list[Text] = []
        head = Text()
        if status.enabled:
            head.append("● CAPTURE ON", style=self._style("on"))
        else:
            head.append("○ capture off", style=self._style("off"))
            head.append("  (c toggles)", style=self._style("dim"))
        head.append(f"  · rid prefix {status.rid_prefix!r}")
        if status.architecture:
            layers = f", L={status.num_layers}" if status.num_layers else ""
            head.append(f"  · {status.architecture}{layers}", style=self._style("dim"))
        lines.append(head)

        layers_line = Text()
        points = list(status.points) if status.points is not None else None
        layers_line.append("capture points ")
        layers_line.append(str(points) if points is not None else units.NA)
        if not status.explicit_layers:
            layers_line.append(" (SGLang default)", style=self._style("dim"))
        layers_line.append("   draft-config ids ")
        layers_line.append(str(list(status.draft_ids)) if status.draft_ids is not None else units.NA)
        if status.is_standard is True:
            layers_line.append("   ✓ EAGLE-3 standard", style=self._style("dim"))
        elif status.is_standard is False and status.standard_points is not None:
            layers_line.append(f"   ⚠ not the standard {list(status.standard_points)} for L={status.num_layers}",
                               style=self._style("warn"))
        lines.append(layers_line)

        ended = self.server_state in FINAL_STATES
        if self.server_layers is not None and ended:
            # The session is over: what it captured, not a capture that still runs.
            past = Text(f"{self.server_state} session captured layers {self.server_layers}", style=self._style("dim"))
            if status.dir_exists and not status.dir_problem:
                past.append(f" · {status.file_count} files, {units.size(status.size_bytes)} in the capture dir")
            lines.append(past)
        elif self.server_layers is not None:
            confirmed = Text("server: layers_to_capture ")
            confirmed.append(str(self.server_layers))
            if points is not None and list(points) != self.server_layers:
                confirmed.append(f"  ✖ differs from the profile's {points}", style=self._style("bad"))
            else:
                confirmed.append("  ✓ capture active", style=self._style("on"))
            lines.append(confirmed)

        where = Text()
        where.append(f"dir {status.dir}")
        if status.dir_problem:
            where.append(f"  ✖ {status.dir_problem}", style=self._style("bad"))
        elif not status.dir_exists:
            where.append("  (created on first capture)", style=self._style("dim"))
        else:
            where.append(f"  · {status.file_count} files · {units.size(status.size_bytes)}")
        fill = status.fs_fill_percent
        if fill is not None:
            free = f"{units.size(status.fs_free_bytes)} free"
            where.append(f"  · fs {units.percent(fill)} full ({free})",
                         style=self._style("warn") if fill >= 90 else "")
        lines.append(where)
        lines.append(Text(status.cuda_graph_note, style=self._style("dim")))
        for message in status.errors:
            lines.append(Text(f"✖ {message}", style=self._style("bad")))
        for message in status.warnings:
            if status.is_standard is False and "standard EAGLE-3 set" in message:
                continue  # already shown next to the layers
            lines.append(Text(f"⚠ {message}", style=self._style("warn")))
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        return lines
