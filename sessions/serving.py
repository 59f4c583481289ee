"""The serving view: SGLang's ``Decode batch`` / ``Prefill batch`` lines (and ``/metrics``) as live figures.

`ServingTracker` takes cleaned log lines (ANSI stripped, ``\\r`` bars collapsed; `feed_bytes` does that for
raw log bytes) and keeps the latest stats line of every DP rank.  It reads the lines of SGLang 0.4 to
0.5.23:

* ``Decode batch.`` (0.4) and ``Decode batch,`` (0.5), ``Prefill batch [<iter>],`` (``SGLANG_LOG_FORWARD_ITERS``);
* any prefix: ``[ts TP0]``, ``[ts DP1 TP4 EP4]``, time only, none, and an outer one (docker compose
  ``name  | ``, ``docker logs -t``, a Ray actor's ``(SGLangEngine pid=…) ``);
* any field list, read as ``name: value`` pairs: ``largest-len``, ``pre-allocated usage``, ``#full token``
  / ``full token usage`` / ``#swa token`` (hybrid pools), ``accept len`` / ``accept rate`` (speculative),
  ``cuda graph`` / ``npu graph`` / ``cpu graph``, with a trailing comma or none.

A line that only mentions decoding (``Decode out of memory happened``) is not a stats line.  With DP
attention every DP leader logs its own lines; the server's figures are the **sum** over the latest line of
each DP rank for throughput and running/queued requests, the **mean** for token usage and accept length,
and the per-rank figures are kept.  `parse_metrics` reads the same gauges from ``/metrics`` text.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sessions.logs.lines import RANK_TOKEN_RE, clean, strip_wrapper

HISTORY_POINTS = 60  # gen-throughput samples kept for the sparkline
_MARKER_RE = re.compile(r"(?P<kind>Decode|Prefill) batch(?: \[\d+\])?[.,] ?")
_FIELD_RE = re.compile(r"\s*(?P<name>[^:,]+?):\s*(?P<value>[^,]*?)\s*(?P<end>,|$)")
_BRACKET_RE = re.compile(
    r"\[(?P<ts>(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:[.,]\d+)?)?(?P<ranks>(?: ?[A-Z_]+\d+)*)\] ?$"
)
# what may stand before the marker besides the bracket: nothing, or an outer prefix ending in a separator
_OUTER_END = ("|", ")", "]")
_ISO_TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?$")
_LOG_TS_RE = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)")


@dataclass(frozen=True)
class BatchLine:
    """One ``Decode batch`` or ``Prefill batch`` line."""

    kind: str  # "decode" | "prefill"
    dp_rank: int | None
    log_time: str | None
    fields: dict[str, Any]

    def number(self, *names: str) -> float | None:
        for name in names:
            value = self.fields.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return None

    @property
    def running_reqs(self) -> int | None:
        """Requests running after this batch.  A ``Prefill batch`` line's ``#running-req`` counts the
        requests that were running before it, not the batch being prefilled (``#new-seq``), which runs too."""
        value = self.number("#running-req")
        if value is None:
            return None
        if self.kind == "prefill":
            new = self.number("#new-seq")
            return None if new is None else int(value + new)
        return int(value)

    @property
    def queue_reqs(self) -> int | None:
        value = self.number("#queue-req")
        return int(value) if value is not None else None

    @property
    def token_usage(self) -> float | None:
        return self.number("token usage", "full token usage")

    @property
    def gen_throughput(self) -> float | None:
        return self.number("gen throughput (token/s)")

    @property
    def input_throughput(self) -> float | None:
        return self.number("input throughput (token/s)")

    @property
    def accept_length(self) -> float | None:
        return self.number("accept len")

    @property
    def accept_rate(self) -> float | None:
        return self.number("accept rate")


def _value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


# How SGLang formats its figures (metrics_reporter.py): a value written "%.2f" that has lost its decimals was
# cut, and so was a last field that no line ends with (a line cut mid-way, issue 23 class 6).
_TWO_DECIMALS = frozenset({"token usage", "full token usage", "gen throughput (token/s)",
                           "input throughput (token/s)", "accept len", "accept rate"})
_TWO_DECIMALS_RE = re.compile(r"-?\d+\.\d\d$")
_LAST_FIELDS = frozenset({"#queue-req", "input throughput (token/s)", "gen throughput (token/s)", "cuda graph",
                          "#pending-token", "timestamp", "largest-len"})
_REPEATED_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")  # Ray's log deduplication


def _complete(name: str, value: str, terminated: bool) -> bool:
    """Whether a field's value was written in full: a "%.2f" figure has its two decimals, and a field not
    followed by a comma is one that ends SGLang's lines."""
    if name in _TWO_DECIMALS and (len(value) < 4 or value[-3] != "." or not _TWO_DECIMALS_RE.match(value)):
        return False
    return terminated or name in _LAST_FIELDS


def parse_batch_line(text: str) -> BatchLine | None:
    """A cleaned log line -> `BatchLine`, or None when it is not a serving stats line.  A field that was cut
    (the line ends mid-way) is left out: each figure is then taken from an earlier complete line."""
    if "batch" not in text:
        return None
    if "across cluster]" in text:
        text = _REPEATED_RE.sub("", text)
    match = _MARKER_RE.search(text)
    if match is None:
        return None
    prefix = text[: match.start()]
    dp_rank = None
    log_time = None
    if prefix:
        stripped = prefix.rstrip()
        bracket = _BRACKET_RE.search(prefix)
        if bracket is not None:
            log_time = bracket.group("ts")
            ranks = {name: int(num) for name, num in RANK_TOKEN_RE.findall(bracket.group("ranks") or "")}
            dp_rank = ranks.get("DP")
        elif not (stripped.endswith(_OUTER_END) or _ISO_TS_RE.search(stripped)
                  or not strip_wrapper(prefix)[1].strip()):
            return None  # the words are inside some other message
    body = text[match.end() :]
    fields: dict[str, Any] = {}
    for part in _FIELD_RE.finditer(body):
        name = part.group("name").strip()
        if name and _complete(name, part.group("value"), part.group("end") == ","):
            fields[name] = _value(part.group("value"))
    kind = match.group("kind").lower()
    if "#running-req" not in fields and "#new-seq" not in fields:
        return None
    return BatchLine(kind, dp_rank, log_time, fields)


@functools.lru_cache(maxsize=4096)  # lines of one second share their stamp; strptime was half the cost
def log_time_epoch(log_time: str | None) -> float | None:
    """``2026-05-01 10:00:00`` (local time, as SGLang writes it) -> epoch seconds; None for time-only."""
    if not log_time:
        return None
    match = _LOG_TS_RE.match(log_time.replace("T", " "))
    if match is None:
        return None
    try:
        return time.mktime(time.strptime(f"{match.group(1)} {match.group(2)}", "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


@dataclass(frozen=True)
class ServingSnapshot:
    """The server's figures now (``status --json``'s ``serving``)."""

    gen_throughput: float | None
    running_reqs: int | None
    queue_reqs: int | None
    token_usage: float | None
    input_throughput: float | None
    updated_at: float | None
    accept_length: float | None = None
    accept_rate: float | None = None
    ranks: tuple[dict[str, Any], ...] = ()
    history: tuple[float, ...] = ()
    source: str = "log"  # "log" or "metrics"
    # Figures the server sent that are no figures (NaN, +Inf, negative or fractional counts): each is
    # None above ("n/a") and named here with its reason.
    unavailable: tuple[tuple[str, str], ...] = ()
    # The present, not the last line: when the figures were taken, when the server last logged a stats
    # line, and whether it is idle now (`SessionServing.snapshot`): an idle server reads running 0 and
    # gen 0, never the last busy line's "running 32".
    taken_at: float | None = None
    last_batch_at: float | None = None
    idle: bool = False

    @property
    def age_s(self) -> float | None:
        """Seconds between the figures' source (the last stats line, or the /metrics read) and now."""
        if self.updated_at is None or self.taken_at is None:
            return None
        return max(0.0, self.taken_at - self.updated_at)

    def to_json(self) -> dict[str, Any]:
        age = self.age_s
        out: dict[str, Any] = {
            "gen_throughput": self.gen_throughput,
            "running_reqs": self.running_reqs,
            "queue_reqs": self.queue_reqs,
            "token_usage": self.token_usage,
            "input_throughput": self.input_throughput,
            "updated_at": self.updated_at,
            "age_s": None if age is None else round(age, 1),
            "idle": self.idle,
            "last_batch_at": self.last_batch_at,
        }
        if self.accept_length is not None:
            out["accept_length"] = self.accept_length
        if self.accept_rate is not None:
            out["accept_rate"] = self.accept_rate
        out["source"] = self.source
        if len(self.ranks) > 1 or (self.ranks and self.ranks[0].get("dp_rank") is not None):
            out["ranks"] = [dict(r) for r in self.ranks]
        out["history"] = [round(v, 2) for v in self.history]
        if self.unavailable:
            out["unavailable"] = dict(self.unavailable)
        return out


@dataclass
class _RankState:
    """The latest complete value of each figure of one DP rank (a figure a cut line lacks keeps its last
    value); running, queued and token usage from the newest line of either kind."""

    gen_throughput: float | None = None
    input_throughput: float | None = None
    accept_length: float | None = None
    accept_rate: float | None = None
    running_reqs: int | None = None
    queue_reqs: int | None = None
    token_usage: float | None = None
    decode_at: float | None = None
    updated_at: float | None = None
    last: BatchLine | None = None  # the newest line itself (the idle limit reads its pace)

    def update(self, line: BatchLine) -> None:
        self.last = line
        running = line.running_reqs
        if running is not None:
            self.running_reqs = running
        queued = line.queue_reqs
        if queued is not None:
            self.queue_reqs = queued
        usage = line.token_usage
        if usage is not None:
            self.token_usage = usage
        if line.kind == "decode":
            fields = line.fields
            if "gen throughput (token/s)" in fields:
                self.gen_throughput = line.gen_throughput
            if "accept len" in fields:
                self.accept_length = line.accept_length
                self.accept_rate = line.accept_rate if "accept rate" in fields else self.accept_rate
        elif "input throughput (token/s)" in line.fields:
            self.input_throughput = line.input_throughput


READY_TEXT = "The server is fired up and ready to roll"


@dataclass
class ServingTracker:
    """Latest stats line per DP rank, plus a short history of the server's gen throughput."""

    ranks: dict[int | None, _RankState] = field(default_factory=dict)
    history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    lines_seen: int = 0
    _partial: bytes = b""
    # every fed line may change the figures: the snapshot is built again only after one (the TUI asks
    # every second, a quiet server logs nothing)
    _changes: int = field(default=0, compare=False, repr=False)
    _built: tuple[int, ServingSnapshot | None] | None = field(default=None, compare=False, repr=False)

    def feed_line(self, text: str, read_at: float | None = None) -> BatchLine | None:
        """One cleaned log line; returns what it parsed (None for any other line)."""
        self._changes += 1
        line = parse_batch_line(text)
        if line is None:
            if READY_TEXT in text:
                self._warmup_done()
            return None
        self.lines_seen += 1
        at = log_time_epoch(line.log_time) or (read_at if read_at is not None else time.time())
        state = self.ranks.setdefault(line.dp_rank, _RankState())
        state.update(line)
        state.updated_at = at
        if line.kind == "decode":
            state.decode_at = at
            if line.gen_throughput is not None:
                total = self._sum(lambda s: s.gen_throughput)
                if total is not None:
                    self.history.append(total)
        return line

    def _warmup_done(self) -> None:
        """SGLang prints "fired up" once its warm-up request has been answered
        (``sglang/srt/entrypoints/http_server.py:2600``, sglang-facts §1.4): the batch lines before it were
        that request's, so nothing runs or waits now."""
        for state in self.ranks.values():
            if state.running_reqs is not None:
                state.running_reqs = 0
            if state.queue_reqs is not None:
                state.queue_reqs = 0

    def latest(self) -> BatchLine | None:
        """The newest stats line of any rank (what the idle limit is computed from)."""
        states = [st for st in self.ranks.values() if st.last is not None and st.updated_at is not None]
        if not states:
            return None
        return max(states, key=lambda st: st.updated_at or 0.0).last

    def feed_lines(self, lines: Iterable[str]) -> None:
        for text in lines:
            self.feed_line(text)

    def feed_bytes(self, chunk: bytes) -> None:
        """Raw log bytes (any split): whole lines are cleaned and fed; a partial last line waits."""
        data = self._partial + chunk
        if b"batch" not in data:
            # no stats line can be in here; keep only a tail that could start one
            cut = data.rfind(b"\n")
            self._partial = data[cut + 1 :] if cut >= 0 else data[-4096:]
            return
        *whole, self._partial = data.split(b"\n")
        if len(self._partial) > 1 << 20:
            self._partial = self._partial[-4096:]
        now = time.time()
        for raw in whole:
            if b"batch" not in raw:
                continue
            self.feed_line(clean(raw.decode("utf-8", errors="replace")).rstrip(), read_at=now)

    def _sum(self, pick) -> float | None:
        values = [v for v in (pick(s) for s in self.ranks.values()) if v is not None]
        return float(sum(values)) if values else None

    def _mean(self, pick) -> float | None:
        values = [v for v in (pick(s) for s in self.ranks.values()) if v is not None]
        return float(sum(values) / len(values)) if values else None

    def snapshot(self) -> ServingSnapshot | None:
        """The server's figures from the latest line of each DP rank (None before any stats line); the
        same object again while no line was fed since."""
        built = self._built
        if built is not None and built[0] == self._changes:
            return built[1]
        snap = self._snapshot()
        self._built = (self._changes, snap)
        return snap

    def _snapshot(self) -> ServingSnapshot | None:
        if not self.ranks:
            return None
        running = self._sum(lambda s: s.running_reqs)
        queued = self._sum(lambda s: s.queue_reqs)
        per_rank = []
        for dp in sorted(self.ranks, key=lambda k: -1 if k is None else k):
            s = self.ranks[dp]
            per_rank.append(
                {
                    "dp_rank": dp,
                    "gen_throughput": s.gen_throughput,
                    "running_reqs": s.running_reqs,
                    "queue_reqs": s.queue_reqs,
                    "token_usage": s.token_usage,
                    "input_throughput": s.input_throughput,
                    "accept_length": s.accept_length,
                    "accept_rate": s.accept_rate,
                    "updated_at": s.updated_at,
                }
            )
        updated = [s.updated_at for s in self.ranks.values() if s.updated_at is not None]
        return ServingSnapshot(
            gen_throughput=self._sum(lambda s: s.gen_throughput),
            running_reqs=int(running) if running is not None else None,
            queue_reqs=int(queued) if queued is not None else None,
            token_usage=self._mean(lambda s: s.token_usage),
            input_throughput=self._sum(lambda s: s.input_throughput),
            updated_at=max(updated) if updated else None,
            accept_length=self._mean(lambda s: s.accept_length),
            accept_rate=self._mean(lambda s: s.accept_rate),
            ranks=tuple(per_rank),
            history=tuple(self.history),
        )


# -- /metrics --------------------------------------------------------------------------------------------

_SAMPLE_RE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_GAUGES = {
    "sglang:gen_throughput": "gen_throughput",
    "sglang:num_running_reqs": "running_reqs",
    "sglang:num_queue_reqs": "queue_reqs",
    "sglang:token_usage": "token_usage",
    "sglang:spec_accept_length": "accept_length",
    "sglang:spec_accept_rate": "accept_rate",
}


# figure -> (smallest value, whole number): a count of requests is a whole number >= 0.
_GAUGE_RULES = {"running_reqs": (0.0, True), "queue_reqs": (0.0, True), "gen_throughput": (0.0, False),
                "token_usage": (0.0, False), "accept_length": (0.0, False), "accept_rate": (0.0, False)}


class MetricsReading(NamedTuple):
    """One ``/metrics`` read: the usable figures, the figures that were sent but are no figures (with the
    reason), and ``error`` when no usable answer came (its reason; then both are empty)."""

    values: dict[str, float]
    unavailable: dict[str, str]
    error: str | None = None


def read_metrics(text: str) -> MetricsReading:
    """SGLang's ``/metrics`` text -> the gauges {gen_throughput, running_reqs, queue_reqs, token_usage,
    accept_*}, each checked by `server_answers.finite_number` (``NaN``, ``+Inf``, a negative or fractional
    count is "n/a" with its reason, never a figure).

    Gauges of several DP ranks are summed (throughput, requests) or averaged (usage, accept figures); one
    bad rank makes the figure unavailable (a sum without it would be wrong)."""
    from sessions.server_answers import finite_number

    sums: dict[str, list[float]] = {}
    unavailable: dict[str, str] = {}
    for raw in text.splitlines():
        if not raw.startswith("sglang:"):
            continue
        match = _SAMPLE_RE.match(raw)
        if match is None or match.group("name") not in _GAUGES:
            continue
        key = _GAUGES[match.group("name")]
        minimum, integer = _GAUGE_RULES[key]
        figure = finite_number(match.group("value"), match.group("name"), minimum=minimum, integer=integer)
        if figure.value is None:
            unavailable.setdefault(key, figure.reason or "not a number")
            continue
        sums.setdefault(key, []).append(figure.value)
    out: dict[str, float] = {}
    for key, values in sums.items():
        if key in unavailable:
            continue
        if key in ("token_usage", "accept_length", "accept_rate"):
            out[key] = sum(values) / len(values)
        else:
            out[key] = sum(values)
    return MetricsReading(out, unavailable)


def parse_metrics(text: str) -> dict[str, float]:
    """The usable figures of `read_metrics`."""
    return read_metrics(text).values


def with_metrics(snapshot: ServingSnapshot | None, metrics: dict[str, float], at: float,
                 unavailable: dict[str, str] | None = None) -> ServingSnapshot:
    """The log's figures updated by a fresh ``/metrics`` read (it also goes to 0 when the server idles).
    A figure in ``unavailable`` is None ("n/a"), with its reason kept on the snapshot."""
    base = snapshot or ServingSnapshot(None, None, None, None, None, None)
    bad = unavailable or {}
    spec = metrics.get("accept_length", 0.0) > 0

    def pick(key: str, old: Any) -> Any:
        if key in bad:
            return None
        value = metrics.get(key)
        if value is None:
            return old
        return int(value) if key in ("running_reqs", "queue_reqs") else value

    return ServingSnapshot(
        gen_throughput=pick("gen_throughput", base.gen_throughput),
        running_reqs=pick("running_reqs", base.running_reqs),
        queue_reqs=pick("queue_reqs", base.queue_reqs),
        token_usage=pick("token_usage", base.token_usage),
        input_throughput=base.input_throughput,
        updated_at=at,
        accept_length=pick("accept_length", None) if spec or "accept_length" in bad else base.accept_length,
        accept_rate=pick("accept_rate", None) if spec or "accept_rate" in bad else base.accept_rate,
        ranks=base.ranks,
        history=base.history,
        source="metrics",
        unavailable=tuple(sorted(bad.items())),
    )


def fetch_metrics_reading(base_url: str, timeout_s: float = 1.0) -> MetricsReading:
    """GET ``<base>/metrics`` through the bounded reader (`sessions.server_answers`: a total deadline of
    ``timeout_s``, `METRICS_MAX_BYTES`, no proxies) -> `read_metrics`; never raises."""
    from sessions import server_answers

    answer = server_answers.fetch(f"{base_url}/metrics", deadline_s=timeout_s,
                                  max_bytes=server_answers.METRICS_MAX_BYTES)
    if answer.error is not None:
        return MetricsReading({}, {}, f"/metrics: {answer.error}")
    if answer.status != 200:
        return MetricsReading({}, {}, f"/metrics answered {answer.status}")
    return read_metrics(answer.text())


def fetch_metrics(base_url: str, timeout_s: float = 1.0) -> dict[str, float] | None:
    """The usable figures of ``<base>/metrics``; None when it gave no usable answer."""
    reading = fetch_metrics_reading(base_url, timeout_s)
    return None if reading.error is not None else reading.values


DEFAULT_DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval (decode steps between two Decode lines)
IDLE_MIN_S = 5.0  # never idle sooner than this after a stats line (the log's stamps have 1 s resolution)
IDLE_MAX_S = 300.0


def idle_after_s(line: BatchLine | None, decode_log_interval: int = DEFAULT_DECODE_LOG_INTERVAL) -> float:
    """Seconds without a stats line after which the server is not decoding anymore.

    SGLang logs a Decode line every ``decode_log_interval`` decode steps while any request runs, so the
    gap between two lines is about interval x (running x accept length) / gen throughput.  Twice that
    (plus the stamps' second), within [`IDLE_MIN_S`, `IDLE_MAX_S`].
    """
    expected = None
    if line is not None:
        gen = line.gen_throughput
        running = line.running_reqs or 1
        accept = line.accept_length or 1.0
        if gen and gen > 0:
            expected = decode_log_interval * running * accept / gen
    if expected is None:
        return IDLE_MIN_S * 2
    return min(IDLE_MAX_S, max(IDLE_MIN_S, 2 * expected + 1.0))


def decode_log_interval_of(argv: list[str] | tuple[str, ...]) -> int:
    """``--decode-log-interval N`` of a launch command (SGLang's default 40 when absent or not a number)."""
    value = None
    for i, arg in enumerate(argv):
        name, eq, inline = str(arg).partition("=")
        if name == "--decode-log-interval":
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    try:
        return max(1, int(str(value))) if value is not None else DEFAULT_DECODE_LOG_INTERVAL
    except ValueError:
        return DEFAULT_DECODE_LOG_INTERVAL


def as_idle(snapshot: ServingSnapshot) -> ServingSnapshot:
    """The figures of a server that runs nothing now: no requests, no throughput (KV usage stays: the
    radix cache keeps what it holds)."""
    return dataclasses.replace(snapshot, gen_throughput=0.0, running_reqs=0, queue_reqs=0, input_throughput=0.0,
                               idle=True)


class SessionServing:
    """The serving view of one session: its log's stats lines, plus ``/metrics`` every few seconds when
    the server was started with ``--enable-metrics`` (what a live status reads).

    Idle, for the present tense: no stats line for longer than `idle_after_s` of the last one, and
    ``/metrics`` (when the server exports it) shows nothing running or queued."""

    METRICS_EVERY_S = 5.0

    def __init__(self, decode_log_interval: int = DEFAULT_DECODE_LOG_INTERVAL) -> None:
        self.tracker = ServingTracker()
        self.decode_log_interval = decode_log_interval
        self._metrics: MetricsReading | None = None
        self._metrics_at = 0.0
        self._metrics_read_at = 0.0

    def reset(self) -> None:
        self.tracker = ServingTracker()

    def feed_bytes(self, chunk: bytes) -> None:
        self.tracker.feed_bytes(chunk)

    def snapshot(self, metrics_url: str | None = None) -> ServingSnapshot | None:
        now = time.time()
        if metrics_url is not None and now - self._metrics_at >= self.METRICS_EVERY_S:
            self._metrics_at = now
            fetched = fetch_metrics_reading(metrics_url)
            if fetched.error is None:
                self._metrics = fetched
                self._metrics_read_at = now
        snap = self.tracker.snapshot()
        if snap is None and (metrics_url is None or self._metrics is None):
            return None
        last_line_at = snap.updated_at if snap is not None else None
        if metrics_url is not None and self._metrics is not None:
            snap = with_metrics(snap, self._metrics.values, self._metrics_read_at, self._metrics.unavailable)
        assert snap is not None
        snap = dataclasses.replace(snap, taken_at=now, last_batch_at=last_line_at)
        silent = last_line_at is None or now - last_line_at > idle_after_s(self.tracker.latest(),
                                                                             self.decode_log_interval)
        metrics_busy = (
            metrics_url is not None and self._metrics is not None
            and (self._metrics.values.get("running_reqs", 0) > 0 or self._metrics.values.get("queue_reqs", 0) > 0)
        )
        return as_idle(snap) if silent and not metrics_busy else snap


def summarize_serving(path: str | Path, max_bytes: int | None = None) -> ServingSnapshot | None:
    """The serving figures at the end of a log file (``inspect-log``), read in blocks by the log core (a
    FIFO or a device is a `sessions.logs.LogFileError` at once)."""
    from sessions.logs.source import iter_blocks

    tracker = ServingTracker()
    for block in iter_blocks(path, max_bytes):
        tracker.feed_bytes(block)
    tracker.feed_bytes(b"\n")
    return tracker.snapshot()
