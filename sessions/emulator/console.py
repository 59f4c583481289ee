"""SGLang-shaped output: log lines, uvicorn lines, the access log, and tqdm progress bars.

Formats (sglang-facts §1.3, §1.5):
* log lines ``[%Y-%m-%d %H:%M:%S{.ms if SGLANG_LOG_MS}{rank prefix}] message`` on stderr; the main
  process has no prefix, a scheduler has `` TP3`` (`` DP0 TP0 EP0`` ... in the title's order);
* uvicorn: ``[ts] INFO:     message`` on stderr; the access log ``[ts] INFO:     127.0.0.1:PORT -
  "POST /generate HTTP/1.1" 200 OK`` on **stdout**;
* tqdm bars: ``\\r``-separated renders with no prefix, a newline only when the bar closes, at most one
  render per 0.1 s (tqdm's ``mininterval``), padded with spaces over a longer previous render.

Every line goes out in one ``os.write`` so that lines of different ranks interleave whole, as they do
when several processes share SGLang's stderr.
"""

from __future__ import annotations

import logging
import os
import time

_UTF_BLOCKS = " " + "".join(chr(c) for c in range(0x258F, 0x2587, -1))  # tqdm's " ▏▎▍▌▋▊▉█"
WEIGHT_BAR_FORMAT = (
    "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"
)
_UVICORN_LEVELS = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}
_HTTP_PHRASES = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def write_fd(fd: int, text: str) -> None:
    """Write all of ``text`` to ``fd`` (a pipe may take it in pieces); a closed stream is ignored."""
    data = text.encode("utf-8", errors="replace")
    try:
        while data:
            written = os.write(fd, data)
            data = data[written:]
    except OSError:
        pass


class Console:
    """One process's log output: ``prefix`` is the rank part of the bracket (" TP3"), empty in main."""

    def __init__(self, prefix: str = "", level: int = logging.INFO, http_level: int | None = None) -> None:
        self.prefix = prefix
        self.level = level
        self.http_level = level if http_level is None else http_level
        self.show_ms = os.environ.get("SGLANG_LOG_MS", "0") not in ("", "0", "false", "False")

    def timestamp(self) -> str:
        now = time.time()
        text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        if self.show_ms:
            text += f".{int(now * 1000) % 1000:03d}"
        return text

    def log(self, message: str, level: int = logging.INFO) -> None:
        """One SGLang log line (``message`` may span lines, like a traceback)."""
        if level >= self.level:
            write_fd(2, f"[{self.timestamp()}{self.prefix}] {message}\n")

    def uvicorn(self, message: str, level: int = logging.INFO) -> None:
        """A line of uvicorn's own logger: ``[ts] INFO:     message`` (level name + colon, padded to 9)."""
        if level >= self.http_level:
            levelprefix = (_UVICORN_LEVELS.get(level, "INFO") + ":").ljust(9)
            write_fd(2, f"[{self.timestamp()}] {levelprefix} {message}\n")

    def access(self, client: str, request_line: str, status: int) -> None:
        """uvicorn's access log line, which SGLang's log config sends to stdout."""
        if logging.INFO >= self.http_level:
            phrase = _HTTP_PHRASES.get(status, "")
            write_fd(1, f'[{self.timestamp()}] INFO:     {client} - "{request_line}" {status} {phrase}\n')

    def raw(self, text: str) -> None:
        """Text without a prefix (tqdm renders, C++ library chatter such as Gloo's)."""
        write_fd(2, text)


class ConsoleLogHandler(logging.Handler):
    """Routes Python ``logging`` records (e.g. from the model backend) into the SGLang line format."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self.console.log(message, record.levelno)
        except Exception:  # noqa: BLE001 - logging must never take the process down
            self.handleError(record)


def format_interval(seconds: float) -> str:
    """tqdm's ``MM:SS`` / ``H:MM:SS``."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def format_meter(
    n: int, total: int, elapsed_s: float, desc: str | None, bar_format: str | None = None
) -> str:
    """One tqdm render (no ``\\r``), as tqdm prints it to a file that is not a terminal."""
    rate = n / elapsed_s if elapsed_s > 0 and n > 0 else None
    if rate is None:
        rate_fmt = "?it/s"
    elif rate < 1:
        rate_fmt = f"{1 / rate:5.2f}s/it"
    else:
        rate_fmt = f"{rate:5.2f}it/s"
    remaining = format_interval((total - n) / rate) if rate else "?"
    percentage = 100.0 * n / total if total else 0.0
    fields = {
        "desc": desc or "",
        "percentage": percentage,
        "n_fmt": str(n),
        "total_fmt": str(total),
        "elapsed": format_interval(elapsed_s),
        "remaining": remaining,
        "rate_fmt": rate_fmt,
    }
    if bar_format is not None:
        return bar_format.format(**fields)
    frac = n / total if total else 0.0
    full, partial = divmod(int(frac * 10 * 8), 8)
    bar = _UTF_BLOCKS[-1] * full
    if full < 10:
        bar += _UTF_BLOCKS[partial] + " " * (10 - full - 1)
    l_bar = f"{desc}: " if desc else ""
    return f"{l_bar}{percentage:3.0f}%|{bar}| {n}/{total} [{fields['elapsed']}<{remaining}, {rate_fmt}]"


class ProgressBar:
    """A tqdm bar written to stderr the way tqdm writes it to a log file."""

    MIN_INTERVAL_S = 0.1  # tqdm's default mininterval

    def __init__(
        self,
        console: Console,
        total: int,
        desc: str | None = None,
        bar_format: str | None = None,
        enabled: bool = True,
    ) -> None:
        self.console = console
        self.total = total
        self.desc = desc
        self.bar_format = bar_format
        self.enabled = enabled
        self.n = 0
        self.started = time.monotonic()
        self._last_render = 0.0
        self._last_len = 0
        self._render(force=True)

    def _render(self, force: bool = False, end: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_render < self.MIN_INTERVAL_S:
            return
        self._last_render = now
        text = format_meter(self.n, self.total, now - self.started, self.desc, self.bar_format)
        padding = " " * max(self._last_len - len(text), 0)
        self._last_len = len(text)
        self.console.raw("\r" + text + padding + end)

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self._render(force=True)

    def update(self, k: int = 1) -> None:
        self.n += k
        self._render()

    def close(self) -> None:
        self._render(force=True, end="\n")
