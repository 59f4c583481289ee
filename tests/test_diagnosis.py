"""Hang diagnosis end to end: real emulator sessions at TP4, real py-spy, real hints, a redacted bundle.

The emulator's faults block every rank in named functions (sessions/emulator/ranks.py): after the
weights in ``all_reduce`` <- ``get_available_gpu_memory`` <- ``init_memory_pool``; with one rank missing
that rank in ``_read_shard`` while the others wait in ``all_reduce``; in graph capture in
``capture_one_batch_size``.  py-spy must show exactly those.
"""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sessions.diagnosis import diagnose, format_report, write_bundle
from sessions.history import last_good
from tests._hang_support import wait_for_state
from tests._tui_support import screen_host

HF_TOKEN = "hf_Zq8mWv3LxT9pKd2RbN7cYs4FgH6jJa1E"
API_KEY = "mykey-7f3e9a1c5b2d8e4f6a0b"
SECRET_ENV = {"HF_TOKEN": HF_TOKEN, "MY_API_KEY": API_KEY, "NCCL_DEBUG": "WARN"}
CONTRACT_FIELDS = {"state", "phase", "silent_for_s", "last_lines", "port_listening", "ready", "processes",
                   "gpus", "baseline", "hints"}
PROCESS_FIELDS = {"pid", "title", "rank", "status", "cpu_percent", "rss_bytes", "num_threads", "children",
                  "stack"}
GUARD_S = 60.0  # a start that has not settled by then is a broken test setup, not a slow machine


FAULT_PHASE = {"hang-after-weights": "weights_loaded", "rank-missing": "weights_loaded",
               "hang-in-graph-capture": "cuda_graph"}


def stalled_session(make_emulator_profile, launched, fault: str, name: str = "emu"):
    """A TP4 emulator session stalled where ``fault`` hangs it.

    stall_after_s is 3 s: short, but above the seconds that spawned ranks need to import on a busy
    2-core machine (a stall seen in ``launching`` before that is not the one under test, so the wait
    goes on until the fault's own phase).
    """
    profile = make_emulator_profile(name, tp=4, fault=fault, watch={"stall_after_s": 3},
                                    server={"env": dict(SECRET_ENV)})
    session = launched.launch(profile)
    status = wait_for_state(session, {"stalled"}, FAULT_PHASE[fault])
    launched.remember(session)
    assert status.state == "stalled" and status.phase == FAULT_PHASE[fault], status.to_json()
    return session


@dataclass(frozen=True)
class Hung:
    """One TP4 session stalled after its weights, shared by the tests that only read it."""

    home: Any
    session: Any
    cli_env: dict[str, str]


@pytest.fixture(scope="module")
def hung(tmp_path_factory) -> Iterator[Hung]:
    """Like the ``home`` + ``make_emulator_profile`` + ``launched`` fixtures, once for the module (a stalled
    start costs seconds); everything it started is stopped by pid at the end."""
    import tomli_w
    from conftest import KIMI_LIKE_CONFIG, REPO_ROOT, LaunchedSessions, get_free_port

    from sessions.home import HOME_ENV, resolve_home
    from sessions.profiles import load_profile

    root = tmp_path_factory.mktemp("hung")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HOME_ENV, str(root / "eagle3-home"))
        mp.delenv("EAGLE3_TUI_DEMO", raising=False)
        home = resolve_home().ensure()
        model_dir = root / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(KIMI_LIKE_CONFIG))
        doc = {
            "server": {"launcher": "emulator", "python": sys.executable, "model_path": str(model_dir),
                       "tp_size": 4, "host": "127.0.0.1", "port": get_free_port(), "env": dict(SECRET_ENV)},
            "watch": {"stall_after_s": 3},
            "emulator": {"time_scale": 0.003, "fault": "hang-after-weights"},
        }
        path = home.profiles_dir / "hung.toml"
        path.write_text(tomli_w.dumps(doc))
        registry = LaunchedSessions(home)
        try:
            session = registry.launch(load_profile(path))
            status = wait_for_state(session, {"stalled"}, "weights_loaded")
            registry.remember(session)
            assert status.state == "stalled" and status.phase == "weights_loaded", status.to_json()
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
            yield Hung(home, session, env)
        finally:
            registry.cleanup()


