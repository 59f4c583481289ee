"""The line catalogue: what the startup tracker looks for in an SGLang log, 0.4.x through 0.5.23.

The markers are SGLang's own log lines (``research/sglang-facts.md`` §1.4-1.5, quoted from its source), with
the older spellings kept next to them; the bars are tqdm's and SGLang's ``% Completed |``; the errors are
SGLang's, torch's C++ ``[rank6]:[E207 …]`` lines, Python tracebacks and the shell's.  The line *format*
(prefix, ANSI, container prefix) and the rank rule are the log core's (`sessions.logs.lines`).

Everything here is pure: patterns, tables and functions of one line.  The state (where a start is, which
traceback is open) is the tracker's (`sessions.phases.tracker`).

Speed: a log is mostly runtime noise (``Decode batch``, access lines).  Those lines carry no startup facts,
so the tracker skips them by one anchored regex (`NOISE_LINE_BYTES_RE`); `NOT_STAMPED_RE` and `NOT_TEMPLATE_RE` find
the other lines of a big buffer with C-speed searches.  Every other line passes a cheap substring test (`KEYWORD_RE`) before any other regex runs.
"""

from __future__ import annotations

import re

from sessions.logs.lines import ANSI_RE, PREFIX_RE, collapse_cr, strip_wrapper
from sessions.phases.model import StartupPhase

# A line longer than this keeps its head and its tail only (a tqdm bar that never ends, a 50 MB dump).
LINE_HEAD_BYTES = 64 * 1024
LINE_TAIL_BYTES = 16 * 1024
_TRUNCATION_MARK = " \u2026 "
TRUNCATION_MARK_BYTES = _TRUNCATION_MARK.encode()

# ---------------------------------------------------------------------------------------------------
# Line format (sglang-facts §1.3): the prefix, ANSI and container rules are the log core's (sessions.logs.lines).

PYLOG_TS_RE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.]\d+ ")

# Runtime noise: lines that can never move a startup forward or carry an error (sglang-facts §6 "Runtime
# liveness signals", uvicorn's access log, --log-requests dumps of user text).  Skipped unread.
_NOISE_BODY = (
    rb"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?: [A-Z_]+\d+)*\] "
    rb"(?:Decode batch|Prefill batch|INFO: +[\d\[:]|Receive: |Finish: )"
)
NOISE_LINE_BYTES_RE = re.compile(_NOISE_BODY)
# Finding the other lines fast: the start of every line that is not runtime noise, in one C-speed scan (a
# negative look-ahead at each newline).  Only SGLang's own noise lines are skipped: a line that starts any
# other way (a wrapper of any form before the message, issue 23) is read.
# Two C-speed searches find them: lines not starting with "[20"; lines with a "] " or "]: " not followed by
# a runtime template (the second form is a deployment's own ``[<time>][<file>:<line>][INFO]: `` wrapper).
# Each is then checked against the noise pattern.  A line that starts with "[20" and has no "] " or "]: "
# at all can be neither a marker nor an error line.
NOT_STAMPED_RE = re.compile(rb"\n(?!\[20)")
NOT_TEMPLATE_RE = re.compile(rb"\]:? (?!Decode batch|Prefill batch|INFO: +[\d\[:]|Receive: |Finish: )")
# Serving stats lines, wherever they stand in a line: proof that the start has finished (issue 23 class 2)
BATCH_LINE_BYTES_RE = re.compile(rb"(?:Decode|Prefill) batch(?: \[\d+\])?[.,] ")

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


KEYWORD_RE = _keyword_pattern(_KEYWORDS)


# ---------------------------------------------------------------------------------------------------
# Markers (sglang-facts §1.4) and bars (§1.5), with the 0.4.x spellings next to the 0.5.23 ones.

