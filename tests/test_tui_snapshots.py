"""A few snapshot tests at fixed sizes (text of the screen, textual==8.2.8 as pinned).

The clock is frozen where the screen shows times, and the data are fixed snapshots, so the text is the
same on every run.  Behaviour is asserted in test_tui_app.py; these catch layout regressions.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from app.tui import Eagle3App
from sessions.demo import ensure_demo_home
from sessions.gpus import GpuProcess, GpuSample, GpuSnapshot
from sessions.home import resolve_home
from sessions.phases import PhaseProgress, StartupPhase, StartupSummary
from sessions.profiles import list_profiles, load_profile, save_profile
from sessions.server import RankStatus, SessionStatus
from tests._tui_support import assert_snapshot, first_poll, run, screen_text
from widgets.gpu_panel import GpuPanel
from widgets.phase_timeline import PhaseTimeline
from widgets.state_line import StateLine

NOW = 1_800_000_000.0
GIB = 2**30


@pytest.fixture(autouse=True)
def _utc(monkeypatch):
    """Times on screen are local: pin the zone so the snapshots match everywhere."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _status(state: str = "starting", phase: str = "loading_weights") -> SessionStatus:
    ranks = tuple(
        RankStatus(
            pid=1000 + r,
            title=f"sglang::scheduler_TP{r}",
            rank=r,
            status="running" if r != 7 else "sleeping",
            cpu_percent=99.0 if r != 7 else 0.0,
            rss_bytes=2 * GIB,
            gpu_index=r,
        )
        for r in range(8)
    ) + (
        RankStatus(
            pid=1100,
            title="sglang::detokenizer",
            rank=None,
            status="sleeping",
            cpu_percent=0.0,
            rss_bytes=GIB,
            gpu_index=None,
            role="detokenizer",
        ),
    )
    summary = StartupSummary(
        phase=StartupPhase(phase),
        progress=PhaseProgress("shards", 45, 64),
        ranks_expected=8,
        rank_arrival={"init_parallel_end": tuple(range(8)), "load_weight_end": tuple(range(7))},
        line_count=217,
    )
    entered = {"launching": NOW - 300, "dist_init": NOW - 290, "loading_weights": NOW - 250}
    return SessionStatus(
        session_id="kimi-k25-tp8-20270115-080000-ab12",
        profile="kimi-k25-tp8",
        pid=999,
        create_time=NOW - 300,
        state=state,
        phase=phase,
        port=30000,
        host="127.0.0.1",
        ranks=ranks,
        log_path=Path("/x/server.log"),
        started_at=NOW - 300,
        port_listening=False,
        ready=None,
        model_info=None,
        silent_for_s=42.0,
        summary=summary,
        phase_entered_at=entered,
        alive=True,
        stall_limit_s=300.0,
    )


def _gpus() -> GpuSnapshot:
    samples = []
    for i in range(8):
        used = (60 + i) * GIB
        samples.append(
            GpuSample(
                i, "NVIDIA H200", used, 140 * GIB, 97.0 - i, 44.0, 512.0, (GpuProcess(1000 + i, used - GIB),)
            )
        )
    samples[5] = GpuSample(5, "ERROR: GPU is lost", None, None, None, lost=True)
    samples[6] = GpuSample(6, "NVIDIA H200", None, 140 * GIB, None, None, None, (GpuProcess(4242, None),))
    return GpuSnapshot(tuple(samples), "nvml", True, None, NOW)


class _Panels(App):
    def compose(self) -> ComposeResult:
        yield StateLine(id="state")
        yield PhaseTimeline(id="timeline")
        yield GpuPanel(id="gpus")

    def on_mount(self) -> None:
        status = _status(state="stalled")
        state, timeline = self.query_one(StateLine), self.query_one(PhaseTimeline)
        state.now = timeline.now = NOW
        state.update_status(status)
        timeline.update_status(status)
        owners = {r.pid: f"TP{r.rank}" for r in status.ranks if r.rank is not None}
        self.query_one(GpuPanel).update_snapshot(_gpus(), owners)


def _panels_snapshot(size: tuple[int, int], name: str) -> None:
    async def scenario() -> None:
        app = _Panels()
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            assert_snapshot(name, screen_text(app))

    run(scenario)


def test_snapshot_status_timeline_and_gpus_at_80x24():
    _panels_snapshot((80, 24), "panels-80x24")


def test_snapshot_status_timeline_and_gpus_at_200x30():
    _panels_snapshot((200, 30), "panels-200x30")


PORT_MASK = "NNNNN"