def hint_ids(d) -> set[str]:
    return {h.id for h in d.hints}


def schedulers(d):
    return {p.rank: p for p in d.processes if p.role == "scheduler"}


def functions(proc) -> list[str]:
    assert proc.stack is not None and proc.stack.ok, (proc.label, proc.stack and proc.stack.error)
    return [f.name for f in proc.stack.frames]


def test_hang_after_weights_every_rank_shows_the_collective_it_waits_in(hung):
    session = hung.session
    d = diagnose(session, stack_timeout_s=20)

    assert d.state == "stalled" and d.phase == "weights_loaded"
    assert d.port_listening is False and d.silent_for_s > 3
    ranks = schedulers(d)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, proc in ranks.items():
        names = functions(proc)
        assert "all_reduce" in names and "get_available_gpu_memory" in names and "init_memory_pool" in names
        assert proc.stack.blocked_in.name == "all_reduce", (rank, str(proc.stack.blocked_in))
        assert proc.title == f"sglang::scheduler_TP{rank}"
    assert d.silent_ranks == (0, 1, 2, 3)
    assert d.missing_load_weight_end == ()
    assert d.collective_ranks.keys() == {0, 1, 2, 3}
    ids = hint_ids(d)
    assert "all-ranks-in-collective" in ids and "port-closed-until-graphs-done" in ids
    assert "nccl-collective-rank-elsewhere" not in ids and "ranks-missing-load-weight-end" not in ids
    assert "no earlier start of this profile reached ready; this one stopped at line" in d.compare
    assert "in weights_loaded" in d.compare

    doc = d.to_json()
    assert CONTRACT_FIELDS <= doc.keys()
    assert all(PROCESS_FIELDS <= p.keys() for p in doc["processes"])
    assert doc["baseline"] is None
    # the emulator publishes per-process GPU memory; each rank shows up on its GPU
    labelled = {p["label"] for g in doc["gpus"] for p in g["processes"] if p["label"]}
    assert {"TP0", "TP1", "TP2", "TP3"} <= labelled
    report = format_report(d)
    assert "TP3" in report and "all_reduce" in report and "weights_loaded" in report


def test_bundle_holds_everything_and_no_secret_from_the_profile_env(hung, tmp_path):
    session = hung.session
    # the sources do hold the secrets: the redaction is what keeps them out
    assert HF_TOKEN in (session.session_dir / "profile.toml").read_text()
    with open(f"/proc/{session.state_record['pid']}/environ", "rb") as fh:
        assert API_KEY.encode() in fh.read()

    d = diagnose(session, stack_timeout_s=20)
    bundle = write_bundle(d, session, tmp_path / "bundle.tar.gz")
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600
    out = tmp_path / "extracted"
    with tarfile.open(bundle) as tar:
        members = tar.getmembers()
        assert all(stat.S_IMODE(m.mode) == 0o600 for m in members)
        # the "data" filter where this Python has it (3.11.4+; Debian's 3.11.2 has no filter argument)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(out, filter="data")
        else:
            tar.extractall(out)
    names = {str(p.relative_to(out)).split("/", 1)[1] for p in out.rglob("*") if p.is_file()}
    assert {"diagnosis.json", "report.txt", "server.log.tail", "profile.toml", "env.txt",
            "command.json"} <= names
    assert {f"stacks/TP{r}-{schedulers(d)[r].pid}.txt" for r in range(4)} <= names
    blob = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    assert HF_TOKEN.encode() not in blob and API_KEY.encode() not in blob
    assert b"HF_TOKEN=***" in blob and b"NCCL_DEBUG=WARN" in blob
    assert b"all_reduce" in blob
    assert json.loads(next(out.rglob("diagnosis.json")).read_text())["phase"] == "weights_loaded"
    # nothing in the diagnosis object itself either
    assert HF_TOKEN not in json.dumps(d.to_json()) and API_KEY not in json.dumps(d.to_json())
    # adv22: two bundles of the same second into one folder shared a name (the second replaced the first);
    # the user's folder keeps its own mode
    reports = tmp_path / "reports"
    reports.mkdir(mode=0o755)
    os.chmod(reports, 0o755)
    first, second = write_bundle(d, session, reports), write_bundle(d, session, reports)
    assert first != second and first.is_file() and second.is_file(), (first, second)
    assert stat.S_IMODE(reports.stat().st_mode) == 0o755 and stat.S_IMODE(second.stat().st_mode) == 0o600


