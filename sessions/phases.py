"""Startup phases of an SGLang server (DESIGN §3, contract) and the StartupTracker that reads them from a log.

The tracker is pure: lines in, events and a summary out, no I/O (``summarize_file`` is the one helper that
opens a file).  It reads SGLang 0.4.x through 0.5.23: the ``[date time TPn]`` prefix with any DP/PP/EP
ranks, tqdm bars separated by ``\\r`` (and bars glued to the next log line), ANSI colours, docker-compose
``name  | `` prefixes, torch's C++ ``[rank6]:[E207 …]`` lines, and Python tracebacks.  The exact markers
are in ``research/sglang-facts.md`` §1.4-1.5; older spellings are kept next to them.

Speed: a log is mostly runtime noise (``Decode batch``, access lines).  Those lines carry no startup facts,
so the tracker skips them by one anchored regex; over a big buffer ``feed_bytes`` finds the other lines
with a C-speed search and never loops over the noise in Python.  Every other line passes a cheap substring
test before any regex runs.
"""
from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

from sessions.logs.lines import (  # noqa: F401 - strip_ansi, parse_prefix, rank_tokens: re-exported
    ANSI_RE,
    CONTAINER_RE,
    PREFIX_RE,
    RANK_TOKEN_RE,
    collapse_cr,
    parse_prefix,
    rank_tokens,
    strip_ansi,
    strip_container_prefix,
)
from sessions.logs.source import iter_blocks


class StartupPhase(str, Enum):
    """Ordered startup phases. A phase may be skipped; the phase of a log is the furthest any rank reached."""

    LAUNCHING = "launching"
    DIST_INIT = "dist_init"
    LOADING_WEIGHTS = "loading_weights"
    WEIGHTS_LOADED = "weights_loaded"
    KV_CACHE = "kv_cache"
    CUDA_GRAPH = "cuda_graph"
    WARMUP = "warmup"
    READY = "ready"

    @property
    def order(self) -> int:
        return _ORDER[self]

    def __str__(self) -> str:  # so f-strings and JSON get the contract name
        return self.value


_ORDER = {p: i for i, p in enumerate(StartupPhase)}

# --- StartupTracker: owned by the log-reader work (issue 3) ------------------------------------------

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PhaseEvent:
    """The log entered ``phase`` at ``line_no`` (1-based); ``log_time`` is the line's own timestamp text."""

    phase: StartupPhase
    line_no: int
    log_time: str | None = None


@dataclass(frozen=True)
class PhaseProgress:
    """Progress inside the current phase, e.g. ("shards", 12, 64) or ("cuda graph bs", 3, 52).

    ``detail`` is the bar's own description when it says more, e.g. "bs=512 avail_mem=20.51 GB".
    """

    label: str
    done: int
    total: int | None
    detail: str | None = None


@dataclass(frozen=True)
class LogError:
    line_no: int
    kind: str  # "traceback", "oom", "nccl", "gloo", "cuda_graph", "watchdog", "warmup", "address_in_use", ...
    text: str
    fatal: bool = True
    rank: int | None = None  # global TP rank of the line, when it has one
    detail: str | None = None  # the exception line that ended the traceback under this line, if any


@dataclass(frozen=True)
class StartupSummary:
    """Everything the tracker knows after the lines fed so far (an immutable snapshot)."""

    phase: StartupPhase = StartupPhase.LAUNCHING
    outcome: str = "incomplete"  # "ready" | "crashed" | "incomplete"
    error: str | None = None  # first fatal error line
    error_line: int | None = None
    errors: tuple[LogError, ...] = ()
    events: tuple[PhaseEvent, ...] = ()
    progress: PhaseProgress | None = None
    ranks_expected: int | None = None
    # marker name ("init_parallel_end", "load_weight_end", ...) -> global TP ranks that logged it
    rank_arrival: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ranks_loaded: tuple[int, ...] = ()
    capture_layers: tuple[int, ...] | None = None  # from our capture plugin's "capture active" line
    line_count: int = 0
    last_log_time: str | None = None
    # --- added by the log reader (compatible extensions) ---
    ranks_seen: tuple[int, ...] = ()  # every global rank that logged any line with a rank prefix
    server_args: dict[str, object] = field(default_factory=dict)  # selected keys of the server_args line
    capture_dir: str | None = None
    errors_dropped: int = 0  # errors beyond the kept ones (a runtime log can hold thousands)


# Arrival markers in startup order (the TUI shows them in this order).
ARRIVAL_MARKERS = (
    "init_parallel_begin",
    "init_parallel_end",
    "load_weight_begin",
    "load_weight_end",
    "kv_cache_allocated",
    "memory_pool_end",
    "cuda_graph_begin",
    "cuda_graph_end",
    "capture_active",
)

# Error kinds that end a server even after it was ready; any other kind after ready is a logged, survived
# error (a bad request's traceback, say).  Errors before ready stop counting once ready is reached.
HARD_FATAL_KINDS = frozenset(
    {"scheduler_exception", "process_exception", "sigquit", "killed", "watchdog", "nccl_watchdog",
     "subprocess_crashed", "scheduler_died", "crash", "exit"}
)
# Errors that a start may survive (a logged traceback, one failed allocation): when the log goes on at
# least two phases further than where the error happened, the start evidently went on without it.  Two,
# because the other ranks of a start whose one rank died can still finish the phase they were in.
SOFT_ERROR_KINDS = frozenset({"traceback", "oom", "negative_kv", "c10d"})

MAX_ERRORS = 256
# A line longer than this keeps its head and its tail only (a tqdm bar that never ends, a 50 MB dump).
LINE_HEAD_BYTES = 64 * 1024
LINE_TAIL_BYTES = 16 * 1024
_TRUNCATION_MARK = " \u2026 "
_TRUNCATION_MARK_BYTES = _TRUNCATION_MARK.encode()

