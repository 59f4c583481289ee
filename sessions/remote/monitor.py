"""Every other host polled in its own thread: the TUI reads the latest `HostView`s and never waits on SSH.

A host's thread connects (version check), then asks ``status --json`` and ``gpus --json`` every
``interval_s``.  Each call has a timeout; a call answered slower than ``SLOW_S`` marks the host slow.  A failed
call keeps the host's last sessions (shown as stale) and retries with a doubling backoff (1 s .. 30 s):
``reconnecting in Ns`` while a host that answered before is being retried, ``unreachable: <ssh's
reason>`` when it never answered or has failed `UNREACHABLE_AFTER` times in a row.  A host running
another version is ``refused`` and retried rarely.  The servers there never notice: they are detached
sessions of that host, and the monitor only reads them.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sessions.gpus import GpuSnapshot
from sessions.home import Home
from sessions.remote.client import HostError, HostUnreachable, RemoteClient, VersionMismatch
from sessions.remote.hosts import Host
from sessions.remote.link import HostLink, SshLink
from sessions.snapshots import SessionEntry

POLL_INTERVAL_S = 2.0
CALL_TIMEOUT_S = 15.0
SLOW_S = 3.0
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
UNREACHABLE_AFTER = 3  # failures in a row after which a host that answered before is "unreachable"
REFUSED_RETRY_S = 60.0

STATES = ("connecting", "connected", "slow", "reconnecting", "unreachable", "refused")


@dataclass(frozen=True)
class HostView:
    """What the panel knows about one host now (immutable; drawn by widgets.host_panel)."""

    name: str
    ssh: str
    state: str  # one of STATES
    reason: str | None = None  # ssh's reason, the timeout, the version refusal
    retry_at: float | None = None  # time.monotonic() of the next attempt (reconnecting, unreachable)
    version: str | None = None
    sessions: tuple[SessionEntry, ...] = ()
    gpus: GpuSnapshot | None = None
    answered_at: float | None = None  # time.time() of the last good answer (sessions are that old)
    answer_s: float | None = None  # the slowest call of the last good poll

    def retry_in_s(self, now: float | None = None) -> float | None:
        if self.retry_at is None:
            return None
        return max(0.0, self.retry_at - (time.monotonic() if now is None else now))

    def state_text(self, now: float | None = None) -> str:
        """``connected``, ``slow (4.1 s)``, ``reconnecting in 4s: <reason>``, ``unreachable: <reason>``."""
        if self.state == "slow" and self.answer_s is not None:
            return f"slow ({self.answer_s:.1f} s)"
        if self.state == "reconnecting":
            wait = self.retry_in_s(now)
            return f"reconnecting in {wait:.0f}s" + (f": {self.reason}" if self.reason else "")
        if self.state in ("unreachable", "refused"):
            return f"{self.state}: {self.reason or 'no reason given'}"
        return self.state

    @property
    def stale(self) -> bool:
        """Its sessions are from an earlier answer (the host does not answer now)."""
        return self.state in ("reconnecting", "unreachable", "refused") and self.answered_at is not None


def session_entry(row: dict[str, Any]) -> SessionEntry:
    """A `status --json` row as the lists show sessions."""
    raw_group = row.get("group")
    group: dict[str, Any] = raw_group if isinstance(raw_group, dict) else {}
    port = row.get("port")
    started = row.get("started_at")
    return SessionEntry(
        str(row.get("session_id", "?")), str(row.get("profile", "?")), str(row.get("state", "unknown")),
        str(row.get("phase", "")), port if isinstance(port, int) else None,
        float(started) if isinstance(started, (int, float)) else None, bool(row.get("alive")),
        group.get("id"), group.get("index"), tuple(g for g in group.get("gpus") or () if isinstance(g, int)),
    )


def _timed(call: Callable[[], Any], took: list[float]) -> Any:
    """``call()``, its duration appended to ``took``."""
    started = time.monotonic()
    result = call()
    took.append(time.monotonic() - started)
    return result


@dataclass
class _HostPoller:
    host: Host
    client: RemoteClient
    view: HostView
    failures: int = 0
    connected_once: bool = False
    wake: threading.Event = field(default_factory=threading.Event)


class HostMonitor:
    """One thread per host; `views()` is the latest state of each, instantly."""

    def __init__(self, hosts: dict[str, Host], home: Home, interval_s: float = POLL_INTERVAL_S,
                 link_factory: Callable[[Host, Home], HostLink] = SshLink,
                 call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.home = home
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pollers = {
            name: _HostPoller(host, RemoteClient(host, link_factory(host, home), call_timeout_s),
                              HostView(name, host.ssh, "connecting"))
            for name, host in hosts.items()
        }
        self._threads: list[threading.Thread] = []

    def start(self) -> HostMonitor:
        for poller in self._pollers.values():
            thread = threading.Thread(target=self._run, args=(poller,), name=f"host-{poller.host.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def views(self) -> tuple[HostView, ...]:
        with self._lock:
            return tuple(p.view for p in self._pollers.values())

    def view(self, name: str) -> HostView:
        with self._lock:
            return self._pollers[name].view

    def poll_now(self) -> None:
        """Ask every host again now (after an action there), and retry a lost one at once."""
        for poller in self._pollers.values():
            poller.wake.set()

    def close(self, wait_s: float = 1.0) -> None:
        """Stop the threads and end the shared connections (``ssh -O exit``: a call in flight ends with
        it); wait at most ``wait_s`` in all for the threads (daemons: a stuck one does not hold the exit)."""
        self._stop.set()
        self.poll_now()
        for poller in self._pollers.values():
            poller.client.link.close()
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- one host's thread --------------------------------------------------------------------------------

    def _set(self, poller: _HostPoller, view: HostView) -> None:
        with self._lock:
            poller.view = view

    def _run(self, poller: _HostPoller) -> None:
        version: str | None = None
        while not self._stop.is_set():
            calls: list[float] = []
            try:
                if version is None:
                    version = _timed(poller.client.connect, calls)
                rows = _timed(poller.client.status, calls)
                gpus = _timed(poller.client.gpus, calls)
            except VersionMismatch as exc:
                version = None
                self._failed(poller, "refused", str(exc), REFUSED_RETRY_S, exc.remote)
            except (HostUnreachable, HostError) as exc:
                version = None  # a reconnect checks the version again: the host may have been updated
                poller.failures += 1
                delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (poller.failures - 1))
                lost = poller.connected_once and poller.failures < UNREACHABLE_AFTER
                self._failed(poller, "reconnecting" if lost else "unreachable", str(exc), delay, None)
            else:
                took = max(calls)  # the slowest answer: a host is slow when one call is, not for asking three
                poller.failures = 0
                poller.connected_once = True
                self._set(poller, HostView(
                    poller.host.name, poller.host.ssh, "slow" if took > SLOW_S else "connected",
                    version=version, sessions=tuple(session_entry(r) for r in rows), gpus=gpus,
                    answered_at=time.time(), answer_s=took,
                ))
                self._sleep(poller, self.interval_s)
                continue
            self._sleep(poller, poller.view.retry_in_s() or 0.0)

    def _failed(self, poller: _HostPoller, state: str, reason: str, delay_s: float, version: str | None) -> None:
        old = poller.view
        self._set(poller, replace(old, state=state, reason=reason, retry_at=time.monotonic() + delay_s,
                                  version=version or old.version))

    def _sleep(self, poller: _HostPoller, seconds: float) -> None:
        poller.wake.wait(seconds)
        poller.wake.clear()