def test_one_rank_missing_is_named_with_its_stack_while_the_others_wait(make_emulator_profile, launched):
    session = stalled_session(make_emulator_profile, launched, "rank-missing")
    d = diagnose(session, stack_timeout_s=20)

    assert d.phase == "weights_loaded"
    assert d.missing_load_weight_end == (3,)
    assert 3 in d.silent_ranks
    ranks = schedulers(d)
    assert "_read_shard" in functions(ranks[3]) and "all_reduce" not in functions(ranks[3])
    for rank in (0, 1, 2):
        assert ranks[rank].stack.blocked_in.name == "all_reduce"
    assert set(d.collective_ranks) == {0, 1, 2}
    ids = hint_ids(d)
    assert {"ranks-missing-load-weight-end", "nccl-collective-rank-elsewhere",
            "rank-blocked-reading-weights"} <= ids
    assert "all-ranks-in-collective" not in ids
    elsewhere = next(h for h in d.hints if h.id == "nccl-collective-rank-elsewhere")
    assert elsewhere.title.startswith("TP0, TP1, TP2 wait in a collective; TP3 in ")
    missing = next(h for h in d.hints if h.id == "ranks-missing-load-weight-end")
    assert "TP3" in missing.title and "3/4" in missing.title


def test_hang_in_graph_capture_shows_the_capture_frames(make_emulator_profile, launched):
    session = stalled_session(make_emulator_profile, launched, "hang-in-graph-capture")
    d = diagnose(session, stack_timeout_s=20)

    assert d.phase == "cuda_graph"
    for proc in schedulers(d).values():
        names = functions(proc)
        assert "capture_one_batch_size" in names and "all_reduce" in names
    ids = hint_ids(d)
    assert {"ranks-blocked-in-graph-capture", "cuda-graph-capture-stall", "all-ranks-in-collective"} <= ids


def test_a_hang_is_compared_with_the_last_good_start_of_the_profile(make_emulator_profile, launched, home):
    good = launched.launch(make_emulator_profile("kimi", tp=4, fault="none"))
    assert wait_for_state(good, {"ready"}).state == "ready"
    good.stop(grace_s=5)
    baseline = last_good(home, "kimi")
    assert baseline is not None and baseline.session_id == good.session_id
    assert baseline.ready_line is not None and baseline.ready_after_s is not None

    session = stalled_session(make_emulator_profile, launched, "hang-after-weights", name="kimi")
    d = diagnose(session, with_stacks=False)
    assert d.baseline is not None and d.baseline.session_id == good.session_id
    assert d.compare.startswith(f"the good start reached ready at line {baseline.ready_line} after ")
    assert f"; this one stopped at line {d.line_count} in weights_loaded, silent for " in d.compare
    rows = {r.phase: r for r in d.phase_rows}
    assert rows["ready"].good_line == baseline.ready_line and rows["ready"].this_line is None
    assert rows["weights_loaded"].good_line is not None and rows["weights_loaded"].this_line is not None
    doc = d.to_json()["baseline"]
    assert doc["line_count"] == baseline.line_count and doc["phases"]["ready"]["line"] == baseline.ready_line
    assert all(p.stack is None for p in d.processes)


