"""The Textual app: `Eagle3App` (dashboard, keymap, command palette, SSH hygiene) and `run_tui(demo)`.

SSH life: the servers run in their own sessions (sessions.server), so nothing the TUI does on exit
reaches them; quitting only leaves.  When the terminal goes away (SIGHUP, or the TTY no longer
answering, as on a dropped SSH link) the app exits at once instead of spinning on a dead input
(dolphie's TTY watch; VoxTerm PR#143).

This module imports no engine module that pulls torch, transformers or sglang (tests check it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import termios
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.driver import Driver

from app.keymap import (
    APP_KEYS,
    DASHBOARD_KEYS,
    PALETTE_NAMES,
    bindings,
    effective_keys,
    key_label,
    load_keymap,
)
from app.typeahead import TypeAheadApp

if TYPE_CHECKING:
    from app.screens.dashboard import DashboardScreen
    from sessions.gpus import GpuSource
    from sessions.home import Home

TTY_CHECK_S = 2.0
HANGUP_EXIT_DEADLINE_S = 5.0


class ActionsProvider(Provider):
    """Command palette entries for every dashboard action, plus one per profile and session."""

    def _commands(self) -> list[tuple[str, Callable[[], Any], str]]:
        app = self.app
        if not isinstance(app, Eagle3App) or app.dashboard is None:  # this provider is Eagle3App's only
            return []
        dashboard = app.dashboard
        keys = effective_keys(app.user_keymap)  # as remapped in config [keys]: the palette shows what works
        commands: list[tuple[str, Callable[[], Any], str]] = []
        for spec in APP_KEYS + DASHBOARD_KEYS:
            if spec.id == "app.command_palette":
                continue
            target = app if spec.id.startswith("app.") else dashboard
            commands.append((PALETTE_NAMES.get(spec.id, spec.description), partial(target.run_action, spec.action),
                             f"{spec.help or spec.description} ({key_label(keys[spec.id])})"))
        commands.append(("Clear log filter", lambda: dashboard.set_log_filter(None), "Show every line again"))
        snapshot = dashboard.last_snapshot
        if snapshot is not None:
            for entry in snapshot.profiles:
                commands.append(
                    (
                        f"Launch profile {entry.name}",
                        _launch_named(dashboard, entry.name),
                        "Start this profile as a detached server",
                    )
                )
            for session in snapshot.sessions:
                commands.append(
                    (
                        f"Show session {session.session_id}",
                        _select_session(dashboard, session.session_id),
                        f"{session.state} · {session.profile}",
                    )
                )
        return commands

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)


def _launch_named(dashboard: DashboardScreen, name: str) -> Callable[[], None]:
    return lambda: dashboard.launch_profile(name)


def _select_session(dashboard: DashboardScreen, session_id: str) -> Callable[[], None]:
    return lambda: dashboard.select_session(session_id)


class Eagle3App(TypeAheadApp[int]):
    """The eagle3-tui control panel; keys typed ahead land on the screen the keys before them opened
    (`app.typeahead`)."""

    TITLE = "eagle3-tui"
    BINDINGS = bindings(APP_KEYS)
    COMMANDS = TypeAheadApp.COMMANDS | {ActionsProvider}
    # The dashboard's workers that may end in a y/N question: keys typed after l, r or c wait for them.
    KEYS_WAIT_FOR_WORKERS = frozenset({"launch", "restart-diff", "capture-preview"})

    def __init__(
        self,
        home: Home,
        demo: bool = False,
        gpu_source: GpuSource | None = None,
        refresh_s: float = 1.0,
        watch_tty: bool | None = None,
        node_resolver: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__()
        # How multi-node servers' nodes are reached (`sessions.server.nodes.NodeResolver`): hosts.toml over
        # ssh unless given (the screenshots' nodes are local homes reached with LocalLink).
        self._node_resolver = node_resolver
        self.home = home
        self.demo = demo
        self._gpu_source = gpu_source
        self.refresh_s = refresh_s
        self._watch_tty = watch_tty
        self.dashboard: DashboardScreen | None = None
        self.host_monitor: Any = None  # sessions.remote.monitor.HostMonitor while hosts.toml names hosts
        self.nodes_monitor: Any = None  # sessions.server.nodes_monitor.NodesMonitor (multi-node sessions)
        self.keymap_problems: list[str] = []
        self.user_keymap: dict[str, str] = {}
        self.hangup_received = False
        self.crash_file: Path | None = None

    def get_driver_class(self) -> type[Driver]:
        """Textual's driver, except on Linux/macOS terminals: the one that ignores bytes that are not UTF-8
        (`app.terminal_input`; Textual's own exits the app on one 0xFF byte)."""
        driver_class = super().get_driver_class()
        from textual.drivers.linux_driver import LinuxDriver

        if driver_class is LinuxDriver:
            from app.terminal_input import ByteSafeLinuxDriver

            return ByteSafeLinuxDriver
        return driver_class

    def on_mount(self) -> None:
        from app.feed import DashboardFeed
        from app.screens.dashboard import DashboardScreen
        from sessions.gpus import default_gpu_source

        keymap, problems = load_keymap(self.home.config_file)
        self.user_keymap = keymap
        if keymap:
            self.set_keymap(keymap)
        self.keymap_problems = [str(p) for p in problems]
        if self._gpu_source is None:
            self._gpu_source = default_gpu_source(self.home, self.demo)
        initial = None
        if self.demo:
            from sessions.demo import HEALTHY_PROFILE

            initial = HEALTHY_PROFILE
        from app.selection import load_selection

        self.dashboard = DashboardScreen(
            DashboardFeed(self.home, self._gpu_source, self._host_monitor(), self._nodes_monitor()),
            demo=self.demo,
            refresh_s=self.refresh_s,
            initial_profile=initial,
            initial=load_selection(self.home),  # reattach: the last TUI's selection and focused pane
        )
        self.push_screen(self.dashboard)
        for problem in self.keymap_problems:
            self.notify(problem, title="config.toml [keys]", severity="error", timeout=20)
        if self.demo:
            from sessions.demo import demo_note

            note = demo_note(self.home)  # the capture demo was skipped (torch & co. missing): say why, once
            if note:
                self.notify(note, title="demo", severity="warning", timeout=20)
        if self._should_watch_tty():
            self._install_hangup_handlers()

    def _host_monitor(self) -> Any:
        """The other hosts' monitor (its threads start now), or None while hosts.toml names none; a bad
        hosts.toml is said once and the dashboard runs without them."""
        from sessions.remote.hosts import HostsError, load_hosts
        from sessions.remote.monitor import HostMonitor

        try:
            hosts = load_hosts(self.home)
        except HostsError as exc:
            self.notify(str(exc), title="hosts.toml", severity="error", timeout=20)
            return None
        if not hosts:
            return None
        self.host_monitor = HostMonitor(hosts, self.home).start()
        return self.host_monitor

    def _nodes_monitor(self) -> Any:
        """The multi-node sessions' monitor: its lister thread looks at <state>/nodes/ and asks each node of
        a live record over its own link (hosts.toml), never on the UI thread."""
        from sessions.server.nodes import ssh_resolver
        from sessions.server.nodes_monitor import NodesMonitor

        factory = self._node_resolver or (lambda: ssh_resolver(self.home))
        self.nodes_monitor = NodesMonitor(self.home, factory).start()
        return self.nodes_monitor

    def _handle_exception(self, error: Exception) -> None:
        """Something escaped anyway: keep its traceback in a crash file in the state dir, then let Textual
        end the app as it always does.  `run_tui` tells the user the path; servers and jobs run on."""
        if self.crash_file is None:
            self.crash_file = write_crash_file(self.home, error)
        super()._handle_exception(error)

    def on_unmount(self) -> None:
        for bench in self._compares():  # however the app ends (a signal, a second q): end them, stopping
            bench.end_compare()         # what they launched (the process waits for those worker threads)
        if self._gpu_source is not None:
            self._gpu_source.close()
        if self.nodes_monitor is not None:
            self.nodes_monitor.close()  # its threads end at their next wait; the nodes' servers run on
        if self.host_monitor is not None:
            self.host_monitor.close()  # its shared ssh connections end; the servers there run on

    def _compares(self) -> list[Any]:
        """The bench screens on the stack whose compare still runs (it may have launched servers)."""
        from app.screens.bench import BenchScreen

        return [s for s in self.screen_stack if isinstance(s, BenchScreen) and s.comparing]

    async def action_quit(self) -> None:
        """Quit; a running compare first ends and stops the servers it launched (shown on its screen), then
        the app exits.  Servers that the user launched keep running, as always.  A second q quits at once
        (on_unmount still ends the compare, and the process waits for its stops)."""
        for bench in self._compares():
            if bench.end_compare(then=self.exit):
                return
        self.exit()

    def action_command_palette(self) -> None:
        """Open the palette (ctrl+p): Textual's, with a burst-safe input and a page-safe list."""
        from app.palette import SafeCommandPalette

        # CommandPalette.is_open takes App[object], and App is invariant in its return type (App[int] here).
        if self.use_command_palette and not SafeCommandPalette.is_open(self):  # type: ignore[arg-type]
            self.push_screen(SafeCommandPalette(id="--command-palette"))

    def action_help(self) -> None:
        from app.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.user_keymap, self.home.config_file))

    # -- SSH life -------------------------------------------------------------------------------------------

    def _should_watch_tty(self) -> bool:
        if self._watch_tty is not None:
            return self._watch_tty
        return not self.is_headless

    def _install_hangup_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        handlers = {signal.SIGHUP: self._hangup, signal.SIGTERM: lambda: self.exit(0)}
        for sig, handler in handlers.items():
            try:
                loop.add_signal_handler(sig, handler)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        self.set_interval(TTY_CHECK_S, self._check_tty, name="tty-watch")

    def _hangup(self) -> None:
        """The terminal is gone (SIGHUP, or the TTY stopped answering): leave now.

        The servers run on in their own sessions.  The exit must not write to the dead terminal: Textual's
        writer thread dies on the first EIO, and its bounded queue then blocks the UI thread for good (seen
        with textual 8.2.8), so output goes to /dev/null first.  A last-resort timer ends the process if
        the orderly exit still gets stuck.
        """
        if self.hangup_received:
            return
        self.hangup_received = True
        if not terminal_alive():
            self._detach_output()
        for bench in self._compares():
            bench.end_compare()
        threading.Thread(
            target=_exit_after, args=(HANGUP_EXIT_DEADLINE_S, self._compares), name="hangup-deadline",
            daemon=True,
        ).start()
        self.exit(0)

    def _detach_output(self) -> None:
        try:
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives until the process ends
        except OSError:
            pass
        driver = self._driver
        if getattr(driver, "_writer_thread", None) is None:
            return
        from textual.drivers._writer_thread import WriterThread

        sink = WriterThread(open(os.devnull, "w"))  # noqa: SIM115 - closed with the process
        sink.start()
        driver._writer_thread = sink  # type: ignore[union-attr]

    def _check_tty(self) -> None:
        if not terminal_alive():
            self._hangup()