BAR_TQDM_RE = re.compile(r"(?P<pct>\d{1,3})%\|[^|\r]*\| *(?P<n>\d+)/(?P<total>\d+) *\[")
BAR_SGLANG_RE = re.compile(r"(?P<pct>\d{1,3})% Completed \| *(?P<n>\d+)/(?P<total>\d+) *\[")
# The end of a bar's `[elapsed<remaining, rate]`; text after it is a log line glued to the bar.
BAR_END_RE = re.compile(r"\d+/\d+ *\[[^\]\r\n]*\]")
PAREN_RE = re.compile(r"\(([^)]*)\)")
GRAPH_BEGIN_RE = re.compile(r"\bCapture\b.*\b(?:cuda|CUDA) graph begin", re.IGNORECASE)
GRAPH_END_RE = re.compile(r"\bCapture\b.*\b(?:cuda|CUDA) graph end", re.IGNORECASE)
GRAPH_FAILED_RE = re.compile(
    r"capture (?:\w+ )*cuda ?graph failed|cuda ?graph capture failed|cudagraph capture failed", re.IGNORECASE
)
REGISTER_GRAPH_RE = re.compile(r"Registering \d+ cuda graph addresses")
NEGATIVE_KV_RE = re.compile(r"larger than the profiled value -\d+")
CAPTURE_PLUGIN_RE = re.compile(
    r"eagle3-capture active: layers_to_capture=\[(?P<layers>[\d,\s]*)\]"
    r"(?:, dir=(?P<dir>.*?))?(?:, rid_prefix=(?P<rid>\S*))?\s*$"
)
CPP_LINE_RE = re.compile(
    r"(?:\[rank(?P<rank>\d+)\]:)?\[(?P<sev>[EF])(?:\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)? | )?"
    r"(?P<src>[\w./-]+\.(?:cpp|cc|cu|h|hpp)):\d+\]"
)
# `Traceback` frames: `  File "x.py", line 12, in f` (faulthandler writes no comma before `in`)
FRAME_RE = re.compile(r'\s+File "(?P<path>[^"]*)", line \d+,? in (?P<func>[\w<>.]+)')
CALL_RE = re.compile(r"(\w+)\(")
EXCEPTION_LINE_RE = re.compile(r"(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*)(?P<colon>:(?:\s.*)?)?$")
EXCEPTION_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Failure", "Failed", "Timeout", "Fault")
KILLED_RE = re.compile(r"(?:[\w./-]+: line \d+: +\d+ +)?Killed(?:\s|$)")
EXITED_RE = re.compile(r"exited with code (\d+)")
ARGPARSE_ERROR_RE = re.compile(r"[\w./-]+: error: ")
HEADER_RE = re.compile(r"(?i)(?:exception|error|fail)[^\r\n]*:\s*$")