def test_slow_weights_with_a_moving_bar_is_never_stalled(make_emulator_profile, launched):
    # At TP2 and this scale the weights take ~9 s of wall clock with only rank 0's bar moving; the stall
    # limit is 4 s, so only counting the bar's redraws as output keeps the start "starting".
    import re

    from sessions.emulator import pacing

    limit_s, scale = 4, 0.006
    profile = make_emulator_profile("slow", tp=2, fault="slow-weights", time_scale=scale,
                                    watch={"stall_after_s": limit_s})
    session = launched.launch(profile)
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + GUARD_S
    while True:  # a sample of the statuses on the way, as the TUI polls them: none may be "stalled"
        status = session.status()
        seen.append((status.state, status.phase))
        if status.state != "starting" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status.state == "ready", (status.state, status.phase, seen[-5:])
    assert ("starting", "loading_weights") in seen
    assert all(state != "stalled" for state, _ in seen)
    # The precondition, from the pacing plan instead of a stopwatch (a paced sleep never ends early):
    # each rank's load, between two lines of its own, lasts longer than the stall limit.
    loads = re.findall(r"\[[^\]]* TP(\d)\] Load weight end\. .*mem usage=([\d.]+) GB\.", session.log_path.read_text())
    planned = {int(rank): max(pacing.WEIGHT_LOAD_MIN_S, float(gb) / pacing.WEIGHT_LOAD_GB_PER_S)
               * pacing.SLOW_WEIGHTS_FACTOR * pacing.Pacing.for_rank(scale, int(rank)).jitter * scale
               for rank, gb in loads}
    assert planned.keys() == {0, 1} and min(planned.values()) > limit_s + 1, planned


def test_missing_pyspy_is_a_hint_not_a_failure(hung, monkeypatch, tmp_path):
    session = hung.session
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    d = diagnose(session)
    assert not d.pyspy.available
    assert "pyspy-not-installed" in hint_ids(d)
    assert all(p.stack.error_kind == "missing" for p in schedulers(d).values())
    assert d.state == "stalled" and d.phase == "weights_loaded"


def test_cli_prints_the_json_contract_and_names_the_bundle(hung, tmp_path):
    session, cli_env = hung.session, hung.cli_env
    bundle = tmp_path / "b.tar.gz"
    done = subprocess.run(
        [sys.executable, "-m", "app", "diagnose", session.session_id[:12], "--json", "--bundle", str(bundle)],
        capture_output=True, text=True, env=cli_env, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert CONTRACT_FIELDS <= doc.keys()
    assert doc["state"] == "stalled" and doc["phase"] == "weights_loaded"
    assert {p["rank"] for p in doc["processes"] if p["role"] == "scheduler"} == {0, 1, 2, 3}
    assert all(p["stack"]["function"].endswith("all_reduce") for p in doc["processes"] if p["role"] == "scheduler")
    assert f"bundle written: {bundle}" in done.stderr and bundle.is_file()
    assert HF_TOKEN not in done.stdout and API_KEY not in done.stdout

    human = subprocess.run([sys.executable, "-m", "app", "diagnose", session.session_id, "--no-stacks"],
                           capture_output=True, text=True, env=cli_env, timeout=120, check=False)
    assert human.returncode == 0, human.stderr
    assert "stalled in phase weights_loaded" in human.stdout and "TP3" in human.stdout

    unknown = subprocess.run([sys.executable, "-m", "app", "diagnose", "no-such-session"],
                             capture_output=True, text=True, env=cli_env, timeout=60, check=False)
    assert unknown.returncode == 2 and "no-such-session" in unknown.stderr


@pytest.mark.timeout(120)
def test_diagnose_screen_shows_stacks_and_saves_a_bundle(hung):
    import asyncio

    from textual.widgets import DataTable

    from app.screens.diagnose import DiagnoseScreen

    session, home = hung.session, hung.home

    async def scenario() -> None:
        app = screen_host(lambda: DiagnoseScreen(session.session_id, home))
        async with app.run_test(size=(140, 50)) as pilot:
            screen = app.screen
            assert isinstance(screen, DiagnoseScreen)
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert screen.error is None and screen.diagnosis is not None
            stacks = list(screen.query("#stacks Collapsible"))
            assert len(stacks) == len([p for p in screen.diagnosis.processes if p.stack is not None])
            assert any("TP2" in str(c.title) and "all_reduce" in str(c.title) for c in stacks)
            assert screen.query_one("#processes", DataTable).row_count == len(screen.diagnosis.processes)
            await pilot.press("b")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert screen.bundle_path is not None and Path(screen.bundle_path).is_file()
            assert HF_TOKEN.encode() not in _tar_bytes(Path(screen.bundle_path))
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, DiagnoseScreen)

    asyncio.run(scenario())



