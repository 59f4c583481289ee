"""One log line from raw bytes to meaning: the cleaning rule and the rank rule (the only copies in the tree).

Cleaning (what a terminal would show): ``\\r`` updates collapse to the last state of the bar, ANSI escape
sequences go, tabs expand, other control characters go, and a tqdm bar that another process's log line
was glued to (no newline between them) gives way to that line.

Rank (which TP rank printed the line), in this order:

1. an explicit tag: SGLang's ``[<time> <ranks>]`` prefix in every form from 0.4 to 0.5.23 (``[23:17:01
   TP7]``, ``[2025-01-01 10:00:00.123 DP1 TP3 EP3]``, any subset of ``DP PP ATTN_CP MOE_DP CP TP EP``; a
   scheduler with ranks but no ``TPn`` is its group's only TP rank, TP0), and torch's ``[rankN]:`` (the
   global rank, which is the TP rank when pp_size is 1); a wrapper (`strip_wrapper`) is skipped;
2. a tqdm bar: TP0 (SGLang draws weight-loading and CUDA-graph bars on rank 0 only).  Before the
   continuation rule, because a bar at 0-9% starts with spaces (``  0%|``);
3. a continuation line (a traceback frame, ``During handling …``, ``SomeError: …``, a blank line): the
   rank of the line before it;
4. anything else (the main process, uvicorn, untagged library output): None, "main".

`own_tag` gives the rule's answer as the line's tag (its prefix's tokens, ``(("PP", 1), ("TP", 2))``) so
that the startup tracker can place it in the server's layout (a global rank); `rank_of` gives the TP rank.
"""

from __future__ import annotations

import functools
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


def strip_container_prefix(text: str) -> tuple[str, str]:
    """(prefix, rest): the docker-compose ``name  | `` or ``docker logs -t`` prefix split off, if any."""
    m = CONTAINER_RE.match(text)
    if m is None or text.startswith("["):
        return "", text
    return text[: m.end()], text[m.end():]


# Wrappers that deployments put in front of the process's own line (issue 23 class 1), one form each; they
# are peeled off in a loop, since they stack (a Ray actor's line in a container, quoted in markdown).
_WRAPPER_RE = re.compile(
    r"(?:"
    r"> ?"  # a markdown quote
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? (?:stdout|stderr) [FP] "  # Kubernetes CRI
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) "  # docker logs -t
    r"|\((?:[\w.\-]+ )?pid=\d+(?:, ip=[\d.]+)?\) "  # a Ray actor: `(SGLangEngine pid=123, ip=10.0.0.1) `
    # a deployment's own logger format: `[<time>][<file>:<line>][INFO]: `, any bracketed fields, no "] "
    r"|(?:\[[^\]\n]*\])+?\[(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]:? ?"
    # Python's logging formats: `2025-01-01 10:00:00,123 - name - INFO - `, `INFO:name:`, `INFO     name: `
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ (?:- [\w.\-]+ )?- (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.\-]+:"
    r"|[A-Za-z0-9][\w.\-]*\s+\| ?"  # docker compose `name  | `
    r")"
)
# SGLang's own header, wherever an unknown wrapper put it
_HEADER_ANYWHERE_RE = re.compile(
    r"\[(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:[.,]\d+)?(?: (?:DP|PP|ATTN_CP|MOE_DP|CP|TP|EP)\d+)*\] "
)
_REPEATED_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")  # Ray's log deduplication


def own_header(text: str, pos: int = 0) -> re.Match[str] | None:
    """SGLang's ``[<time> <ranks>] `` header at ``pos``, or None.  A bracketed time followed at once by
    another bracket (``[<time>][<file>:<line>][INFO]: ``) is a deployment's own format, not SGLang's."""
    if not text.startswith("[", pos):
        return None
    m = PREFIX_RE.match(text, pos)
    if m is None or text.startswith("[", m.end()) and text[m.end() - 1] == "]":
        return None
    return m


