"""The dashboard's last selection (profile, session, focused pane), kept in ``<state>/tui-selection.json`` so
that reattaching (`eagle3-tui` after a quit or a dropped SSH link) shows what the user was looking at, and
the keys act on the same things as before (issue 21: reattaching did not restore the selection).

The file is tiny and private (0600, written atomically); a missing, unreadable or odd one is ignored: the
dashboard then starts on its defaults, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessions.home import Home

SELECTION_FILE = "tui-selection.json"
MAX_BYTES = 4096  # three short names; anything bigger is not ours
PANES = (1, 2, 3, 4)
_NAME_MAX = 255


@dataclass(frozen=True)
class Selection:
    """What the dashboard had selected: the profile and session cursors and the focused pane (1-4)."""

    profile: str | None = None
    session: str | None = None
    pane: int | None = None


def _name(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= _NAME_MAX and value.isprintable() else None


def load_selection(home: Home) -> Selection:
    """The kept selection, or an empty one when there is none (or it cannot be read)."""
    from sessions.safe_files import Kind, read_json

    try:
        data = read_json(home.state_root / SELECTION_FILE, Kind("selection file", MAX_BYTES, private=True))
    except (OSError, ValueError):  # missing, a FIFO or a link, cut, not JSON: start on the defaults
        return Selection()
    if not isinstance(data, dict):
        return Selection()
    pane = data.get("pane")
    return Selection(_name(data.get("profile")), _name(data.get("session")),
                     pane if isinstance(pane, int) and pane in PANES else None)


def save_selection(home: Home, selection: Selection) -> None:
    """Keep ``selection`` (atomically, 0600); a failure is ignored (the next change tries again)."""
    from sessions.home import atomic_write_json

    try:
        atomic_write_json(home.state_root / SELECTION_FILE,
                          {"profile": selection.profile, "session": selection.session, "pane": selection.pane})
    except OSError:
        pass
