"""Nothing blocks the UI while a launch waits: the launch lock held by another process, the GPU check.

* `l` with ``launch.lock`` held elsewhere shows a moving progress line naming the holder, and `q` quits
  the real TUI process while the lock is still held (a blocking ``flock`` in the worker kept the whole
  process alive until the holder let go; issue 22 item 17);
* the CLI's lock wait has a timeout and a message naming the holder;
* the GPU-busy question offers "stop <holder> and launch", and `s` does exactly that (real sessions).
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from test_server import run_cli
from test_tui_ssh import _env, _read_until, _spawn_tui, _wait_exit

from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from sessions.server import LAUNCH_LOCK_FILE
from tests._tui_support import first_poll, key_event, run, wait_until
from widgets.action_line import ActionLine
from widgets.confirm_modal import ChoiceModal


@pytest.fixture
def lock_holder(home) -> Iterator[subprocess.Popen]:
    """Another process that takes the home's launch lock (writing its pid, as a launch does) and keeps it
    until the test ends."""
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.ftruncate(fd, 0); os.pwrite(fd, f'{os.getpid()}\\n'.encode(), 0)\n"
        "print('held', flush=True)\n"
        "time.sleep(3600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(home.state_root / LAUNCH_LOCK_FILE)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def _lock_is_held(home) -> bool:
    fd = os.open(home.state_root / LAUNCH_LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


async def _launch_into_the_lock_wait(pilot, app: Eagle3App) -> ActionLine:
    """After the first poll, `l` on the first profile until its worker waits for the held launch lock; the
    action line that shows the wait."""
    await first_poll(pilot, app)
    await pilot.press("1", "home", "l")
    line = app.dashboard.query_one(ActionLine)
    await wait_until(pilot, lambda: "waiting for another launch" in line.text, "the lock wait shown")
    return line


def test_q_quits_the_tui_while_another_process_holds_the_launch_lock(home, make_emulator_profile, cli_env, lock_holder):
    make_emulator_profile("locked", tp=1)
    pid, fd = _spawn_tui(_env(cli_env))
    try:
        _read_until(fd, b"GPUs")
        os.write(fd, b"1")
        time.sleep(0.3)  # the profiles pane has focus (keys are taken one at a time anyway)
        os.write(fd, b"l")
        _read_until(fd, b"waiting for another launch")  # the worker is inside the lock wait
        os.write(fd, b"q")
        code = _wait_exit(pid)  # the old code never exited while the lock was held
        assert _lock_is_held(home), "the holder still holds the lock: the TUI quit without it"
    finally:
        os.close(fd)
    assert code == 0
    assert not list(home.sessions_dir.iterdir()), "nothing was launched"


def test_the_cli_lock_wait_times_out_naming_the_holder(home, make_emulator_profile, cli_env, lock_holder):
    make_emulator_profile("locked", tp=1)
    result = run_cli("launch", "locked", "--lock-timeout", "0.5", env=cli_env)
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert f"pid {lock_holder.pid}" in result.stderr and "launch.lock" in result.stderr
    assert "--lock-timeout" in result.stderr
    assert not list(home.sessions_dir.iterdir())
    bad = run_cli("launch", "locked", "--lock-timeout", "-3", env=cli_env)
    assert bad.returncode == 2 and "--lock-timeout" in bad.stderr


def test_the_gpu_busy_question_offers_stop_the_holder_and_launch(home, make_emulator_profile, launched,
                                                                 tp4_holding_gpus_0_to_3):
    holder = tp4_holding_gpus_0_to_3
    make_emulator_profile("big", tp=8)
    seen: dict[str, object] = {}

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(100, 30)) as pilot:
            await first_poll(pilot, app)
            await pilot.press("1", "home")
            await wait_until(pilot, lambda: app.dashboard.selected_profile == "big", "big selected")
            await pilot.press("l")
            line = app.dashboard.query_one(ActionLine)
            await wait_until(pilot, lambda: isinstance(app.screen, ChoiceModal), "the GPUs-in-use question")
            modal = app.screen
            assert isinstance(modal, ChoiceModal)
            seen["choices"] = list(modal.choices)
            seen["question"] = modal.question
            await pilot.press("s")
            await wait_until(pilot, lambda: "stopping " + holder.session_id in line.text or
                             any(p.name.startswith("big-") for p in home.sessions_dir.iterdir()),
                             "the stop of the holder under way")
            await wait_until(pilot, lambda: [p for p in home.sessions_dir.iterdir() if p.name.startswith("big-")],
                             "the launch of big after the stop")

    try:
        run(scenario)
    finally:
        for folder in home.sessions_dir.iterdir():
            if folder.name.startswith("big-"):
                launched.track(folder.name)
    assert seen["question"] == f"Launch big on GPUs in use by {holder.session_id}?"
    assert ("stop", "Stop it and launch (s)") in seen["choices"], seen
    assert not holder.is_alive() and holder.status().state == "stopped"


def test_a_launch_waiting_for_the_lock_says_so_on_a_moving_line(home, make_emulator_profile, lock_holder):
    make_emulator_profile("locked", tp=1)
    texts: list[str] = []

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(100, 30)) as pilot:
            line = await _launch_into_the_lock_wait(pilot, app)
            texts.append(line.text)
            await wait_until(pilot, lambda: line.text != texts[0], "the line moves")
            texts.append(line.text)
            lock_holder.send_signal(signal.SIGKILL)  # the holder goes: the launch goes on
            await wait_until(pilot, lambda: any(home.sessions_dir.iterdir()), "the launch after the lock")

    try:
        run(scenario)
    finally:
        from sessions.server import list_sessions

        for session in list_sessions(home):
            session.stop(grace_s=2.0)
    assert f"pid {lock_holder.pid}" in texts[0], texts


def test_q_never_waits_behind_a_launch_worker(home, make_emulator_profile, monkeypatch, lock_holder):
    """Keys typed after `l` wait for the launch worker (its outcome may be a question), up to a limit; `q`
    must not: with the limit made an hour, the old dispatch held `q` for that hour."""
    import asyncio

    from app import typeahead

    monkeypatch.setattr(typeahead, "SETTLE_LIMIT_S", 3600.0)
    make_emulator_profile("locked", tp=1)
    exited: list[bool] = []

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(100, 30)) as pilot:
            await _launch_into_the_lock_wait(pilot, app)
            event = key_event("q")
            event.set_sender(app)
            app._driver.send_message(event)  # as the terminal sends it
            for _ in range(600):  # a guard only: the old dispatch held q for SETTLE_LIMIT_S (an hour here)
                if app._exit:
                    break
                await asyncio.sleep(0.05)
            exited.append(app._exit)
            assert _lock_is_held(home)  # still held: q did not wait for the lock

    run(scenario)
    assert exited == [True]

