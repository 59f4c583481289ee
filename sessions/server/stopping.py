"""The helpers of a stop: who is still alive, waiting for them to go, GPU memory left, the message."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import psutil

from sessions import probes


def _identities(procs: list) -> set[tuple[int, float]]:
    found = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # NoSuchProcess: already gone
            found.add((proc.pid, proc.create_time()))
    return found


def _wait_gone(alive: Callable[[], list], timeout_s: float, reap: Callable[[], None]) -> None:
    deadline = time.monotonic() + max(0.0, timeout_s)
    delay = 0.02
    while True:
        reap()
        if not alive() or time.monotonic() >= deadline:
            return
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _gpu_pids_left(pids: set[int]) -> tuple[int, ...]:
    """Session pids that NVML still lists as holding GPU memory (empty without NVML)."""
    from sessions.gpus import NvmlSource

    source = NvmlSource(wait_s=3.0)
    try:
        deadline = time.monotonic() + 5.0  # the driver may release a dead process's memory a moment later
        while True:
            snapshot = source.snapshot()
            if not snapshot.available:
                return ()
            held = {p.pid for s in snapshot.samples for p in s.processes} & pids
            if not held or time.monotonic() >= deadline:
                return tuple(sorted(held))
            time.sleep(0.25)
    finally:
        source.close()


def _stop_message(
    session_id: str,
    was_alive: bool,
    stopped: bool,
    survivors: tuple[int, ...],
    port_is_free: bool,
    gpu_left: tuple[int, ...],
    port: int | None,
    host: str,
    signals: list[str],
    waited_s: float,
) -> str:
    if stopped and was_alive:
        how = "SIGTERM" if not any("SIGKILL" in s for s in signals) else "SIGTERM, then SIGKILL"
        text = f"stopped {session_id} in {waited_s:.1f}s ({how})"
        if port and port_is_free:
            text += f"; port {port} is free"
    elif stopped:
        text = f"{session_id} was not running; nothing of it remains"
    else:
        parts = []
        if survivors:
            parts.append(f"still running: pid {', '.join(map(str, survivors))}")
        if gpu_left:
            parts.append(f"still holding GPU memory: pid {', '.join(map(str, gpu_left))}")
        text = f"could not stop {session_id}: " + "; ".join(parts)
    if port and not port_is_free:
        text += f"; {probes.describe_port_user(host, port)}"
    return text


