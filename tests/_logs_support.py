"""Builds synthetic SGLang 0.5.23 startup logs from the exact line formats of sglang-facts §1.4-1.5.

The builder records, while it writes, which phase each line belongs to per that table, the line of each
phase's first marker, the ranks that logged each marker and the line of the error it injected.  Tests
compare the tracker's reading with that record, so the expectation comes from the format table, not from
the tracker.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sessions.phases import StartupPhase

PHASE_ORDER = list(StartupPhase)

# Real SGLang logs from public issues and docs, with their provenance in index.tsv (tests/data/sglang-logs/).
SGLANG_LOGS = Path(__file__).resolve().parent / "data" / "sglang-logs"


@dataclass
class BuiltLog:
    text: str = ""
    lines: list[str] = field(default_factory=list)
    first_line: dict[StartupPhase, int] = field(default_factory=dict)  # phase -> first marker line
    arrivals: dict[str, set[int]] = field(default_factory=dict)  # marker -> global ranks
    error_line: int | None = None
    error_text: str | None = None
    ready: bool = False

    @property
    def furthest(self) -> StartupPhase:
        return max(self.first_line, key=lambda p: p.order) if self.first_line else StartupPhase.LAUNCHING


class LogBuilder:
    """Writes lines the way SGLang's logger and tqdm do, with optional container prefix and ANSI colours."""

    def __init__(self, tp: int = 8, *, dp_attention: bool = False, ep: bool = False, ms: bool = False,
                 docker: str | None = None, ansi: bool = False) -> None:
        self.tp = tp
        self.dp_attention = dp_attention
        self.ep = ep
        self.ms = ms
        self.docker = docker
        self.ansi = ansi
        self.out = BuiltLog()
        self._second = 0

    # -- primitives -------------------------------------------------------------------------------------

    def _ts(self) -> str:
        self._second += 1
        minute, second = divmod(self._second, 60)
        ts = f"2026-11-01 10:{minute % 60:02d}:{second:02d}"
        return ts + (".123" if self.ms else "")

    def _ranks(self, rank: int | None) -> str:
        if rank is None:
            return ""
        parts = []
        if self.dp_attention:
            parts.append(f"DP{rank}")
        if self.tp > 1 or self.dp_attention:
            parts.append(f"TP{rank}")
        if self.ep:
            parts.append(f"EP{rank}")
        return "".join(" " + p for p in parts)

    def raw(self, text: str) -> int:
        """One physical line (may hold ``\\r`` renders); returns its 1-based number."""
        if self.docker is not None:
            prefix = f"{self.docker}  | "
            if self.ansi:
                prefix = f"\x1b[36m{self.docker}  |\x1b[0m "
            text = prefix + text
        self.out.lines.append(text)
        return len(self.out.lines)

    def log(self, msg: str, rank: int | None = None, phase: StartupPhase | None = None,
            marker: str | None = None) -> int:
        if self.ansi and "Capture" in msg:
            msg = f"\x1b[1;33m{msg}\x1b[0m"
        line_no = self.raw(f"[{self._ts()}{self._ranks(rank)}] {msg}")
        if phase is not None:
            self.out.first_line.setdefault(phase, line_no)
        if marker is not None:
            self.out.arrivals.setdefault(marker, set()).add(0 if rank is None else rank)
        return line_no

    def each_rank(self, msg: str, phase: StartupPhase | None = None, marker: str | None = None,
                  ranks: list[int] | None = None) -> None:
        for r in ranks if ranks is not None else range(self.tp):
            self.log(msg, r if self.tp > 1 or self.dp_attention else None, phase, marker)

    def bar(self, desc_fmt: str, total: int, phase: StartupPhase, *, sglang_format: bool,
            stop_at: int | None = None, glue: str | None = None) -> int:
        """A tqdm bar: ``\\r``-separated renders on one physical line (newline only when it closes)."""
        renders = []
        last = total if stop_at is None else stop_at
        for n in range(last + 1):
            desc = desc_fmt.format(n=n)
            pct = int(100 * n / total)
            if sglang_format:
                renders.append(f"{desc}: {pct:3d}% Completed | {n}/{total} [00:{n:02d}<00:10,  1.50it/s]")
            else:
                if n == 0:
                    renders.append(f"  0%|          | 0/{total} [00:00<?, ?it/s]")
                renders.append(f"{desc}: {pct:3d}%|#         | {n}/{total} [00:{n:02d}<00:10,  1.50it/s]")
        text = "\r" + "\r".join(renders)
        if glue is not None:
            text += glue
        line_no = self.raw(text)
        self.out.first_line.setdefault(phase, line_no)
        return line_no

    def error(self, line_no: int, text: str) -> None:
        if self.out.error_line is None:
            self.out.error_line = line_no
            self.out.error_text = text

    def build(self) -> BuiltLog:
        self.out.text = "\n".join(self.out.lines) + "\n"
        return self.out

    # -- the 0.5.23 startup ------------------------------------------------------------------------------

    def server_args(self, extra: str = "") -> None:
        dp = self.tp if self.dp_attention else 1
        ep = self.tp if self.ep else 1
        attn_tp = 1 if self.dp_attention else self.tp
        self.log(
            f"server_args={{'model_path': '/models/kimi-k2.5', 'tp_size': {self.tp}, 'dp_size': {dp}, "
            f"'ep_size': {ep}, 'attn_dp_size': {dp}, 'attn_tp_size': {attn_tp}, 'watchdog_timeout': 300, "
            f"'custom_sigquit_handler': None{extra}}}"
        )

    def startup(self, stop_after: StartupPhase | None = None, *, deepgemm: bool = False,
                prefill_graph: bool = True, decode_graph: bool = True, shards: int = 8,
                missing_load_end: list[int] | None = None) -> LogBuilder:
        """Everything from the server_args dump to ready, or up to the end of ``stop_after``."""
        def done(phase: StartupPhase) -> bool:
            return stop_after is not None and phase == stop_after

        self.server_args()
        self.each_rank("Init parallel begin.", StartupPhase.DIST_INIT, "init_parallel_begin")
        self.each_rank("Init parallel ends. elapsed=1.25 s", StartupPhase.DIST_INIT, "init_parallel_end")
        self.each_rank("Memory baseline taken. mem usage=0.52 GB")
        if done(StartupPhase.DIST_INIT):
            return self
        self.each_rank("Load weight begin. avail mem=138.42 GB", StartupPhase.LOADING_WEIGHTS, "load_weight_begin")
        self.bar("Multi-thread loading shards", shards, StartupPhase.LOADING_WEIGHTS, sglang_format=True)
        if done(StartupPhase.LOADING_WEIGHTS):
            return self
        loaded = [r for r in range(self.tp) if r not in (missing_load_end or [])]
        self.each_rank(
            "Load weight end. elapsed=42.10 s, type=DeepseekV3ForCausalLM, quant=fp8, avail mem=60.00 GB, "
            "mem usage=78.42 GB.", StartupPhase.WEIGHTS_LOADED, "load_weight_end", ranks=loaded,
        )
        if done(StartupPhase.WEIGHTS_LOADED) or missing_load_end:
            return self
        self.each_rank("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, KV size: 40.21 GB",
                       StartupPhase.KV_CACHE, "kv_cache_allocated")
        self.each_rank("Memory pool end. avail mem=18.00 GB", StartupPhase.KV_CACHE, "memory_pool_end")
        if deepgemm:
            self.log("Entering DeepGEMM JIT Pre-Compile session. It may take a long time (typically 10-20 mins) "
                     "if you have not run `sglang.compile_deep_gemm`.", 0 if self.tp > 1 else None,
                     StartupPhase.KV_CACHE)
            self.log("Try DeepGEMM JIT Compiling for <GEMM_NT_F8F8BF16> N=7168, K=2048, num_groups=1 with all Ms.",
                     0 if self.tp > 1 else None, StartupPhase.KV_CACHE)
            self.bar("DeepGEMM warmup", 16, StartupPhase.KV_CACHE, sglang_format=False)
        if done(StartupPhase.KV_CACHE):
            return self
        if prefill_graph:
            self.each_rank("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4096, 2048, 1024], "
                           "avail mem=17.50 GB", StartupPhase.CUDA_GRAPH, "cuda_graph_begin")
            self.bar("Capturing prefill shape (num_tokens={n} avail_mem=17.40 GB)", 3, StartupPhase.CUDA_GRAPH,
                     sglang_format=False)
            self.each_rank("Capture target prefill CUDA graph end. elapsed=12.00 s, mem usage=1.00 GB, "
                           "avail mem=16.50 GB.", StartupPhase.CUDA_GRAPH, "cuda_graph_end")
        else:
            self.each_rank("Disable prefill CUDA graph because pp_size > 1")
        if decode_graph:
            self.each_rank("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                           "avail mem=16.50 GB", StartupPhase.CUDA_GRAPH, "cuda_graph_begin")
            self.bar("Capturing batches (bs={n} avail_mem=16.40 GB)", 12, StartupPhase.CUDA_GRAPH,
                     sglang_format=False)
            self.each_rank("Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=20.00 s, "
                           "mem usage=2.00 GB, avail mem=14.50 GB.", StartupPhase.CUDA_GRAPH, "cuda_graph_end")
        if done(StartupPhase.CUDA_GRAPH):
            return self
        self.log("max_total_num_tokens=1048576, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                 "max_running_requests=512, context_len=262144, available_gpu_mem=14.50 GB",
                 0 if self.tp > 1 else None)
        self.log("Engine startup timings (s): load_weight=42.10, kv_cache_allocation=1.00, scheduler_e2e=80.00, "
                 "cuda_graph={prefill=12.00, decode=20.00}, tokenizer_e2e=2.00", None, StartupPhase.WARMUP)
        self.log("INFO:     Started server process [4242]", None, StartupPhase.WARMUP)
        self.log("INFO:     Waiting for application startup.")
        self.log("INFO:     Application startup complete.")
        self.log("INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)")
        self.log('INFO:     127.0.0.1:50512 - "GET /model_info HTTP/1.1" 200 OK')
        self.log("Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
                 "#running-req: 0, #queue-req: 0", 0 if self.tp > 1 else None)
        if done(StartupPhase.WARMUP):
            return self
        self.log('INFO:     127.0.0.1:50520 - "POST /generate HTTP/1.1" 200 OK')
        self.log("The server is fired up and ready to roll!", None, StartupPhase.READY)
        self.out.ready = True
        return self

    def runtime_noise(self, n: int) -> LogBuilder:
        for i in range(n):
            if i % 3 == 0:
                self.log(f"Decode batch, #running-req: 3, #token: {i}, token usage: 0.01, cuda graph: True, "
                         "gen throughput (token/s): 412.50, #queue-req: 0", 0 if self.tp > 1 else None)
            elif i % 3 == 1:
                self.log(f'INFO:     127.0.0.1:{40000 + i % 2000} - "POST /generate HTTP/1.1" 200 OK')
            else:
                self.log(f"Prefill batch, #new-seq: 1, #new-token: {i % 900}, #cached-token: 0, token usage: 0.01, "
                         "#running-req: 2, #queue-req: 0", 0 if self.tp > 1 else None)
        return self

    def scheduler_exception(self, rank: int, frames: list[tuple[str, str]], exc_line: str) -> int:
        """SGLang's ``Scheduler hit an exception: <traceback>`` from one rank, then the parent's sigquit."""
        line_no = self.log("Scheduler hit an exception: Traceback (most recent call last):",
                           rank if self.tp > 1 else None)
        self.error(line_no, self.out.lines[line_no - 1])
        for path, func in frames:
            self.raw(f'  File "{path}", line 100, in {func}')
            self.raw(f"    {func}()")
        self.raw(exc_line)
        self.raw("")
        self.log("Received sigquit from a child process. It usually means the child failed.")
        return line_no
