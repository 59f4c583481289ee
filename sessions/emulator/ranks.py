"""The scheduler (one per TP rank) and detokenizer child processes of an emulated SGLang server.

They are started by the main process with the ``spawn`` context, like SGLang (engine.py:1995), and:
* set ``PR_SET_PDEATHSIG = SIGKILL`` first thing (``kill_itself_when_parent_died``, utils/common.py:
  3432-3438), so they die with the main process, and stay in its process group;
* take SGLang's titles (``sglang::scheduler_TP3``, ``sglang::detokenizer``) with setproctitle;
* log through the inherited stderr with the rank prefix, the weight bar on rank 0 and the graph bars on
  TP0 only.

The call chain mirrors SGLang's names (``run_scheduler_process`` -> ``Scheduler.__init__`` ->
``init_model_worker`` -> ``TpModelWorker`` -> ``ModelRunner.__init__`` -> ``initialize`` ->
``init_torch_distributed`` / ``load_model`` / ``init_memory_pool`` / ``init_device_graphs`` ->
``capture_one_batch_size``), so that py-spy stacks of a hung emulated rank read like a real one.
Collectives (``GroupCoordinator.all_reduce``) are completed by the main process, which lets a missing
rank block the others exactly where NCCL would.

Messages, rank -> main: ``("barrier", rank, name)``, ``("mem", rank, used_bytes, util_percent)``,
``("gpu", rank, "real"|"emulated", note)``, ``("ready", rank, info)``, ``("reply", msg_id, rank, payload)``.
Main -> rank: ``("barrier_release", name)``, ``("generate", msg_id, request, is_warmup)``,
``("internal_state", msg_id)``, ``("flush_cache", msg_id)``, ``("shutdown",)``.
"""

from __future__ import annotations

import collections
import ctypes
import faulthandler
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from sessions.emulator import pacing
from sessions.emulator.args import EmulatorOptions, context_len, log_level_number, log_prefix, scheduler_title
from sessions.emulator.backend import FixedBackend
from sessions.emulator.batcher import Batcher
from sessions.emulator.console import WEIGHT_BAR_FORMAT, Console, ConsoleLogHandler, ProgressBar
from sessions.emulator.draft_worker import DraftWorker
from sessions.emulator.faults import (
    CUDA_ILLEGAL_ADDRESS,
    FAILING_SHARD_FRACTION,
    Fault,
    SafetensorError,
    block_forever,
    failing_rank,
)
from sessions.emulator.gpu_memory import GIB, GpuMemoryHolder, MemoryPlan, kv_dtype_name, plan_memory
from sessions.emulator.model_config import ModelConfig, load_model_config
from sessions.emulator.nodes import check_interfaces, fail_for_lost_peer, node_layout, wait_for_gated_launch
from sessions.emulator.pacing import Pacing
from sessions.emulator.spec_decode import SpecDecoding
from sessions.emulator.speculative import is_speculative

_PR_SET_PDEATHSIG = 1


