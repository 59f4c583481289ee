"""Render every screen of the real app in demo mode to screenshots/ (SVG, and PNG for the README).

The app runs headless under Pilot on a private demo home, against live emulator sessions (the demo's own
profiles, on free ports), and is driven with keys the way a user would: launch the healthy profile,
watch it start and become ready, filter the log, go full-screen, open help, edit the profile, ask for a
restart (the flag diff), then launch the profile that hangs after weights and wait until it is stalled;
diagnose, capture and jobs are shot when those parts are present.  Each screen is saved at 80x24 and
200x50.  PNGs are made with cairosvg when it is installed, else with librsvg's ``rsvg-convert``.

    python screenshots/make_screenshots.py [--out screenshots] [--sizes 80x24,200x50]
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

_TEXT = re.compile(
    r'(<text\b[^>]*?\bx=")([\d.]+)("[^>]*?\btextLength=")([\d.]+)("[^>]*>)((?:&#160;)+)([^<]*</text>)'
)


def svg_for_png(svg: str) -> str:
    """cairosvg drops leading non-breaking spaces of a <text> run and so shifts it left by that many cells;
    move the run's x right instead (Textual sets every run's x and textLength, so the cell width is known)."""

    def shift(match: re.Match[str]) -> str:
        pad = match.group(6).count("&#160;")
        rest = match.group(7)[: -len("</text>")]
        cells = pad + len(html.unescape(rest))
        width = float(match.group(4))
        cell = width / cells if cells else 0.0
        x = float(match.group(2)) + pad * cell
        return (
            f"{match.group(1)}{x:.1f}{match.group(3)}{width - pad * cell:.1f}{match.group(5)}{match.group(7)}"
        )

    # Textual names "Fira Code" (embedded as a web font cairosvg cannot load) and falls back to a proportional
    # face; a local monospace font keeps the columns.
    svg = svg.replace("font-family: Fira Code, monospace;", "font-family: DejaVu Sans Mono, monospace;")
    return _TEXT.sub(shift, svg)


def to_png(svg_path: Path, columns: int) -> Path | None:
    """The PNG beside ``svg_path``: with cairosvg when installed, else with librsvg's ``rsvg-convert``."""
    png_path = svg_path.with_suffix(".png")
    width = min(2000, columns * 10)
    svg = svg_for_png(svg_path.read_text())
    try:
        import cairosvg
    except ImportError:
        import shutil
        import subprocess

        rsvg = shutil.which("rsvg-convert")
        if rsvg is None:
            return None
        subprocess.run([rsvg, "--width", str(width), "--format", "png", "--output", str(png_path)],
                       input=svg.encode(), check=True, timeout=120)
        return png_path
    cairosvg.svg2png(bytestring=svg.encode(), write_to=str(png_path), output_width=width)
    return png_path


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Shooter:
    def __init__(self, app, pilot, out: Path, sizes: list[tuple[int, int]], base: tuple[int, int]) -> None:
        self.app, self.pilot, self.out, self.sizes, self.base = app, pilot, out, sizes, base
        self.made: list[Path] = []

    async def wait(self, condition, what: str, limit_s: float = 120.0):
        deadline = time.monotonic() + limit_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise SystemExit(f"make_screenshots: never happened within {limit_s:.0f} s: {what}")
            await self.pilot.pause(0.1)

    async def polls(self, count: int = 1) -> None:
        dashboard = self.app.dashboard
        target = dashboard.poll_count + count
        await self.wait(lambda: dashboard.poll_count >= target or not dashboard.is_active, "a poll")
        await self.pilot.pause()

    async def shoot(self, name: str) -> None:
        for columns, rows in self.sizes:
            await self.pilot.resize_terminal(columns, rows)
            await self.pilot.pause(0.3)
            if self.app.dashboard.is_active:
                await self.polls(1)
            await self.pilot.pause()
            svg = self.out / f"{name}-{columns}x{rows}.svg"
            self.app.save_screenshot(filename=svg.name, path=str(self.out))
            self.made.append(svg)
            png = to_png(svg, columns)
            if png is not None:
                self.made.append(png)
            print(f"  {svg.name}" + (f" + {png.name}" if png else ""), file=sys.stderr)
        await self.pilot.resize_terminal(*self.base)
        await self.pilot.pause(0.2)