COMPARE_CLEANUP_DEADLINE_S = 120.0


def _exit_after(seconds: float, busy: Callable[[], list[Any]] = list) -> None:
    """End the process after ``seconds``, later while ``busy()`` (a compare still stopping the servers it
    launched: cutting that short would leave them running), but never past the cleanup deadline."""
    time.sleep(seconds)
    deadline = time.monotonic() + COMPARE_CLEANUP_DEADLINE_S
    while time.monotonic() < deadline:
        try:
            if not busy():
                break
        except Exception:  # noqa: BLE001 - the app is half torn down: stop waiting for it
            break
        time.sleep(0.2)
    os._exit(0)


def terminal_alive(fd: int | None = None) -> bool:
    """False once the controlling terminal hung up (tcgetattr fails with EIO/ENOTTY/EBADF)."""
    if fd is None:
        try:
            if sys.__stdin__ is None:  # started without a stdin at all
                return False
            fd = sys.__stdin__.fileno()
        except (ValueError, OSError):
            return False
    try:
        termios.tcgetattr(fd)
        os.fstat(fd)
    except (termios.error, OSError):
        return False
    return True


def write_crash_file(home: Home, error: BaseException) -> Path | None:
    """Write ``error``'s traceback to ``<state>/crashes/tui-<time>-<pid>.txt`` (0600); its path, or None
    when even that fails (the traceback still reaches the terminal through Textual)."""
    import traceback

    from sessions.home import atomic_write_text, ensure_private_dir

    try:
        folder = ensure_private_dir(home.state_root / "crashes")
        path = folder / f"tui-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
        from sessions.redaction import redact_text

        # An exception's message may quote a command line or a URL: the crash file is kept redacted too.
        text = redact_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))
        atomic_write_text(path, f"eagle3-tui crashed at {time.strftime('%Y-%m-%d %H:%M:%S')}\n\n{text}")
    except Exception:  # noqa: BLE001 - the crash report must never raise a second error
        return None
    return path


