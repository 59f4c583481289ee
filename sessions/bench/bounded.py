"""Bounded reads of a server's answers for the bench: SSE lines with a size cap, JSON bodies with a size
cap that must be objects, and the checks that make a streamed count a number the bench may use.

The bench never trusts what a server says (issue 22, item 9): a line with no newline for hundreds of MB, a
``completion_tokens`` that jumps to millions or falls, a ``/server_info`` that is a list.  Each of these is
an `AnswerError` with a reason; the client turns it into a failed request, never into a figure.  The
caps are far above what SGLang sends: a streamed chunk carries the cumulative text and output ids, about
10 bytes per token, so 8 MiB holds a chunk of more than 500,000 tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from sessions.server_answers import finite_number, kind_of

MAX_SSE_LINE_BYTES = 8 << 20
MAX_JSON_BODY_BYTES = 8 << 20  # /server_info of a big MoE server is about 20 KB
MAX_PROMPT_TOKENS = 1 << 24


class AnswerError(ValueError):
    """A server answer the bench refuses to use; the message says what was wrong."""


def iter_lines(response: Any, max_line: int = MAX_SSE_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a streamed body (``\\n``-separated, a trailing ``\\r`` dropped), each at most ``max_line``
    bytes; a longer one raises `AnswerError` as soon as it passes the cap, without keeping the rest."""
    pending = bytearray()
    for chunk in response.iter_raw():
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                pending += chunk[start:]
                if len(pending) > max_line:
                    raise AnswerError(f"a streamed line longer than {max_line} bytes (no newline)")
                break
            pending += chunk[start:end]
            if len(pending) > max_line:
                raise AnswerError(f"a streamed line of {len(pending)} bytes, more than the cap of {max_line}")
            yield bytes(pending).rstrip(b"\r")
            pending.clear()
            start = end + 1
    if pending:
        yield bytes(pending).rstrip(b"\r")


def read_body(response: Any, cap: int = MAX_JSON_BODY_BYTES) -> bytes:
    """The whole body, refused once it passes ``cap`` bytes."""
    out = bytearray()
    for chunk in response.iter_raw():
        out += chunk
        if len(out) > cap:
            raise AnswerError(f"a body of more than {cap} bytes")
    return bytes(out)


def get_json_object(client: Any, url: str, headers: dict[str, str] | None = None,
                    cap: int = MAX_JSON_BODY_BYTES) -> dict[str, Any]:
    """``GET url`` read with a size cap; the answer must be HTTP 200 with a JSON object."""
    with client.stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            raise AnswerError(f"HTTP {response.status_code}")
        body = read_body(response, cap)
    return json_object(body, url.rsplit("/", 1)[-1] or url)


def json_object(raw: bytes | str, what: str) -> dict[str, Any]:
    """A JSON object, or `AnswerError`.  Plain `json.loads`, not `server_answers.parse_json`: a NaN or an
    infinity is let through here so that the check of the field that holds it (`count`, `finite`) names
    the field ("spec_accept_length inf is outside ..."), where parse_json would refuse the whole chunk."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise AnswerError(f"{what} is not JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise AnswerError(f"{what} is {kind_of(data)}, not an object")
    return data


def count(value: Any, name: str, limit: int) -> int:
    """A count the server reports: an int in [0, limit] (a float with an integral value is accepted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AnswerError(f"{name} is {kind_of(value)} {str(value)[:40]!r}, not a count")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise AnswerError(f"{name} is {value!r}, not a count")
    if not 0 <= value <= limit:
        raise AnswerError(f"{name} {int(value)} is outside 0..{limit}")
    return int(value)


def finite(value: Any, name: str, low: float, high: float) -> float:
    """A figure the server reports: a JSON number (not a string, not a bool) that `finite_number` takes,
    within [low, high]."""
    number = None if isinstance(value, str) else finite_number(value, name).value
    if number is None:
        raise AnswerError(f"{name} is {str(value)[:40]!r}, not a finite number")
    if not low <= number <= high:
        raise AnswerError(f"{name} {value!r} is outside {low:g}..{high:g}")
    return number