def _status(app):
    snapshot = app.dashboard.last_snapshot
    return snapshot.status if snapshot is not None else None


async def scenario(out: Path, sizes: list[tuple[int, int]]) -> list[Path]:
    from textual.widgets import Input

    from app.screens.bench import BenchScreen
    from app.screens.profile_editor import ProfileEditorScreen
    from app.tui import Eagle3App
    from sessions.demo import (
        CAPTURE_PROFILE,
        HANG_PROFILE,
        HEALTHY_PROFILE,
        demo_job_spec_path,
        ensure_demo_home,
    )
    from sessions.home import resolve_home
    from sessions.profiles import load_profile, save_profile
    from widgets.confirm_modal import ConfirmModal

    home = ensure_demo_home(resolve_home(demo=True))
    names = [HEALTHY_PROFILE, HANG_PROFILE]
    capture_demo = (home.profiles_dir / f"{CAPTURE_PROFILE}.toml").is_file()  # absent without torch & co.
    if capture_demo:
        names.append(CAPTURE_PROFILE)
    for name in names:  # free ports: the demo's own may be taken here
        save_profile(load_profile(name, home).with_changes(server={"port": free_port()}))
    if capture_demo:  # the demo job spec is written from the capture profile's port: write it again
        demo_job_spec_path(home).unlink(missing_ok=True)
        ensure_demo_home(home)
    app = Eagle3App(home, demo=True, refresh_s=0.5)
    base = max(sizes)
    async with app.run_test(size=base) as pilot:
        shot = Shooter(app, pilot, out, sizes, base)
        await shot.wait(lambda: app.dashboard is not None and app.dashboard.poll_count >= 1, "the first poll")
        await shot.shoot("dashboard-idle")

        await pilot.press("l")  # launch the healthy profile (selected first)
        await shot.wait(
            lambda: (
                (s := _status(app))
                and s.summary.progress is not None
                and s.summary.progress.label == "shards"
                and s.summary.progress.done >= 10
            ),
            "weights loading",
        )
        await shot.shoot("dashboard-starting")
        await shot.wait(lambda: (s := _status(app)) and s.state == "ready", "the healthy session is ready")
        await shot.polls(2)
        await shot.shoot("dashboard-ready")

        await pilot.press("b")  # the one-key bench of the ready Kimi session (modelled at 90 tok/s)
        bench = await shot.wait(lambda: isinstance(app.screen, BenchScreen) and app.screen, "the bench screen")
        await shot.wait(lambda: bench.last_result is not None or not bench.running, "the bench done", 300)
        await shot.shoot("bench")
        await pilot.press("escape")
        await shot.wait(lambda: app.screen is app.dashboard, "back on the dashboard")

        await pilot.press("slash")
        await pilot.press(*"Load weight end")
        await pilot.press("enter")
        await shot.wait(lambda: not app.dashboard.query_one("LogView").filter_scanning, "the filter scan")
        await shot.shoot("log-filter")
        await pilot.press("4", "escape")

        await pilot.press("f")
        await shot.shoot("log-fullscreen")
        await pilot.press("f")

        await pilot.press("question_mark")
        await shot.shoot("help")
        await pilot.press("escape")

        await pilot.press("1", "e")
        await shot.wait(
            lambda: isinstance(app.screen, ProfileEditorScreen) and app.screen.last_check, "the editor"
        )
        editor = app.screen
        editor.query_one("#mem_fraction_static", Input).value = "0.8"
        await shot.wait(lambda: "--mem-fraction-static 0.8" in editor.last_check.preview, "the new preview")
        await shot.shoot("editor")
        await pilot.press("ctrl+s")
        await shot.wait(lambda: not editor.dirty, "saved")
        await pilot.press("escape")
        await shot.wait(lambda: app.screen is app.dashboard, "back on the dashboard")

        await pilot.press("r")
        await shot.wait(lambda: isinstance(app.screen, ConfirmModal), "the restart question")
        await shot.shoot("restart-confirm")
        await pilot.press("n")

        await pilot.press("s")  # stop the healthy one first: both would not fit on the same 8 GPUs
        await shot.wait(lambda: isinstance(app.screen, ConfirmModal), "the stop question")
        await pilot.press("y")
        await shot.wait(lambda: (s := _status(app)) and s.state == "stopped", "stopped", limit_s=90)
        await pilot.press("1", "down", "l")  # the profile that hangs after weights
        await shot.wait(
            lambda: (s := _status(app)) and s.profile == HANG_PROFILE and s.state == "stalled",
            "the hanging session is stalled",
            limit_s=240,
        )
        await shot.polls(1)
        await shot.shoot("dashboard-hang")

        try:
            from app.screens.diagnose import DiagnoseScreen
        except ImportError:
            DiagnoseScreen = None
        if DiagnoseScreen is not None:
            await pilot.press("d")
            await shot.wait(lambda: isinstance(app.screen, DiagnoseScreen), "the diagnose screen")
            diagnose = app.screen
            await shot.wait(lambda: diagnose.diagnosis is not None or diagnose.error, "the diagnosis", 180)
            await pilot.pause(0.5)
            await shot.shoot("diagnose")
            await pilot.press("escape")

        await pilot.press("c")  # capture on for the hang profile: first the question with the flag diff
        await shot.wait(lambda: isinstance(app.screen, ConfirmModal), "the capture question", 60)
        await pilot.pause(0.3)
        await shot.shoot("capture-question")
        await pilot.press("y")  # the panel appears
        await shot.wait(lambda: app.dashboard.query_one("#capture-slot").display, "the capture panel", 30)
        await shot.shoot("capture")
        await pilot.press("c")
        await shot.wait(lambda: isinstance(app.screen, ConfirmModal), "the capture question (off)", 60)
        await pilot.press("y")
        await shot.wait(lambda: not app.dashboard.query_one("#capture-slot").display, "capture off again", 30)

        try:
            from app.screens.jobs import JobsScreen
        except ImportError:
            JobsScreen = None
        if JobsScreen is not None:
            await pilot.press("x")
            await shot.wait(lambda: isinstance(app.screen, JobsScreen), "the jobs screen")
            await pilot.pause(0.5)
            await shot.shoot("jobs")
            await pilot.press("escape")
        if capture_demo and JobsScreen is not None:
            await capture_and_jobs(app, pilot, shot, JobsScreen)
            await replicas_job(app, pilot, shot, JobsScreen)
        await pilot.press("q")
    return shot.made