# ---------------------------------------------------------------------------------------------------
# Line format (sglang-facts §1.3): the prefix, ANSI and container rules are the log core's (sessions.logs.lines).

_PYLOG_TS_RE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.]\d+ ")

# Runtime noise: lines that can never move a startup forward or carry an error (sglang-facts §6 "Runtime
# liveness signals", uvicorn's access log, --log-requests dumps of user text).  Skipped unread.
_NOISE_BODY = (
    rb"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?: [A-Z_]+\d+)*\] "
    rb"(?:Decode batch|Prefill batch|INFO: +[\d\[:]|Receive: |Finish: )"
)
_NOISE_LINE_BYTES_RE = re.compile(_NOISE_BODY)
# Finding the other lines fast: those not starting with "[20", and those with a "] " not followed by a
# runtime template (each is then checked against the noise pattern).  A line that starts with "[20" and
# has no "] " at all can be neither a marker nor an error line, and is skipped too.
_NOT_STAMPED_RE = re.compile(rb"\n(?!\[20)")
_NOT_TEMPLATE_RE = re.compile(rb"\] (?!Decode batch|Prefill batch|INFO: +[\d\[:]|Receive: |Finish: )")

# Substrings (of the lower-cased line) that a line must contain for the tracker to look closer.
_KEYWORDS = (
    # errors
    "error", "exception", "fail", "traceback", 'file "', "killed", "sigquit", "watchdog", "in use",
    "memory", ".cpp:", "died", "crash", "exited with code", "fatal", "segmentation", "dumped", "abort",
    "errno", "terminate called", "is dead",
    # phase markers
    "init parallel", "distributed", "load weight", "shards", "safetensors", "kv cache", "profiled value",
    "deepgemm", "captur", "graph addr", "compiling", "startup", "uvicorn", "fired up", "server process",
    "server_args", "completed |", "%|", "\r",
)


def _keyword_pattern(words: tuple[str, ...]) -> re.Pattern[str]:
    # grouped by first character: Python's re tries alternatives one by one, so fewer branches is faster
    groups: dict[str, list[str]] = {}
    for w in words:
        groups.setdefault(w[0], []).append(w[1:])
    parts = []
    for first, rests in groups.items():
        alts = "|".join(re.escape(r) for r in sorted(rests, key=len, reverse=True))
        parts.append(re.escape(first) + (f"(?:{alts})" if any(rests) else ""))
    return re.compile("|".join(parts))


_KEYWORD_RE = _keyword_pattern(_KEYWORDS)


# ---------------------------------------------------------------------------------------------------
# Markers (sglang-facts §1.4) and bars (§1.5), with the 0.4.x spellings next to the 0.5.23 ones.

_BAR_TQDM_RE = re.compile(r"(?P<pct>\d{1,3})%\|[^|\r]*\| *(?P<n>\d+)/(?P<total>\d+) *\[")
_BAR_SGLANG_RE = re.compile(r"(?P<pct>\d{1,3})% Completed \| *(?P<n>\d+)/(?P<total>\d+) *\[")
# The end of a bar's `[elapsed<remaining, rate]`; text after it is a log line glued to the bar.
_BAR_END_RE = re.compile(r"\d+/\d+ *\[[^\]\r\n]*\]")
_BS_RE = re.compile(r"bs=(\d+)")
_NUM_TOKENS_RE = re.compile(r"num_tokens=(\d+)")
_PAREN_RE = re.compile(r"\(([^)]*)\)")
_GRAPH_BEGIN_RE = re.compile(r"\bCapture\b.*\b(?:cuda|CUDA) graph begin", re.IGNORECASE)
_GRAPH_END_RE = re.compile(r"\bCapture\b.*\b(?:cuda|CUDA) graph end", re.IGNORECASE)
_GRAPH_FAILED_RE = re.compile(
    r"capture (?:\w+ )*cuda ?graph failed|cuda ?graph capture failed|cudagraph capture failed", re.IGNORECASE
)
_REGISTER_GRAPH_RE = re.compile(r"Registering \d+ cuda graph addresses")
_NEGATIVE_KV_RE = re.compile(r"larger than the profiled value -\d+")
_CAPTURE_PLUGIN_RE = re.compile(
    r"eagle3-capture active: layers_to_capture=\[(?P<layers>[\d,\s]*)\]"
    r"(?:, dir=(?P<dir>.*?))?(?:, rid_prefix=(?P<rid>\S*))?\s*$"
)
_CPP_LINE_RE = re.compile(
    r"(?:\[rank(?P<rank>\d+)\]:)?\[(?P<sev>[EF])(?:\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)? | )?"
    r"(?P<src>[\w./-]+\.(?:cpp|cc|cu|h|hpp)):\d+\]"
)
_SERVER_ARGS_KEYS = (
    "tp_size", "pp_size", "dp_size", "ep_size", "nnodes", "node_rank", "enable_dp_attention", "attn_dp_size",
    "attn_tp_size",
    "attention_backend", "prefill_attention_backend", "decode_attention_backend", "disable_cuda_graph",
    "enable_torch_compile", "disable_custom_all_reduce", "mem_fraction_static", "cuda_graph_max_bs",
    "watchdog_timeout", "dist_timeout", "moe_a2a_backend", "deepep_mode", "enable_deepep_moe", "model_path",
    "host", "port", "speculative_algorithm", "enable_return_aux_hidden_states", "skip_server_warmup",
    "load_format", "kv_cache_dtype", "quantization", "dist_init_addr", "chunked_prefill_size",
    "disable_radix_cache", "enable_p2p_check",
)
_SERVER_ARG_RE = re.compile(
    r"(?<![\w])['\"]?(?P<key>" + "|".join(_SERVER_ARGS_KEYS) + r")['\"]?\s*[=:]\s*"
    r"(?P<value>'[^']*'|\"[^\"]*\"|[^,)}\]\s]+)"
)
# `Traceback` frames: `  File "x.py", line 12, in f` (faulthandler writes no comma before `in`)
_FRAME_RE = re.compile(r'\s+File "(?P<path>[^"]*)", line \d+,? in (?P<func>[\w<>.]+)')
_CALL_RE = re.compile(r"(\w+)\(")
_EXCEPTION_LINE_RE = re.compile(r"(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*)(?P<colon>:(?:\s.*)?)?$")
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Failure", "Failed", "Timeout", "Fault")
_KILLED_RE = re.compile(r"(?:[\w./-]+: line \d+: +\d+ +)?Killed(?:\s|$)")
_EXITED_RE = re.compile(r"exited with code (\d+)")
_ARGPARSE_ERROR_RE = re.compile(r"[\w./-]+: error: ")
_HEADER_RE = re.compile(r"(?i)(?:exception|error|fail)[^\r\n]*:\s*$")

