"""Proof that a hung emulated start stays hung, from py-spy stacks instead of a sleep.

A test that must show "the start does not move on" used to sleep a second and look again.  That proves
nothing on a slow machine and wastes the second on a fast one.  `wait_until_parked` waits for the state in
which nothing *can* move on without an outside event:

1. every rank's main thread is idle (blocked in the kernel) inside the frame its fault blocks it in;
2. then the emulator's main thread is idle in ``_wait_for_ready``, waiting on the rank pipes: the wait
   returns at once while a pipe holds a message, so by then it has read every arrival the ranks sent
   before they blocked, and a collective it would (wrongly) release is already in the ranks' pipes;
3. then every rank is still idle in that frame: a release in its pipe would have woken it.

A log read after that is the log's final state.  Only a hung test waits for the deadline.
"""
from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from sessions.stacks import StackDump, dump_stacks

PARK_LIMIT_S = 90.0  # stops a hung test only; nothing asserts on time
ANSWER_LIMIT_S = 120.0  # a hang guard, not a timing: a read that waits on a FIFO waits forever


SETTLE_LIMIT_S = 90.0  # a start that has not settled by then is a broken test setup, not a slow machine


def wait_for_state(session: Any, wanted: set[str], phase: str | None = None,
                   guard_s: float = SETTLE_LIMIT_S) -> Any:
    """Poll ``session.status()`` until it is in one of ``wanted`` (in ``phase``, when given) or has ended
    (crashed, exited, stopped: the caller's assertion on the state says which); the status.  The guard only
    stops a start that never settles, and the failure shows the log's tail."""
    deadline = time.monotonic() + guard_s
    while True:
        status = session.status()
        settled = status.state in wanted and (phase is None or status.phase == phase)
        if settled or status.state in ("crashed", "exited", "stopped"):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{session.session_id} never reached {wanted} in {phase}: {status.state} in "
                                 f"{status.phase}; log tail: {session.log_path.read_text()[-2000:]}")
        time.sleep(0.2)


def answered(call: Callable[[], object]) -> object:
    """``call()``'s result (or the exception it raised) from a thread; fails the test when it is still
    blocked after ANSWER_LIMIT_S, instead of hanging the suite."""
    box: list = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(ANSWER_LIMIT_S)
    if worker.is_alive():
        raise AssertionError(f"still blocked after {ANSWER_LIMIT_S:g} s")
    return box[0]


def rank_pids(proc: subprocess.Popen, tp: int) -> dict[int, int]:
    """rank -> pid of the emulator's ``sglang::scheduler_TP<rank>`` children."""
    found: dict[int, int] = {}
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline()).strip()
        except psutil.Error:
            continue
        for rank in range(tp):
            if title == f"sglang::scheduler_TP{rank}":
                found[rank] = child.pid
    return found


def _parked(dump: StackDump, function: str) -> bool:
    main = dump.main_thread
    return bool(dump.ok and main is not None and main.status == "idle"
                and any(f.name == function for f in main.frames))


def _describe(dumps: dict[int, StackDump]) -> str:
    return "\n".join(f"--- pid {pid}: {d.error or ''}\n{d.text}" for pid, d in dumps.items())


def wait_until_parked(proc: subprocess.Popen, parked_in: dict[int, str],
                      moved_on: Callable[[], str | None] = lambda: None,
                      limit_s: float = PARK_LIMIT_S) -> dict[int, StackDump]:
    """Wait until every rank ``r`` of ``parked_in`` is blocked in function ``parked_in[r]`` and the main
    process idles waiting for them (see the module docstring); return the ranks' last stacks by rank.

    ``moved_on()`` returns a reason when the start has visibly gone past the hang (a wrong release): the
    wait then fails at once instead of at the deadline.  A py-spy that cannot attach fails the test with
    py-spy's own error: the proof needs the stacks.
    """
    deadline = time.monotonic() + limit_s
    last: dict[int, StackDump] = {}
    while True:
        if (reason := moved_on()) is not None:
            raise AssertionError(f"the start moved on past its hang: {reason}\n{_describe(last)}")
        if proc.poll() is not None:
            raise AssertionError(f"the emulator exited {proc.returncode} while it should hang")
        pids = rank_pids(proc, max(parked_in) + 1)
        if pids.keys() >= parked_in.keys():
            by_pid = {pids[r]: f for r, f in parked_in.items()}
            last = dump_stacks(by_pid)
            failed = [d for d in last.values() if not d.ok and d.error_kind != "gone"]
            assert not failed, f"py-spy could not read a rank: {_describe(last)}"
            if all(_parked(last[pid], f) for pid, f in by_pid.items()):
                main = dump_stacks([proc.pid])[proc.pid]
                assert main.ok or main.error_kind == "gone", f"py-spy could not read the main process: {main.error}"
                if _parked(main, "_wait_for_ready"):
                    again = dump_stacks(by_pid)
                    if all(_parked(again[pid], f) for pid, f in by_pid.items()):
                        return {r: again[pids[r]] for r in parked_in}
                    last = again
        if time.monotonic() > deadline:
            raise AssertionError(f"the ranks never parked in {parked_in} within {limit_s:g} s:\n{_describe(last)}")
        time.sleep(0.05)  # between rounds (py-spy itself takes longer): the poll interval of a wait