def _screen_has(app, text: str) -> bool:
    import io

    from rich.console import Console

    console = Console(width=app.size.width, file=io.StringIO(), color_system=None, record=True)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return text in console.export_text()


async def capture_and_jobs(app, pilot, shot: Shooter, jobs_screen) -> None:
    """The tiny real model with capture on, ready ("capture active"); then the demo job running and done."""
    from sessions.demo import CAPTURE_PROFILE
    from widgets.confirm_modal import ConfirmModal

    await pilot.press("s")  # stop the hanging one (it holds the 8 emulated GPUs)
    await shot.wait(lambda: isinstance(app.screen, ConfirmModal), "the stop question")
    await pilot.press("y")
    await shot.wait(lambda: (s := _status(app)) and s.state == "stopped", "hang stopped", limit_s=90)
    await shot.polls(1)
    await shot.shoot("dashboard-stopped")
    from widgets.lists import ProfileList

    await pilot.press("1", "home")  # walk down the profile list to the capture profile, then launch it
    profiles = app.screen.query_one(ProfileList)
    for _ in range(20):
        if profiles.highlighted_id == CAPTURE_PROFILE:
            break
        await pilot.press("down")
    await pilot.press("l")
    await shot.polls(1)
    if isinstance(app.screen, ConfirmModal):  # the healthy Kimi session still holds the emulated GPUs
        await pilot.press("y")
    await shot.wait(
        lambda: (s := _status(app)) and s.profile == CAPTURE_PROFILE and s.state == "ready",
        "the capture session is ready",
        limit_s=180,
    )
    await shot.wait(lambda: _screen_has(app, "capture active"), "capture active on the panel", 60)
    await shot.polls(1)
    await shot.shoot("dashboard-capture-ready")

    await pilot.press("x", "n")
    await shot.wait(lambda: isinstance(app.screen, jobs_screen) is False, "the spec prompt")
    await pilot.pause(0.3)
    await pilot.press("enter")  # the prompt holds the demo spec
    await shot.wait(lambda: isinstance(app.screen, jobs_screen), "back on the jobs screen")
    jobs = app.screen
    await shot.wait(lambda: jobs.jobs and jobs.jobs[0].done > 0, "the demo job under way", 120)
    if jobs.jobs[0].state == "running":  # the tiny model is fast: a running bar only when caught in time
        await shot.shoot("jobs-running")
    else:
        print("  (the demo job finished before a running shot)", file=sys.stderr)
    await shot.wait(lambda: jobs.jobs and jobs.jobs[0].state in ("done", "failed"), "the demo job done", 300)
    await pilot.pause(1.5)
    await shot.shoot("jobs-done")
    await pilot.press("escape")
    await shot.wait(lambda: app.screen is app.dashboard, "back on the dashboard")


