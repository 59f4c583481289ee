"""The multi-node view (app/screens/nodes.py) over real sshd hosts (tests/_ssh_support.py): a 2-node TP4 emulator
server on h2 (127.0.0.2) and h3 (127.0.0.3), launched with `l` from the TUI or by the CLI, opened from its
card (5, Enter).  The view shows a GPU panel per node (that host's GPUs, processes named by global TP rank),
the arrival timeline per rank, the log of each node (n/p switch) and the merged log (time order, prefixed
n0/n1); a node killed with SIGKILL shows as dead there; s stops the server on both nodes and frees their GPUs."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from pathlib import Path

from app.screens.nodes import MultiNodeScreen, NodesDiagnoseScreen
from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from sessions.logs import PREFIX_RE
from tests._nodes_support import free_port_on
from tests._tui_support import first_poll, screen_text, wait_until
from tests.test_hosts import cli
from tests.test_nodes_ssh import two_node_profile
from widgets.confirm_modal import ConfirmModal

ARRIVED = r"\d\d:\d\d:\d\d→\d\d:\d\d:\d\d"  # begin → ends, both logged


def toasts(app: Eagle3App) -> str:
    """The notifications shown so far (a failure says what the app said)."""
    return "\n".join(n.message for n in app._notifications)


def view_of(app: Eagle3App) -> MultiNodeScreen | None:
    return app.screen if isinstance(app.screen, MultiNodeScreen) else None


def part(app: Eagle3App, selector: str) -> str:
    view = view_of(app)
    if view is None:
        return ""
    return view.query_one(selector).shown.plain


def node_line(text: str, node: int) -> str:
    found = re.search(rf"^(?: node |n){node} .*$", text, re.MULTILINE)
    return found.group(0) if found else ""


def log_text(app: Eagle3App) -> str:
    view = view_of(app)
    return view.query_one("#node-log").visible_text() if view is not None else ""


def log_title(app: Eagle3App) -> str:
    view = view_of(app)
    return str(view.query_one("#node-log-pane").border_title) if view is not None else ""


def gpu_title(app: Eagle3App, node: int) -> str:
    view = view_of(app)
    if view is None:
        return ""
    with contextlib.suppress(Exception):
        return str(view.query_one(f"#node-gpu-pane-{node}").border_title)
    return ""


def gpu_text(app: Eagle3App, node: int) -> str:
    view = view_of(app)
    if view is None:
        return ""
    with contextlib.suppress(Exception):
        return view.query_one(f"#node-gpu-{node}").render().plain
    return ""


def held_gpus(name: str, env: dict[str, str]) -> list[int]:
    """The GPUs of host ``name`` that hold a process, as that host's own ``gpus --json`` says."""
    shown = cli(["gpus", "--json", "--host", name], env)
    assert shown.returncode == 0, shown.stderr
    return [g["index"] for g in json.loads(shown.stdout)["samples"] if g.get("processes")]


def track_record(home, node_id: str, remotes: dict) -> dict:
    record = json.loads((home.state_root / "nodes" / f"{node_id}.json").read_text())
    for n in record["nodes"]:
        if n["session_id"]:
            remotes[n["host"]].track(n["session_id"])
    return record