def _free_port_5_digits() -> int:
    """A port free on 127.0.0.1 now, with as many digits as the mask (so masking keeps the columns)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if len(str(port)) == len(PORT_MASK):
            return port


def _demo_app(home, seed_demo_models) -> tuple[Eagle3App, dict[str, int]]:
    """The app on the demo home, every demo profile pinned to a port checked free here (the demo's own
    31000/31010/31020 may be taken on this machine, and then the demo picks another)."""
    seed_demo_models()  # the tiny model written once per worker (conftest), not once per test
    demo_home = ensure_demo_home(resolve_home(demo=True))
    ports = {}
    for name in list_profiles(demo_home):
        ports[name] = _free_port_5_digits()
        save_profile(load_profile(name, demo_home).with_changes(server={"port": ports[name]}))
    assert len(set(ports.values())) == len(ports), ports
    return Eagle3App(demo_home, demo=True), ports


def _mask_ports(text: str, ports: dict[str, int]) -> str:
    """The pinned ports as NNNNN: a port the app shows that is not a profile's own stays visible."""
    for port in ports.values():
        text = text.replace(f":{port}", f":{PORT_MASK}")
    return text


def test_snapshot_idle_demo_dashboard_at_80x24(home, seed_demo_models):
    async def scenario() -> None:
        app, ports = _demo_app(home, seed_demo_models)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app, polls=2)
            assert_snapshot("dashboard-idle-80x24", _mask_ports(screen_text(app), ports))

    run(scenario)


def test_snapshot_help_at_80x24(home, seed_demo_models):
    async def scenario() -> None:
        app, ports = _demo_app(home, seed_demo_models)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await pilot.press("question_mark")
            await pilot.pause()
            assert_snapshot("help-80x24", _mask_ports(screen_text(app), ports))

    run(scenario)


class _OneStateLine(App):
    def __init__(self, status: SessionStatus) -> None:
        super().__init__()
        self.status = status

    def compose(self) -> ComposeResult:
        yield StateLine(id="state")

    def on_mount(self) -> None:
        line = self.query_one(StateLine)
        line.now = NOW + 3600  # long after the end: the line must not count up to now
        line.update_status(self.status)


@pytest.mark.parametrize(
    ("state", "phase", "record", "expected"),
    [
        ("stopped", "ready", {"stopped_at": NOW + 11, "ended_at": NOW + 11},
         "■ STOPPED  after 0:11 ready · stopped 08:00:11"),
        ("crashed", "loading_weights", {"ended_at": NOW + 42},
         "✖ CRASHED  after 4:52 loading_weights · crashed 08:00:42"),
        ("exited", "ready", {"ended_at": NOW + 125}, "○ EXITED  after 2:05 ready · exited 08:02:05"),
        ("stopped", "ready", {}, "■ STOPPED  in ready"),  # no record of the end: says so, no made-up time
    ],
)
def test_state_line_says_how_and_when_a_session_ended(tmp_path, state, phase, record, expected):
    # The poll reads the record (sessions.server.status.ended_at_of); the widget only draws the status and
    # never opens state.json (none exists here).
    from sessions.server.status import ended_at_of

    status = _status(state=state, phase=phase)
    entered = dict(status.phase_entered_at, ready=NOW)
    status = dataclasses.replace(status, alive=False, phase_entered_at=entered, session_dir=tmp_path,
                                 ended_at=ended_at_of(record, state))

    async def scenario() -> None:
        app = _OneStateLine(status)
        async with app.run_test(size=(120, 10)) as pilot:
            await pilot.pause()
            first = screen_text(app).splitlines()[0]
            assert first.startswith(expected), first
            assert " for " not in first, first

    run(scenario)


@pytest.mark.parametrize(
    ("launch_tp_size", "expected"),
    [(8, "ranks 0/8  (no processes)"), (None, "ranks 0  (no processes)")],
)
def test_the_ranks_of_a_session_without_processes_never_read_n_a(tmp_path, launch_tp_size, expected):
    """Issue 21: a stopped session whose log has no server_args line showed `ranks 0/n/a`."""
    status = _status(state="stopped", phase="launching")
    summary = dataclasses.replace(status.summary, ranks_expected=None, rank_arrival={})
    # the end time comes with the status (widgets never open state.json)
    status = dataclasses.replace(status, alive=False, ranks=(), summary=summary, session_dir=tmp_path,
                                 launch_tp_size=launch_tp_size, ended_at=NOW + 11)

    async def scenario() -> None:
        app = _OneStateLine(status)
        async with app.run_test(size=(120, 10)) as pilot:
            await pilot.pause()
            text = screen_text(app)
            assert expected in text and "n/a" not in text, text

    run(scenario)
