"""SSH life: `eagle3-tui` in a real pseudo-terminal exits cleanly on SIGHUP and when the terminal goes away,
and the server it watched keeps running (it lives in its own session)."""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time

import pytest

from tests.conftest import REPO_ROOT


def _spawn_tui(env: dict[str, str], block_sighup: bool = False) -> tuple[int, int]:
    pid, fd = pty.fork()
    if pid == 0:  # the child becomes the TUI, with the pty as its controlling terminal
        try:
            if block_sighup:  # as if the hangup signal never reached us (only the dead TTY tells)
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
            os.chdir(REPO_ROOT)
            os.execve(sys.executable, [sys.executable, "-m", "app"], env)
        finally:
            os._exit(127)
    return pid, fd


def _read_until(fd: int, marker: bytes, limit_s: float = 60.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + limit_s
    while marker not in seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"the TUI never drew {marker!r}; it wrote: {seen[-500:]!r}")
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def _wait_exit(pid: int, limit_s: float = 30.0) -> int:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the TUI (pid {pid}) did not exit within {limit_s:.0f} s")


@pytest.fixture
def running_session(home, make_emulator_profile, launched):
    session = launched.launch(make_emulator_profile("emu", tp=2))
    deadline = time.monotonic() + 60
    while session.status(probe_http=False).state != "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    launched.remember(session)
    return session


def _env(cli_env: dict[str, str]) -> dict[str, str]:
    return dict(cli_env, TERM="xterm", COLUMNS="100", LINES="30")


@pytest.mark.parametrize("how", ["sighup", "terminal closed", "terminal dead, no signal"])
def test_the_tui_exits_cleanly_when_the_terminal_goes_and_the_server_keeps_running(
    how, running_session, cli_env
):
    pid, fd = _spawn_tui(_env(cli_env), block_sighup=(how == "terminal dead, no signal"))
    try:
        _read_until(fd, b"GPUs")  # the dashboard is up
        if how == "sighup":
            os.kill(pid, signal.SIGHUP)
        else:
            os.close(fd)  # the SSH connection drops: the pty master goes away
            fd = -1
        code = _wait_exit(pid)
    finally:
        if fd >= 0:
            os.close(fd)
    assert code == 0
    status = running_session.status(probe_http=True)
    assert status.alive and status.state == "ready"


@pytest.mark.parametrize("garbage", [b"\xff", b"\x80", b"\xc3", b"\xff?\x80", b"\xe2\x82"])
def test_bytes_that_are_not_utf8_are_ignored_and_the_keys_around_them_still_work(garbage, home, cli_env,
                                                                                 make_emulator_profile):
    """One 0xFF or 0x80 byte typed into the TUI made Textual's input thread raise UnicodeDecodeError, and the
    app exited at once with status 0 (issue 22 #16).  Now the byte is dropped: the help key typed after it
    (in the same packet or the next) opens help, and q still quits with status 0."""
    make_emulator_profile("emu", tp=2)
    pid, fd = _spawn_tui(_env(cli_env))
    try:
        _read_until(fd, b"GPUs")  # the dashboard is up
        os.write(fd, garbage)
        os.write(fd, b"?")
        # Alive, and reading keys after the bad bytes (_read_until returns early when the terminal closes).
        assert b"Help \xc2\xb7 eagle3-tui" in _read_until(fd, b"Help \xc2\xb7 eagle3-tui"), "no help drawn"
        done, _status = os.waitpid(pid, os.WNOHANG)
        assert done == 0, "the TUI exited after the undecodable bytes"
        os.write(fd, b"\x1b")  # close help
        _read_until(fd, b"Profiles")
        os.write(fd, b"q")
        code = _wait_exit(pid)
    finally:
        os.close(fd)
    assert code == 0