@pytest.mark.timeout(120)
def test_closing_the_diagnose_screen_while_it_collects_does_not_crash(hung, monkeypatch):
    """Escape right away: the diagnosis thread finishes after the screen is gone, and the app raises nothing."""
    import asyncio
    import threading

    from textual.app import App

    import sessions.diagnosis
    from app.screens.diagnose import DiagnoseScreen

    session, home = hung.session, hung.home
    failures: list[BaseException] = []
    finished = threading.Event()
    real_diagnose = sessions.diagnosis.diagnose

    def observed(*args, **kwargs):  # the real diagnosis; the event says when its thread is done
        try:
            return real_diagnose(*args, **kwargs)
        finally:
            finished.set()

    monkeypatch.setattr(sessions.diagnosis, "diagnose", observed)

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(DiagnoseScreen(session.session_id, home))

        def _handle_exception(self, error: Exception) -> None:
            failures.append(error)
            super()._handle_exception(error)

    async def scenario() -> None:
        app = Host()
        async with app.run_test(size=(140, 50)) as pilot:
            screen = app.screen
            assert isinstance(screen, DiagnoseScreen)
            assert not finished.is_set(), "the diagnosis (py-spy on every rank) should still be running"
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, DiagnoseScreen)
            # the diagnosis thread's own event, waited for off the loop (the bound stops a hung test only)
            assert await asyncio.to_thread(finished.wait, 60), "the diagnosis thread never finished"
            for _ in range(5):  # let the thread's call_from_thread reach the app
                await pilot.pause()
            assert app.is_running and screen.diagnosis is None

    asyncio.run(scenario())
    assert not failures, failures

def _tar_bytes(path: Path) -> bytes:
    with tarfile.open(path) as tar:
        return b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())


def test_a_stopped_rank_is_named_and_still_gets_its_stack(hung):
    import signal

    session = hung.session
    tp1 = next(r for r in session.status().ranks if r.rank == 1)
    os.kill(tp1.pid, signal.SIGSTOP)
    try:
        d = diagnose(session, stack_timeout_s=20)
    finally:
        os.kill(tp1.pid, signal.SIGCONT)
    assert schedulers(d)[1].status == "stopped"
    stopped = next(h for h in d.hints if h.id == "rank-process-not-running")
    assert f"TP1 (pid {tp1.pid}) is stopped" in stopped.title
    # a stopped rank still gets its stack (read without suspending it)
    assert schedulers(d)[1].stack.ok and schedulers(d)[1].stack.blocked_in.name == "all_reduce"