REPLICAS_PROFILE = "tiny-llama-replicas"
REPLICAS = 4


def free_port_run(count: int) -> int:
    """A base port with ``count`` free ports from it (a group's replica i listens on base + i), below Linux's
    ephemeral range (32768-60999): a port from there may be a client connection's by the time replica i
    binds it."""
    import random

    from sessions import probes

    for _ in range(50):
        base = random.randrange(20000, 32000)
        if base + count <= 65535 and all(probes.port_free("127.0.0.1", base + i) for i in range(count)):
            return base
    raise SystemExit(f"make_screenshots: found no {count} free ports in a row")


async def replicas_job(app, pilot, shot: Shooter, jobs_screen) -> None:
    """Issue 24: the tiny model as a group of four replicas (``[server] replicas = 4``, capture on), then one
    extraction job over the group (``servers = [GROUP]``): the jobs screen with a row per server, the ETA
    and the storage estimate, shot while the job runs."""
    from dataclasses import replace

    from textual.widgets import Input

    from sessions.demo import CAPTURE_PROFILE, DEMO_DATASET_NAME, demo_root, tiny_model_dir
    from sessions.extraction.progress import list_jobs
    from sessions.profiles import load_profile, save_profile
    from sessions.server import group_members, list_sessions
    from widgets.confirm_modal import ConfirmModal
    from widgets.lists import ProfileList

    home = app.home
    for session in list_sessions(home):  # the four replicas take emulated GPUs 0-3
        if session.is_alive():
            await asyncio.to_thread(session.stop, grace_s=10.0)
    # The prefill is modelled slower than the tiny model's real forwards, so the job runs long enough to be
    # shot mid-way at both sizes; the servers are otherwise the capture demo's own.
    capture = load_profile(CAPTURE_PROFILE, home)
    profile = replace(capture.with_changes(server={"port": free_port_run(REPLICAS), "replicas": REPLICAS,
                                                   "extra_args": ["--emulate-prefill-tokens-per-s", "300"]}),
                      name=REPLICAS_PROFILE, path=None)
    save_profile(profile, home=home)

    await shot.wait(lambda: app.screen is app.dashboard, "the dashboard")
    await pilot.press("1", "home")
    profiles = app.screen.query_one(ProfileList)
    await shot.wait(lambda: any(o.id == REPLICAS_PROFILE for o in profiles.options), "the profile listed", 30)
    for _ in range(30):
        if profiles.highlighted_id == REPLICAS_PROFILE:
            break
        await pilot.press("down")
    if profiles.highlighted_id != REPLICAS_PROFILE:
        raise SystemExit(f"make_screenshots: profile {REPLICAS_PROFILE} not found in the list")
    await pilot.press("l")
    await shot.polls(1)
    if isinstance(app.screen, ConfirmModal):
        await pilot.press("y")

    def group() -> list:
        ids = {s.group.group_id for s in list_sessions(home)
               if s.group is not None and s.profile_name == REPLICAS_PROFILE}
        return group_members(max(ids), home) if ids else []  # the newest group (the ids start with a time)

    def ready() -> bool:
        states = [m.status().state for m in group()]
        if any(state in ("crashed", "stopped") for state in states):
            raise SystemExit(f"make_screenshots: a replica ended before ready: {states}")
        return len(states) == REPLICAS and all(state == "ready" for state in states)

    await shot.wait(ready, "the four replicas ready", limit_s=300)
    await shot.polls(2)
    await shot.shoot("dashboard-replicas")
    group_id = group()[0].group.group_id
    spec = home.config_root / "jobs" / "demo-replicas.toml"
    spec.write_text(
        "# The demo dataset over the four replicas of tiny-llama-replicas (one shared queue of samples).\n"
        "[job]\n"
        'name = "demo-replicas"\n'
        f'servers = ["{group_id}"]\n'
        f'model_path = "{tiny_model_dir(home)}"\n'
        f'dataset = "{demo_root(home) / "datasets" / DEMO_DATASET_NAME}"\n'
        f'output_dir = "{demo_root(home) / "output" / "demo-replicas"}"\n'
        "max_length = 1024\n"
        "concurrency = 4\n")

    await pilot.press("x", "n")
    await shot.wait(lambda: not isinstance(app.screen, jobs_screen), "the spec prompt")
    await pilot.pause(0.3)
    app.screen.query_one("#spec-path", Input).value = str(spec)
    await pilot.press("enter")
    await shot.wait(lambda: isinstance(app.screen, jobs_screen), "back on the jobs screen")
    jobs = app.screen

    def running() -> bool:
        job = next((j for j in jobs.jobs if j.name == "demo-replicas"), None)
        return bool(job and job.state == "running" and len(job.servers or []) == REPLICAS
                    and all(row.get("done") for row in job.servers) and job.eta_s is not None)

    await shot.wait(running, "the job under way on all four servers", 180)
    await pilot.pause(1.5)
    await shot.shoot("jobs-replicas")
    for job in list_jobs(home):
        if job.name == "demo-replicas":
            print(f"  job {job.job_id}: {job.state} {job.done}/{job.total}", file=sys.stderr)
    await pilot.press("escape")
    await shot.wait(lambda: app.screen is app.dashboard, "back on the dashboard")