# Traceback frames -> the phase the process was in (for logs without markers).
_FRAME_FUNCS = {
    "init_torch_distributed": StartupPhase.DIST_INIT,
    "initialize_model_parallel": StartupPhase.DIST_INIT,
    "init_distributed_environment": StartupPhase.DIST_INIT,
    "ensure_model_parallel_initialized": StartupPhase.DIST_INIT,
    "init_process_group": StartupPhase.DIST_INIT,
    "init_world_group": StartupPhase.DIST_INIT,
    "init_model_parallel_group": StartupPhase.DIST_INIT,
    "load_model": StartupPhase.LOADING_WEIGHTS,
    "load_weights": StartupPhase.LOADING_WEIGHTS,
    "load_weights_and_postprocess": StartupPhase.LOADING_WEIGHTS,
    "safetensors_weights_iterator": StartupPhase.LOADING_WEIGHTS,
    "multi_thread_safetensors_weights_iterator": StartupPhase.LOADING_WEIGHTS,
    "init_memory_pool": StartupPhase.KV_CACHE,
    "profile_max_num_token": StartupPhase.KV_CACHE,
    "init_cuda_graphs": StartupPhase.CUDA_GRAPH,
    "init_device_graphs": StartupPhase.CUDA_GRAPH,
    "init_piecewise_cuda_graphs": StartupPhase.CUDA_GRAPH,
    "capture": StartupPhase.CUDA_GRAPH,
    "capture_one_batch_size": StartupPhase.CUDA_GRAPH,
    "_capture_one_stream": StartupPhase.CUDA_GRAPH,
    "_wait_and_warmup": StartupPhase.WARMUP,
    "_execute_server_warmup": StartupPhase.WARMUP,
}
_FRAME_PATHS = (
    ("/model_loader/", StartupPhase.LOADING_WEIGHTS),
    ("kv_cache_configurator", StartupPhase.KV_CACHE),
    ("cuda_graph_runner", StartupPhase.CUDA_GRAPH),
    ("cuda_graph_setup", StartupPhase.CUDA_GRAPH),
)

_PHASE_OF_PROGRESS = {
    "shards": StartupPhase.LOADING_WEIGHTS,
    "cuda graph bs": StartupPhase.CUDA_GRAPH,
    "cuda graph prefill": StartupPhase.CUDA_GRAPH,
    "cuda graph tokens": StartupPhase.CUDA_GRAPH,
    "piecewise compile": StartupPhase.CUDA_GRAPH,
    "cuda graph": StartupPhase.CUDA_GRAPH,
    "deepgemm jit": StartupPhase.KV_CACHE,
    "deepgemm warmup": StartupPhase.KV_CACHE,
}


def _truncate_bytes(line: bytes) -> bytes:
    if len(line) <= LINE_HEAD_BYTES + LINE_TAIL_BYTES + len(_TRUNCATION_MARK_BYTES):
        return line
    return line[:LINE_HEAD_BYTES] + _TRUNCATION_MARK_BYTES + line[-LINE_TAIL_BYTES:]


def _parse_value(raw: str) -> object:
    if raw[:1] in ("'", '"'):
        return raw[1:-1]
    if raw in ("True", "true"):
        return True
    if raw in ("False", "false"):
        return False
    if raw in ("None", "null"):
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def _timestamp_of(text: str) -> str | None:
    """The timestamp a line shows (its last ``\\r`` segment), or None."""
    if "\x1b" in text:
        text = ANSI_RE.sub("", text)
    if not text.startswith("["):
        _, text = strip_container_prefix(text)
    if "\r" in text:
        text = collapse_cr(text)
    m = PREFIX_RE.match(text)
    if m is not None:
        return m.group("ts")
    m = _PYLOG_TS_RE.match(text)
    return m.group(1) if m is not None else None


def _bar_label(desc: str) -> tuple[str, str | None] | None:
    """(progress label, detail) for a tqdm description, or None for a bar we don't track."""
    if "Capturing batches" in desc:
        m = _PAREN_RE.search(desc)
        return "cuda graph bs", (m.group(1) if m else None)
    if "Capturing prefill shape" in desc:
        m = _PAREN_RE.search(desc)
        return "cuda graph prefill", (m.group(1) if m else None)
    if "Capturing num tokens" in desc or "Capturing" in desc:
        m = _PAREN_RE.search(desc)
        return "cuda graph tokens", (m.group(1) if m else None)
    if "Compiling num tokens" in desc:
        m = _PAREN_RE.search(desc)
        return "piecewise compile", (m.group(1) if m else None)
    if "DeepGEMM" in desc:
        return "deepgemm warmup", None
    low = desc.lower()
    if "shards" in low or "safetensors" in low or "checkpoint" in low:
        return "shards", desc.strip() or None
    return None