def test_a_crashed_start_is_diagnosed_from_its_log_alone(make_emulator_profile, launched, tmp_path):
    profile = make_emulator_profile("oom", tp=2, fault="oom-kv-cache", server={"env": dict(SECRET_ENV)})
    session = launched.launch(profile)
    status = wait_for_state(session, {"crashed"})
    assert status.state == "crashed"
    d = diagnose(session, stack_timeout_s=5)
    assert d.state == "crashed" and d.processes == ()
    assert d.error is not None and d.error_line is not None
    # the first error is the exception and the rank that raised it, not "Scheduler hit an exception: ..."
    assert re.match(r"TP\d: RuntimeError: Not enough memory\. Please try to increase --mem-fraction-static", d.error)
    assert "negative-kv-budget" in hint_ids(d)
    assert "pyspy-not-installed" not in hint_ids(d)  # nothing to take stacks of: not worth a hint
    bundle = write_bundle(d, session, tmp_path)
    assert bundle.parent == tmp_path and bundle.name.endswith(".tar.gz")
    assert HF_TOKEN.encode() not in _tar_bytes(bundle)


def _report(rank: int, cpu: float, stack_text: str | None):
    from sessions.diagnosis import ProcessReport
    from sessions.stacks import StackDump, parse_dump

    pid = 1000 + rank
    dump = None if stack_text is None else StackDump(pid, True, stack_text, parse_dump(stack_text))
    return ProcessReport(pid, f"sglang::scheduler_TP{rank}", "scheduler", rank, "sleeping", cpu, 1 << 30, 4,
                         (), dump)


def _stack(*frames: str) -> str:
    return 'Thread 1 (idle): "MainThread"\n' + "".join(f"    {f}\n" for f in frames)


REAL_ALL_REDUCE = _stack(
    "all_reduce (torch/distributed/distributed_c10d.py:2501)",
    "wrapper (torch/distributed/c10d_logger.py:81)",
    "_all_reduce_in_place (sglang/srt/distributed/parallel_state.py:612)",
    "get_available_gpu_memory (sglang/srt/utils/common.py:410)",
    "init_memory_pool (sglang/srt/model_executor/model_runner.py:1500)",
)
REAL_LOADING = _stack(
    "_load_file (safetensors/torch.py:311)",
    "safetensors_weights_iterator (sglang/srt/model_loader/weight_utils.py:1370)",
    "load_weights (sglang/srt/models/deepseek_v2.py:2900)",
)


def test_runtime_predicates_read_sglang_shaped_stacks_and_cpu():
    from sessions.diagnosis import (
        RuntimeEvidence,
        all_ranks_in_collective,
        collective_with_rank_elsewhere,
        rank_idle_while_others_spin,
    )

    mixed = RuntimeEvidence(processes=(
        _report(0, 100.0, REAL_ALL_REDUCE), _report(1, 99.0, REAL_ALL_REDUCE), _report(2, 0.0, REAL_LOADING),
    ))
    found = collective_with_rank_elsewhere(mixed)
    assert found == {
        "waiting": "TP0, TP1",
        "collective": "all_reduce (torch/distributed/distributed_c10d.py:2501)",
        "others": "TP2 in _load_file (safetensors/torch.py:311)",
    }
    assert all_ranks_in_collective(mixed) is None
    assert rank_idle_while_others_spin(mixed) == {"idle": "TP2", "busy": "TP0, TP1"}

    together = RuntimeEvidence(processes=(_report(0, 0.0, REAL_ALL_REDUCE), _report(1, 0.0, REAL_ALL_REDUCE)))
    assert collective_with_rank_elsewhere(together) is None
    assert rank_idle_while_others_spin(together) is None
    assert all_ranks_in_collective(together)["callers"] == (
        "get_available_gpu_memory (sglang/srt/utils/common.py:410)")
    # a static log's evidence never matches a runtime predicate
    from sessions.hints import HintEvidence

    assert collective_with_rank_elsewhere(HintEvidence()) is None


def test_cli_refuses_a_bundle_path_in_a_missing_folder(hung, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "app", "diagnose", hung.session.session_id, "--no-stacks",
         "--bundle", str(tmp_path / "nowhere" / "b.tar.gz")],
        capture_output=True, text=True, env=hung.cli_env, timeout=60, check=False,
    )
    assert done.returncode == 2 and "--bundle" in done.stderr and "nowhere" in done.stderr
    assert done.stdout == ""
