"""What the dashboard's keys act on, and the selection they keep.

The session a key acts on is the one under the cursor of the focused pane (`target_session`), the profile
likewise (`target_profile`), so that `s` on a profile never stops another profile's server (issue 21).
Moving the selection (a pick in pane 1 or 2, a launch, a restart, the palette) goes through
`select_session`, `follow_profile` and `select_profile`; `keep_selection` writes what is selected to the
state dir so that the next TUI restores it (`app.selection`).

A mixin of `DashboardScreen` (kept apart so the screen module stays readable): it reads the screen's
``last_snapshot``, ``selected_session`` and ``selected_profile`` and uses its ``poll_now``.  Textual
dispatches ``@on`` handlers only from the classes it builds, not from a plain mixin, so the highlight
handlers stay on the screen and call `follow_profile` and `select_session` here.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from app.feed import DashboardFeed, DashboardSnapshot
from app.selection import Selection, save_selection
from widgets.lists import ProfileList, SessionEntry, SessionList
from widgets.log_view import LogView
from widgets.nodes_card import NodesCard


class Targeting:
    """Targets and selection for `DashboardScreen` (see the module docstring)."""

    feed: DashboardFeed
    last_snapshot: DashboardSnapshot | None
    selected_session: str | None
    selected_profile: str | None
    saved_selection: Selection  # what the state dir holds (the one restored, then each one written)
    focused: Any  # Screen's (an annotation only: a value here would shadow it)

    if TYPE_CHECKING:  # provided by Screen and DashboardScreen; never defined here (they would shadow them)
        def query_one(self, *args: Any, **kwargs: Any) -> Any: ...
        def notify(self, *args: Any, **kwargs: Any) -> Any: ...
        def run_worker(self, *args: Any, **kwargs: Any) -> Any: ...
        def poll_now(self) -> None: ...

    # -- selection ----------------------------------------------------------------------------------------

    def follow_profile(self, name: str | None) -> None:
        """The profile cursor moved to ``name`` in pane 1."""
        if name == self.selected_profile:
            return
        self.selected_profile = name
        snapshot = self.last_snapshot
        if snapshot is None:
            return
        # Follow the profile: show its newest session when the one shown belongs to another profile.
        shown = next((s for s in snapshot.sessions if s.session_id == self.selected_session), None)
        newest = next((s for s in snapshot.sessions if s.profile == name), None)
        if newest is not None and (shown is None or shown.profile != name):
            self.select_session(newest.session_id)
        else:
            self.poll_now()  # its capture panel

    def select_session(self, session_id: str | None) -> None:
        """Show ``session_id`` (the card, the log) and poll for it now."""
        self.selected_session = session_id
        self.query_one(SessionList).select_id(session_id)
        self.poll_now()

    # -- targets: what a key acts on -------------------------------------------------------------------------

    def target_session(self, verb: str, live_only: bool = True, quiet: bool = False) -> SessionEntry | None:
        """The session a key acts on: the one under the cursor of the pane that has focus, as on screen.

        Profiles pane: the highlighted profile's running session (``live_only`` False: else its newest one).
        Sessions pane: the highlighted session.  Elsewhere (GPUs, log): the session the card and the log show.
        When there is none, it says so (unless ``quiet``) and returns None: `s` on a profile with no server
        stopped the session pane's one, another profile's (issue 21)."""
        snapshot = self.last_snapshot
        if snapshot is None:
            if not quiet:
                self.notify(f"Nothing to {verb} yet: the first refresh has not finished.", severity="warning")
            return None
        focused = self.focused
        if isinstance(focused, ProfileList):
            name = focused.highlighted_id
            profile = next((p for p in snapshot.profiles if p.name == name), None)
            session_id = profile.live_session if profile is not None else None
            if session_id is None and not live_only:
                session_id = next((s.session_id for s in snapshot.sessions if s.profile == name), None)
            if session_id is None:
                if not quiet:
                    what = "running session" if live_only else "session"
                    self.notify(f"Profile {name or '(none)'} has no {what} to {verb}"
                                f"{' (l launches it)' if name else ''}.", severity="warning")
                return None
        elif isinstance(focused, SessionList):
            session_id = focused.highlighted_id
        elif isinstance(focused, NodesCard):
            # The Multi-node pane: keys act on the server under its cursor (s and d do), never on the local
            # session the card above shows.
            if not quiet:
                self.notify(f"{verb.capitalize()} acts on a local session: in the Multi-node pane, Enter opens the server's "
                            "view (s stops it, d diagnoses it).", severity="warning")
            return None
        else:
            session_id = self.selected_session
        entry = next((s for s in snapshot.sessions if s.session_id == session_id), None)
        if entry is None:
            if not quiet:
                self.notify(f"No session selected to {verb}.", severity="warning")
            return None
        if entry.session_id != self.selected_session:
            self.select_session(entry.session_id)  # the card and the log show what the key acts on
        return entry

    def target_profile(self) -> str | None:
        """The profile a key acts on: the highlighted one in the profiles pane, the highlighted session's in
        the sessions pane, else the one the profile cursor is on."""
        focused = self.focused
        if isinstance(focused, SessionList) and self.last_snapshot is not None:
            session = next((s for s in self.last_snapshot.sessions if s.session_id == focused.highlighted_id),
                           None)
            profiles = {p.name for p in self.last_snapshot.profiles}
            if session is not None and session.profile in profiles:
                return session.profile
        if isinstance(focused, ProfileList) and focused.highlighted_id:
            return focused.highlighted_id
        return self.selected_profile or self.query_one(ProfileList).highlighted_id

    def select_profile(self, name: str) -> None:
        """Put the profile cursor on ``name`` (a new or saved-as profile; the palette): keys act on the cursor,
        so it moves now, not at the next refresh (which keeps it there, or puts it there once listed)."""
        self.selected_profile = name
        self.query_one(ProfileList).select_id(name)

    def focused_pane(self) -> int | None:
        """1-4: the pane that has focus (None: the filter bar or nothing)."""
        focused = self.focused
        for number, pane in ((1, ProfileList), (2, SessionList), (4, LogView)):
            if isinstance(focused, pane):
                return number
        return 3 if focused is not None and focused.id == "gpu-pane" else None

    def keep_selection(self) -> None:
        """Write the selection to the state dir when it changed (a thread: never the UI's disk wait)."""
        selection = Selection(self.selected_profile, self.selected_session,
                              self.focused_pane() or self.saved_selection.pane)
        if selection == self.saved_selection:
            return
        self.saved_selection = selection
        self.run_worker(partial(save_selection, self.feed.home, selection), name="selection-save",
                        group="selection-save", thread=True, exit_on_error=False)

    def selected_status(self) -> Any:
        snapshot = self.last_snapshot
        if snapshot is None or snapshot.status is None or snapshot.selected != self.selected_session:
            return None
        return snapshot.status
