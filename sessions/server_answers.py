"""One bounded reader for every answer a server gives us: the probes (``/ready``, ``/model_info``),
``/server_info`` (``/get_server_info``), ``/metrics`` and the bench's ``/server_info``.

Each read has a total deadline (connect, headers and body together: a server that trickles one byte
every half second is cut off at the deadline, not when it stops), a size cap (a 400 MB body is refused
once the cap is passed, and nothing beyond the cap is held), and typed results: `get_json` with
``expect=dict`` fails with a reason for any other JSON, for non-finite numbers and for nesting deeper than
`JSON_MAX_DEPTH`; `finite_number` turns a figure into a float or a reason.  Nothing here raises for what a
server sends: a violation is an `Answer` with ``error`` set.

httpx's timeouts bound each socket read, not the whole answer, so a trickle that sends a byte within
every read timeout (headers included) would never end; this reads with h11 (the HTTP/1.1 parser httpx
itself uses) over a socket whose timeout is the time left until the deadline, before every read.  No
proxy is used (a probe of a local server must never go through an ``http_proxy`` meant for the internet)
and no redirect is followed.
"""
from __future__ import annotations

import functools
import json
import math
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import h11

from sessions.safe_files import json_depth, json_kind

DEFAULT_DEADLINE_S = 2.0
# /server_info of a TP8 server is a few tens of KB; /model_info and /ready far less.
JSON_MAX_BYTES = 4 << 20
# /metrics of SGLang with histograms on is a few hundred KB per DP rank.
METRICS_MAX_BYTES = 16 << 20
HEADERS_MAX_BYTES = 64 << 10
JSON_MAX_DEPTH = 32
_READ_CHUNK = 64 << 10


@dataclass(frozen=True)
class Answer:
    """One HTTP answer read in full within its deadline and cap (``error`` None), or why it was not.

    ``status`` None means no HTTP answer at all (refused, timed out before the headers, ...); with an
    ``error`` and a ``status`` the headers came but the body broke a limit, and ``body`` is empty."""

    url: str
    status: int | None
    body: bytes
    error: str | None
    content_type: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class JsonResult(NamedTuple):
    """A JSON answer: ``json`` is the decoded value (None when there is none or it broke a rule, with
    ``error`` saying which).  The shape `sessions.probes.http_get_json` has always returned."""

    status: int | None
    json: Any
    error: str | None


