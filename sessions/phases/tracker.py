"""The StartupTracker: an SGLang log, line by line, to where its start is (`StartupSummary`).

The tracker is pure: lines in, events and a summary out, no I/O.  What it looks for is the line catalogue's
(`sessions.phases.catalogue`); which rank a line comes from is the log core's one rank rule
(`sessions.logs.lines.own_tag`: the line's tag, or the line before's rank for a continuation), placed in the
server's layout by `sessions.phases.topology`.  The state here is the phase, the open traceback, the
arrivals per rank and the errors.  It reads the ``[date time TPn]`` prefix with any DP/PP/EP ranks, tqdm
bars separated by ``\\r`` (and bars glued to the next log line), ANSI colours, docker-compose ``name  | ``
prefixes, torch's C++ ``[rank6]:[E207 …]`` lines, and Python tracebacks.
"""

from __future__ import annotations

import dataclasses
import re

from sessions.logs.lines import (
    ANSI_RE,
    PREFIX_RE,
    clean,
    collapse_cr,
    own_header,
    own_tag,
    strip_ansi,
    strip_wrapper,
)
from sessions.phases.catalogue import (
    BAR_SGLANG_RE,
    BAR_TQDM_RE,
    BATCH_LINE_BYTES_RE,
    CALL_RE,
    CAPTURE_PLUGIN_RE,
    CPP_LINE_RE,
    EXCEPTION_LINE_RE,
    EXCEPTION_SUFFIXES,
    FRAME_FUNCS,
    FRAME_RE,
    GRAPH_BEGIN_RE,
    GRAPH_END_RE,
    HEADER_RE,
    KEYWORD_RE,
    LINE_HEAD_BYTES,
    LINE_TAIL_BYTES,
    NOISE_LINE_BYTES_RE,
    NOT_STAMPED_RE,
    NOT_TEMPLATE_RE,
    PHASE_OF_PROGRESS,
    PYLOG_TS_RE,
    REGISTER_GRAPH_RE,
    SERVING_FRAMES,
    TRUNCATION_MARK_BYTES,
    bar_label,
    classify,
    exception_kind,
    phase_of_frame,
    split_glued,
    timestamp_of,
    truncate_bytes,
)
from sessions.phases.model import (
    ARRIVAL_MARKERS,
    HARD_FATAL_KINDS,
    SOFT_ERROR_KINDS,
    LogError,
    PhaseEvent,
    PhaseProgress,
    StartupPhase,
    StartupSummary,
)
from sessions.phases.topology import Topology
from sessions.serving import parse_batch_line