async def replicas_scenario(out: Path, sizes: list[tuple[int, int]]) -> list[Path]:
    """Only the replicas scene (``--only replicas``), on a fresh demo home."""
    from app.screens.jobs import JobsScreen
    from app.tui import Eagle3App
    from sessions.demo import CAPTURE_PROFILE, capture_demo_missing, ensure_demo_home
    from sessions.home import resolve_home

    home = ensure_demo_home(resolve_home(demo=True))
    if not (home.profiles_dir / f"{CAPTURE_PROFILE}.toml").is_file():
        raise SystemExit(f"make_screenshots: the replicas scene needs the capture demo: {capture_demo_missing()}")
    app = Eagle3App(home, demo=True, refresh_s=0.5)
    base = max(sizes)
    async with app.run_test(size=base) as pilot:
        shot = Shooter(app, pilot, out, sizes, base)
        await shot.wait(lambda: app.dashboard is not None and app.dashboard.poll_count >= 1, "the first poll")
        await replicas_job(app, pilot, shot, JobsScreen)
        await pilot.press("q")
    return shot.made


# -- one server across two nodes (issue 26) ---------------------------------------------------------------
# The nodes are this machine with their own homes, reached with `LocalLink` (our own CLI as a subprocess,
# exactly what ssh runs on a real host), at 127.0.0.1 and 127.0.0.2; hosts "gpu-a" and "gpu-b".