def fetch(url: str, *, deadline_s: float = DEFAULT_DEADLINE_S, max_bytes: int = JSON_MAX_BYTES,
          method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None) -> Answer:
    """``method url`` read within ``deadline_s`` in all and at most ``max_bytes`` of body; never raises."""
    started = time.monotonic()
    deadline = started + max(0.0, float(deadline_s))

    def failed(error: str, status: int | None = None, content_type: str = "") -> Answer:
        return Answer(url, status, b"", error, content_type, time.monotonic() - started)

    try:  # urlsplit raises for "http://[::1" (adv22: a ValueError traceback out of "never raises")
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError as exc:
        return failed(f"not a valid URL: {url!r} ({exc})")
    if parts.scheme not in ("http", "https") or not hostname:
        return failed(f"not an http(s) URL: {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return failed(f"bad port in {url!r}: {exc}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.netloc.rsplit("@", 1)[-1]
    request_headers = [("Host", host_header), ("User-Agent", "eagle3-tui"), ("Accept", "*/*"),
                       ("Connection", "close")]
    request_headers += [(k, v) for k, v in (headers or {}).items()]
    if body is not None:
        request_headers.append(("Content-Length", str(len(body))))
    sock: socket.socket | None = None
    status: int | None = None
    content_type = ""
    try:
        sock = socket.create_connection((hostname, port), timeout=_left(deadline))
        if parts.scheme == "https":
            sock = _ssl_context().wrap_socket(sock, server_hostname=hostname)
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEADERS_MAX_BYTES)
        out = conn.send(h11.Request(method=method, target=target, headers=request_headers)) or b""
        if body:
            out += conn.send(h11.Data(data=body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        sock.settimeout(_left(deadline))
        sock.sendall(out)
        chunks: list[bytes] = []
        size = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                sock.settimeout(_left(deadline))
                conn.receive_data(sock.recv(_READ_CHUNK))
            elif isinstance(event, h11.Response):
                status = event.status_code
                content_type = _header(event.headers, b"content-type")
                length = _header(event.headers, b"content-length")
                if length.isdigit() and int(length) > max_bytes:
                    return failed(_over_cap(int(length), max_bytes, claimed=True), status, content_type)
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > max_bytes:
                    return failed(_over_cap(size, max_bytes), status, content_type)
                chunks.append(bytes(event.data))
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                if status is None:
                    return failed("the server closed the connection without an answer")
                return Answer(url, status, b"".join(chunks), None, content_type, time.monotonic() - started)
            # h11.InformationalResponse (100 Continue): read on
    except TimeoutError:
        what = "its body" if status is not None else "an answer"
        return failed(f"timed out after {deadline_s:g}s with no complete answer (waiting for {what})", status,
                      content_type)
    except ConnectionRefusedError:
        return failed("connection refused")
    except h11.RemoteProtocolError as exc:
        return failed(f"not a valid HTTP answer: {exc}", status, content_type)
    except (OSError, ssl.SSLError) as exc:
        return failed(exc.strerror or str(exc) or type(exc).__name__, status, content_type)
    except Exception as exc:  # noqa: BLE001 - a reader reports, it never crashes its caller
        return failed(f"{type(exc).__name__}: {exc}", status, content_type)
    finally:
        if sock is not None:
            sock.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _header(headers: Any, name: bytes) -> str:
    for key, value in headers:
        if key.lower() == name:
            return bytes(value).decode("latin-1").strip()
    return ""


def _over_cap(size: int, cap: int, claimed: bool = False) -> str:
    said = "says it is" if claimed else "passed"
    return f"the answer {said} {size} bytes, over the {cap}-byte cap; not read"


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context()


# --- JSON ------------------------------------------------------------------------------------------------

def kind_of(value: Any) -> str:
    """``an object``, ``an array``, ``a number`` ...: how a JSON value is named in a reason."""
    return _with_article(json_kind(value))


def _expected(expect: type) -> str:
    """``an object`` for dict, ``an array`` for list ...: the kind a caller asked for, named as `kind_of` does."""
    sample: dict[type, Any] = {dict: {}, list: [], str: "", bool: True, int: 0, float: 0.0}
    return kind_of(sample[expect]) if expect in sample else expect.__name__


def _with_article(noun: str) -> str:
    return noun if noun == "null" else f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def parse_json(body: bytes, expect: type | None = dict, max_depth: int = JSON_MAX_DEPTH) -> tuple[Any, str | None]:
    """(value, None) or (None, why): JSON text with finite numbers only, nested at most ``max_depth``
    deep, and of type ``expect`` (None: any)."""
    def no_constant(name: str) -> Any:
        raise ValueError(f"holds {name}, which is not a finite number")

    def finite_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"holds {text[:40]}, which is not a finite number")
        return value

    try:
        decoded = body.decode("utf-8")
        if json_depth(decoded) > max_depth:  # counted on the text: a deep answer is never built, nor recursed into
            return None, f"is nested deeper than {max_depth} levels"
        value = json.loads(decoded, parse_constant=no_constant, parse_float=finite_float)
    except RecursionError:  # json_depth counts brackets; this is its backstop
        return None, f"is nested deeper than {max_depth} levels"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"is not JSON ({exc})"
    if expect is not None and not isinstance(value, expect):
        return None, f"is {kind_of(value)}, not {_expected(expect)}"
    return value, None


def get_json(url: str, *, deadline_s: float = DEFAULT_DEADLINE_S, max_bytes: int = JSON_MAX_BYTES,
             expect: type | None = dict, headers: dict[str, str] | None = None) -> JsonResult:
    """GET ``url`` as JSON of type ``expect``, bounded as `fetch`; never raises.

    A 200 answer that is not valid JSON of that type is ``(200, None, reason)``.  Other statuses keep a
    JSON body when there is a valid one (an error's ``detail``) and no error: the status says it."""
    answer = fetch(url, deadline_s=deadline_s, max_bytes=max_bytes, headers=headers)
    if answer.error is not None:
        return JsonResult(answer.status, None, f"{_path(url)}: {answer.error}")
    if not answer.body.strip():
        return JsonResult(answer.status, None, None if answer.status != 200 or expect is None
                          else f"{_path(url)}: the answer is empty, not {_expected(expect) if expect is not None else 'JSON'}")
    value, why = parse_json(answer.body, expect if answer.status == 200 else None)
    if why is not None:
        return JsonResult(answer.status, None, f"{_path(url)}: the answer {why}" if answer.status == 200 else None)
    return JsonResult(answer.status, value, None)


def _path(url: str) -> str:
    try:
        return urlsplit(url).path or "/"
    except ValueError:  # not a URL at all: fetch has said so
        return url[:200]


# --- numbers ---------------------------------------------------------------------------------------------


class Figure(NamedTuple):
    """A number a server reported: ``value`` None when it cannot be used, ``reason`` saying why."""

    value: float | None
    reason: str | None


def finite_number(raw: Any, name: str, *, minimum: float | None = None, integer: bool = False) -> Figure:
    """``raw`` (a JSON number or the text of a Prometheus sample) as a finite float, at least ``minimum``,
    whole when ``integer``; else ``Figure(None, reason)``: ``NaN``, ``+Inf``, ``-3`` requests, ``1.5``
    requests, a string or a bool are not figures."""
    if isinstance(raw, bool):
        return Figure(None, f"{name} is a boolean ({raw!r}), not a number")
    if isinstance(raw, (int, float)):
        try:
            value = float(raw)
        except OverflowError:  # a JSON integer of hundreds of digits: json.loads makes it an int
            return Figure(None, f"{name} is an integer of {len(str(raw))} digits, not a finite number")
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            return Figure(None, f"{name} is {raw[:40]!r}, not a number")
    else:
        return Figure(None, f"{name} is {kind_of(raw)}, not a number")
    if not math.isfinite(value):
        return Figure(None, f"{name} is {raw!s:.20}, not a finite number")
    if minimum is not None and value < minimum:
        return Figure(None, f"{name} is {value:g}, below {minimum:g}")
    if integer and value != int(value):
        return Figure(None, f"{name} is {value:g}, not a whole number")
    return Figure(value, None)