# Traceback frames -> the phase the process was in (for logs without markers).
FRAME_FUNCS = {
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
# Frames of the scheduler's serving loop: a traceback through them is a crash while serving (the start had
# finished), whatever the log showed before (issue 23 class 3).
SERVING_FRAMES = frozenset({
    "event_loop_normal", "event_loop_overlap", "event_loop_pp", "event_loop_normal_disagg_prefill",
    "event_loop_overlap_disagg_prefill", "event_loop_normal_disagg_decode", "event_loop_overlap_disagg_decode",
    "run_batch", "process_batch_result", "process_batch_result_decode", "process_batch_result_prefill",
    "get_next_batch_to_run", "get_new_batch_prefill", "update_running_batch", "run_event_loop",
    "forward_batch_generation", "process_input_requests",
})
FRAME_PATHS = (
    ("/model_loader/", StartupPhase.LOADING_WEIGHTS),
    ("kv_cache_configurator", StartupPhase.KV_CACHE),
    ("cuda_graph_runner", StartupPhase.CUDA_GRAPH),
    ("cuda_graph_setup", StartupPhase.CUDA_GRAPH),
)

PHASE_OF_PROGRESS = {
    "shards": StartupPhase.LOADING_WEIGHTS,
    "cuda graph bs": StartupPhase.CUDA_GRAPH,
    "cuda graph prefill": StartupPhase.CUDA_GRAPH,
    "cuda graph tokens": StartupPhase.CUDA_GRAPH,
    "piecewise compile": StartupPhase.CUDA_GRAPH,
    "cuda graph": StartupPhase.CUDA_GRAPH,
    "deepgemm jit": StartupPhase.KV_CACHE,
    "deepgemm warmup": StartupPhase.KV_CACHE,
}


def truncate_bytes(line: bytes) -> bytes:
    if len(line) <= LINE_HEAD_BYTES + LINE_TAIL_BYTES + len(TRUNCATION_MARK_BYTES):
        return line
    return line[:LINE_HEAD_BYTES] + TRUNCATION_MARK_BYTES + line[-LINE_TAIL_BYTES:]


def timestamp_of(text: str) -> str | None:
    """The timestamp a line shows (its last ``\\r`` segment), or None."""
    if "\x1b" in text:
        text = ANSI_RE.sub("", text)
    if "\r" in text:
        text = collapse_cr(text)
    if not text.startswith("["):
        _, text = strip_wrapper(text)
    m = PREFIX_RE.match(text)
    if m is not None:
        return m.group("ts")
    m = PYLOG_TS_RE.match(text)
    return m.group(1) if m is not None else None


def bar_label(desc: str) -> tuple[str, str | None] | None:
    """(progress label, detail) for a tqdm description, or None for a bar we don't track."""
    if "Capturing batches" in desc:
        m = PAREN_RE.search(desc)
        return "cuda graph bs", (m.group(1) if m else None)
    if "Capturing prefill shape" in desc:
        m = PAREN_RE.search(desc)
        return "cuda graph prefill", (m.group(1) if m else None)
    if "Capturing num tokens" in desc or "Capturing" in desc:
        m = PAREN_RE.search(desc)
        return "cuda graph tokens", (m.group(1) if m else None)
    if "Compiling num tokens" in desc:
        m = PAREN_RE.search(desc)
        return "piecewise compile", (m.group(1) if m else None)
    if "DeepGEMM" in desc:
        return "deepgemm warmup", None
    low = desc.lower()
    if "shards" in low or "safetensors" in low or "checkpoint" in low:
        return "shards", desc.strip() or None
    return None


def split_glued(piece: str) -> list[str]:
    """A tqdm bar with a log line glued after its ``[elapsed<remaining, rate]`` becomes two pieces."""
    parts: list[str] = []
    while "%|" in piece or "% Completed" in piece:
        m = BAR_END_RE.search(piece)
        if m is None or not piece[m.end():].strip():
            break
        parts.append(piece[: m.end()])
        piece = piece[m.end():]
    parts.append(piece)
    return parts


def classify(s: str, msg: str) -> tuple[str | None, bool]:
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
    if GRAPH_FAILED_RE.search(msg):
        return "cuda_graph", True
    if "profiled value -" in msg and NEGATIVE_KV_RE.search(msg):
        return "negative_kv", True
    if "Not enough memory. Please try to increase --mem-fraction-static" in msg:
        return "negative_kv", True
    if "cuda out of memory" in low or "outofmemoryerror" in low or "hip out of memory" in low:
        return "oom", True
    if "address already in use" in low or "[errno 98]" in low:
        return "address_in_use", True
    if "Exception in run_tp_server" in msg or "Exception in ModelTpServer" in msg:
        return "traceback", True
    if "Killed" in s and KILLED_RE.match(s):
        return "killed", True
    if "exited with code" in s:
        em = EXITED_RE.search(s)
        if em is not None and em.group(1) != "0":
            return "exit", True
    if "Fatal Python error" in s or "Segmentation fault" in s or "terminate called after throwing" in s:
        return "crash", True
    if s.startswith("Aborted (core dumped)"):
        return "crash", True
    if ": error: " in s and ARGPARSE_ERROR_RE.match(s):
        return "bad_args", True
    return None, False


def exception_kind(text: str) -> str:
    low = text.lower()
    if GRAPH_FAILED_RE.search(text):
        return "cuda_graph"
    if "out of memory" in low or "outofmemoryerror" in low:
        return "oom"
    if "address already in use" in low:
        return "address_in_use"
    if "gloo" in low:
        return "gloo"
    if "nccl" in low:
        return "nccl"
    if "not enough memory" in low or ("memory" in low and "kv cache" in low):
        return "negative_kv"
    return "traceback"


def phase_of_frame(func: str, path: str) -> StartupPhase | None:
    """The startup phase a traceback frame (function, file path) shows the process was in, or None."""
    phase = FRAME_FUNCS.get(func)
    if phase is None:
        for needle, p in FRAME_PATHS:
            if needle in path:
                phase = p
                break
    if phase is StartupPhase.CUDA_GRAPH and func.startswith("replay"):
        return None  # a graph replay is serving, not capturing
    return phase
