"""GPU memory of an emulated start: the per-rank plan, real allocations, and ``emulated_gpus.json``.

* `MemoryPlan` is what one rank's GPU holds after each step (CUDA context + NCCL, weights, KV pool, CUDA
  graphs), computed the way SGLang sizes the KV pool: ``rest = avail_after_weights -
  avail_before_weights * (1 - mem_fraction_static)`` (model_runner_kv_cache_mixin).  The log's "avail mem"
  numbers come from it.
* `GpuMemoryHolder` makes a rank really hold ``--emulate-gpu-memory-gb`` on GPU ``rank % device_count``
  when torch and CUDA are present, growing in the same proportions, so NVML shows a real start.  torch is
  imported only there, lazily, inside the rank.
* `EmulatedGpuBoard` (main process) publishes the plan's numbers for the GPU panel when no real memory is
  held: ``emulated_gpus.json`` in the working directory (the session dir), rewritten atomically about
  once a second, in the shape `sessions.gpus.EmulatedSource` reads.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.emulator.faults import Fault
from sessions.emulator.model_config import ModelConfig

GIB = 1 << 30
EMULATED_GPUS_FILE = "emulated_gpus.json"
EMULATED_GPU_NAME = "NVIDIA H200"
EMULATED_GPU_TOTAL_BYTES = 143771 * 1024 * 1024  # an H200 as NVML reports it
# A checkpoint that would not fit the emulated GPU (a config without its quantization, say) is shown as
# this share of the GPU instead: the emulator is about the lifecycle, not about capacity planning.
_MAX_WEIGHT_SHARE = 0.55
_KV_DTYPE_BYTES = {"fp8_e5m2": 1, "fp8_e4m3": 1, "mxfp8": 1, "nvfp4": 1, "fp4_mx_block16": 1}


def kv_dtype_name(kv_cache_dtype: str) -> str:
    """The torch dtype SGLang logs for the KV cache."""
    return {
        "fp8_e5m2": "torch.float8_e5m2",
        "fp8_e4m3": "torch.float8_e4m3fn",
        "mxfp8": "torch.float8_e4m3fn",
        "nvfp4": "torch.uint8",
        "fp4_mx_block16": "torch.uint8",
    }.get(kv_cache_dtype, "torch.bfloat16")


@dataclass(frozen=True)
class MemoryPlan:
    """One rank's GPU memory (GB = 2**30 bytes, as SGLang logs it) after each startup step."""

    total_gb: float
    baseline_gb: float  # after Init parallel: CUDA context, NCCL buffers
    weights_gb: float
    kv_budget_gb: float  # negative when the weights leave no room (oom-kv-cache)
    kv_tokens: int  # the profiled max_total_num_tokens (negative with a negative budget)
    kv_gb: float  # what the KV pool really takes (0 when the budget is negative)
    req_pool_gb: float
    prefill_graph_gb: float
    decode_graph_gb: float

    @property
    def avail_before_weights_gb(self) -> float:
        return self.total_gb - self.baseline_gb

    def used_gb(self, step: str, fraction: float = 1.0) -> float:
        """Used memory after ``step`` ("start", "dist", "weights", "kv", "prefill_graph", "decode_graph");
        ``fraction`` is the part of that step done so far."""
        order = ("start", "dist", "weights", "kv", "prefill_graph", "decode_graph")
        sizes = {
            "start": 0.0,
            "dist": self.baseline_gb,
            "weights": self.weights_gb,
            "kv": self.kv_gb + self.req_pool_gb,
            "prefill_graph": self.prefill_graph_gb,
            "decode_graph": self.decode_graph_gb,
        }
        used = 0.0
        for name in order:
            if name == step:
                return used + sizes[name] * fraction
            used += sizes[name]
        raise ValueError(step)

    def avail_gb(self, step: str, fraction: float = 1.0) -> float:
        return self.total_gb - self.used_gb(step, fraction)

    @property
    def final_used_gb(self) -> float:
        return self.used_gb("decode_graph")


def plan_memory(model: ModelConfig, args: dict[str, Any], fault: Fault, tp_rank: int) -> MemoryPlan:
    total = EMULATED_GPU_TOTAL_BYTES / GIB
    nccl = 0.6 if args["tp_size"] > 1 else 0.0
    baseline = 1.05 + 0.04 * (tp_rank % 4) + nccl
    # The KV budget uses the min free memory over the TP group (an all-reduce), so every rank gets the
    # same #tokens; the ranks' own "avail mem" lines still differ a little, as on real GPUs.
    avail_before = total - (1.05 + 0.04 * min(3, args["tp_size"] - 1) + nccl)
    weights = min(model.weight_bytes() / GIB / args["tp_size"], _MAX_WEIGHT_SHARE * total)
    weights = max(weights, 0.05)
    mfs = args["mem_fraction_static"]
    if fault is Fault.OOM_KV_CACHE:
        # Weights past the static budget: the profiled KV budget comes out about -4 GB.
        weights = min(avail_before * mfs + 4.0, avail_before - 1.0)
    rest = (avail_before - weights) - avail_before * (1 - mfs)  # model_runner_kv_cache_mixin
    req_pool = 0.05 if rest > 0.5 else 0.0
    kv_budget = rest - req_pool
    kv_dtype_bytes = _KV_DTYPE_BYTES.get(args["kv_cache_dtype"], 2)
    bytes_per_token = model.kv_bytes_per_token(args["tp_size"], kv_dtype_bytes)
    page = max(1, args["page_size"])
    tokens = int(kv_budget * GIB / bytes_per_token) // page * page
    if kv_budget > 0 and args["max_total_tokens"]:
        tokens = min(tokens, args["max_total_tokens"])
    kv_gb = tokens * bytes_per_token / GIB if tokens > 0 else 0.0
    prefill_graph = (
        0.0
        if args["cuda_graph_backend_prefill"] == "disabled"
        else (0.15 + 0.35 * len(args["cuda_graph_bs_prefill"]) / 58)
    )
    decode_graph = (
        0.0
        if args["cuda_graph_backend_decode"] == "disabled"
        else (0.3 + 1.4 * len(args["cuda_graph_bs_decode"]) / 52)
    )
    return MemoryPlan(
        total, baseline, weights, kv_budget, tokens, kv_gb, req_pool, prefill_graph, decode_graph
    )


