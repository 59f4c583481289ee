"""The dispatch of every extraction job (issue 24 items 3 and 6): a shared queue of samples, one lane per
server.  A one-server job is this scheduler over a list of one lane; there is no other dispatch loop.

    samples (render thread) ─┐
    samples given back ──────┴▶ SampleScheduler ─▶ the lane with the most room ─▶ /generate ─▶ collect ─▶ record
                                                   (ServerLane: window, state, counts, prober)

* **The queue.**  Samples come from the dataset in order, and a sample whose attempt failed comes back to
  the front of the queue (after its backoff), so it is redone on whichever server has room next.  A sample
  is only ever in one place: the queue, one request, or recorded; its index is its dataset line, assigned
  by the reader, so two servers can never write one index twice.
* **The window** of each lane (`AimdWindow`) is sized from that server's own pace; see its docstring.
* **Failures.**  A server that does not answer (connection refused or dropped, 503) is ``down`` at once:
  its samples in flight come back to the queue without spending their retries.  A failed attempt
  (timeout, 5xx, a capture that did not arrive) gives the sample back with one retry spent and counts
  against the lane; after ``max_straight_failures`` in a row the lane is ``left out``.  A lane that is not
  live is probed (``/ready``, then its identity) with exponential backoff, and rejoins with a fresh window
  once it answers and serves the job's model (a ``refused`` lane serves another model:
  `sessions.extraction.servers`).  The job pauses only while no lane is live; when every attempt on every
  server fails (``max_straight_failures`` × lanes in a row, no success between) the setup is wrong and the
  job aborts.  While no lane is live each prober asks every ``PROBE_WAITING_S`` (the whole job waits on
  them), and ``down_timeout_s`` (the spec's ``server_down_timeout_s``, 0 = forever) ends the wait.
* **One server.**  The same rules, worded for one: the job's pause reason is the lane's own (``server
  unreachable at URL: ...``, or why the server that answers is not the job's), and the abort after
  ``max_straight_failures`` says ``N consecutive attempts failed``.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sessions.extraction.backpressure import CaptureSpaceGate, GateClosed
from sessions.extraction.client import AttemptFailed, ExtractionClient, RetryPolicy, ServerDown, Stopped
from sessions.extraction.progress import RateMeter
from sessions.extraction.servers import ServerEndpoint
from sessions.redaction import redact_text

LIVE, DOWN, LEFT_OUT, REFUSED = "live", "down", "left out", "refused"
PROBE_FIRST_S = 0.5
PROBE_MAX_S = 30.0
PROBE_WAITING_S = 1.0  # while no lane is live (the one-server job's probe interval since issue 12)


@dataclass
class AimdWindow:
    """How many requests one server gets at a time: additive increase, multiplicative decrease (AIMD).

    AIMD because it needs no model of the server: it starts small (``start``), so a slow or cold server
    is not buried under a burst, and first doubles per window of successes (TCP's slow start: +1 per
    success, so a fast server reaches its pace in a few round trips, not tens), until the first sign of
    queueing or failure; from then on it grows by about one request per window of successes (+1/size per
    success) while the server's latency stays near the best it has shown, and halves on a failed attempt.  When the
    latency (smoothed) passes ``queue_factor`` × the lowest seen, the extra requests only wait in the
    server's queue (SGLang prefills what it has room for; the rest queue), so the window shrinks by a
    quarter instead: each server settles at its own pace, and a fast one gets more than a slow one.
    The ceiling is the spec's ``concurrency`` (per server).
    """

    ceiling: int
    start: float = 2.0
    queue_factor: float = 4.0
    limit: float = 0.0
    min_latency_s: float | None = None
    smoothed_s: float | None = None
    slow_start: bool = True

    def __post_init__(self) -> None:
        self.limit = min(float(self.ceiling), self.start)

    @property
    def size(self) -> int:
        return max(1, int(self.limit))

    def on_success(self, latency_s: float) -> None:
        if self.min_latency_s is None or latency_s < self.min_latency_s:
            self.min_latency_s = latency_s
        self.smoothed_s = latency_s if self.smoothed_s is None else 0.8 * self.smoothed_s + 0.2 * latency_s
        if self.smoothed_s > self.queue_factor * max(self.min_latency_s, 1e-4):
            self.slow_start = False
            self.limit = max(1.0, self.limit * 0.75)
        else:
            step = 1.0 if self.slow_start else 1.0 / self.limit
            self.limit = min(float(self.ceiling), self.limit + step)

    def on_failure(self) -> None:
        self.slow_start = False
        self.limit = max(1.0, self.limit / 2)

    def reset(self) -> None:
        self.limit = min(float(self.ceiling), self.start)
        self.min_latency_s = self.smoothed_s = None
        self.slow_start = True


@dataclass
class ServerLane:
    """One server of the job: its client, capture gate, window, state and counts."""

    endpoint: ServerEndpoint
    client: ExtractionClient
    gate: CaptureSpaceGate
    window: AimdWindow
    state: str = LIVE
    reason: str | None = None
    in_flight: int = 0
    done: int = 0
    failures: int = 0
    straight_failures: int = 0
    rates: RateMeter = field(default_factory=RateMeter)
    prober: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self.endpoint.name

    def has_room(self) -> bool:
        return self.state == LIVE and self.in_flight < self.window.size

    def row(self) -> dict[str, Any]:
        """The lane's line in ``progress.json``'s ``servers`` (the jobs screen and ``extract status``)."""
        samples_s = self.rates.rates()[0]
        return {"name": self.name, "url": redact_text(self.endpoint.url), "state": self.state,
                "reason": self.reason, "done": self.done, "samples_per_s": round(samples_s, 3),
                "failures": self.failures, "in_flight": self.in_flight, "window": self.window.size,
                "capture_dir": str(self.endpoint.capture_dir)}


# What the scheduler calls back into the job run (the runner owns the collector and the bookkeeping).
Collect = Callable[[ServerLane, Any, str], Awaitable[Any]]  # (lane, sample, rid) -> ManifestEntry
Record = Callable[[Any], None]
Fail = Callable[[Any, str], Any]  # (sample, reason) -> the ManifestEntry of a failed sample
IdentityCheck = Callable[[ServerLane], Awaitable[str | None]]  # None: the lane may serve the job


class SampleScheduler:
    """The shared queue and the lanes (see the module docstring)."""

    def __init__(self, lanes: list[ServerLane], *, job_id: str, retry: RetryPolicy, max_straight_failures: int,
                 identity_check: IdentityCheck, on_change: Callable[[], None], log: Callable[[str], None],
                 clear: Callable[[ServerLane, str], Awaitable[None]], dump_bytes_per_token: Callable[[], int],
                 down_timeout_s: float = 0.0) -> None:
        self.lanes = lanes
        self.job_id = job_id
        self.retry = retry
        self.max_straight_failures = max_straight_failures
        self.identity_check = identity_check
        self.on_change = on_change
        self.log = log
        self.clear = clear
        self.dump_bytes_per_token = dump_bytes_per_token
        self.queue: deque[Any] = deque()  # samples given back, redone before new ones
        self.backing_off = 0  # samples given back that wait out their backoff before they queue again
        self.attempts: dict[int, int] = {}  # failed attempts per sample index (ServerDown spends none)
        self.given_back = 0
        self.retries = 0  # samples given back after a failed attempt (a server down spends no retry)
        self.down_timeout_s = down_timeout_s
        self.none_live_since: float | None = None  # monotonic time the last live lane went
        self.straight_failures = 0  # job-wide, reset by any success
        self.abort_reason: str | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.ahead: deque[Any] = deque()  # samples read ahead while no lane had room (see `_read_ahead`)
        self._source: tuple[Callable[[], Any], object, object, Record] = (lambda: None, None, None, lambda _e: None)
        self._source_done = False
        self._changed = asyncio.Event()
        self._stopped = False

    # -- state ---------------------------------------------------------------------------------------------
    def live(self) -> list[ServerLane]:
        return [lane for lane in self.lanes if lane.state == LIVE]

    def no_server_reason(self) -> str | None:
        """Why nothing can be sent (every lane out), naming each server; None while one is live.  With one
        server, its own reason (``server unreachable at ...``): there is no other to name."""
        if self.live():
            return None
        if len(self.lanes) == 1:
            lane = self.lanes[0]
            return lane.reason or f"server {lane.name} {lane.state}"
        return "no server left: " + "; ".join(f"{lane.name} {lane.state}" + (f" ({lane.reason})" if lane.reason
                                                                            else "") for lane in self.lanes)

    def set_state(self, lane: ServerLane, state: str, reason: str | None) -> None:
        if lane.state == state and lane.reason == reason:
            return
        lane.state, lane.reason = state, reason
        self.log(f"server {lane.name}: {state}" + (f": {reason}" if reason else ""))
        if self.live():
            self.none_live_since = None
        elif self.none_live_since is None:
            self.none_live_since = time.monotonic()
        if state != LIVE:
            self._start_prober(lane)
        self._changed.set()
        self.on_change()

    def lanes_checked(self) -> None:
        """The start-up identity check set the lanes' first states: a job that starts with none live starts
        its ``down_timeout_s`` clock now."""
        if not self.live() and self.none_live_since is None:
            self.none_live_since = time.monotonic()

    def eta_rate(self) -> float:
        """Samples/s of the live lanes together: what the ETA counts on."""
        return sum(lane.rates.rates()[0] for lane in self.live())

    # -- probing -------------------------------------------------------------------------------------------
    def _start_prober(self, lane: ServerLane) -> None:
        if self._stopped or (lane.prober is not None and not lane.prober.done()):
            return
        lane.prober = asyncio.get_running_loop().create_task(self._probe(lane))

    async def _probe(self, lane: ServerLane) -> None:
        delay = PROBE_FIRST_S
        while not self._stopped and lane.state != LIVE:
            await asyncio.sleep(delay)
            # Backing off only while other lanes carry the job; with none live the job waits on this one.
            delay = min(PROBE_MAX_S, delay * 2) if self.live() else PROBE_WAITING_S
            if self._stopped:
                return
            self._check_down_timeout()
            if self.abort_reason:
                return
            try:
                ready = await lane.client.probe_ready()
            except Exception:  # noqa: BLE001 - a probe that fails is a server still away
                ready = False
            if not ready:
                continue  # still away (a refused lane stays refused, its reason naming the model)
            problem = await self.identity_check(lane)
            if problem is not None:
                self.set_state(lane, REFUSED, problem)
                continue
            lane.straight_failures = 0
            lane.window.reset()
            lane.rates.start(lane.done, 0, 0)
            self.set_state(lane, LIVE, None)
            self.log(f"server {lane.name} rejoins the job")
            return

    def _check_down_timeout(self) -> None:
        """Abort once no lane has been live for ``down_timeout_s`` (0: wait for ever)."""
        if not self.down_timeout_s or self.none_live_since is None or self.abort_reason:
            return
        down_for = time.monotonic() - self.none_live_since
        if down_for <= self.down_timeout_s:
            return
        what = (f"the server at {self.lanes[0].endpoint.url} stayed down" if len(self.lanes) == 1
                else "no server was live")
        self.abort_reason = f"{what} for {down_for:.0f} s (server_down_timeout_s = {self.down_timeout_s:g})"
        self._changed.set()

    def capture_blocked_reason(self) -> str | None:
        """Why nothing can be admitted for the capture filesystems: every live lane's gate is blocked by a
        fill over its threshold (with one server: its gate is)."""
        live = self.live()
        reasons = [lane.gate.blocked_reason for lane in live]
        if not live or not all(reasons):
            return None
        return "; ".join(r for r in reasons if r)

    # -- the loop ------------------------------------------------------------------------------------------
    async def run(self, take: Callable[[], Any], end: object, empty: object, record: Record, collect: Collect,
                  fail: Fail, stopped: Callable[[], bool], held: Callable[[], bool]) -> None:
        """Dispatch until the source is spent and every sample has an outcome (or ``stopped()``).

        ``take()`` returns the next item of the source without blocking: a sample, a ManifestEntry (a line
        that is no sample: recorded as it is), ``end`` or ``empty``."""
        loop = asyncio.get_running_loop()
        self._source = (take, end, empty, record)
        for lane in self.lanes:
            lane.rates.start(lane.done, 0, 0)
            if lane.state != LIVE:
                self._start_prober(lane)
        while not stopped() and not self.abort_reason:
            if self.queue:
                sample = self.queue.popleft()
            elif self.ahead:
                sample = self.ahead.popleft()
            elif not self._source_done:
                item = self._take_one()
                if item is None:
                    await asyncio.sleep(0.002)
                    continue
                sample = item
            else:
                if not self.tasks and not self.backing_off:
                    break
                await self._wait_change(0.2)
                continue
            while held() and not stopped():
                await asyncio.sleep(0.1)
            chosen = await self._free_lane(stopped)
            if chosen is None:
                self.queue.appendleft(sample)  # stopped: the next run sends it
                break
            chosen.in_flight += 1
            task = loop.create_task(self._attempt(chosen, sample, record, collect, fail))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _take_one(self) -> Any:
        """The next sample of the source, or None (nothing ready, or the source is spent).  A line that is no
        sample (a ManifestEntry) is recorded as it is taken."""
        take, end, empty, record = self._source
        while not self._source_done:
            item = take()
            if item is empty:
                return None
            if item is end:
                self._source_done = True
                return None
            if not hasattr(item, "input_ids"):  # a ManifestEntry of a line that cannot be a sample
                record(item)
                continue
            return item
        return None

    def _read_ahead(self) -> bool:
        """While no lane has room: take samples ahead (up to the lanes' ceilings together), so that the lines
        that are no sample behind them are recorded even while every server is down, as they always were."""
        if self._source_done or len(self.ahead) >= sum(lane.window.ceiling for lane in self.lanes):
            return False
        sample = self._take_one()
        if sample is None:
            return False
        self.ahead.append(sample)
        return True

    async def _wait_change(self, timeout_s: float) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            pass

    async def _free_lane(self, stopped: Callable[[], bool]) -> ServerLane | None:
        while not stopped() and not self.abort_reason:
            ready = [lane for lane in self.lanes if lane.has_room()]
            if ready:  # the most room relative to its window; a fast server's window is the larger
                return min(ready, key=lambda lane: (lane.in_flight / lane.window.size, lane.in_flight))
            if not self._read_ahead():
                await self._wait_change(0.2)
        return None

    async def _attempt(self, lane: ServerLane, sample: Any, record: Record, collect: Collect, fail: Fail) -> None:
        rid = f"{lane.endpoint.rid_prefix}{self.job_id}-{sample.index}"
        try:
            async with lane.gate.reserve(len(sample.input_ids) * self.dump_bytes_per_token()):
                await self.clear(lane, rid)
                started = time.monotonic()
                await lane.client.post_generate(rid, sample.input_ids)
                latency = time.monotonic() - started
                entry = await collect(lane, sample, rid)
        except ServerDown as exc:
            await self.clear(lane, rid)
            self._give_back(sample, 0.0)
            if lane.state == LIVE:
                lane.window.on_failure()
                lane.failures += 1
                self.set_state(lane, DOWN, f"server unreachable at {lane.endpoint.url}: {exc}")
            return
        except AttemptFailed as exc:
            await self.clear(lane, rid)
            self._lane_failed(lane, exc.reason)
            spent = self.attempts[sample.index] = self.attempts.get(sample.index, 0) + 1
            if not exc.retryable:
                record(fail(sample, exc.reason))
            elif spent > self.retry.max_retries:
                record(fail(sample, f"{spent} attempts failed; last: {exc.reason}"))
            else:
                self.retries += 1
                self._give_back(sample, self.retry.delay_s(spent))
            return
        except (Stopped, GateClosed):
            return  # cancelled before it was sent: the next run sends it
        except Exception as exc:  # noqa: BLE001 - a sample must end with an outcome, not a silent dead task
            record(fail(sample, f"{type(exc).__name__}: {exc}"))
            return
        finally:
            lane.in_flight -= 1
            self._changed.set()
        self.straight_failures = 0
        lane.straight_failures = 0
        lane.window.on_success(latency)
        lane.done += 1
        lane.rates.add(lane.done, 0, 0)
        self.attempts.pop(sample.index, None)
        record(entry)

    def _lane_failed(self, lane: ServerLane, reason: str) -> None:
        lane.failures += 1
        lane.straight_failures += 1
        lane.window.on_failure()
        self.straight_failures += 1
        if self.straight_failures >= self.max_straight_failures * len(self.lanes) and not self.abort_reason:
            where = "" if len(self.lanes) == 1 else " on every server"
            self.abort_reason = f"{self.straight_failures} consecutive attempts failed{where}; last: {reason}"
            return
        if lane.state == LIVE and lane.straight_failures >= self.max_straight_failures:
            self.set_state(lane, LEFT_OUT, f"{lane.straight_failures} straight failures; last: {reason}")

    def _give_back(self, sample: Any, delay_s: float) -> None:
        """The sample goes back to the front of the shared queue (after ``delay_s``, its backoff)."""
        self.given_back += 1
        if delay_s <= 0:
            self.queue.appendleft(sample)
            self._changed.set()
            return
        self.backing_off += 1

        def back() -> None:
            self.backing_off -= 1
            self.queue.appendleft(sample)
            self._changed.set()

        asyncio.get_running_loop().call_later(delay_s, back)

    def stop(self) -> None:
        """Cancel: nothing more is sent; requests in flight finish; probers end."""
        self._stopped = True
        for lane in self.lanes:
            lane.client.stop()
            lane.gate.closed = True
            if lane.prober is not None:
                lane.prober.cancel()
        self._changed.set()

    async def aclose(self) -> None:
        for lane in self.lanes:
            if lane.prober is not None:
                lane.prober.cancel()
            await lane.client.aclose()

    # -- the progress file -----------------------------------------------------------------------------------
    def totals(self) -> dict[str, Any]:
        """The job-wide dispatch figures of the progress file, and each server's row."""
        fills = [fill for lane in self.lanes if (fill := lane.gate.last_fill) is not None]
        return {"in_flight": sum(lane.in_flight for lane in self.lanes),
                "retries": self.retries,
                "backpressure_waits": sum(lane.gate.waits for lane in self.lanes),
                "peak_reserved_capture_bytes": max(lane.gate.peak_reserved_bytes for lane in self.lanes),
                "capture_fill": round(max(fills), 4) if fills else None,
                "servers": [lane.row() for lane in self.lanes]}
