"""The dashboard's launch and housekeeping actions: `l` (launch the targeted profile; the palette's
"Launch profile NAME"), the launch worker with its progress line, the GPUs-in-use question (launch anyway,
or stop the holder and launch), and `P` (prune ended sessions).

A mixin of `DashboardScreen` (kept apart so the screen module stays readable): it uses the screen's
``feed``, ``notify`` and ``poll_now``, `Targeting`'s ``target_profile`` and ``select_session``, and
`TargetActions`' ``report_failure``, ``run_action_worker`` and ``ask_then_run``.  Every wait (the launch
lock, the GPU check, the stops, prune's liveness checks) runs in a thread worker; the UI thread only asks
and draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.worker import get_current_worker

from app.screens.dashboard_actions import STOP_GRACE_S
from app.screens.dashboard_messages import SessionLaunched
from widgets.action_line import ActionLine
from widgets.confirm_modal import ChoiceModal


class LaunchActions:
    """Launch and prune for `DashboardScreen` (see the module docstring)."""

    feed: Any
    app: Any

    if TYPE_CHECKING:  # provided by Screen and DashboardScreen; never defined here (they would shadow them)
        def query_one(self, *args: Any, **kwargs: Any) -> Any: ...
        def notify(self, *args: Any, **kwargs: Any) -> Any: ...
        def post_message(self, message: Any) -> bool: ...
        def report_failure(self, what: str, exc: BaseException) -> None: ...
        def run_action_worker(self, name: str, work: Callable[..., None], *args: Any) -> None: ...
        def ask_then_run(self, question: str, detail: str, name: str, work: Callable[..., None], *args: Any,
                         notice: str | None = None) -> None: ...
        def target_profile(self) -> str | None: ...
        def select_session(self, session_id: str | None) -> None: ...
        def poll_now(self) -> None: ...

    def action_launch(self) -> None:
        self.launch_profile(self.target_profile())

    def launch_profile(self, name: str | None) -> None:
        """Launch ``name`` as a detached server (l on it; the palette's "Launch profile NAME")."""
        if not name:
            self.notify("No profile to launch: create one in <config>/profiles.", severity="warning")
            return
        self.notify(f"Launching {name}…", timeout=3)
        self._start_launch(name)

    def _start_launch(self, name: str, force: bool = False, stop_first: tuple[str, ...] = ()) -> None:
        """The launch (and the stops it was asked to do first) in a worker; the progress line shows its
        steps, the lock wait and the GPU check, so the card never looks frozen (issue 21 item 10)."""
        line = self.query_one(ActionLine)
        line.start(f"launch {name}")
        self.run_action_worker("launch", self._launch, name, line, force, stop_first)

    def _launch(self, name: str, line: ActionLine, force: bool = False, stop_first: tuple[str, ...] = ()) -> None:
        from sessions.profiles import load_profile
        from sessions.server import GpuBusy, ServerSession
        from sessions.server.launch_lock import LaunchCancelled

        worker = get_current_worker()  # line.step() only sets a field under a lock: safe from this thread
        try:
            for session_id in stop_first:
                line.step(f"stopping {session_id} (SIGTERM, then SIGKILL after {STOP_GRACE_S:.0f} s)")
                report = self.feed.session(session_id).stop(grace_s=STOP_GRACE_S)
                self.feed.forget_final(session_id)
                if not report.stopped:
                    raise RuntimeError(f"{session_id} did not stop, so {name} was not launched: {report.message}")
            profile = load_profile(name, self.feed.home)
            if profile.host is not None and profile.host != "local":
                line.step(f"launching on host {profile.host} over ssh")
                session_ids = self._launch_on_host(profile, force)
                line.finish()
                if not worker.is_cancelled:
                    self.app.call_from_thread(self._launched_on_host, session_ids, name, profile.host)
                return
            if (profile.server.nnodes or 1) > 1 and self.feed.nodes is not None:
                # One server across nodes: every node checked first, then node 0, then the others (`nodes`).
                from sessions.server.nodes import launch_nodes

                record = launch_nodes(self.feed.home, profile, self.feed.nodes.resolver_factory(), progress=line.step)
                line.finish()
                if not worker.is_cancelled:
                    self.app.call_from_thread(self._launched_across_nodes, record.node_id, name, len(record.nodes))
                return
            # A profile with replicas starts its whole group (one check of every member's GPUs first).
            members = ServerSession.launch_group(
                profile, self.feed.home, force=force, cancelled=lambda: worker.is_cancelled, progress=line.step
            )
        except LaunchCancelled:
            line.finish()
            return  # the TUI is quitting (or the worker was cancelled): nobody to tell
        except GpuBusy as exc:  # other processes hold memory on its GPUs: the user decides
            line.finish()
            if not worker.is_cancelled:
                self.app.call_from_thread(self._confirm_busy_launch, name, exc)
            return
        except Exception as exc:  # noqa: BLE001 - LaunchError/ProfileError name their fields
            line.finish()
            if not worker.is_cancelled:
                self.app.call_from_thread(self.report_failure, f"Launch of {name} refused", exc)
            return
        line.finish()
        for session in members:
            self.feed.adopt(session)
        if not worker.is_cancelled:
            self.app.call_from_thread(self._launched, members[0].session_id, name)

    def _launch_on_host(self, profile: Any, force: bool) -> list[str]:
        """``launch -`` on the profile's host (sessions.remote): the servers run there, detached."""
        from sessions.remote.client import RemoteClient
        from sessions.remote.hosts import hosts_path, load_hosts
        from sessions.remote.link import SshLink

        home = self.feed.home
        host = load_hosts(home).get(profile.host)
        if host is None:
            raise ValueError(f"host: no host {profile.host!r} in {hosts_path(home)}")
        client = RemoteClient(host, SshLink(host, home))
        client.connect()
        session_ids = client.launch_profile(profile, force=force)
        if self.feed.hosts is not None:
            self.feed.hosts.poll_now()  # the other hosts' pane shows it at once
        return session_ids

    def _launched_across_nodes(self, node_id: str, name: str, nnodes: int) -> None:
        """A multi-node launch: its view opens (per-node arrival, a GPU panel and a log per node)."""
        from app.screens.nodes import MultiNodeScreen

        self.notify(f"Launched {name} as {node_id} on {nnodes} nodes: its view follows every node (Esc: the "
                    "dashboard, where the Multi-node pane keeps its card).", title="launched", timeout=8)
        self.post_message(SessionLaunched(node_id, name))
        self.app.push_screen(MultiNodeScreen(self.feed.home, node_id, self.feed.nodes))

    def _launched_on_host(self, session_ids: list[str], name: str, host: str) -> None:
        self.notify(f"Launched {name} on host {host} as {', '.join(session_ids)}: the Other hosts pane follows it.",
                    title="launched", timeout=6)

    def _launched(self, session_id: str, name: str) -> None:
        self.notify(
            f"Launched {name} as {session_id}. The port stays closed until graphs are done.",
            title="launched",
            timeout=6,
        )
        self.post_message(SessionLaunched(session_id, name))
        self.select_session(session_id)

    def _confirm_busy_launch(self, name: str, exc: Any) -> None:
        """GPUs in use: launch anyway, or (when the holders are this home's sessions) stop them first."""
        holders = tuple(exc.holder_sessions)
        gpus = ", ".join(f"GPU{b.index}" for b in exc.busy)
        held_by = ", ".join(holders) + ("" if exc.only_sessions_hold else " and other processes") if holders else "other processes"
        detail = (f"{gpus} held by {held_by}. A server started there may run out of memory.\n\n"
                  + "\n".join(b.text() for b in exc.busy))
        choices = [("force", "Launch anyway (y)")]
        if holders:
            # The question names the holders; the button stays short so all three answers fit at 80 columns.
            choices.append(("stop", "Stop it and launch (s)" if len(holders) == 1 else "Stop them and launch (s)"))
            if not exc.only_sessions_hold:
                detail += "\nProcesses outside this home's sessions hold memory too: stopping its sessions may not be enough."
        in_use_by = f" by {', '.join(holders)}" if holders else ""

        def answered(choice: str | None) -> None:
            if choice == "force":
                self._start_launch(name, force=True)
            elif choice == "stop":
                self._start_launch(name, stop_first=holders)

        self.app.push_screen(ChoiceModal(f"Launch {name} on GPUs in use{in_use_by}?", detail, choices), answered)

    # -- actions: housekeeping ------------------------------------------------------------------------------

    def action_prune(self) -> None:
        """P: list the ended sessions prune would remove (in a worker: it checks every server), ask y/N."""
        self.run_action_worker("prune-plan", self._prune_plan)

    def _prune_plan(self) -> None:
        from sessions.server.prune import plan_prune

        try:
            plan = plan_prune(self.feed.home)
        except Exception as exc:  # noqa: BLE001
            self.app.call_from_thread(self.report_failure, "Prune failed", exc)
            return
        self.app.call_from_thread(self._confirm_prune, plan)

    def _confirm_prune(self, plan: Any) -> None:
        if not plan.to_remove:
            self.notify(f"Nothing to prune: {len(plan.kept)} kept, {len(plan.running)} running.", timeout=5)
            return
        lines = [f"remove {i.session_id} ({i.state})" for i in plan.to_remove]
        lines += [f"keep   {i.session_id}: {i.why}" for i in plan.kept]
        if plan.running:
            lines.append(f"running, never pruned: {', '.join(plan.running)}")
        self.ask_then_run(f"Remove {len(plan.to_remove)} ended session folder(s)?", "\n".join(lines), "prune",
                          self._prune, plan)

    def _prune(self, plan: Any) -> None:
        from sessions.server.prune import prune

        try:
            removed, problems = prune(self.feed.home, plan)
        except Exception as exc:  # noqa: BLE001 - a lock timeout names the holder
            self.app.call_from_thread(self.report_failure, "Prune failed", exc)
            return
        for session_id in removed:
            self.feed.forget_final(session_id)
        text = f"Removed {len(removed)} session folder(s)." + ("\n" + "\n".join(problems) if problems else "")
        self.app.call_from_thread(self.notify, text, title="prune", severity="warning" if problems else "information")
        self.app.call_from_thread(self.poll_now)