# errors that follow a crash as its consequence (the parent reaping its children), not another crash
_ECHO_KINDS = frozenset({"sigquit", "killed", "exit", "subprocess_crashed", "scheduler_died"})
MAX_ERRORS = 256  # errors kept; a runtime log can hold thousands (the rest are counted in errors_dropped)


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
        self._topology = Topology()
        # the rank (the log core's rule, placed by the topology) of the last line ranked, for the next
        # line's continuation; a line `_scan` skipped unread is found again by `_line_before`
        self._ranked: tuple[int, int | None] = (0, None)
        self._scan_buf: bytes | None = None  # the buffer `_scan` is in, and where its current line starts
        self._scan_begin = 0
        self._scan_start = 0
        self._last_line = b""  # the last line of the previous buffer (truncated)
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
        self._tb_serving = False  # the open traceback ran through the serving loop
        # chained tracebacks: the error the last closed traceback belongs to, and the line it closed at;
        # `_chain_next` is that error once "During handling ..." / "The above exception ..." followed it
        self._chain_owner: int | None = None
        self._chain_at = 0
        self._chain_next: int | None = None
        # an exception line outside any traceback (an abridged paste): fatal when nothing moved on after it
        self._bare_exception: tuple[int, str, int | None] | None = None
        self._moved_at = 0  # the line of the last phase event or progress
        self._warmup_batches = 0  # serving lines seen in warmup (its own request logs one Prefill batch)
        self._wrapper_re: re.Pattern[str] | None = None  # an unknown wrapper learned from this log
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

    def skip_lines(self, newlines: int) -> None:
        """``newlines`` complete lines pass unread (the middle of a huge log: startup is read from its head,
        the serving view from its tail).  A held partial line ends among them; an open traceback is closed
        where the reading stops.  Numbering goes on exactly: a later line keeps its ``grep -n`` number."""
        if newlines <= 0:
            return
        held = bool(self._pending)
        self.flush()
        self._line_no += newlines - (1 if held else 0)

    def _add_pending(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) > LINE_HEAD_BYTES + 2 * LINE_TAIL_BYTES + len(TRUNCATION_MARK_BYTES):
            # keep the head and at least the last LINE_TAIL_BYTES; the exact tail is cut at the end
            del self._pending[LINE_HEAD_BYTES: len(self._pending) - LINE_TAIL_BYTES]
            self._pending_cut = True

    def _finish_pending_line(self) -> bytes:
        line = bytes(self._pending)
        cut = self._pending_cut
        self._pending = bytearray()
        self._pending_cut = False
        if cut:
            return line[:LINE_HEAD_BYTES] + TRUNCATION_MARK_BYTES + line[-LINE_TAIL_BYTES:]
        return truncate_bytes(line)

    def _scan(self, buf: bytes, begin: int, end: int) -> None:
        """The whole lines in ``buf[begin:end]`` (ending with ``\\n``); runtime noise is skipped without a
        Python loop (regex scans and ``bytes.count`` over the buffer, no copy)."""
        base = self._line_no
        starts = {begin} if not buf.startswith(b"[20", begin) else set()
        starts.update(m.start() + 1 for m in NOT_STAMPED_RE.finditer(buf, begin, end))
        starts.update(buf.rfind(b"\n", begin, m.start()) + 1 or begin
                      for m in NOT_TEMPLATE_RE.finditer(buf, begin, end))
        starts.discard(end)
        serving: set[int] = set()
        if self._phase is not StartupPhase.READY:
            # serving lines are noise once ready; before, the first few are evidence that the start finished
            for n, m in enumerate(BATCH_LINE_BYTES_RE.finditer(buf, begin, end)):
                if n == 3:
                    break
                serving.add(buf.rfind(b"\n", begin, m.start()) + 1 or begin)
            starts |= serving
        counted_to = begin  # the newlines before this offset are counted in `lines`
        lines = 0
        self._scan_buf, self._scan_begin = buf, begin
        for start in sorted(starts):
            if NOISE_LINE_BYTES_RE.match(buf, start, end) is not None and (
                    start not in serving or self._phase is StartupPhase.READY):
                continue  # noise (a serving line is read while it may prove the start finished)
            lines += buf.count(b"\n", counted_to, start)
            counted_to = start
            self._scan_start = start
            self._raw_line(truncate_bytes(buf[start: buf.find(b"\n", start, end)]), base + lines + 1)
        self._scan_buf = None
        self._line_no = base + lines + buf.count(b"\n", counted_to, end)
        last_start = buf.rfind(b"\n", begin, end - 1) + 1 or begin
        self._last_line = truncate_bytes(buf[last_start: end - 1])
        self._note_last_ts(buf, begin, end)

    def _line_before(self) -> bytes:
        """The line before the one being read, when the tracker skipped it unread (runtime noise)."""
        if self._scan_buf is not None and self._scan_start > self._scan_begin:
            end = self._scan_start - 1
            start = self._scan_buf.rfind(b"\n", self._scan_begin, end) + 1 or self._scan_begin
            return truncate_bytes(self._scan_buf[start:end])
        return self._last_line

    def _rank_of(self, text: str, line_no: int) -> tuple[int | None, bool]:
        """(rank, explicit) of a line: the log core's rank rule (`own_tag`), the tag placed by the topology;
        explicit when the line names its rank itself (a prefix or torch's ``[rankN]:``)."""
        tag, continues = own_tag(clean(text))
        if continues:
            at, rank = self._ranked
            if at != line_no - 1:  # the line before was skipped unread: never a continuation itself
                before, _ = own_tag(clean(self._line_before().decode("utf-8", "replace")))
                rank = None if before is None else self._topology.global_rank(before)
        else:
            rank = None if tag is None else self._topology.global_rank(tag)
        self._ranked = (line_no, rank)
        return rank, bool(tag)

    def _note_last_ts(self, buf: bytes, begin: int, end: int) -> None:
        """``last_log_time`` after a scan: the last line of ``buf[begin:end]`` with a timestamp (noise too)."""
        stop = end - 1  # the "\n" that ends the last line
        while stop >= begin:
            start = buf.rfind(b"\n", begin, stop) + 1 or begin
            ts = timestamp_of(truncate_bytes(buf[start:stop]).decode("utf-8", "replace"))
            if ts is not None:
                self._last_ts = ts
                return
            stop = start - 1

    def _one_line(self, raw: bytes, line_no: int) -> None:
        """A line completed outside `_scan` (the end of a partial line), read by `_scan`'s rules."""
        text = raw.decode("utf-8", "replace")
        ts = timestamp_of(text)
        if ts is not None:
            self._last_ts = ts
        candidate = not raw.startswith(b"[20") or NOT_TEMPLATE_RE.search(raw) is not None  # as `_scan` finds
        noise = NOISE_LINE_BYTES_RE.match(raw) is not None
        if (candidate and not noise) or (self._phase is not StartupPhase.READY and BATCH_LINE_BYTES_RE.search(raw)):
            self._line(text, line_no)
        else:
            self._last_line = raw

    def _raw_line(self, raw: bytes, line_no: int) -> None:
        self._line(raw.decode("utf-8", "replace"), line_no)

    # -- one line ------------------------------------------------------------------------------------

    def _line(self, text: str, line_no: int) -> None:
        """One line that is not runtime noise (``_last_ts`` is settled by the caller)."""
        if "\x1b" in text:  # colours (docker compose paints its prefixes) would split the keywords
            text = ANSI_RE.sub("", text)
        wrapper = ""
        if own_header(text) is None:
            wrapper, text = self._unwrap(text)
        if self._phase is not StartupPhase.READY and "batch" in text:
            self._serving_line(text, line_no)
        if text[:1] == "[" and "\r" not in text:
            pm = PREFIX_RE.match(text)
            ts = pm.group("ts") if pm is not None else None
        else:
            ts = timestamp_of(text)
        rank, explicit = self._rank_of(text, line_no)
        if not self._tb_open and KEYWORD_RE.search(text.lower()) is None:
            if ts is not None:
                self._event_ts = ts
            return
        if explicit and rank is not None:
            self._ranks_seen.add(rank)
        container, body = wrapper, text
        if "\r" in body:
            pieces = [p for p in body.split("\r") if p.strip()]
            whole = len(pieces) == 1
        else:
            pieces = [body] if body.strip() else []
            whole = True
        for piece in pieces:
            parts = split_glued(piece)
            for part in parts:
                part = part.rstrip()
                shown = (container + part).rstrip() if whole and len(parts) == 1 else part
                self._segment(part, line_no, shown, rank)
        if ts is not None:
            self._event_ts = ts

    def _unwrap(self, text: str) -> tuple[str, str]:
        """(wrapper, message) of a line: a wrapper this log has shown before, else `strip_wrapper`.  A
        wrapper that stood before SGLang's own header is learned (its digits as any digits), so that the
        log's lines without a header (traceback frames, bars) lose it too."""
        if self._wrapper_re is not None:
            m = self._wrapper_re.match(text)
            if m is not None and m.end():
                return text[: m.end()], text[m.end():]
        wrapper, rest = strip_wrapper(text)
        if wrapper and own_header(rest) is not None:
            self._wrapper_re = re.compile(re.sub(r"\d+", r"\\d+", re.escape(wrapper)))
        return wrapper, rest

    def _serving_line(self, text: str, line_no: int) -> None:
        """A ``Decode batch`` / ``Prefill batch`` stats line before ready: the start has finished.  The
        warmup's own request logs one ``Prefill batch`` before "fired up", so in warmup it takes a second
        serving line (or a ``Decode batch``)."""
        line = parse_batch_line(text)
        if line is None:
            return
        if self._phase is StartupPhase.WARMUP and line.kind == "prefill":
            self._warmup_batches += 1
            if self._warmup_batches < 2:
                return
        self._advance(StartupPhase.READY, line_no)

    def _segment(self, s: str, line_no: int, shown: str, rank: int | None) -> None:
        # A timestamper that puts a header like SGLang's before every line (``ts '[%Y-%m-%d %H:%M:%S]'``)
        # puts it before a traceback's frames, its exception line and a chain's "The above exception" too.
        header = own_header(s) if s.startswith("[") else None
        body = s[header.end():] if header is not None else s
        # 1. traceback continuation
        if self._tb_open:
            if not body or body[0].isspace():
                fm = FRAME_RE.match(body)
                if fm is not None:
                    self._frame(fm.group("func"), fm.group("path"), line_no)
                elif "(" in body:  # the source line: the call it shows is the next frame (often cut off)
                    for func in CALL_RE.findall(body):
                        if func in FRAME_FUNCS:
                            self._frame(func, "", line_no)
                return
            if body.startswith(("Traceback (most recent call last)", "During handling of the above exception",
                                "The above exception was the direct cause")):
                return
            em = EXCEPTION_LINE_RE.match(body)
            if em is not None and (em.group("colon") or em.group("name").endswith(EXCEPTION_SUFFIXES)):
                self._close_traceback((line_no, body))
                return
            self._close_traceback(None)
        if body.startswith(("During handling of the above exception", "The above exception was the direct cause")):
            if self._chain_owner is not None and line_no - self._chain_at <= 3:
                self._chain_next = self._chain_owner  # the next traceback continues that error's chain
            return
        # 2. the server_args dump: settings only, never markers or errors (it holds "sigquit", "watchdog")
        if "server_args=" in s:
            self._topology.read_server_args(s)
            return
        # 3. the line's own prefix: its time and its message (its rank is the line's, from the log core)
        pm = PREFIX_RE.match(s) if s.startswith("[") else None
        msg = s
        if pm is not None:
            self._event_ts = pm.group("ts")
            msg = s[pm.end():]
        else:
            lm = PYLOG_TS_RE.match(s)
            if lm is not None:
                self._event_ts = lm.group(1)
        # 4. a traceback starts here
        tb_at = s.find("Traceback (most recent call last)")
        if tb_at >= 0:
            self._open_traceback(s, msg, tb_at, line_no, rank, shown)
            return
        if s.startswith(" ") and s.lstrip().startswith('File "'):  # an excerpt that starts mid-traceback
            self._tb_open, self._tb_line, self._tb_header, self._tb_rank = True, line_no, None, rank
            fm = FRAME_RE.match(s)
            if fm is not None:
                self._frame(fm.group("func"), fm.group("path"), line_no)
            return
        # 5. errors, then markers, then progress
        n_errors = len(self._errors)
        if ": " in msg and msg[:1].isalpha():
            em = EXCEPTION_LINE_RE.match(msg)
            if em is not None and em.group("colon") and em.group("name").endswith(EXCEPTION_SUFFIXES):
                self._bare_exception = (line_no, msg, rank)  # fatal if it ends the log (`summary`)
                if exception_kind(msg) == "negative_kv":  # no room for the KV pool: the start got that far
                    self._advance(StartupPhase.KV_CACHE, line_no)
        self._errors_in(s, msg, line_no, rank, shown)
        self._markers_in(msg, line_no, rank)
        if "%" in msg:
            self._progress_in(msg, line_no)
        if msg.endswith(":") and HEADER_RE.search(msg):  # "...exception:" whose traceback may follow
            owner = len(self._errors) - 1 if len(self._errors) > n_errors else None
            self._header_candidate = (line_no, shown, rank, owner)

    # -- tracebacks ----------------------------------------------------------------------------------

    def _open_traceback(self, s: str, msg: str, tb_at: int, line_no: int, rank: int | None, shown: str) -> None:
        header = own_header(s) if s.startswith("[") else None  # a header alone logs no message
        before = s[header.end() if header is not None and header.end() <= tb_at else 0:tb_at].strip()
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
        elif self._chain_next is not None:
            owner, self._chain_next = self._chain_next, None  # the next traceback of a chain
        else:
            hc = self._header_candidate
            if hc is not None and hc[0] == line_no - 1:
                # the header is the line before: its rank is the one this traceback took (the core's rule)
                owner = hc[3] if hc[3] is not None else self._add_error(hc[0], "traceback", hc[1], True, hc[2])
        self._tb_open, self._tb_line, self._tb_header, self._tb_rank = True, line_no, owner, rank
        self._tb_serving = False
        self._bare_exception = None

    def _close_traceback(self, exception: tuple[int, str] | None) -> None:
        """End of the traceback: at its exception line (``exception``) or cut short (None)."""
        if not self._tb_open:
            return
        self._tb_open = False
        header = self._tb_header
        serving = self._tb_serving
        self._chain_owner, self._chain_at = None, 0
        if header is not None and header < len(self._errors):
            err = self._errors[header]
            if exception is not None:
                kind = err.kind
                if kind == "traceback":
                    kind = exception_kind(exception[1])
                cause, cause_line = err.cause, err.cause_line
                if err.detail is not None:  # a chain: its first exception is the root cause
                    cause, cause_line = cause or err.detail, cause_line or err.detail_line
                err = LogError(err.line_no, kind, err.text, err.fatal, err.rank, exception[1], exception[0],
                               cause, cause_line, err.while_serving)
                self._chain_owner, self._chain_at = header, exception[0]
            if serving and not err.while_serving:
                err = dataclasses.replace(err, while_serving=True)
            self._errors[header] = err
            return
        if header is not None:
            return
        if exception is not None:
            line_no, text = exception
            owner = self._add_error(line_no, exception_kind(text), text, True, self._tb_rank)
            if owner is not None:
                self._errors[owner] = LogError(line_no, self._errors[owner].kind, text, True, self._tb_rank,
                                               None, None, None, None, serving)
                self._chain_owner, self._chain_at = owner, line_no
        else:
            owner = self._add_error(self._tb_line, "traceback", "Traceback (most recent call last):", True,
                                    self._tb_rank)
            if owner is not None and serving:
                self._errors[owner] = dataclasses.replace(self._errors[owner], while_serving=True)

    def _frame(self, func: str, path: str, line_no: int) -> None:
        if func in SERVING_FRAMES:  # the scheduler's serving loop: the start had finished
            self._tb_serving = True
            self._advance(StartupPhase.READY, line_no)
            return
        phase = phase_of_frame(func, path)
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
            cm = CPP_LINE_RE.match(s)
            if cm is not None:  # torch's `[rankN]:` is the line's tag: the rank came with the line
                if "collective operation timeout" in s:
                    kind = "nccl_watchdog"
                elif "gloo" in s.lower():
                    kind = "gloo"
                elif "NCCL" in s:
                    kind = "nccl"
                else:
                    kind = "c10d"
        if kind is None:
            kind, fatal = classify(s, msg)
        if kind is not None:
            self._add_error(line_no, kind, shown, fatal, rank)
            if kind == "negative_kv":
                self._advance(StartupPhase.KV_CACHE, line_no)
            elif kind == "warmup":
                self._advance(StartupPhase.WARMUP, line_no)
            elif kind == "cuda_graph":
                self._advance(StartupPhase.CUDA_GRAPH, line_no)

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
            if GRAPH_BEGIN_RE.search(msg):
                self._arrive("cuda_graph_begin", rank)
                self._advance(StartupPhase.CUDA_GRAPH, line_no)
            elif GRAPH_END_RE.search(msg):
                self._arrive("cuda_graph_end", rank)
                self._advance(StartupPhase.CUDA_GRAPH, line_no)
            elif REGISTER_GRAPH_RE.search(msg):
                self._advance(StartupPhase.CUDA_GRAPH, line_no)
        if ("Engine startup timings" in msg or "Uvicorn running on" in msg or "Application startup" in msg
                or "Started server process" in msg):
            self._advance(StartupPhase.WARMUP, line_no)
        if "fired up and ready to roll" in msg:
            self._advance(StartupPhase.READY, line_no)
        if "eagle3-capture active" in msg:
            cm = CAPTURE_PLUGIN_RE.search(msg)
            if cm is not None:
                self._capture_layers = tuple(int(x) for x in re.findall(r"\d+", cm.group("layers")))
                self._capture_dir = cm.group("dir") or None
                self._arrive("capture_active", rank)

    def _progress_in(self, msg: str, line_no: int) -> None:
        m = BAR_SGLANG_RE.search(msg) or BAR_TQDM_RE.search(msg)
        if m is None:
            return
        desc = msg[: m.start()].rstrip().rstrip(":").strip()
        done, total = int(m.group("n")), int(m.group("total"))
        if desc:
            found = bar_label(desc)
            if found is None:
                return
            label, detail = found
        else:  # tqdm's first render has no description yet (sglang-facts §1.5): attribute it by phase
            if self._phase is not StartupPhase.CUDA_GRAPH:
                return
            label, detail = "cuda graph", None
        self._set_progress(PhaseProgress(label, done, total, detail), line_no)

    def _set_progress(self, progress: PhaseProgress, line_no: int) -> None:
        self._moved_at = line_no
        phase = PHASE_OF_PROGRESS.get(progress.label)
        if phase is not None:
            self._advance(phase, line_no)
        self._progress = progress

    def _advance(self, phase: StartupPhase, line_no: int) -> None:
        if phase.order > self._phase.order:
            self._moved_at = line_no
            self._phase = phase
            self._progress = None
            event = PhaseEvent(phase, line_no, self._event_ts)
            self._events.append(event)
            self._new_events.append(event)

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
        m = BAR_SGLANG_RE.search(tail) or BAR_TQDM_RE.search(tail)
        if m is None:
            return None
        desc = tail[: m.start()].rstrip().rstrip(":").strip()
        _, desc = strip_wrapper(desc)
        found = bar_label(desc) if desc else (("cuda graph", None) if self._phase is StartupPhase.CUDA_GRAPH
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

    def _open_chain_error(self) -> LogError | None:
        """The error of a traceback still open (being written, or an excerpt cut inside it) that no error
        line owns: its chain's, when it continues one, else a bare traceback's."""
        if not self._tb_open or self._tb_header is not None:
            return None
        return LogError(self._tb_line, "traceback", "Traceback (most recent call last):", True, self._tb_rank,
                        while_serving=self._tb_serving)

    def _bare_exception_error(self, errors: list[LogError]) -> LogError | None:
        """An exception line outside any traceback (a paste that dropped the traceback) as a fatal error,
        when it ends the log: nothing moved on after it, and what came after is only the crash's echo."""
        bare = self._bare_exception
        if bare is None or self._tb_open or self._moved_at > bare[0]:
            return None
        line_no, text, rank = bare
        if any(e.line_no >= line_no and e.kind not in _ECHO_KINDS for e in errors):
            return None
        return LogError(line_no, exception_kind(text), text, True, rank, text, line_no)

    def summary(self) -> StartupSummary:
        errors = list(self._errors)
        open_error = self._open_chain_error()
        if open_error is not None:
            errors.append(open_error)
        bare = self._bare_exception_error(errors)
        if bare is not None:
            errors.append(bare)
        ready_line = next((e.line_no for e in self._events if e.phase is StartupPhase.READY), None)
        settled: list[LogError] = []
        for err in errors:
            fatal = err.fatal
            if err.while_serving:
                pass  # the serving loop raised: a crash of a server that was up
            elif ready_line is not None and (err.line_no < ready_line or err.kind not in HARD_FATAL_KINDS):
                fatal = False  # the server came up (or kept serving) after it
            if fatal and err.kind in SOFT_ERROR_KINDS and self._went_on_after(err):
                fatal = False
            settled.append(err if fatal == err.fatal else dataclasses.replace(err, fatal=fatal))
        first = min((e for e in settled if e.fatal), key=lambda e: e.line_no, default=None)
        error_rank = None
        if first is not None:
            error_rank = first.rank
            if error_rank is None and "Scheduler" in first.text and (self._topology.ranks_expected() or 1) == 1:
                error_rank = 0  # a TP1 scheduler tags no line: it is TP0
        outcome = "crashed" if first is not None else ("ready" if ready_line is not None else "incomplete")
        arrival = {m: tuple(sorted(self._arrival[m])) for m in ARRIVAL_MARKERS if m in self._arrival}
        progress = self._pending_progress() or self._progress
        return StartupSummary(
            phase=self._phase,
            outcome=outcome,
            error=first.exception if first is not None else None,
            error_line=first.exception_line if first is not None else None,
            error_rank=error_rank,
            error_cause=first.cause if first is not None else None,
            error_cause_line=first.cause_line if first is not None else None,
            errors=tuple(sorted(settled, key=lambda e: e.line_no)),
            events=tuple(self._events),
            progress=progress,
            ranks_expected=self._topology.ranks_expected(),
            rank_arrival=arrival,
            ranks_loaded=arrival.get("load_weight_end", ()),
            capture_layers=self._capture_layers,
            line_count=self.line_count,
            last_log_time=self._last_ts,
            ranks_seen=tuple(sorted(self._ranks_seen)),
            server_args=dict(self._topology.args),
            capture_dir=self._capture_dir,
            errors_dropped=self._errors_dropped,
        )
