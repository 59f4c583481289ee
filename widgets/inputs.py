"""Widgets that keep every key of a burst (a paste, or type-ahead over a slow SSH link), in order.

Why keys were lost: Textual's `Input` inserts a printable key in its own `_on_key`, at once, but a
non-printable key (End, Backspace, Left, ...) only reaches its binding after the event has bubbled through
every ancestor's message queue back to the App (`App._on_key` -> `_check_bindings`).  With a burst in the
queues, the printable keys that follow overtake it: "End, 80 x Backspace, /new/path" typed the path first
and then deleted it.  `InOrderInput` runs its own (non-priority) bindings where the key arrives, so each
key takes effect before the next one is read.  Keys it does not bind bubble as before, and priority
bindings were already checked by the App before the key was forwarded here.
"""

from __future__ import annotations

from textual import events
from textual.widgets import Input


async def run_own_binding(widget: Input, event: events.Key) -> bool:
    """Run ``widget``'s own binding for ``event`` now (True when one handled it), as the App would later."""
    if event.is_printable:
        return False
    for binding in widget._bindings.key_to_bindings.get(event.key, ()):
        if binding.priority:
            continue  # the App ran priority bindings before forwarding the key
        if await widget.app.run_action(binding.action, widget):
            event.stop()
            event.prevent_default()
            return True
    return False


class InOrderInput(Input):
    """An `Input` whose cursor and editing keys take effect in the order they were typed."""

    async def _on_key(self, event: events.Key) -> None:
        if await run_own_binding(self, event):
            self._restart_blink()
            return
        await super()._on_key(event)
