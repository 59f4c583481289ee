"""The failures the emulator can be told to have (``--emulate-fault``, DESIGN §7), and how each one looks.

Each fault reproduces what SGLang 0.5.23 prints and does in that situation (sglang-facts §1.4, §6, §7,
fixtures/hang-catalog.md), because the log reader and the hang diagnosis are built against those:

* ``hang-after-weights``: every rank logs ``Load weight end`` and then blocks in the first collective of
  ``init_memory_pool`` (the min-of-free-memory all-reduce), as in catalog row 1; py-spy shows
  ``all_reduce`` <- ``get_available_gpu_memory`` <- ``init_memory_pool`` <- ``ModelRunner.__init__``.
* ``rank-missing``: the last rank never finishes its weights (stuck reading a shard in ``_read_shard``);
  the others log ``Load weight end`` and wait for it in that same all-reduce.
* ``hang-in-graph-capture``: every rank blocks in ``capture_one_batch_size`` on the third decode batch
  size, mid-bar (catalog rows 5-6: a collective inside the captured forward never completes).
* ``oom-kv-cache``: the weights leave a negative KV budget; every rank raises SGLang's ``Not enough
  memory. Please try to increase --mem-fraction-static.``, logs ``Scheduler hit an exception`` and
  SIGQUITs the main process, which logs ``Received sigquit from a child process`` and kills the tree.
* ``address-in-use``: everything loads, then uvicorn cannot bind: ``[Errno 98] error while attempting
  to bind on address (...): address already in use``, and the server exits 1.
* ``crash-while-serving``: ready, then the last rank raises a CUDA error in the first client forward
  (or after ``CRASH_AFTER_READY_S`` scaled); the main process takes SGLang's running-phase SIGQUIT path.
* ``slow-weights``: weights load 5x slower but the bar keeps moving.
* ``scheduler-exception``: the last rank raises while loading a shard (a truncated safetensors header).
* ``node-never-joins`` (``--nnodes`` > 1): the last node never reaches node 0's rendezvous (its packets are
  dropped): its c10d client warns ``failed to connect ... Connection timed out`` and every rank of every
  node stays at ``Init parallel begin.`` (`sessions.emulator.nodes`).
* ``node-dies-loading`` (``--nnodes`` > 1): the last node dies (SIGKILL of its whole tree) while its ranks
  load weights; the other nodes' ranks fail in their next collective with NCCL's ``ncclRemoteError``.
"""

from __future__ import annotations

import os
from enum import Enum
from typing import NoReturn


class Fault(str, Enum):
    NONE = "none"
    HANG_AFTER_WEIGHTS = "hang-after-weights"
    RANK_MISSING = "rank-missing"
    HANG_IN_GRAPH_CAPTURE = "hang-in-graph-capture"
    OOM_KV_CACHE = "oom-kv-cache"
    ADDRESS_IN_USE = "address-in-use"
    CRASH_WHILE_SERVING = "crash-while-serving"
    SLOW_WEIGHTS = "slow-weights"
    SCHEDULER_EXCEPTION = "scheduler-exception"
    NODE_NEVER_JOINS = "node-never-joins"
    NODE_DIES_LOADING = "node-dies-loading"

    def __str__(self) -> str:
        return self.value


FAULT_IDS = tuple(f.value for f in Fault)

# Barriers (collectives) that the main process never completes for a given fault.
_NEVER_RELEASED = {
    Fault.HANG_AFTER_WEIGHTS: frozenset({"init_memory_pool"}),
    Fault.HANG_IN_GRAPH_CAPTURE: frozenset({"cuda_graph_capture:2"}),  # the third batch size
}
# The shard at which the failing rank of rank-missing / scheduler-exception stops (of n: about 60%).
FAILING_SHARD_FRACTION = 0.6


def never_released_barriers(fault: Fault) -> frozenset[str]:
    return _NEVER_RELEASED.get(fault, frozenset())


def failing_rank(fault: Fault, tp_size: int) -> int | None:
    """The one rank a single-rank fault hits: the last one (rank 0 at TP1)."""
    if fault in (Fault.RANK_MISSING, Fault.SCHEDULER_EXCEPTION, Fault.CRASH_WHILE_SERVING):
        return tp_size - 1
    return None


class OutOfMemoryError(RuntimeError):
    """Stands in for ``torch.OutOfMemoryError`` in tracebacks (same printed name)."""


OutOfMemoryError.__module__ = "torch"


class SafetensorError(Exception):
    """Stands in for ``safetensors_rust.SafetensorError`` (same printed name)."""


SafetensorError.__module__ = "safetensors_rust"

CUDA_ILLEGAL_ADDRESS = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def block_forever() -> NoReturn:
    """Block in a read that never returns (a stuck file read or a collective waiting for a dead peer).

    A pipe read keeps the thread in a plain syscall, so py-spy shows the Python caller on top, the way a
    rank stuck in NCCL or on a hung filesystem looks; signals still end the process.
    """
    read_fd, _write_fd = os.pipe()  # keep the write end open so the read never sees EOF
    while True:
        os.read(read_fd, 1)