def strip_wrapper(text: str) -> tuple[str, str]:
    """(wrapper, message): whatever a deployment put in front of SGLang's own line, split off.

    Known forms (markdown ``> ``, Kubernetes CRI ``<ts> stdout F ``, ``docker logs -t``, docker compose,
    Ray's ``(pid=…)`` with its ``[repeated 2x across cluster]`` suffix, Python logging formats and
    ``[<time>][<file>:<line>][INFO]: ``) are peeled off; then, for an unknown one, the text before SGLang's
    own ``[<date> <time> …] `` header.  A line that is SGLang's own (it starts with ``[`` and its header)
    has no wrapper.  Where the message starts is never a reason not to read it."""
    if own_header(text) is not None:
        return "", text
    if "repeated" in text and "across cluster]" in text:
        text = _REPEATED_RE.sub("", text)
    pos = 0
    while True:
        m = _WRAPPER_RE.match(text, pos)
        if m is None or m.end() == pos:
            break
        pos = m.end()
        if text.startswith("[", pos) and own_header(text, pos) is not None:
            return text[:pos], text[pos:]
    if "[" in text:
        h = _HEADER_ANYWHERE_RE.search(text, pos)
        if h is not None and h.start() > pos and not _BAR_TAIL_RE.search(text, pos, h.start()):
            return text[: h.start()], text[h.start():]
    return text[:pos], text[pos:]


Tag = tuple[tuple[str, int], ...]
"""A line's explicit rank tag: its prefix's tokens in order (``(("DP", 1), ("TP", 3))``), or
``((TORCH_RANK, n),)`` for torch's ``[rankN]:``.  A bar's tag is ``()``: TP0 of the main group."""
TORCH_RANK = "rank"  # torch's `[rankN]:` names a global rank, not a TP rank


@functools.lru_cache(maxsize=1024)
def _tag_of(ranks: str) -> Tag:
    return tuple((name, int(num)) for name, num in RANK_TOKEN_RE.findall(ranks))


def _tag_and_stamp(text: str) -> tuple[Tag | None, bool]:
    """(the explicit tag of a cleaned line or None, whether the line has SGLang's ``[<time>]`` prefix)."""
    m = own_header(text)
    if m is not None and not m.group("ranks") and text.startswith("[", m.end()):
        # a timestamper's ``[<time>] `` before SGLang's own ``[<time> TP1] ``: the line's tag is the inner one
        m = own_header(text, m.end()) or m
    if m is None:
        wrapper, text = strip_wrapper(text)  # a wrapper never hides the line's own tag
        if not text.startswith("["):
            return None, False
        m = PREFIX_RE.match(text) if wrapper else own_header(text)
    if m is not None:
        ranks = m.group("ranks")
        return (_tag_of(ranks) if ranks else None), True
    t = TORCH_RANK_RE.match(text)
    return (((TORCH_RANK, int(t.group("rank"))),) if t else None), False


def rank_tag(text: str) -> Tag | None:
    """The explicit tag a cleaned line names itself by (rule 1), else None (no tag, or a prefix without ranks)."""
    return _tag_and_stamp(text)[0]


def tp_rank(tag: Tag) -> int:
    """The TP rank a tag names: torch's rank, else its ``TPn``, else TP0 (a scheduler with ranks but no TPn)."""
    for name, num in tag:
        if name == "TP" or name == TORCH_RANK:
            return num
    return 0


def tagged_rank(text: str) -> int | None:
    """The rank a cleaned line names itself (rule 1), else None."""
    tag = rank_tag(text)
    return None if tag is None else tp_rank(tag)


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
BAR_TAG: Tag = ()


def own_tag(text: str) -> tuple[Tag | None, bool]:
    """(tag, continues): the tag a cleaned line has by itself (rules 1, 2 and 4), and whether it is a
    continuation line that takes the rank of the line before it instead (rule 3)."""
    tag, stamped = _tag_and_stamp(text)
    if tag is not None:
        return tag, False
    if is_bar(text):
        return BAR_TAG, False
    if stamped:
        return None, False  # stamped but untagged: the main process, never a continuation
    return None, is_continuation(text)


def own_rank(text: str) -> int | None:
    """The rank a line has by itself (rules 1, 2 and 4), or `INHERIT` for a continuation line."""
    tag, continues = own_tag(text)
    if continues:
        return INHERIT
    return None if tag is None else tp_rank(tag)


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
