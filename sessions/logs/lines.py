"""One log line from raw bytes to meaning: the cleaning rule and the rank rule (the only copies in the tree).

Cleaning (what a terminal would show): ``\\r`` updates collapse to the last state of the bar, ANSI escape
sequences go, tabs expand, other control characters go, and a tqdm bar that another process's log line
was glued to (no newline between them) gives way to that line.

Rank (which TP rank printed the line), in this order:

1. an explicit tag: SGLang's ``[<time> <ranks>]`` prefix in every form from 0.4 to 0.5.23 (``[23:17:01
   TP7]``, ``[2025-01-01 10:00:00.123 DP1 TP3 EP3]``, any subset of ``DP PP ATTN_CP MOE_DP CP TP EP``; a
   scheduler with ranks but no ``TPn`` is its group's only TP rank, TP0), and torch's ``[rankN]:`` (the
   global rank, which is the TP rank when pp_size is 1); a docker-compose ``name  | `` prefix is skipped;
2. a tqdm bar: TP0 (SGLang draws weight-loading and CUDA-graph bars on rank 0 only).  Before the
   continuation rule, because a bar at 0-9% starts with spaces (``  0%|``);
3. a continuation line (a traceback frame, ``During handling …``, ``SomeError: …``, a blank line): the
   rank of the line before it;
4. anything else (the main process, uvicorn, untagged library output): None, "main".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# `[2025-03-08 12:29:11 TP3] msg`, `[23:17:01 TP7] msg` (0.3/0.4), `[... DP0 PP0 ATTN_CP0 MOE_DP0 TP0 EP0]`
PREFIX_RE = re.compile(
    r"\[(?P<ts>(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:[.,]\d+)?)"
    r"(?P<ranks>(?: (?:DP|PP|ATTN_CP|MOE_DP|CP|TP|EP)\d+)*)\] ?"
)
RANK_TOKEN_RE = re.compile(r"(DP|PP|ATTN_CP|MOE_DP|CP|TP|EP)(\d+)")
# torch.distributed's own prefix: `[rank10]:[E130 18:11:34.707 ProcessGroupGloo.cpp:143] ...`
TORCH_RANK_RE = re.compile(r"\[rank(?P<rank>\d+)\]:")
# docker compose `name  | ` and `docker logs -t` timestamps, both put in front of the process's own line
CONTAINER_RE = re.compile(
    r"(?:[A-Za-z0-9][\w.\-]*\s+\| ?|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) )"
)
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# A bar without its newline, then another process's log line: the line is what counts.
_EMBEDDED_PREFIX_RE = re.compile(r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d")
_BAR_TAIL_RE = re.compile(r"\d+%|it/s|s/it")
_BAR_RE = re.compile(r"\d{1,3}%\|[^|]*\|\s*\d+/\d+|\d{1,3}% Completed \|")
_TRACEBACK_STARTS = ("Traceback", "During handling", "The above exception")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a log. ``number`` is 1-based, or None where it is not known (yet)."""

    number: int | None
    raw: str  # the decoded line as written (ANSI, ``\r`` kept; a huge line is cut to head … tail)
    text: str  # what a terminal would show (`clean`)
    rank: int | None  # the TP rank the line belongs to (`rank_of`), None for the main process
    offset: int = -1  # byte offset of the line's start in its file, -1 when not from a file


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor moves, titles)."""
    return ANSI_RE.sub("", text) if "\x1b" in text else text


def collapse_cr(text: str) -> str:
    """What a terminal shows for a line with ``\\r``: its last non-empty ``\\r`` segment (a tqdm bar's last state)."""
    if "\r" not in text:
        return text
    for segment in reversed(text.split("\r")):
        if segment.strip():
            return segment
    return ""


def clean(raw: str) -> str:
    """The line as a terminal shows it (the one cleaning rule: see the module docstring)."""
    text = raw
    if "\r" in text:
        text = collapse_cr(text)
    if "\x1b" in text:
        text = ANSI_RE.sub("", text)
    if "\t" in text:
        text = text.expandtabs(4)
    if _CONTROL_RE.search(text):
        text = _CONTROL_RE.sub("", text)
    embedded = _EMBEDDED_PREFIX_RE.search(text, 1) if "[" in text[1:] else None
    if embedded is not None and _BAR_TAIL_RE.search(text, 0, embedded.start()):
        text = text[embedded.start():]
    return text


def parse_prefix(text: str) -> tuple[str, str, str] | None:
    """(timestamp, rank tokens, message) of an SGLang log line, or None when it has no such prefix."""
    m = PREFIX_RE.match(text)
    if m is None:
        return None
    return m.group("ts"), m.group("ranks"), text[m.end():]


def rank_tokens(ranks: str) -> dict[str, int]:
    """``" DP0 TP3 EP3"`` -> {"DP": 0, "TP": 3, "EP": 3}."""
    return {name: int(num) for name, num in RANK_TOKEN_RE.findall(ranks)}


def strip_container_prefix(text: str) -> tuple[str, str]:
    """(prefix, rest): the docker-compose ``name  | `` or ``docker logs -t`` prefix split off, if any."""
    m = CONTAINER_RE.match(text)
    if m is None or text.startswith("["):
        return "", text
    return text[: m.end()], text[m.end():]


def tagged_rank(text: str) -> int | None:
    """The rank a cleaned line names itself (rule 1), else None."""
    if not text.startswith("["):
        _, text = strip_container_prefix(text)
        if not text.startswith("["):
            return None
    m = PREFIX_RE.match(text)
    if m is not None:
        ranks = m.group("ranks")
        if not ranks:
            return None
        tp = re.search(r" TP(\d+)", ranks)
        return int(tp.group(1)) if tp else 0
    t = TORCH_RANK_RE.match(text)
    return int(t.group("rank")) if t else None


def is_bar(text: str) -> bool:
    """A tqdm (or SGLang ``% Completed |``) progress bar (rule 2)."""
    return ("%|" in text or "% Completed" in text) and _BAR_RE.search(text) is not None


def is_continuation(text: str) -> bool:
    """A line that belongs to the line before it (rule 3): a traceback or multi-line message line."""
    if not text.strip() or text[:1].isspace() or text.startswith(_TRACEBACK_STARTS):
        return True
    head, colon, _ = text.partition(":")
    return bool(colon) and " " not in head and head.replace(".", "").replace("_", "").isalnum()


INHERIT = -2  # `own_rank`: the line takes the rank of the line before it


def own_rank(text: str) -> int | None:
    """The rank a line has by itself (rules 1, 2 and 4), or `INHERIT` for a continuation line."""
    tagged = tagged_rank(text)
    if tagged is not None:
        return tagged
    if is_bar(text):
        return 0
    if text.startswith("[") and PREFIX_RE.match(text) is not None:
        return None  # stamped but untagged: the main process, never a continuation
    return INHERIT if is_continuation(text) else None


def rank_of(text: str, previous: int | None) -> int | None:
    """The rank a cleaned line belongs to, given the rank of the line before it (the whole rule)."""
    own = own_rank(text)
    return previous if own == INHERIT else own


def rank_from_context(texts_before: list[str]) -> int | None:
    """The rank a continuation line inherits, from the cleaned lines before it (nearest last)."""
    for text in reversed(texts_before):
        own = own_rank(text)
        if own != INHERIT:
            return own
    return None


def make_line(number: int | None, raw: str, previous: int | None, offset: int = -1) -> LogLine:
    """A `LogLine` from the decoded text, ranked after a line of rank ``previous``."""
    text = clean(raw)
    return LogLine(number, raw, text, rank_of(text, previous), offset)


def lines_of_text(text: str) -> list[LogLine]:
    """Every line of ``text`` (a whole small log), numbered from 1 and ranked in order."""
    out: list[LogLine] = []
    previous: int | None = None
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()  # the newline that ends the last line does not start another
    for number, raw in enumerate(parts, start=1):
        line = make_line(number, raw, previous)
        previous = line.rank
        out.append(line)
    return out