class GpuMemoryHolder:
    """Real GPU memory held by one rank (torch, imported lazily); grows with the plan's proportions."""

    CHUNK_BYTES = 1 << 30

    def __init__(self, torch_module: Any, device_index: int, target_bytes: int) -> None:
        self._torch = torch_module
        self.device_index = device_index
        self.target_bytes = target_bytes
        self.held_bytes = 0
        self._tensors: list[Any] = []

    @classmethod
    def open(cls, target_gb: float, gpu_id: int) -> tuple[GpuMemoryHolder | None, str]:
        """A holder on GPU ``gpu_id % device_count``, or (None, why not).

        ``gpu_id`` is SGLang's ``base_gpu_id + tp_rank * gpu_id_step``: as in SGLang, it indexes the GPUs
        CUDA shows (after ``CUDA_VISIBLE_DEVICES``)."""
        try:
            import torch
        except Exception as exc:  # noqa: BLE001 - no torch (or a broken one): emulated numbers instead
            return None, f"torch is not importable ({type(exc).__name__}: {exc})"
        try:
            if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
                return None, "torch sees no CUDA device"
            index = gpu_id % torch.cuda.device_count()
            torch.cuda.set_device(index)
        except Exception as exc:  # noqa: BLE001
            return None, f"CUDA is not usable ({exc})"
        return cls(torch, index, int(target_gb * GIB)), f"holding {target_gb:g} GB on cuda:{index}"

    def grow_to(self, fraction: float) -> None:
        """Hold ``fraction`` of the target (never shrinks)."""
        want = int(self.target_bytes * min(max(fraction, 0.0), 1.0))
        while self.held_bytes < want:
            size = min(self.CHUNK_BYTES, want - self.held_bytes)
            self._tensors.append(
                self._torch.empty(size, dtype=self._torch.uint8, device=f"cuda:{self.device_index}")
            )
            self.held_bytes += size

    def release(self) -> None:
        self._tensors.clear()
        self.held_bytes = 0
        with contextlib.suppress(Exception):  # exiting anyway; the driver frees the rest
            self._torch.cuda.synchronize(self.device_index)
            self._torch.cuda.empty_cache()


@dataclass
class _RankOnBoard:
    pid: int | None = None
    gpu_index: int = 0
    used_bytes: int = 0
    utilization_percent: float = 0.0


class EmulatedGpuBoard:
    """Publishes per-GPU emulated memory for the ranks of this server (main process, a daemon thread)."""

    INTERVAL_S = 1.0

    def __init__(self, directory: Path, main_pid: int, gpu_count: int) -> None:
        self.path = Path(directory) / EMULATED_GPUS_FILE
        self.main_pid = main_pid
        self.gpu_count = gpu_count
        self._ranks: dict[int, _RankOnBoard] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._io_lock = threading.Lock()  # a write never lands after disable()/stop() removed the file
        self._enabled = True
        self._thread: threading.Thread | None = None

    def set_rank(self, rank: int, pid: int | None, gpu_index: int) -> None:
        with self._lock:
            entry = self._ranks.setdefault(rank, _RankOnBoard())
            entry.pid, entry.gpu_index = pid, gpu_index % self.gpu_count

    def update(self, rank: int, used_bytes: int, utilization_percent: float) -> None:
        with self._lock:
            entry = self._ranks.setdefault(rank, _RankOnBoard())
            entry.used_bytes, entry.utilization_percent = used_bytes, utilization_percent

    def disable(self) -> None:
        """Real GPU memory is held: NVML shows it, so stop publishing emulated numbers."""
        with self._io_lock:
            self._enabled = False
            self._remove()

    def start(self) -> None:
        self._write()
        self._thread = threading.Thread(target=self._run, name="emulated-gpus", daemon=True)
        self._thread.start()

    def stop(self, remove: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if remove:
            with self._io_lock:
                self._enabled = False
                self._remove()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            ranks = [(r, _RankOnBoard(**vars(e))) for r, e in sorted(self._ranks.items())]
        gpus = []
        for index in range(self.gpu_count):
            here = [e for _, e in ranks if e.gpu_index == index]
            gpus.append(
                {
                    "index": index,
                    "name": EMULATED_GPU_NAME,
                    "memory_total_bytes": EMULATED_GPU_TOTAL_BYTES,
                    "memory_used_bytes": sum(e.used_bytes for e in here),
                    "utilization_percent": max((e.utilization_percent for e in here), default=0.0),
                    "processes": [
                        {"pid": e.pid, "used_bytes": e.used_bytes}
                        for e in here
                        if e.pid is not None and e.used_bytes > 0
                    ],
                }
            )
        return {"updated_at": time.time(), "pid": self.main_pid, "gpus": gpus}

    def _run(self) -> None:
        # Wall clock on purpose: the GPU panel polls in real seconds whatever the time scale.
        while not self._stop.wait(self.INTERVAL_S):
            self._write()

    def _write(self) -> None:
        from sessions.home import atomic_write_json

        with self._io_lock:
            if not self._enabled:
                return
            try:
                atomic_write_json(self.path, self.snapshot())
            except OSError:
                pass  # an unwritable session dir must not take the server down

    def _remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
