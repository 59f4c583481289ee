"""The log core: a server log from raw bytes to meaning, the one route every reader takes.

* `sessions.logs.lines`: `LogLine` (number, raw, text, rank), the cleaning rule and the rank rule;
* `sessions.logs.filter`: `LogFilter` (text, ``/regex/`` or ``re:regex``, rank);
* `sessions.logs.source`: `open_log` (``O_NONBLOCK`` + ``fstat``: special files are refused at once) and
  the whole-file readers (tail, head and tail, blocks, an increment);
* `sessions.logs.file`: `LogFile`, the indexed, followed view of one log (the TUI and ``logs``), and a
  session's one reader, shared by its status tracker and its log view;
* `sessions.logs.poll`: what a poll gives (`PollResult`), its listeners (`LogListener`), `ReadStats`;
* `sessions.logs.display`: what is shown of a line, redacted once.
"""

from sessions.logs.display import printed, shown
from sessions.logs.file import LogFile
from sessions.logs.filter import MAIN_RANK, LogFilter
from sessions.logs.lines import (
    ANSI_RE,
    PREFIX_RE,
    LogLine,
    clean,
    collapse_cr,
    rank_of,
    strip_ansi,
    tagged_rank,
)
from sessions.logs.poll import LogListener, PollResult, ReadStats
from sessions.logs.source import (
    LogFileError,
    iter_blocks,
    open_log,
    read_head_and_tail,
    read_increment,
    read_tail,
)

__all__ = [
    "ANSI_RE",
    "MAIN_RANK",
    "PREFIX_RE",
    "LogFile",
    "LogFileError",
    "LogFilter",
    "LogLine",
    "LogListener",
    "PollResult",
    "ReadStats",
    "clean",
    "collapse_cr",
    "iter_blocks",
    "open_log",
    "printed",
    "rank_of",
    "read_head_and_tail",
    "read_increment",
    "read_tail",
    "shown",
    "strip_ansi",
    "tagged_rank",
]