def test_view_launched_from_the_tui_shows_gpus_logs_and_merged_log_per_node_and_stops_both_nodes(
        ssh_hosts, home, cli_env, small_model_dir: Path) -> None:
    from tests.conftest import LaunchedSessions

    port = free_port_on(("127.0.0.2", "127.0.0.3"))
    two_node_profile(home.profiles_dir / "two-node.toml", small_model_dir, port)
    remotes = {name: LaunchedSessions(ssh_hosts.homes[name]) for name in ("h2", "h3")}

    async def run() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(200, 50)) as pilot:
            await first_poll(pilot, app)
            await pilot.press("1", "l")  # the only profile: one server across h2 and h3
            try:
                view = await wait_until(pilot, lambda: view_of(app), "the multi-node view opens after the launch")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; screens {app.screen_stack}; the app said:\n{toasts(app)}") from None
            track_record(home, view.node_id, remotes)
            await wait_until(pilot, lambda: "· ready ·" in part(app, "#node-card")
                             and "serving" in node_line(part(app, "#node-arrivals"), 1), "ready on both nodes")
            # The arrival timeline: each node's global TP ranks, begin → ends, from that node's own log.
            await wait_until(pilot, lambda: re.search(rf"n0 h2\s+TP0–1\s+ready\s+TP0 {ARRIVED} TP1 {ARRIVED}",
                                                      part(app, "#node-arrivals")), "node 0's ranks through")
            await wait_until(pilot, lambda: re.search(rf"n1 h3\s+TP2–3\s+serving\s+TP2 {ARRIVED} TP3 {ARRIVED}",
                                                      part(app, "#node-arrivals")), "node 1's ranks through")
            # A GPU panel per node: that host's GPUs, its processes named by their global TP rank.
            await wait_until(pilot, lambda: re.search(r"n1 h3 · TP2–3 · \d+ GPUs · emulated", gpu_title(app, 1))
                             and "TP2" in gpu_text(app, 1) and "TP3" in gpu_text(app, 1), "node 1's GPU panel")
            # Each node's panel is read in its own thread: node 0's may still show a reading from before its
            # ranks held memory when node 1's is through, so it is waited for too.
            await wait_until(pilot, lambda: re.search(r"n0 h2 · TP0–1 · \d+ GPUs · emulated", gpu_title(app, 0))
                             and "TP0" in gpu_text(app, 0), "node 0's GPU panel")
            assert "TP2" not in gpu_text(app, 0)
            assert "TP0" not in gpu_text(app, 1)

            # The merged log first: both nodes' lines, each prefixed with its node.
            assert log_title(app).startswith("Log merged (n0 n1)")
            await wait_until(pilot, lambda: re.search(r"n0 \[.* TP[01]\]", log_text(app))
                             and re.search(r"n1 \[.* TP[23]\]", log_text(app)), "the merged log shows both nodes")
            await pilot.press("n")  # node 0's log
            await wait_until(pilot, lambda: log_title(app).startswith("Log n0 h2")
                             and re.search(r"TP[01]\]", log_text(app)), "node 0's log")
            assert not re.search(r"TP[23]\]", log_text(app)) and not re.search(r"^[ !]{2}n\d \[", log_text(app), re.MULTILINE)
            await pilot.press("n")  # node 1's log
            await wait_until(pilot, lambda: log_title(app).startswith("Log n1 h3")
                             and re.search(r"TP[23]\]", log_text(app)), "node 1's log")
            assert not re.search(r"TP[01]\]", log_text(app))
            await pilot.press("slash", *"Init parallel ends", "enter")  # the log pane's filter works here too
            await wait_until(pilot, lambda: "filter" in log_title(app) and log_text(app).count("Init parallel ends") == 2
                             and "Load weight" not in log_text(app), "node 1's two ranks through, filtered")
            await pilot.press("escape")  # clears the filter, stays in the view
            await wait_until(pilot, lambda: "filter" not in log_title(app), "the filter cleared")
            assert view_of(app) is view
            await pilot.press("p", "p")  # back to node 0, then the merged log
            await wait_until(pilot, lambda: log_title(app).startswith("Log merged"), "p goes back to the merged log")

            # merged.log holds every line of both nodes once, in time order, each prefixed with its node.
            def merged_complete() -> list[str] | None:
                logs = view.detail.logs()
                merged = view.detail.merged_path.read_text().splitlines()
                return merged if logs and len(merged) == sum(x.lines for x in logs) and len(merged) > 20 else None

            merged = await wait_until(pilot, merged_complete, "merged.log caught up with both nodes")
            assert all(re.match(r"n[01] ", line) for line in merged), merged[:5]
            stamps = [m.group("ts") for line in merged if (m := PREFIX_RE.match(line[3:]))]
            assert stamps == sorted(stamps), "merged lines out of time order"
            for rank in (0, 1):
                own = view.detail.log_path(rank).read_text().splitlines()
                assert [line[3:] for line in merged if line.startswith(f"n{rank} ")] == own  # each node's order kept
            assert {line[:2] for line in merged} == {"n0", "n1"}

            # s stops it from the view: node 0 first, then h3; both hosts' GPUs are freed.
            assert held_gpus("h2", cli_env) == [0, 1] and held_gpus("h3", cli_env) == [0, 1]
            await pilot.press("s")
            modal = await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal) and app.screen, "the stop question")
            assert view.node_id in modal.question and "2 nodes" in modal.question
            assert "Node 0 first" in modal.detail and "node 1 (h3)" in modal.detail
            await pilot.press("y")
            await wait_until(pilot, lambda: "· stopped" in part(app, "#node-card"), "the view shows it stopped", 180)
            assert "stopped" in node_line(part(app, "#node-arrivals"), 0)
            assert "stopped" in node_line(part(app, "#node-arrivals"), 1)
            assert held_gpus("h2", cli_env) == [] and held_gpus("h3", cli_env) == []
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is app.dashboard, "Esc goes back to the dashboard")

    try:
        asyncio.run(run())
    finally:
        for remote in remotes.values():
            remote.cleanup()