NODE_ADDRESSES = ("127.0.0.1", "127.0.0.2")
SMALL_MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
               "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 8192, "vocab_size": 32000, "max_position_embeddings": 4096,
               "torch_dtype": "bfloat16"}


def _port_free_on(addresses: tuple[str, ...]) -> int:
    import socket

    while True:
        port = free_port()
        try:
            for address in addresses[1:]:
                with socket.socket() as sock:
                    sock.bind((address, port))
            return port
        except OSError:
            continue


def _node_table(root: Path) -> dict:
    from sessions.remote.link import LocalLink
    from sessions.server.nodes import NodeEndpoint

    env = {"PYTHONPATH": str(REPO_ROOT), "EAGLE3_TUI_DEMO": ""}
    return {name: NodeEndpoint(name, address, LocalLink(env=env | {"EAGLE3_TUI_HOME": str(root / name)}))
            for name, address in zip(("gpu-a", "gpu-b"), NODE_ADDRESSES, strict=True)}


def _nodes_profile(home, model: Path, name: str, fault: str, time_scale: float) -> None:
    (home.profiles_dir / f"{name}.toml").write_text(f"""[server]
launcher = "emulator"
python = "{sys.executable}"
model_path = "{model}"
tp_size = 4
host = "127.0.0.1"
port = {_port_free_on(NODE_ADDRESSES)}
nnodes = 2
hosts = ["gpu-a", "gpu-b"]

[watch]
stall_after_s = 15

[emulator]
time_scale = {time_scale}
fault = "{fault}"
""")


def _shown(app, selector: str) -> str:
    """What the multi-node view's card or arrival lines draw ("" before the view has composed)."""
    from app.screens.nodes import MultiNodeScreen

    screen = app.screen
    found = screen.query(selector) if isinstance(screen, MultiNodeScreen) else None
    return found.first().shown.plain if found else ""


def _arrivals(app) -> str:
    return _shown(app, "#node-arrivals")


async def nodes_scenario(out: Path, sizes: list[tuple[int, int]], root: Path) -> list[Path]:
    """A 2-node TP4 emulator start launched with l (its view opens), the view once ready (GPU panel and
    log per node, merged log), then a node that never joins (`node-never-joins`): the rendezvous verdict and
    its diagnosis."""
    import json
    import time as clock

    from app.screens.nodes import MultiNodeScreen, NodesDiagnoseScreen
    from app.tui import Eagle3App
    from sessions.gpus import EmulatedSource
    from sessions.home import Home

    home = Home(root / "here" / "config", root / "here" / "state").ensure()
    model = root / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(SMALL_MODEL))
    _nodes_profile(home, model, "two-node", "none", 0.02)
    _nodes_profile(home, model, "two-node-never-joins", "node-never-joins", 0.02)
    table = _node_table(root)
    app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.5, node_resolver=lambda: table.__getitem__)
    base = max(sizes)
    async with app.run_test(size=base) as pilot:
        shot = Shooter(app, pilot, out, sizes, base)
        await shot.wait(lambda: app.dashboard is not None and app.dashboard.poll_count >= 1, "the first poll")
        await pilot.press("1", "l")  # two-node (first in the list)
        view = await shot.wait(lambda: isinstance(app.screen, MultiNodeScreen) and app.screen, "the view", 180)
        await shot.wait(lambda: "→" in _arrivals(app) and "n1" in _arrivals(app), "ranks arriving", 180)
        await shot.shoot("nodes-start")
        await shot.wait(lambda: "serving" in _arrivals(app), "ready on both nodes", 240)
        await shot.wait(lambda: all(g.gpus is not None for g in view.detail.gpus()), "both GPU panels", 60)
        await pilot.pause(2)
        await shot.shoot("nodes-ready")
        await pilot.press("n", "n")  # node 1's own log
        await pilot.pause(1.5)
        await shot.shoot("nodes-log-node1")
        await pilot.press("s")
        await shot.wait(lambda: not isinstance(app.screen, MultiNodeScreen), "the stop question")
        await pilot.press("y")
        await shot.wait(lambda: "stopped" in _arrivals(app), "stopped on both nodes", 180)
        await pilot.press("escape")
        await shot.wait(lambda: app.screen is app.dashboard, "back on the dashboard")

        await pilot.press("1", "down", "l")  # two-node-never-joins: gpu-b never reaches gpu-a's rendezvous
        await shot.wait(lambda: isinstance(app.screen, MultiNodeScreen), "the view", 180)
        started = clock.monotonic()
        await shot.wait(lambda: "rendezvous:" in _shown(app, "#node-card")
                        and clock.monotonic() - started > 10, "the rendezvous verdict", 240)
        await shot.shoot("nodes-never-joins")
        await pilot.press("escape")
        await shot.wait(lambda: app.screen is app.dashboard, "back on the dashboard")
        await pilot.press("5")
        await shot.polls(2)
        await shot.shoot("dashboard-nodes")
        await pilot.press("d")  # d on the focused card diagnoses the multi-node server
        diagnose = await shot.wait(lambda: isinstance(app.screen, NodesDiagnoseScreen) and app.screen,
                                   "the diagnosis screen")
        await shot.wait(lambda: diagnose.report is not None or diagnose.error, "the diagnosis", 300)
        await pilot.pause(0.5)
        await shot.shoot("nodes-diagnose")
        await pilot.press("escape")
        await pilot.press("q")
    stop_nodes_everywhere(home, table)
    return shot.made