def kill_itself_when_parent_died(parent_pid: int) -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL), then make sure the parent did not die before we asked."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:  # not glibc: ask the loader (slower: find_library may run ldconfig)
            from ctypes.util import find_library

            libc = ctypes.CDLL(find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def _set_title(title: str) -> None:
    import setproctitle  # a declared dependency: the ranks are found by their titles

    setproctitle.setproctitle(title)


def _prepare_child(parent_pid: int, title: str, console: Console) -> None:
    kill_itself_when_parent_died(parent_pid)
    _set_title(title)
    faulthandler.enable()  # scheduler.py:6295
    # Ctrl-C reaches the whole process group; the main process tears the ranks down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    root = logging.getLogger()
    root.handlers[:] = [ConsoleLogHandler(console)]
    root.setLevel(console.level)


@dataclass(frozen=True)
class RankSpec:
    """Everything a scheduler child needs (pickled into the spawned process)."""

    server_args: dict[str, Any]
    tp_rank: int
    gpu_id: int
    parent_pid: int
    options: EmulatorOptions
    dp_rank: int | None = None  # the replica under a DP controller (plain --dp-size); None without one


class ShutdownRequested(Exception):
    """The main process sent ShutdownReq: release and exit 0."""


class GroupCoordinator:
    """The rank's side of the TP group: collectives complete when the main process releases them."""

    def __init__(self, conn: Connection, rank: int) -> None:
        self.conn = conn
        self.rank = rank
        self.pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self.lost_peer: str | None = None  # another node went away (--nnodes > 1)
        self.time_scale = 0.0

    def all_reduce(self, name: str) -> None:
        """Block until every rank of the group reached collective ``name`` (like an NCCL all-reduce)."""
        if self.lost_peer is not None:
            self.fail_for_lost_peer()
        self.conn.send(("barrier", self.rank, name))
        self._wait_for_peers(name)

    def _wait_for_peers(self, name: str) -> None:
        while True:
            message = self.conn.recv()
            if message[0] == "barrier_release" and message[1] == name:
                return
            if message[0] == "shutdown":
                raise ShutdownRequested()
            if message[0] == "peer_lost":
                self.lost_peer = str(message[2])
                self.fail_for_lost_peer()
            self.pending.append(message)

    def fail_for_lost_peer(self) -> NoReturn:
        fail_for_lost_peer(self.lost_peer or "<unknown>", self.time_scale)  # a request that arrived while we waited: handled afterwards

    def send(self, *message: Any) -> None:
        self.conn.send(message)


def run_scheduler_process(spec: RankSpec, conn: Connection) -> None:
    """The scheduler child's entry point (scheduler.py:run_scheduler_process)."""
    args = spec.server_args
    console = Console(
        prefix=log_prefix(args, spec.tp_rank, spec.dp_rank), level=log_level_number(args["log_level"])
    )
    _prepare_child(spec.parent_pid, scheduler_title(args, spec.tp_rank, spec.dp_rank), console)
    scheduler: Scheduler | None = None
    try:
        scheduler = Scheduler(spec, conn, console)
        scheduler.event_loop_normal()
    except ShutdownRequested:
        pass
    except Exception:  # noqa: BLE001 - scheduler.py:6370-6373 catches everything the same way
        # Log, then SIGQUIT the parent, which tears the whole tree down.
        console.log(f"Scheduler hit an exception: {traceback.format_exc().rstrip()}", logging.ERROR)
        os.kill(spec.parent_pid, signal.SIGQUIT)
        time.sleep(120)  # the parent kills us (or PDEATHSIG does)
    finally:
        if scheduler is not None:
            scheduler.release()


class Scheduler:
    """The per-rank scheduler: builds the model worker, reports ready, then serves requests."""

    def __init__(self, spec: RankSpec, conn: Connection, console: Console) -> None:
        self.spec = spec
        self.args = spec.server_args
        self.options = spec.options
        self.tp_rank = spec.tp_rank
        self.tp_size = self.args["tp_size"]
        self.console = console
        self.pacing = Pacing.for_rank(spec.options.time_scale, spec.tp_rank)
        self.tp_group = GroupCoordinator(conn, spec.tp_rank)
        self.tp_group.time_scale = spec.options.time_scale
        self.started = time.monotonic()
        self.crash_rank = (
            failing_rank(spec.options.fault, self.tp_size)
            if (spec.options.fault is Fault.CRASH_WHILE_SERVING)
            else None
        )
        self.serving_since: float | None = None
        self.batcher: Batcher | None = None
        self._busy = False
        self.init_model_worker()
        if self.tp_rank == 0:
            runner = self.model_runner
            spec_model = (SpecDecoding.from_server(self.args, spec.options, runner.model.param_count(),
                                                   runner.draft_config)
                          if is_speculative(self.args) else None)
            self.batcher = Batcher(
                self.model_runner.backend,
                self.args,
                spec.options.cost,
                console,
                self.model_runner.plan.kv_tokens,
                self.model_runner.max_running_requests,
                self.tp_group.send,
                self.tp_rank,
                spec_model,
            )
            self.batcher.dp_rank = spec.dp_rank  # meta_info["dp_rank"] (output_streamer.py:718-728)
        self.report_ready()

    # -- startup --------------------------------------------------------------------------------------

    def init_model_worker(self) -> None:
        self.tp_worker = TpModelWorker(self)
        self.model_runner = self.tp_worker.model_runner

    def report_ready(self) -> None:
        runner = self.model_runner
        plan = runner.plan
        if self.tp_rank == 0:
            # scheduler.py:1267-1275, TP0 only
            self.console.log(
                f"max_total_num_tokens={plan.kv_tokens}, "
                f"chunked_prefill_size={self.args['chunked_prefill_size']}, "
                f"max_prefill_tokens={self.args['max_prefill_tokens']}, "
                f"max_running_requests={runner.max_running_requests}, context_len={runner.context_len}, "
                f"available_gpu_mem={plan.avail_gb('decode_graph'):.2f} GB"
            )
        runner.report_memory("decode_graph", 1.0, 0.0)
        self.serving_since = time.monotonic()
        self.tp_group.send(
            "ready",
            self.tp_rank,
            {
                "max_total_num_tokens": plan.kv_tokens,
                "max_running_requests": runner.max_running_requests,
                "context_len": runner.context_len,
                "load_weight_s": runner.timings.get("load_weight", 0.0),
                "kv_cache_allocation_s": runner.timings.get("kv_cache_allocation", 0.0),
                "cuda_graph_s": dict(runner.cuda_graph_timings),
                "scheduler_e2e_s": time.monotonic() - self.started,
            },
        )

    # -- serving --------------------------------------------------------------------------------------

    def event_loop_normal(self) -> None:
        """Handle what arrived, then run one forward while there is work (TP0's batcher)."""
        while True:
            batcher = self.batcher
            message = self.recv_requests(block=batcher is None or not batcher.busy)
            while message is not None:
                if message[0] == "shutdown":
                    return
                self.handle_message(message)
                message = self.recv_requests(block=False)
            if batcher is not None and batcher.busy:
                if not self._busy:
                    self._busy = True
                    self.model_runner.report_memory("decode_graph", 1.0, 85.0)
                batcher.step()
                if not batcher.busy:
                    self._busy = False
                    self.model_runner.report_memory("decode_graph", 1.0, 0.0)
                    batcher.idle_metrics()

    def handle_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "generate":
            self.handle_generate_request(message[1], message[2], message[3])
        elif kind == "abort_request":
            if self.batcher is not None:
                self.batcher.abort(message[2])
            self.tp_group.send("reply", message[1], self.tp_rank, {"success": True})
        elif kind == "internal_state":
            self.tp_group.send("reply", message[1], self.tp_rank, self.get_internal_state())
        elif kind == "flush_cache":
            self.tp_group.send("reply", message[1], self.tp_rank, self.flush_cache())
        elif kind == "peer_lost":
            self.tp_group.lost_peer = str(message[2])
            if message[1] == 0:
                # The other nodes' ranks wait for TP0's request broadcast: that receive fails at once.
                self.tp_group.fail_for_lost_peer()

    def recv_requests(self, block: bool = True) -> tuple[Any, ...] | None:
        """The next message; None at once when ``block`` is False and nothing is waiting."""
        if self.tp_group.pending:
            return self.tp_group.pending.popleft()
        conn = self.tp_group.conn
        while True:
            timeout = self._idle_crash_in_s() if block else 0.0
            if conn.poll(timeout):
                return conn.recv()
            if not block:
                return None
            self.self_check_during_idle()

    def _idle_crash_in_s(self) -> float | None:
        if self.crash_rank != self.tp_rank or self.serving_since is None:
            return None
        delay = max(self.pacing.scaled(pacing.CRASH_AFTER_READY_S), pacing.CRASH_AFTER_READY_MIN_WALL_S)
        return max(0.0, self.serving_since + delay - time.monotonic())

    def self_check_during_idle(self) -> None:
        """crash-while-serving without client traffic: the failing rank's next forward faults."""
        self.run_batch(None)

    def handle_generate_request(self, msg_id: int, request: dict[str, Any], is_warmup: bool) -> None:
        if is_warmup:
            self.serving_since = time.monotonic()  # crash-while-serving's clock starts once the server is Up
        elif self.crash_rank == self.tp_rank:
            self.run_batch(request)
        if self.tp_size > 1:
            self.tp_group.all_reduce(f"forward:{msg_id}")  # every rank takes part in every forward
        if self.batcher is not None:
            self.batcher.add(msg_id, request)

    def run_batch(self, request: dict[str, Any] | None) -> NoReturn:
        self.model_runner.forward_batch_generation(request)
        raise AssertionError("unreachable")

    @property
    def last_gen_throughput(self) -> float:
        return self.batcher.stats.last_gen_throughput if self.batcher is not None else 0.0

    def get_internal_state(self) -> dict[str, Any]:
        plan = self.model_runner.plan
        return {
            "tp_rank": self.tp_rank,
            "world_size": self.tp_size,
            "memory_usage": {
                "weight": round(plan.weights_gb, 2),
                "kvcache": round(plan.kv_gb, 2),
                "token_capacity": plan.kv_tokens,
                "graph": round(plan.prefill_graph_gb + plan.decode_graph_gb, 2),
            },
            "effective_max_running_requests_per_dp": self.model_runner.max_running_requests,
            "last_gen_throughput": self.last_gen_throughput,
        } | self._spec_state()

    def _spec_state(self) -> dict[str, Any]:
        accept = self.batcher.avg_spec_accept_length if self.batcher is not None else None
        return {} if accept is None else {"avg_spec_accept_length": accept}

    def flush_cache(self) -> dict[str, Any]:
        if self.batcher is not None:
            self.batcher.flush_stats()
        if self.tp_rank == 0:
            flush = getattr(self.model_runner.backend, "flush_cache", None)
            if callable(flush):
                flush()
            self.console.log("Cache flushed successfully!")
        return {"success": True}

    def release(self) -> None:
        model_runner = getattr(self, "model_runner", None)
        if model_runner is not None and model_runner.gpu_memory is not None:
            model_runner.gpu_memory.release()


class TpModelWorker:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._init_model_runner()

    def _init_model_runner(self) -> None:
        self.model_runner = ModelRunner(self.scheduler)


class ModelRunner:
    """Dist init, weights, KV pool, attention setup and CUDA graphs, each in SGLang's log format."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.args = scheduler.args
        self.tp_rank = scheduler.tp_rank
        self.tp_size = scheduler.tp_size
        self.console = scheduler.console
        self.pacing = scheduler.pacing
        self.fault = scheduler.options.fault
        self.tp_group = scheduler.tp_group
        self.model: ModelConfig = load_model_config(self.args["model_path"])
        self.draft_config: dict[str, Any] | None = None  # the EAGLE draft's config.json (DraftWorker)
        self.plan: MemoryPlan = plan_memory(self.model, self.args, self.fault, self.tp_rank)
        self.context_len = context_len(self.args, self.model)
        self.max_running_requests = self.args["max_running_requests"] or max(
            1, min(4096, max(self.plan.kv_tokens, 1) // max(1, min(self.context_len, 4096)) * 8)
        )
        self.timings: dict[str, float] = {}
        self.cuda_graph_timings: dict[str, float] = {}
        self.backend: Any = None
        self.layers_to_capture = _layers_to_capture(self.model, self.args)
        self.gpu_memory = self._open_gpu_memory()
        self.initialize()

    def _open_gpu_memory(self) -> GpuMemoryHolder | None:
        gb = self.scheduler.options.gpu_memory_gb
        if gb is None:
            self.tp_group.send("gpu", self.tp_rank, "emulated", "no --emulate-gpu-memory-gb")
            return None
        holder, note = GpuMemoryHolder.open(gb, self.scheduler.spec.gpu_id)
        self.tp_group.send("gpu", self.tp_rank, "real" if holder else "emulated", note)
        self.console.log(
            f"[emulator] GPU memory: {note}" + ("" if holder else "; publishing emulated numbers")
        )
        return holder

    def report_memory(self, step: str, fraction: float, utilization_percent: float) -> None:
        used_gb = self.plan.used_gb(step, fraction)
        if self.gpu_memory is not None:
            self.gpu_memory.grow_to(used_gb / max(self.plan.final_used_gb, 1e-9))
        self.tp_group.send("mem", self.tp_rank, int(used_gb * GIB), utilization_percent)

    def initialize(self) -> None:
        self.init_torch_distributed()
        self.load_model()
        self.init_memory_pool()
        self.init_attention_backends()
        self.init_device_graphs()
        if is_speculative(self.args):
            # The EAGLE worker builds its draft model runner after the target's (eagle_worker_v2.py).
            DraftWorker(self).initialize()

    # -- parallel init --------------------------------------------------------------------------------

    def init_torch_distributed(self) -> None:
        self.pacing.sleep(pacing.SCHEDULER_BOOT_S)  # interpreter start and imports
        begin = time.monotonic()
        self.console.log("Init parallel begin.")
        check_interfaces(os.environ)  # Gloo and NCCL look up their interface first
        self.tp_group.all_reduce("init_parallel")  # the rendezvous: every rank must join
        # torch prints this once the Gloo group has connected its peers, so after the rendezvous: a rank
        # whose peers never join (a node that cannot reach --dist-init-addr) never prints it.
        peers = self.tp_size - 1
        self.console.raw(
            f"[Gloo] Rank {self.tp_rank} is connected to {peers} peer ranks. "
            f"Expected number of connected peer ranks is : {peers}\n"
        )
        if self.tp_rank == 0:
            self.console.log("sglang is using nccl==2.27.7")
        self.pacing.sleep(pacing.INIT_PARALLEL_S)
        self.console.log(f"Init parallel ends. elapsed={time.monotonic() - begin:.2f} s")
        wait_for_gated_launch(self.console, self.args, self.tp_rank, self.tp_group.all_reduce)
        self.report_memory("dist", 1.0, 0.0)
        self.console.log(f"Memory baseline taken. mem usage={self.plan.baseline_gb:.2f} GB")

    # -- weights --------------------------------------------------------------------------------------

    def load_model(self) -> None:
        begin = time.monotonic()
        self.console.log(f"Load weight begin. avail mem={self.plan.avail_gb('weights', 0.0):.2f} GB")
        DefaultModelLoader(self).load_model()
        if self.tp_rank == 0:
            self.backend = self._make_backend()
        elapsed = time.monotonic() - begin
        self.timings["load_weight"] = elapsed
        quant = f"quant={self.model.quant_method}, " if self.model.quant_method else ""
        self.console.log(
            f"Load weight end. elapsed={elapsed:.2f} s, type={self.model.architecture}, {quant}"
            f"avail mem={self.plan.avail_gb('weights'):.2f} GB, mem usage={self.plan.weights_gb:.2f} GB."
        )

    def _make_backend(self) -> Any:
        flags = dict(
            self.args,
            time_scale=self.scheduler.options.time_scale,
            emulator_layers_to_capture=self.layers_to_capture,
            emulate_thinking=self.scheduler.options.thinking,
        )
        if self.model.safetensors_files:
            from sessions.emulator.model_backend import ModelBackend

            try:
                return ModelBackend(self.args["model_path"], flags)
            except ModuleNotFoundError as exc:
                # Only the tensor packages (the [extract] extra) may be absent, and only when nothing is
                # captured: a capture launch without its forward would dump nothing, so it fails here.
                if (exc.name or "").partition(".")[0] not in _TENSOR_PACKAGES or self.layers_to_capture:
                    raise
                self.console.log(
                    f"[emulator] model-backed forward unavailable ({exc}); answering /generate "
                    "with a fixed continuation",
                    logging.WARNING,
                )
        backend = FixedBackend(self.args["model_path"], flags)
        self._log_capture_line(flags)
        return backend

    def _log_capture_line(self, flags: dict[str, Any]) -> None:
        """Without weights nothing is dumped, but the capture plugin's line (it needs only config.json)
        still shows what a real capture launch would capture (ModelBackend logs it itself)."""
        try:
            from sessions.emulator.model_backend import capture_active_line_for

            line = capture_active_line_for(self.args["model_path"], flags)
        except Exception:  # noqa: BLE001 - the capture pieces are optional for the emulator
            return
        if line:
            self.console.log(line)

    # -- KV cache -------------------------------------------------------------------------------------

    def get_available_gpu_memory(self, distributed: bool) -> float:
        """The min of free memory over the TP group: the first collective after the weights."""
        if distributed:
            self.tp_group.all_reduce("init_memory_pool")
        return self.plan.avail_gb("weights")

    def init_memory_pool(self) -> None:
        begin = time.monotonic()
        self.get_available_gpu_memory(distributed=True)
        plan = self.plan
        max_total = self.args["max_total_tokens"]
        if max_total and max_total > plan.kv_tokens:
            self.console.log(
                f"max_total_tokens={max_total} is larger than the profiled value {plan.kv_tokens}. "
                "Use the profiled value instead.",
                logging.WARNING,
            )
        if plan.kv_tokens <= 0:
            # pool_configurator.py: MemoryPoolConfig.__post_init__
            raise RuntimeError(
                "Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: mem_fraction_static={self.args['mem_fraction_static']}"
            )
        dtype = kv_dtype_name(self.args["kv_cache_dtype"])
        if self.tp_rank == 0:
            self.console.log(f"Using KV cache dtype: {dtype}")
        self.pacing.sleep(pacing.KV_CACHE_S)
        if self.model.is_mla:
            sizes = f"KV size: {plan.kv_gb:.2f} GB"
        else:
            sizes = f"K size: {plan.kv_gb / 2:.2f} GB, V size: {plan.kv_gb / 2:.2f} GB"
        self.console.log(f"KV Cache is allocated. dtype: {dtype}, #tokens: {plan.kv_tokens}, {sizes}")
        self.report_memory("kv", 1.0, 0.0)
        self.console.log(f"Memory pool end. avail mem={plan.avail_gb('kv'):.2f} GB")
        self.timings["kv_cache_allocation"] = time.monotonic() - begin

    # -- attention and capture layers -----------------------------------------------------------------

    def init_attention_backends(self) -> None:
        prefill, decode = self.args["prefill_attention_backend"], self.args["decode_attention_backend"]
        if prefill != decode:
            self.console.log(
                f"Using hybrid attention backend for decode and prefill: "
                f"decode_backend={decode}, prefill_backend={prefill}."
            )
        if self.args["aux_hidden_state_capture"]:
            self.set_eagle3_layers_to_capture()

    def set_eagle3_layers_to_capture(self) -> None:
        """Capture-only mode sets the layers before graph capture and refuses impossible ids (§4.1)."""
        if self.model.architecture == "DeepseekV4ForCausalLM":  # only DSpark capture (sglang-facts §4.2)
            raise AttributeError(
                f"'{self.model.architecture}' object has no attribute 'set_eagle3_layers_to_capture'"
            )
        ids = self.args["return_aux_hidden_state_layer_ids"] or []
        too_big = [i for i in ids if i >= self.model.num_hidden_layers]
        if too_big:
            raise ValueError(
                f"--return-aux-hidden-state-layer-ids {ids}: ids {too_big} are out of range for a model with "
                f"num_hidden_layers={self.model.num_hidden_layers}"
            )
        setter = getattr(self.backend, "set_eagle3_layers_to_capture", None)
        if callable(setter):
            setter(self.layers_to_capture)

    # -- CUDA graphs ----------------------------------------------------------------------------------

    def init_device_graphs(self) -> None:
        if self.args["cuda_graph_backend_prefill"] != "disabled":
            self.capture_prefill_graphs()
        if self.args["cuda_graph_backend_decode"] != "disabled":
            CudaGraphRunner(self).capture()

    def capture_prefill_graphs(self) -> None:
        sizes = list(self.args["cuda_graph_bs_prefill"])
        begin = time.monotonic()
        avail = self.plan.avail_gb("prefill_graph", 0.0)
        self.console.log(
            f"Capture target prefill CUDA graph begin. backend={self.args['cuda_graph_backend_prefill']}, "
            f"num_tokens={sizes}, avail mem={avail:.2f} GB"
        )
        bar = ProgressBar(self.console, len(sizes), enabled=self.tp_rank == 0)
        for i, num_tokens in enumerate(reversed(sizes)):  # largest first
            bar.set_description(
                f"Capturing prefill shape (num_tokens={num_tokens} "
                f"avail_mem={self.plan.avail_gb('prefill_graph', i / len(sizes)):.2f} GB)"
            )
            self.pacing.sleep(pacing.PREFILL_GRAPH_S / max(1, len(sizes)))
            self.report_memory("prefill_graph", (i + 1) / len(sizes), 70.0)
            bar.update(1)
        bar.close()
        elapsed = time.monotonic() - begin
        self.cuda_graph_timings["target_prefill"] = elapsed
        self.console.log(
            f"Capture target prefill CUDA graph end. elapsed={elapsed:.2f} s, "
            f"mem usage={self.plan.prefill_graph_gb:.2f} GB, "
            f"avail mem={self.plan.avail_gb('prefill_graph'):.2f} GB."
        )

    # -- serving --------------------------------------------------------------------------------------

    def forward_batch_generation(self, request: dict[str, Any] | None) -> NoReturn:
        """crash-while-serving: the failing rank's forward hits a CUDA fault."""
        raise RuntimeError(CUDA_ILLEGAL_ADDRESS.rstrip())


class DefaultModelLoader:
    """model_loader/loader.py: walks the shards; rank 0 shows the ``Multi-thread loading shards`` bar."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.model = runner.model
        self.shards = self.model.shard_count()
        seconds = max(pacing.WEIGHT_LOAD_MIN_S, runner.plan.weights_gb / pacing.WEIGHT_LOAD_GB_PER_S)
        if runner.fault is Fault.SLOW_WEIGHTS:
            seconds *= pacing.SLOW_WEIGHTS_FACTOR
        self.seconds_per_shard = seconds / self.shards
        failing = failing_rank(runner.fault, runner.tp_size)
        if runner.fault is Fault.NODE_DIES_LOADING:
            layout = node_layout(runner.args)  # the last node's first rank takes its node down
            failing = layout.ranks_of(layout.nnodes - 1)[0] if layout.is_multi_node else None
        self.fail_at_shard = int(self.shards * FAILING_SHARD_FRACTION) if failing == runner.tp_rank else None

    def load_model(self) -> None:
        self.load_weights_and_postprocess()

    def load_weights_and_postprocess(self) -> None:
        bar = ProgressBar(
            self.runner.console,
            self.shards,
            desc="Multi-thread loading shards",
            bar_format=WEIGHT_BAR_FORMAT,
            enabled=self.runner.tp_rank == 0,
        )
        for index, _name in enumerate(self.safetensors_weights_iterator()):
            self.runner.report_memory("weights", (index + 1) / self.shards, 3.0)
            bar.update(1)
        bar.close()

    def safetensors_weights_iterator(self):
        names = self.model.safetensors_files or tuple(
            f"model-{i + 1:05d}-of-{self.shards:05d}.safetensors" for i in range(self.shards)
        )
        for index, name in enumerate(names):
            yield self._read_shard(index, name)

    def _read_shard(self, index: int, name: str) -> str:
        if index == self.fail_at_shard and self.runner.fault is Fault.NODE_DIES_LOADING:
            # The node goes down: its main process and, by PDEATHSIG, every rank on it.
            os.kill(self.runner.scheduler.spec.parent_pid, signal.SIGKILL)
            block_forever()
        if index == self.fail_at_shard:
            if self.runner.fault is Fault.RANK_MISSING:
                block_forever()  # a read that never returns: this rank never logs "Load weight end"
            if self.runner.fault is Fault.SCHEDULER_EXCEPTION:
                raise SafetensorError(f"Error while deserializing header: MetadataIncompleteBuffer ({name})")
        self.runner.pacing.sleep(self.seconds_per_shard)
        return name


class CudaGraphRunner:
    """The decode graph capture (decode_cuda_graph_runner.py): largest batch size first, bar on TP0."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.capture_bs = list(runner.args["cuda_graph_bs_decode"])

    def capture(self) -> None:
        runner = self.runner
        begin = time.monotonic()
        # With speculative decoding the target's graph is the verify graph over num_draft_tokens tokens.
        spec = is_speculative(runner.args)
        self.phase = "verify" if spec else "decode"
        per_req = runner.args["speculative_num_draft_tokens"] if spec else 1
        runner.console.log(
            f"Capture target {self.phase} CUDA graph begin. backend={runner.args['cuda_graph_backend_decode']}, "
            f"num_tokens_per_req={per_req}, avail mem={runner.plan.avail_gb('decode_graph', 0.0):.2f} GB"
        )
        bar = ProgressBar(runner.console, len(self.capture_bs), enabled=runner.tp_rank == 0)
        total = len(self.capture_bs)
        for i, bs in enumerate(reversed(self.capture_bs)):
            bar.set_description(
                f"Capturing batches (bs={bs} avail_mem="
                f"{runner.plan.avail_gb('decode_graph', i / total):.2f} GB)"
            )
            self.capture_one_batch_size(i, bs)
            runner.report_memory("decode_graph", (i + 1) / total, 90.0)
            bar.update(1)
        bar.close()
        elapsed = time.monotonic() - begin
        runner.cuda_graph_timings[f"target_{self.phase}"] = elapsed
        runner.console.log(
            f"Capture target {self.phase} CUDA graph end. bs={self.capture_bs}, elapsed={elapsed:.2f} s, "
            f"mem usage={runner.plan.decode_graph_gb:.2f} GB, "
            f"avail mem={runner.plan.avail_gb('decode_graph'):.2f} GB."
        )

    def capture_one_batch_size(self, index: int, bs: int) -> None:
        # Larger batches take longer to capture; the whole list takes DECODE_GRAPH_S.
        share = (0.5 + bs / max(self.capture_bs)) / sum(
            0.5 + b / max(self.capture_bs) for b in self.capture_bs
        )
        self.runner.pacing.sleep(pacing.DECODE_GRAPH_S * share)
        self.run_once(index)

    def run_once(self, index: int) -> None:
        # The captured forward's all-reduce (custom all-reduce / NCCL); it never completes under
        # hang-in-graph-capture.
        self.runner.tp_group.all_reduce(f"cuda_graph_capture:{index}")


_TENSOR_PACKAGES = ("torch", "transformers", "safetensors", "tokenizers")


def _layers_to_capture(model: ModelConfig, args: dict[str, Any]) -> list[int] | None:
    """SGLang's ``layers_to_capture`` for capture-only mode, by the model family's +1 rule (§4.3)."""
    if not args.get("aux_hidden_state_capture"):
        return None
    from sessions.capture.layers import LayerConvention, LayerRule, rule_for

    ids = args.get("return_aux_hidden_state_layer_ids")
    rule = rule_for(model.architecture) or LayerRule.PLUS_ONE
    return LayerConvention(rule, model.num_hidden_layers).points_from_ids(ids)


def run_detokenizer_process(
    parent_pid: int, conn: Connection, title: str, log_level: str, soft_watchdog: bool
) -> None:
    """``sglang::detokenizer`` (or ``sglang::data_parallel_controller``): idle until shutdown or EOF."""
    console = Console(level=log_level_number(log_level))
    _prepare_child(parent_pid, title, console)
    if soft_watchdog and title == "sglang::detokenizer":
        console.log("Watchdog DetokenizerManager initialized.")
    try:
        while True:
            message = conn.recv()
            if message and message[0] == "shutdown":
                return
    except (EOFError, OSError):
        return