def test_view_opened_from_its_card_shows_a_killed_node_dead_and_diagnoses_it(
        ssh_hosts, home, cli_env, small_model_dir: Path, tmp_path: Path) -> None:
    from sessions import probes
    from sessions.server import ServerSession
    from tests.conftest import LaunchedSessions

    port = free_port_on(("127.0.0.2", "127.0.0.3"))
    two_node_profile(home.profiles_dir / "two-node.toml", small_model_dir, port)
    remotes = {name: LaunchedSessions(ssh_hosts.homes[name]) for name in ("h2", "h3")}
    try:
        launched = cli(["launch", "two-node"], cli_env)
        assert launched.returncode == 0, launched.stderr
        node_id = launched.stdout.split()[0]
        record = track_record(home, node_id, remotes)

        async def run() -> None:
            app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
            async with app.run_test(size=(80, 24)) as pilot:
                await first_poll(pilot, app)
                await wait_until(pilot, lambda: app.dashboard.query_one("#nodes-pane").display, "the Multi-node pane")
                await pilot.press("5")
                await wait_until(pilot, lambda: app.focused is not None and app.focused.id == "nodes", "5 focuses it")
                await pilot.press("r")  # not a local session's key here: refused, names what to do instead
                await pilot.press("enter")
                await wait_until(pilot, lambda: view_of(app), "Enter opens the card's view")
                assert view_of(app).node_id == node_id
                await wait_until(pilot, lambda: "serving" in node_line(part(app, "#node-arrivals"), 1)
                                 and "TP3" in gpu_text(app, 1), "ready, node 1's GPUs shown")
                (tmp_path / "view-80x24.txt").write_text(screen_text(app))

                node1 = record["nodes"][1]["session_id"]
                session = ServerSession.load(node1, ssh_hosts.homes["h3"])
                rec = session.state_record
                victims = [rec["pid"], *(p.pid for p in probes.process_tree(rec["pid"], rec["create_time"]))]
                for pid in victims:  # node 1's server dies at once: no shutdown, no log line
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                await wait_until(pilot, lambda: "dead" in node_line(part(app, "#node-arrivals"), 1),
                                 "node 1 shown dead in the view")
                assert "crashed" in part(app, "#node-card") and "dead node: node 1 (h3" in part(app, "#node-card")
                assert "dead" not in node_line(part(app, "#node-arrivals"), 0)
                text = screen_text(app)
                (tmp_path / "view-dead-80x24.txt").write_text(text)
                assert "n1 h3" in text and "dead" in text
                await pilot.press("d")
                diag = await wait_until(pilot, lambda: isinstance(app.screen, NodesDiagnoseScreen) and app.screen,
                                        "the diagnosis screen")
                await wait_until(pilot, lambda: diag.report is not None or diag.error, "the diagnosis", 240)
                assert diag.error is None, diag.error
                assert "node 1 (h3) is dead" in diag.report["text"]
                await pilot.press("escape")
                await wait_until(pilot, lambda: view_of(app) is not None, "back in the view")

        asyncio.run(run())
    finally:
        for remote in remotes.values():
            remote.cleanup()