def stop_nodes_everywhere(home, table: dict) -> None:
    from sessions.server.nodes import NODE_ID_PREFIX, NODES_DIR, load_record
    from sessions.server.nodes_status import stop_nodes

    for path in (home.state_root / NODES_DIR).glob(f"{NODE_ID_PREFIX}*.json"):
        try:
            stop_nodes(load_record(home, path.stem), table.__getitem__, home, grace_s=10.0)
        except Exception as exc:  # noqa: BLE001 - said; the next record is stopped anyway
            print(f"make_screenshots: stopping {path.stem}: {exc}", file=sys.stderr)


def stop_everything(home_root: str) -> None:
    from sessions.home import resolve_home
    from sessions.server import list_sessions

    home = resolve_home(demo=True)
    assert str(home.state_root).startswith(home_root)
    try:
        from sessions.extraction.job import cancel_job
        from sessions.extraction.progress import list_jobs

        for job in list_jobs(home):
            if job.state not in ("done", "failed", "cancelled", "interrupted"):
                cancel_job(job.job_id, home, grace_s=10.0)
    except ImportError:
        pass
    for session in list_sessions(home):
        if session.is_alive():
            session.stop(grace_s=10.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "screenshots")
    parser.add_argument("--sizes", default="80x24,200x50", help="comma-separated COLSxROWS")
    parser.add_argument("--only", choices=("demo", "nodes", "replicas"), default=None,
                        help="only the demo's screens, only the multi-node ones, or only the job over four replicas "
                        "(jobs-replicas-*, dashboard-replicas-*); default: the demo's and the multi-node ones")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eagle3-screens-") as root:
        os.environ["EAGLE3_TUI_HOME"] = root
        os.environ["EAGLE3_TUI_DEMO"] = "1"
        os.environ.setdefault("TZ", "UTC")
        made = []
        if args.only == "replicas":
            try:
                made += asyncio.run(replicas_scenario(args.out, sizes))
            finally:
                stop_everything(root)
        if args.only in (None, "demo"):
            try:
                made += asyncio.run(scenario(args.out, sizes))
            finally:
                stop_everything(root)
        if args.only in (None, "nodes"):
            made += asyncio.run(nodes_scenario(args.out, sizes, Path(root) / "nodes"))
    print(f"{len(made)} files in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