class StartupTracker:
    """Reads an SGLang startup log line by line; ``summary()`` says where it is.

    Feed it with ``feed_line`` (one line), ``feed_text`` / ``feed_bytes`` (any chunk; partial lines wait for
    their end) and call ``flush()`` at the end of a static file.  Line numbers are 1-based ``\\n`` lines, as
    ``grep -n`` and the log view count them.  Chunking never changes the result.
    """

    def __init__(self) -> None:
        self._line_no = 0  # lines completed so far
        self._phase = StartupPhase.LAUNCHING
        self._events: list[PhaseEvent] = []
        self._new_events: list[PhaseEvent] = []
        self._errors: list[LogError] = []
        self._errors_dropped = 0
        self._progress: PhaseProgress | None = None
        self._arrival: dict[str, set[int]] = {}
        self._ranks_seen: set[int] = set()
        self._server_args: dict[str, object] = {}
        self._rank_cache: dict[str, int] = {}
        self._capture_layers: tuple[int, ...] | None = None
        self._capture_dir: str | None = None
        self._last_ts: str | None = None  # last_log_time
        self._event_ts: str | None = None  # the time stamped on events from lines without their own
        self._deepgemm_kernels = 0
        # traceback state
        self._tb_open = False
        self._tb_line = 0
        self._tb_header: int | None = None  # index into _errors of the line that owns this traceback
        self._tb_rank: int | None = None
        # (line_no, text, rank, index of its own error) of a line that may head the next line's traceback
        self._header_candidate: tuple[int, str, int | None, int | None] | None = None
        # partial line (bytes) waiting for its newline; bounded (head + tail)
        self._pending = bytearray()
        self._pending_cut = False

    # -- feeding -------------------------------------------------------------------------------------

    def feed_line(self, text: str) -> list[PhaseEvent]:
        """One line (without its newline); returns the phase events it caused."""
        return self.feed_bytes(text.encode("utf-8", "surrogatepass") + b"\n")

    def feed_text(self, chunk: str) -> list[PhaseEvent]:
        """Any piece of log text; lines end at ``\\n`` (``\\r`` separates tqdm renders inside a line)."""
        return self.feed_bytes(chunk.encode("utf-8", "surrogatepass"))

    def feed_bytes(self, chunk: bytes) -> list[PhaseEvent]:
        """Raw log bytes (decoded as UTF-8 with replacement); partial lines wait for the next call."""
        self._new_events = []
        last_nl = chunk.rfind(b"\n")
        if last_nl < 0:
            if chunk:
                self._add_pending(chunk)
            return []
        start = 0
        if self._pending:
            first_nl = chunk.find(b"\n")
            self._add_pending(chunk[:first_nl])
            self._line_no += 1
            self._one_line(self._finish_pending_line(), self._line_no)
            start = first_nl + 1
        if start <= last_nl:
            self._scan(chunk, start, last_nl + 1)
        if last_nl + 1 < len(chunk):
            self._add_pending(chunk[last_nl + 1:])
        return self._new_events

    def flush(self) -> list[PhaseEvent]:
        """End of input: the last line without a newline counts, an unfinished traceback is closed."""
        self._new_events = []
        if self._pending:
            self._line_no += 1
            self._one_line(self._finish_pending_line(), self._line_no)
        self._close_traceback(None)
        return self._new_events

    def _add_pending(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) > LINE_HEAD_BYTES + 2 * LINE_TAIL_BYTES + len(_TRUNCATION_MARK_BYTES):
            # keep the head and at least the last LINE_TAIL_BYTES; the exact tail is cut at the end
            del self._pending[LINE_HEAD_BYTES: len(self._pending) - LINE_TAIL_BYTES]
            self._pending_cut = True

    def _finish_pending_line(self) -> bytes:
        line = bytes(self._pending)
        cut = self._pending_cut
        self._pending = bytearray()
        self._pending_cut = False
        if cut:
            return line[:LINE_HEAD_BYTES] + _TRUNCATION_MARK_BYTES + line[-LINE_TAIL_BYTES:]
        return _truncate_bytes(line)

    def _scan(self, buf: bytes, begin: int, end: int) -> None:
        """The whole lines in ``buf[begin:end]`` (ending with ``\\n``); runtime noise is skipped without a
        Python loop (regex scans and ``bytes.count`` over the buffer, no copy)."""
        base = self._line_no
        starts = {begin} if not buf.startswith(b"[20", begin) else set()
        starts.update(m.start() + 1 for m in _NOT_STAMPED_RE.finditer(buf, begin, end))
        starts.update(buf.rfind(b"\n", begin, m.start()) + 1 or begin
                      for m in _NOT_TEMPLATE_RE.finditer(buf, begin, end))
        starts.discard(end)
        counted_to = begin  # the newlines before this offset are counted in `lines`
        lines = 0
        for start in sorted(starts):
            if _NOISE_LINE_BYTES_RE.match(buf, start, end) is not None:
                continue
            lines += buf.count(b"\n", counted_to, start)
            counted_to = start
            self._raw_line(_truncate_bytes(buf[start: buf.find(b"\n", start, end)]), base + lines + 1)
        self._line_no = base + lines + buf.count(b"\n", counted_to, end)
        self._note_last_ts(buf, begin, end)

    def _note_last_ts(self, buf: bytes, begin: int, end: int) -> None:
        """``last_log_time`` after a scan: the last line of ``buf[begin:end]`` with a timestamp (noise too)."""
        stop = end - 1  # the "\n" that ends the last line
        while stop >= begin:
            start = buf.rfind(b"\n", begin, stop) + 1 or begin
            ts = _timestamp_of(_truncate_bytes(buf[start:stop]).decode("utf-8", "replace"))
            if ts is not None:
                self._last_ts = ts
                return
            stop = start - 1

    def _one_line(self, raw: bytes, line_no: int) -> None:
        """A line completed outside `_scan` (the end of a partial line), read by `_scan`'s rules."""
        text = raw.decode("utf-8", "replace")
        ts = _timestamp_of(text)
        if ts is not None:
            self._last_ts = ts
        candidate = not raw.startswith(b"[20") or _NOT_TEMPLATE_RE.search(raw) is not None
        if candidate and _NOISE_LINE_BYTES_RE.match(raw) is None:
            self._line(text, line_no)

    def _raw_line(self, raw: bytes, line_no: int) -> None:
        self._line(raw.decode("utf-8", "replace"), line_no)

    # -- one line ------------------------------------------------------------------------------------

    def _line(self, text: str, line_no: int) -> None:
        """One line that is not runtime noise (``_last_ts`` is settled by the caller)."""
        if "\x1b" in text:  # colours (docker compose paints its prefixes) would split the keywords
            text = ANSI_RE.sub("", text)
        if text[:1] == "[" and "\r" not in text:
            pm = PREFIX_RE.match(text)
            ts = pm.group("ts") if pm is not None else None
        else:
            ts = _timestamp_of(text)
        if not self._tb_open and _KEYWORD_RE.search(text.lower()) is None:
            if ts is not None:
                self._event_ts = ts
            return
        container, body = strip_container_prefix(text)
        if "\r" in body:
            pieces = [p for p in body.split("\r") if p.strip()]
            whole = len(pieces) == 1
        else:
            pieces = [body] if body.strip() else []
            whole = True
        for piece in pieces:
            parts = self._split_glued(piece)
            for part in parts:
                part = part.rstrip()
                shown = (container + part).rstrip() if whole and len(parts) == 1 else part
                self._segment(part, line_no, shown)
        if ts is not None:
            self._event_ts = ts

    @staticmethod
    def _split_glued(piece: str) -> list[str]:
        """A tqdm bar with a log line glued after its ``[elapsed<remaining, rate]`` becomes two pieces."""
        parts: list[str] = []
        while "%|" in piece or "% Completed" in piece:
            m = _BAR_END_RE.search(piece)
            if m is None or not piece[m.end():].strip():
                break
            parts.append(piece[: m.end()])
            piece = piece[m.end():]
        parts.append(piece)
        return parts

    def _segment(self, s: str, line_no: int, shown: str) -> None:
        # 1. traceback continuation
        if self._tb_open:
            if not s or s[0].isspace():
                fm = _FRAME_RE.match(s)
                if fm is not None:
                    self._frame(fm.group("func"), fm.group("path"), line_no)
                elif "(" in s:  # the source line: the call it shows is the next frame (often cut off)
                    for func in _CALL_RE.findall(s):
                        if func in _FRAME_FUNCS:
                            self._frame(func, "", line_no)
                return
            if s.startswith(("Traceback (most recent call last)", "During handling of the above exception",
                             "The above exception was the direct cause")):
                return
            em = _EXCEPTION_LINE_RE.match(s)
            if em is not None and (em.group("colon") or em.group("name").endswith(_EXCEPTION_SUFFIXES)):
                self._close_traceback((line_no, s))
                return
            self._close_traceback(None)
        # 2. the server_args dump: settings only, never markers or errors (it holds "sigquit", "watchdog")
        if "server_args=" in s:
            self._read_server_args(s)
            return
        # 3. the line's own prefix
        pm = PREFIX_RE.match(s) if s.startswith("[") else None
        rank: int | None = None
        msg = s
        if pm is not None:
            self._event_ts = pm.group("ts")
            msg = s[pm.end():]
            if pm.group("ranks"):
                rank = self._global_rank(pm.group("ranks"))
                self._ranks_seen.add(rank)
        else:
            lm = _PYLOG_TS_RE.match(s)
            if lm is not None:
                self._event_ts = lm.group(1)
        # 4. a traceback starts here
        tb_at = s.find("Traceback (most recent call last)")
        if tb_at >= 0:
            self._open_traceback(s, msg, tb_at, line_no, rank, shown)
            return
        if s.startswith(" ") and s.lstrip().startswith('File "'):  # an excerpt that starts mid-traceback
            self._tb_open, self._tb_line, self._tb_header, self._tb_rank = True, line_no, None, None
            fm = _FRAME_RE.match(s)
            if fm is not None:
                self._frame(fm.group("func"), fm.group("path"), line_no)
            return
        # 5. errors, then markers, then progress
        n_errors = len(self._errors)
        self._errors_in(s, msg, line_no, rank, shown)
        self._markers_in(msg, line_no, rank)
        if "%" in msg:
            self._progress_in(msg, line_no)
        if msg.endswith(":") and _HEADER_RE.search(msg):  # "...exception:" whose traceback may follow
            owner = len(self._errors) - 1 if len(self._errors) > n_errors else None
            self._header_candidate = (line_no, shown, rank, owner)

    # -- tracebacks ----------------------------------------------------------------------------------

    def _open_traceback(self, s: str, msg: str, tb_at: int, line_no: int, rank: int | None, shown: str) -> None:
        before = s[:tb_at].strip()
        owner: int | None = None
        if before:
            n_before = len(self._errors)
            self._errors_in(s, msg, line_no, rank, shown)
            self._markers_in(msg, line_no, rank)
            if len(self._errors) > n_before:
                owner = len(self._errors) - 1
            elif PREFIX_RE.match(s) is not None or before.endswith(":"):
                # a logged exception: "<message>: Traceback (most recent call last):"
                owner = self._add_error(line_no, "traceback", shown, True, rank)
        else:
            hc = self._header_candidate
            if hc is not None and hc[0] == line_no - 1:
                owner = hc[3] if hc[3] is not None else self._add_error(hc[0], "traceback", hc[1], True, hc[2])
                rank = hc[2]
        self._tb_open, self._tb_line, self._tb_header, self._tb_rank = True, line_no, owner, rank

    def _close_traceback(self, exception: tuple[int, str] | None) -> None:
        """End of the traceback: at its exception line (``exception``) or cut short (None)."""
        if not self._tb_open:
            return
        self._tb_open = False
        header = self._tb_header
        if header is not None and header < len(self._errors):
            if exception is not None:
                err = self._errors[header]
                kind = err.kind
                if kind == "traceback":
                    kind = self._exception_kind(exception[1])
                self._errors[header] = LogError(err.line_no, kind, err.text, err.fatal, err.rank, exception[1])
            return
        if header is not None:
            return
        if exception is not None:
            line_no, text = exception
            self._add_error(line_no, self._exception_kind(text), text, True, self._tb_rank)
        else:
            self._add_error(self._tb_line, "traceback", "Traceback (most recent call last):", True, self._tb_rank)

    @staticmethod
    def _exception_kind(text: str) -> str:
        low = text.lower()
        if _GRAPH_FAILED_RE.search(text):
            return "cuda_graph"
        if "out of memory" in low or "outofmemoryerror" in low:
            return "oom"
        if "address already in use" in low:
            return "address_in_use"
        if "gloo" in low:
            return "gloo"
        if "nccl" in low:
            return "nccl"
        if "not enough memory" in low:
            return "negative_kv"
        return "traceback"

    def _frame(self, func: str, path: str, line_no: int) -> None:
        phase = _FRAME_FUNCS.get(func)
        if phase is None:
            for needle, p in _FRAME_PATHS:
                if needle in path:
                    phase = p
                    break
        if phase is StartupPhase.CUDA_GRAPH and func.startswith("replay"):
            return  # a graph replay is serving, not capturing
        if phase is not None:
            self._advance(phase, line_no)

    # -- errors --------------------------------------------------------------------------------------

    def _add_error(self, line_no: int, kind: str, text: str, fatal: bool, rank: int | None) -> int | None:
        if len(self._errors) >= MAX_ERRORS:
            self._errors_dropped += 1
            return None
        self._errors.append(LogError(line_no, kind, text, fatal, rank))
        return len(self._errors) - 1

    def _errors_in(self, s: str, msg: str, line_no: int, rank: int | None, shown: str) -> None:
        kind: str | None = None
        fatal = True
        if s.startswith("[") and (".cpp:" in s or ".cc:" in s or ".cu:" in s or ".h:" in s):
            cm = _CPP_LINE_RE.match(s)
            if cm is not None:
                if cm.group("rank") is not None and rank is None:
                    rank = int(cm.group("rank"))
                if "collective operation timeout" in s:
                    kind = "nccl_watchdog"
                elif "gloo" in s.lower():
                    kind = "gloo"
                elif "NCCL" in s:
                    kind = "nccl"
                else:
                    kind = "c10d"
        if kind is None:
            kind, fatal = self._classify(s, msg)
        if kind is not None:
            self._add_error(line_no, kind, shown, fatal, rank)
            if kind == "negative_kv":
                self._advance(StartupPhase.KV_CACHE, line_no)
            elif kind == "warmup":
                self._advance(StartupPhase.WARMUP, line_no)
            elif kind == "cuda_graph":
                self._advance(StartupPhase.CUDA_GRAPH, line_no)

    @staticmethod
    def _classify(s: str, msg: str) -> tuple[str | None, bool]:
        """(error kind, fatal) of a line outside a traceback, or (None, False)."""
        if "hit an exception" in msg:  # Scheduler / TpModelWorkerClient / DetokenizerManager / ... died
            return ("scheduler_exception" if "Scheduler hit" in msg else "process_exception"), True
        if "Initialization failed. warmup error" in msg:
            return "warmup", True
        if "scheduler died during initialization" in msg:
            return "scheduler_died", True
        if "Received sigquit from a child" in msg or "SIGQUIT received" in msg:
            return "sigquit", True
        if ("Subprocess" in msg and "crashed with exit code" in msg) or "unexpectedly failed with an exit code" in msg:
            return "subprocess_crashed", True
        if "scheduler is dead" in msg:
            return "scheduler_died", True
        if "collective operation timeout" in msg:
            return "nccl_watchdog", True
        low = msg.lower()
        if "watchdog timeout" in low:
            return "watchdog", "soft=true" not in low.replace(" ", "")
        if _GRAPH_FAILED_RE.search(msg):
            return "cuda_graph", True
        if "profiled value -" in msg and _NEGATIVE_KV_RE.search(msg):
            return "negative_kv", True
        if "Not enough memory. Please try to increase --mem-fraction-static" in msg:
            return "negative_kv", True
        if "cuda out of memory" in low or "outofmemoryerror" in low or "hip out of memory" in low:
            return "oom", True
        if "address already in use" in low or "[errno 98]" in low:
            return "address_in_use", True
        if "Exception in run_tp_server" in msg or "Exception in ModelTpServer" in msg:
            return "traceback", True
        if "Killed" in s and _KILLED_RE.match(s):
            return "killed", True
        if "exited with code" in s:
            em = _EXITED_RE.search(s)
            if em is not None and em.group(1) != "0":
                return "exit", True
        if "Fatal Python error" in s or "Segmentation fault" in s or "terminate called after throwing" in s:
            return "crash", True
        if s.startswith("Aborted (core dumped)"):
            return "crash", True
        if ": error: " in s and _ARGPARSE_ERROR_RE.match(s):
            return "bad_args", True
        return None, False

    # -- markers and progress ------------------------------------------------------------------------

    def _arrive(self, marker: str, rank: int | None) -> None:
        r = 0 if rank is None else rank
        self._arrival.setdefault(marker, set()).add(r)
        self._ranks_seen.add(r)

    def _markers_in(self, msg: str, line_no: int, rank: int | None) -> None:
        if "Init " in msg:
            if "Init parallel begin" in msg or "Init torch distributed begin" in msg:
                self._arrive("init_parallel_begin", rank)
                self._advance(StartupPhase.DIST_INIT, line_no)
            elif "Init parallel ends" in msg or "Init torch distributed ends" in msg:
                self._arrive("init_parallel_end", rank)
                self._advance(StartupPhase.DIST_INIT, line_no)
        if "Load weight " in msg:
            if "Load weight begin" in msg:
                self._arrive("load_weight_begin", rank)
                self._advance(StartupPhase.LOADING_WEIGHTS, line_no)
            elif "Load weight end" in msg:
                self._arrive("load_weight_end", rank)
                self._advance(StartupPhase.WEIGHTS_LOADED, line_no)
        if "KV Cache" in msg or "KV cache" in msg or "Memory pool end" in msg:
            if "KV Cache is allocated" in msg or "KV Cache VA upper bound" in msg:
                self._arrive("kv_cache_allocated", rank)
                self._advance(StartupPhase.KV_CACHE, line_no)
            elif "Memory pool end" in msg:
                self._arrive("memory_pool_end", rank)
                self._advance(StartupPhase.KV_CACHE, line_no)
            elif "Using KV cache dtype" in msg:
                self._advance(StartupPhase.KV_CACHE, line_no)
        if "DeepGEMM" in msg:
            if "Entering DeepGEMM JIT" in msg:
                self._set_progress(PhaseProgress("deepgemm jit", 0, None), line_no)
            elif "Try DeepGEMM JIT Compiling" in msg:
                self._deepgemm_kernels += 1
                kind = msg.split("Compiling for", 1)[-1].split(" with all Ms")[0].strip() or None
                self._set_progress(PhaseProgress("deepgemm jit", self._deepgemm_kernels, None, kind), line_no)
        if "raph" in msg:
            if _GRAPH_BEGIN_RE.search(msg):
                self._arrive("cuda_graph_begin", rank)
                self._advance(StartupPhase.CUDA_GRAPH, line_no)
            elif _GRAPH_END_RE.search(msg):
                self._arrive("cuda_graph_end", rank)
                self._advance(StartupPhase.CUDA_GRAPH, line_no)
            elif _REGISTER_GRAPH_RE.search(msg):
                self._advance(StartupPhase.CUDA_GRAPH, line_no)
        if ("Engine startup timings" in msg or "Uvicorn running on" in msg or "Application startup" in msg
                or "Started server process" in msg):
            self._advance(StartupPhase.WARMUP, line_no)
        if "fired up and ready to roll" in msg:
            self._advance(StartupPhase.READY, line_no)
        if "eagle3-capture active" in msg:
            cm = _CAPTURE_PLUGIN_RE.search(msg)
            if cm is not None:
                self._capture_layers = tuple(int(x) for x in re.findall(r"\d+", cm.group("layers")))
                self._capture_dir = cm.group("dir") or None
                self._arrive("capture_active", rank)

    def _progress_in(self, msg: str, line_no: int) -> None:
        m = _BAR_SGLANG_RE.search(msg) or _BAR_TQDM_RE.search(msg)
        if m is None:
            return
        desc = msg[: m.start()].rstrip().rstrip(":").strip()
        done, total = int(m.group("n")), int(m.group("total"))
        if desc:
            found = _bar_label(desc)
            if found is None:
                return
            label, detail = found
        else:  # tqdm's first render has no description yet (sglang-facts §1.5): attribute it by phase
            if self._phase is not StartupPhase.CUDA_GRAPH:
                return
            label, detail = "cuda graph", None
        self._set_progress(PhaseProgress(label, done, total, detail), line_no)

    def _set_progress(self, progress: PhaseProgress, line_no: int) -> None:
        phase = _PHASE_OF_PROGRESS.get(progress.label)
        if phase is not None:
            self._advance(phase, line_no)
        self._progress = progress

    def _advance(self, phase: StartupPhase, line_no: int) -> None:
        if phase.order > self._phase.order:
            self._phase = phase
            self._progress = None
            event = PhaseEvent(phase, line_no, self._event_ts)
            self._events.append(event)
            self._new_events.append(event)

    # -- ranks and server args -----------------------------------------------------------------------

    def _global_rank(self, ranks: str) -> int:
        rank = self._rank_cache.get(ranks)
        if rank is None:
            rank = self._rank_cache[ranks] = self._compute_rank(ranks)
        return rank

    def _compute_rank(self, ranks: str) -> int:
        tokens = rank_tokens(ranks)
        tp = tokens.get("TP", 0)
        tp_size = self._server_args.get("tp_size")
        if not isinstance(tp_size, int) or tp_size <= 0:
            return tp
        rank = tp
        pp = tokens.get("PP", 0)
        pp_size = self._server_args.get("pp_size")
        pp_size = pp_size if isinstance(pp_size, int) and pp_size > 0 else 1
        if pp:
            rank += pp * tp_size
        dp = tokens.get("DP", 0)
        if dp and self._plain_dp():
            rank += dp * tp_size * pp_size
        return rank

    def _plain_dp(self) -> bool:
        """DP replicas each with their own TP group (not DP attention, where DPn sits inside the TP group)."""
        dp = self._server_args.get("dp_size")
        if not isinstance(dp, int) or dp <= 1:
            return False
        args = self._server_args
        attn_dp, attn_tp, tp = args.get("attn_dp_size"), args.get("attn_tp_size"), args.get("tp_size")
        attention_dp = (
            args.get("enable_dp_attention") is True
            or (isinstance(attn_dp, int) and attn_dp > 1)
            or (isinstance(attn_tp, int) and isinstance(tp, int) and 0 < attn_tp < tp)
        )
        return not attention_dp

    def _read_server_args(self, s: str) -> None:
        body = s[s.index("server_args=") + len("server_args="):]
        found: dict[str, object] = {}
        for m in _SERVER_ARG_RE.finditer(body):
            found.setdefault(m.group("key"), _parse_value(m.group("value")))
        if found:
            self._server_args = found
            self._rank_cache.clear()

    def _ranks_expected(self) -> int | None:
        tp = self._server_args.get("tp_size")
        if not isinstance(tp, int) or tp <= 0:
            return None
        pp = self._server_args.get("pp_size")
        expected = tp * (pp if isinstance(pp, int) and pp > 0 else 1)
        if self._plain_dp():
            expected *= int(self._server_args["dp_size"])  # type: ignore[arg-type]
        return expected

    # -- the snapshot --------------------------------------------------------------------------------

    @property
    def phase(self) -> StartupPhase:
        return self._phase

    @property
    def line_count(self) -> int:
        return self._line_no + (1 if self._pending else 0)

    def _pending_progress(self) -> PhaseProgress | None:
        """Progress of a tqdm bar still being drawn (no newline yet), read without changing any state."""
        if not self._pending:
            return None
        tail = bytes(self._pending[-4096:]).decode("utf-8", "replace")
        tail = strip_ansi(collapse_cr(tail))
        if "%" not in tail:
            return None
        m = _BAR_SGLANG_RE.search(tail) or _BAR_TQDM_RE.search(tail)
        if m is None:
            return None
        desc = tail[: m.start()].rstrip().rstrip(":").strip()
        _, desc = strip_container_prefix(desc)
        found = _bar_label(desc) if desc else (("cuda graph", None) if self._phase is StartupPhase.CUDA_GRAPH
                                               else None)
        if found is None:
            return None
        return PhaseProgress(found[0], int(m.group("n")), int(m.group("total")), found[1])

    def _went_on_after(self, err: LogError) -> bool:
        """Whether the start moved on after ``err`` far enough that ``err`` did not stop it."""
        at = max((ev.phase.order for ev in self._events if ev.line_no <= err.line_no), default=0)
        later = max((ev.phase.order for ev in self._events if ev.line_no > err.line_no), default=-1)
        if err.kind == "negative_kv":  # a budget that was not really negative: the start passed the KV pool
            return later > StartupPhase.KV_CACHE.order
        return later >= at + 2

    def summary(self) -> StartupSummary:
        errors = list(self._errors)
        if self._tb_open and self._tb_header is None:  # a bare traceback still being written
            errors.append(LogError(self._tb_line, "traceback", "Traceback (most recent call last):", True,
                                   self._tb_rank))
        ready_line = next((e.line_no for e in self._events if e.phase is StartupPhase.READY), None)
        settled: list[LogError] = []
        for err in errors:
            fatal = err.fatal
            if ready_line is not None and (err.line_no < ready_line or err.kind not in HARD_FATAL_KINDS):
                fatal = False  # the server came up (or kept serving) after it
            if fatal and err.kind in SOFT_ERROR_KINDS and self._went_on_after(err):
                fatal = False
            settled.append(err if fatal == err.fatal else LogError(err.line_no, err.kind, err.text, fatal,
                                                                    err.rank, err.detail))
        first = min((e for e in settled if e.fatal), key=lambda e: e.line_no, default=None)
        outcome = "crashed" if first is not None else ("ready" if ready_line is not None else "incomplete")
        arrival = {m: tuple(sorted(self._arrival[m])) for m in ARRIVAL_MARKERS if m in self._arrival}
        progress = self._pending_progress() or self._progress
        return StartupSummary(
            phase=self._phase,
            outcome=outcome,
            error=first.text if first is not None else None,
            error_line=first.line_no if first is not None else None,
            errors=tuple(sorted(settled, key=lambda e: e.line_no)),
            events=tuple(self._events),
            progress=progress,
            ranks_expected=self._ranks_expected(),
            rank_arrival=arrival,
            ranks_loaded=arrival.get("load_weight_end", ()),
            capture_layers=self._capture_layers,
            line_count=self.line_count,
            last_log_time=self._last_ts,
            ranks_seen=tuple(sorted(self._ranks_seen)),
            server_args=dict(self._server_args),
            capture_dir=self._capture_dir,
            errors_dropped=self._errors_dropped,
        )


def summarize_text(text: str) -> StartupSummary:
    """The summary of a whole static log given as text."""
    tracker = StartupTracker()
    tracker.feed_text(text)
    tracker.flush()
    return tracker.summary()


def summarize_bytes(data: bytes) -> StartupSummary:
    tracker = StartupTracker()
    tracker.feed_bytes(data)
    tracker.flush()
    return tracker.summary()


def summarize_file(path: str | Path, max_bytes: int | None = None) -> StartupSummary:
    """The summary of a static log file, read in 8 MiB blocks by the log core (memory stays bounded for any
    size; a FIFO or a device is a `sessions.logs.LogFileError` at once)."""
    tracker = StartupTracker()
    for block in iter_blocks(path, max_bytes):
        tracker.feed_bytes(block)
    tracker.flush()
    return tracker.summary()
