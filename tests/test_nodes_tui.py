"""The dashboard's multi-node card over real sshd hosts (tests/_ssh_support.py): a 2-node TP4 emulator server
on h2 (127.0.0.2) and h3 (127.0.0.3) shows as one card with a line per node and each rank's arrival, at 80x24
and 200x50; h3's sshd going away shows node 1 unreachable while the dashboard keeps polling and answering."""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from tests._nodes_support import free_port_on
from tests._tui_support import first_poll, screen_text, wait_until
from tests.test_hosts import cli
from tests.test_nodes_ssh import two_node_profile


def card(app: Eagle3App) -> str:
    return app.dashboard.query_one("#nodes").shown.plain if app.dashboard else ""


def line_of(text: str, node: int) -> str:
    found = re.search(rf"^ node {node} .*$", text, re.MULTILINE)
    return found.group(0) if found else ""


def test_two_node_server_is_one_card_with_a_line_per_node_at_80x24_and_200x50(
        ssh_hosts, home, cli_env, small_model_dir: Path, tmp_path: Path) -> None:
    from tests.conftest import LaunchedSessions

    port = free_port_on(("127.0.0.2", "127.0.0.3"))
    two_node_profile(home.profiles_dir / "two-node.toml", small_model_dir, port)
    remotes = {name: LaunchedSessions(ssh_hosts.homes[name]) for name in ("h2", "h3")}
    try:
        launched = cli(["launch", "two-node"], cli_env)
        assert launched.returncode == 0, launched.stderr
        node_id = launched.stdout.split()[0]
        record = json.loads((home.state_root / "nodes" / f"{node_id}.json").read_text())
        for n in record["nodes"]:
            remotes[n["host"]].track(n["session_id"])

        def ready(app: Eagle3App) -> bool:
            return (f"{node_id} two-node · TP4 over 2 nodes · ready" in card(app)
                    and "serving" in line_of(card(app), 1))

        async def small() -> None:
            app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
            async with app.run_test(size=(80, 24)) as pilot:
                await first_poll(pilot, app)
                await wait_until(pilot, lambda: ready(app), "the 2-node server ready on the card")
                text = screen_text(app)
                (tmp_path / "nodes-80x24.txt").write_text(text)
                assert "Multi-node · 1 live" in text
                rows = [row for row in text.splitlines() if re.search(r" node [01] h[23] ", row)]
                assert len(rows) == 2, text  # one card, a line per node, even at 80 columns
                assert re.search(r"node 0 h2\s+TP0–1\s+ready", rows[0]) and re.search(r"node 1 h3\s+TP2–3\s+serving", rows[1])

        async def large() -> None:
            app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
            async with app.run_test(size=(200, 50)) as pilot:
                await first_poll(pilot, app)
                await wait_until(pilot, lambda: ready(app), "the 2-node server ready on the card")
                text = screen_text(app)
                (tmp_path / "nodes-200x50.txt").write_text(text)
                assert re.search(r"node 0 h2\s+TP0–1\s+ready\s+begin 2/2 ends 2/2\s+TP0✓ TP1✓", text), text
                assert re.search(r"node 1 h3\s+TP2–3\s+serving\s+begin 2/2 ends 2/2\s+TP2✓ TP3✓", text), text
                assert "· ready · node 0 serves, 1 worker node(s) alive" in text

                ssh_hosts.servers["h3"].stop()  # h3 is gone: its line says so, the rest goes on
                await wait_until(pilot, lambda: "unreachable" in line_of(card(app), 1), "node 1 shown unreachable")
                node1 = line_of(card(app), 1)
                assert "TP2✓ TP3✓" in node1 and "last answer" in node1  # what it said last, and how old
                assert "ready" in line_of(card(app), 0)
                polls = app.dashboard.poll_count
                await pilot.press("3")
                await wait_until(pilot, lambda: app.focused is not None and app.focused.id == "gpu-pane",
                                 "key 3 focused the GPU pane")
                await wait_until(pilot, lambda: app.dashboard.poll_count >= polls + 3, "three more polls")
                (tmp_path / "nodes-h3-lost-200x50.txt").write_text(screen_text(app))
                ssh_hosts.servers["h3"].start()
                await wait_until(pilot, lambda: "serving" in line_of(card(app), 1), "node 1 back")
                await wait_until(pilot, lambda: "no answer" not in line_of(card(app), 1) and
                                 "unreachable" not in card(app), "node 1 answering again")

                ssh_hosts.servers["h3"].pause()  # h3 hangs: node 1's call is out, the card says how long
                try:
                    await wait_until(pilot, lambda: "no answer for" in line_of(card(app), 1)
                                     or "unreachable" in line_of(card(app), 1), "node 1 shown not answering")
                    assert "ready" in line_of(card(app), 0) and "no answer" not in line_of(card(app), 0)
                    await pilot.press("2")
                    await wait_until(pilot, lambda: app.focused is not None and app.focused.id == "sessions",
                                     "key 2 answered while h3 hangs")
                finally:
                    ssh_hosts.servers["h3"].resume()
                await wait_until(pilot, lambda: "serving" in line_of(card(app), 1) and
                                 "no answer" not in line_of(card(app), 1), "node 1 answering after the hang")

                stopped = cli(["nodes", "stop", node_id, "--json"], cli_env)
                assert stopped.returncode == 0, stopped.stderr
                await wait_until(pilot, lambda: f"{node_id} two-node · TP4 over 2 nodes · stopped" in card(app),
                                 "the card shows it stopped")
                assert "stopped" in line_of(card(app), 0) and "stopped" in line_of(card(app), 1)
                assert "Multi-node · 0 live of 1" in screen_text(app)

        asyncio.run(small())
        asyncio.run(large())
    finally:
        for remote in remotes.values():
            remote.cleanup()
