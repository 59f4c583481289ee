"""HostPanel: the other hosts of hosts.toml, one block each: connection state, version, GPUs, sessions.

Drawn from the immutable `HostView`s of `sessions.remote.monitor` (the dashboard's poll reads them from
the monitor's threads without waiting).  A host that does not answer says so in its first line
(``unreachable: <ssh's reason>``, ``reconnecting in 4s``) and its sessions are the last ones it gave,
marked with how old they are.  Hidden while hosts.toml names no host.
"""
from __future__ import annotations

import re
import time

from rich.text import Text
from textual.widgets import Static

from sessions.remote.monitor import HostView
from widgets import units
from widgets.state_line import state_glyph

_HOST_STYLE = {"connected": "green", "slow": "yellow", "connecting": "dim", "reconnecting": "bold yellow",
               "unreachable": "bold red", "refused": "bold red"}
_SESSION_STYLE = {"ready": "green", "starting": "yellow", "stalled": "bold yellow", "crashed": "bold red",
                  "exited": "dim", "stopped": "dim"}
_MAX_SESSIONS = 4  # per host; the rest is counted
# ssh's "ssh: connect to host 10.0.0.2 port 22: Connection refused": the host is on the line already
_SSH_PREFIX = re.compile(r"ssh: connect to host \S+ port \d+: ")


def gpu_summary(view: HostView) -> str:
    snap = view.gpus
    if snap is None:
        return ""
    if not snap.samples:
        # "NVML not available: the NVIDIA driver library ... was not found": the head says enough here
        return "no GPUs" if snap.available else (snap.message or "no GPU reading").split(":")[0][:60]
    used = sum(s.memory_used_bytes or 0 for s in snap.samples)
    total = sum(s.memory_total_bytes or 0 for s in snap.samples)
    busy = sum(1 for s in snap.samples if s.processes)
    label = "emulated " if snap.source == "emulated" else ""
    return f"{len(snap.samples)} {label}GPUs, {busy} in use, {units.gib(used)}/{units.gib(total)} GiB"


def hosts_text(views: tuple[HostView, ...], now: float | None = None, wall: float | None = None) -> Text:
    """``h2 ● connected · 0.1.0 · 8 GPUs, ...`` then a line a session (`` ✓ ready :30000 emu id``)."""
    now = time.monotonic() if now is None else now
    wall = time.time() if wall is None else wall
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, view in enumerate(views):
        if i:
            text.append("\n")
        text.append(view.name, style="bold")
        text.append(f" {_SSH_PREFIX.sub('', view.state_text(now))}", style=_HOST_STYLE.get(view.state, "bold"))
        if view.state == "unreachable" and view.retry_at is not None:
            text.append(f" (retry in {view.retry_in_s(now):.0f}s)", style="dim")
        details = [d for d in (view.version and f"v{view.version}", gpu_summary(view)) if d]
        if details:
            text.append(" · " + " · ".join(details), style="dim")
        if view.stale and view.answered_at is not None:
            text.append(f" · sessions as of {units.duration(wall - view.answered_at)} ago", style="yellow")
        live = [s for s in view.sessions if s.alive] or list(view.sessions[:1])
        for s in live[:_MAX_SESSIONS]:
            glyph, _ = state_glyph(s.state)
            text.append("\n  ")
            text.append(f"{glyph} {s.state:<8}", style=_SESSION_STYLE.get(s.state, "bold"))
            text.append(f" :{s.port}" if s.port else " :-", style="dim")
            text.append(f" {s.profile} ")
            text.append(s.session_id, style="dim")
        if len(live) > _MAX_SESSIONS:
            text.append(f"\n  … {len(live) - _MAX_SESSIONS} more", style="dim")
        if not view.sessions and view.answered_at is not None:
            text.append("\n  no sessions", style="dim")
    return text


class HostPanel(Static):
    DEFAULT_CSS = "HostPanel { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.views: tuple[HostView, ...] = ()
        self.shown = Text()  # what the panel draws now (tests read it)

    def update_hosts(self, views: tuple[HostView, ...]) -> None:
        self.views = views
        shown = hosts_text(views)
        if shown.plain != self.shown.plain:  # the retry countdown changes each second; nothing else repaints
            self.shown = shown
            self.update(shown)