def exit_message(app: Eagle3App) -> str | None:
    """What the terminal shows after the TUI closed: the servers that keep running, and the crash file."""
    from sessions.server import FINAL_STATES

    lines = []
    snapshot = app.dashboard.last_snapshot if app.dashboard is not None else None
    live = [s for s in (snapshot.sessions if snapshot is not None else ()) if s.state not in FINAL_STATES]
    if live:
        names = ", ".join(f"{s.session_id} ({s.profile}{f' :{s.port}' if s.port else ''})" for s in live)
        lines.append(
            f"eagle3-tui: {len(live)} server{'s keep' if len(live) != 1 else ' keeps'} running: {names}. "
            "`eagle3-tui stop SESSION` stops one; `eagle3-tui` reattaches."
        )
    if app.crash_file is not None:
        lines.append(f"eagle3-tui: the TUI hit an unexpected error; the traceback is in {app.crash_file}")
        if not live:
            lines.append("eagle3-tui: servers and jobs keep running; `eagle3-tui status` lists them.")
    return "\n".join(lines) or None


def run_tui(demo: bool = False) -> int:
    """Open the TUI on the normal home, or on the demo home (created on first use) with ``demo``."""
    from sessions.home import resolve_home

    if demo:
        from sessions.demo import ensure_demo_home, say_on_stderr

        # Before the TUI takes the screen: the first start writes the tiny model, and says so meanwhile.
        resolved = ensure_demo_home(resolve_home(demo=True), progress=say_on_stderr)
    else:
        resolved = resolve_home().ensure()
    app = Eagle3App(resolved, demo=demo)
    app.run()
    message = exit_message(app)
    if message and not app.hangup_received:  # after a hangup nobody is there to read it (and EIO)
        try:
            print(message, file=sys.stderr)
        except OSError:
            pass
    return app.return_code or 0
