"""The emulator's command line: SGLang 0.5.23's ``launch_server`` flags (a realistic subset) plus our own.

Parsing follows SGLang (sglang-facts §3.1): ``argparse`` with ``allow_abbrev=True``, so ``--tp 8`` works
as an unambiguous prefix of ``--tp-size`` while ``--cuda-graph-max-bs`` fails as ambiguous
(``--cuda-graph-max-bs-decode`` / ``--cuda-graph-max-bs-prefill``); unknown flags exit 2 with argparse's
message.  `resolve_server_args` then fills the ``None`` defaults the way SGLang's resolution hooks do on
an H200 and checks the capture-only flags (sglang-facts §4.1); its errors are raised as exceptions, which
SGLang prints as a traceback before exiting 1.

Our own flags: ``--time-scale``, ``--emulate-fault``, ``--emulate-gpu-memory-gb``, ``--emulate-gpus``, the
serving cost model's ``--emulate-decode-tokens-per-s``, ``--emulate-prefill-tokens-per-s`` and
``--emulate-batch-cost`` (`cost_model`), and the speculative-decoding model's
``--emulate-spec-accept-length``, ``--emulate-spec-draft-cost``, ``--emulate-spec-verify-cost``.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sessions.emulator.cost_model import (
    DEFAULT_BATCH_COST_PER_REQ,
    DEFAULT_DECODE_TOKENS_PER_S,
    DEFAULT_PREFILL_TOKENS_PER_S,
    DecodeCostModel,
)
from sessions.emulator.faults import FAULT_IDS, Fault
from sessions.emulator.model_config import ModelConfig
from sessions.emulator.nodes import check_node_args
from sessions.emulator.speculative import resolve_speculative

SGLANG_VERSION = "0.5.23"

# sglang/srt/arg_groups/choices.py:69-99 (0.5.23)
ATTENTION_BACKEND_CHOICES = (
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "qsa",
    "dsv4",
    "compressed",
    "fa3",
    "fa4",
    "flashinfer",
    "llada2_cfg_flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "hpc_ops",
    "minicpm_flashattn",
    "minicpm_flashinfer",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
)
KV_CACHE_DTYPE_CHOICES = (
    "auto",
    "fp8_e5m2",
    "fp8_e4m3",
    "mxfp8",
    "bf16",
    "bfloat16",
    "nvfp4",
    "fp4_mx_block16",
)
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
AUX_CAPTURE_ALGORITHMS = ("EAGLE3", "DFLASH", "DSPARK")
MOE_A2A_BACKENDS = (
    "none",
    "deepep",
    "mooncake",
    "nixl",
    "mori",
    "ascend_fuseep",
    "flashinfer",
    "megamoe",
    "deepep_v2",
    "ascend_tp",
    "pplx",
    "flashinfer_megamoe",
)
CUDA_GRAPH_BACKENDS = ("full", "breakable", "disabled")
# Default decode capture sizes (the 52-entry list SGLang logs for max bs 512, fixture 23) and the
# prefill num_tokens buckets (fixture 27).
DEFAULT_DECODE_BS = (1, 2, 4, 8, 12, 16, *range(24, 257, 8), *range(272, 513, 16))
DEFAULT_PREFILL_NUM_TOKENS = (
    4,
    8,
    12,
    16,
    20,
    24,
    28,
    32,
    48,
    64,
    80,
    96,
    112,
    128,
    144,
    160,
    176,
    192,
    208,
    224,
    240,
    256,
    288,
    320,
    352,
    384,
    416,
    448,
    480,
    512,
    576,
    640,
    704,
    768,
    832,
    896,
    960,
    1024,
    1280,
    1536,
    1792,
    2048,
    2304,
    2560,
    2816,
    3072,
    3328,
    3584,
    3840,
    4096,
    4608,
    5120,
    5632,
    6144,
    6656,
    7168,
    7680,
    8192,
)
# An H200 as the emulator pretends to have (143771 MiB, as NVML reports it).
EMULATED_GPU_TOTAL_GB = 143771 / 1024


def si_int(text: str) -> int:
    """SGLang's int with SI/IEC suffixes: ``128k`` = 128000, ``128Ki`` = 131072, ``1M``, ``1Mi``, ``2G``."""
    match = re.fullmatch(r"\s*(-?\d+)\s*([kKMG]i?)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")
    number, suffix = int(match.group(1)), match.group(2)
    if not suffix:
        return number
    base = 1024 if suffix.endswith("i") else 1000
    power = "KMG".index(suffix[0].upper()) + 1
    return number * base**power


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if value < 0 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


# (flag names, add_argument keywords); a bool default False becomes store_true.  Order = server_args order.
# --load-balance-method's choices (arg_groups/fields/parallel.py:91-103)
LOAD_BALANCE_METHODS = ("auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens")

_SGLANG_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (
        ("--model-path", "--model"),
        {"type": str, "required": True, "help": "The model dir (must hold config.json)."},
    ),
    (("--tokenizer-path",), {"type": str, "default": None}),
    (("--tokenizer-mode",), {"type": str, "default": "auto"}),
    (("--tokenizer-worker-num",), {"type": int, "default": 1}),
    (("--skip-tokenizer-init",), {"default": False}),
    (("--load-format",), {"type": str, "default": "auto"}),
    (("--model-loader-extra-config",), {"type": str, "default": "{}"}),
    (("--trust-remote-code",), {"default": False}),
    (("--context-length",), {"type": si_int, "default": None}),
    (("--is-embedding",), {"default": False}),
    (("--revision",), {"type": str, "default": None}),
    (("--model-impl",), {"type": str, "default": "auto"}),
    (("--host",), {"type": str, "default": "127.0.0.1"}),
    (("--port",), {"type": int, "default": 30000}),
    (("--skip-server-warmup",), {"default": False}),
    (("--nccl-port",), {"type": int, "default": None}),
    (
        ("--dtype",),
        {
            "type": str,
            "default": "auto",
            "choices": ("auto", "half", "float16", "bfloat16", "float", "float32"),
        },
    ),
    (("--quantization",), {"type": str, "default": None}),
    (("--kv-cache-dtype",), {"type": str, "default": "auto", "choices": KV_CACHE_DTYPE_CHOICES}),
    (("--mem-fraction-static",), {"type": float, "default": None}),
    (("--max-running-requests",), {"type": int, "default": None}),
    (("--max-queued-requests",), {"type": int, "default": None}),
    (("--max-total-tokens",), {"type": si_int, "default": None}),
    (("--chunked-prefill-size",), {"type": int, "default": None}),
    (("--max-prefill-tokens",), {"type": int, "default": 16384}),
    (("--schedule-policy",), {"type": str, "default": "fcfs"}),
    (("--schedule-conservativeness",), {"type": float, "default": 1.0}),
    (("--page-size",), {"type": int, "default": 1}),
    (("--device",), {"type": str, "default": "cuda"}),
    (("--tp-size", "--tensor-parallel-size"), {"type": int, "default": 1}),
    (("--pp-size", "--pipeline-parallel-size"), {"type": int, "default": 1}),
    (("--dp-size", "--data-parallel-size"), {"type": int, "default": 1}),
    (("--attn-dp-size", "--attention-data-parallel-size"), {"type": int, "default": 1}),
    (("--enable-dp-attention",), {"default": False, "help": "Deprecated: use --attn-dp-size <dp-size>."}),
    # arg_groups/fields/parallel.py:91-103; "auto" resolves to round_robin outside PD disaggregation
    (("--load-balance-method",), {"type": str, "default": "auto", "choices": LOAD_BALANCE_METHODS}),
    (("--ep-size", "--expert-parallel-size", "--ep"), {"type": int, "default": 1}),
    (("--nnodes",), {"type": int, "default": 1}),
    (("--node-rank",), {"type": int, "default": 0}),
    (("--dist-init-addr", "--nccl-init-addr"), {"type": str, "default": None}),
    (("--dist-timeout",), {"type": int, "default": None}),
    (("--gated-launch-port",), {"type": int, "default": None}),
    (("--base-gpu-id",), {"type": int, "default": 0}),
    (("--gpu-id-step",), {"type": int, "default": 1}),
    (("--stream-interval",), {"type": int, "default": 1}),
    (("--random-seed",), {"type": int, "default": None}),
    (("--watchdog-timeout",), {"type": float, "default": 300.0}),
    (("--soft-watchdog-timeout",), {"type": float, "default": None}),
    (("--download-dir",), {"type": str, "default": None}),
    (("--log-level",), {"type": str, "default": "info"}),
    (("--log-level-http",), {"type": str, "default": None}),
    (("--log-requests",), {"default": False}),
    (("--log-requests-level",), {"type": int, "default": 2, "choices": (0, 1, 2, 3)}),
    (("--crash-dump-folder",), {"type": str, "default": None}),
    (("--show-time-cost",), {"default": False}),
    (("--enable-metrics",), {"default": False}),
    (("--decode-log-interval",), {"type": int, "default": 40}),
    (("--api-key",), {"type": str, "default": None}),
    (("--admin-api-key",), {"type": str, "default": None}),  # SGLang 0.5.23: admin-only endpoints' key
    (("--served-model-name",), {"type": str, "default": None}),
    (("--chat-template",), {"type": str, "default": None}),
    (("--reasoning-parser",), {"type": str, "default": None}),
    (("--tool-call-parser",), {"type": str, "default": None}),
    (("--json-model-override-args",), {"type": str, "default": "{}"}),
    (("--enable-cache-report",), {"default": False}),
    (("--incremental-streaming-output",), {"default": False}),
    (("--attention-backend",), {"type": str, "default": None, "choices": ATTENTION_BACKEND_CHOICES}),
    (("--prefill-attention-backend",), {"type": str, "default": None, "choices": ATTENTION_BACKEND_CHOICES}),
    (("--decode-attention-backend",), {"type": str, "default": None, "choices": ATTENTION_BACKEND_CHOICES}),
    (("--sampling-backend",), {"type": str, "default": None}),
    (
        ("--disable-cuda-graph",),
        {"default": False, "help": "Deprecated: disables decode and prefill graphs."},
    ),
    (("--disable-decode-cuda-graph",), {"default": False}),
    (("--disable-prefill-cuda-graph",), {"default": False}),
    (("--cuda-graph-backend-decode",), {"type": str, "default": None, "choices": CUDA_GRAPH_BACKENDS}),
    (("--cuda-graph-backend-prefill",), {"type": str, "default": None, "choices": CUDA_GRAPH_BACKENDS}),
    (("--cuda-graph-max-bs-decode",), {"type": int, "default": None}),
    (("--cuda-graph-max-bs-prefill",), {"type": int, "default": None}),
    (("--cuda-graph-bs-decode",), {"type": int, "nargs": "+", "default": None}),
    (("--cuda-graph-bs-prefill",), {"type": int, "nargs": "+", "default": None}),
    (("--enable-torch-compile",), {"default": False}),
    (("--torch-compile-max-bs",), {"type": int, "default": 32}),
    (("--disable-custom-all-reduce",), {"default": False}),
    (("--enable-symm-mem",), {"default": False}),
    (("--pre-warm-nccl",), {"default": False}),
    (("--enable-p2p-check",), {"default": False}),
    (("--disable-overlap-schedule",), {"default": False}),
    (("--enable-mixed-chunk",), {"default": False}),
    (("--enable-two-batch-overlap",), {"default": False}),
    (("--enable-dp-lm-head",), {"default": False}),
    (("--moe-a2a-backend",), {"type": str, "default": "none", "choices": MOE_A2A_BACKENDS}),
    (("--moe-runner-backend",), {"type": str, "default": "auto"}),
    (("--moe-dense-tp-size",), {"type": int, "default": None}),
    (("--enable-eplb",), {"default": False}),
    (("--ep-num-redundant-experts",), {"type": int, "default": 0}),
    (("--disable-shared-experts-fusion",), {"default": False}),
    (("--disable-radix-cache",), {"default": False}),
    (("--enable-return-hidden-states",), {"default": False}),
    (("--return-hidden-states-mode",), {"type": str, "default": None, "choices": ("last", "full")}),
    (("--enable-return-aux-hidden-states",), {"default": False}),
    (("--return-aux-hidden-state-layer-ids",), {"type": int, "nargs": "+", "default": None}),
    (("--forward-hooks",), {"type": str, "default": None}),
    # A free string in SGLang (upper-cased, then looked up: sessions/emulator/speculative.py).
    (("--speculative-algorithm",), {"type": str, "default": None}),
    (("--speculative-draft-model-path", "--speculative-draft-model"), {"type": str, "default": None}),
    (("--speculative-draft-model-revision",), {"type": str, "default": None}),
    (("--speculative-num-steps",), {"type": int, "default": None}),
    (("--speculative-eagle-topk",), {"type": int, "default": None}),
    (("--speculative-num-draft-tokens",), {"type": int, "default": None}),
    (("--sleep-on-idle",), {"default": False}),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang serve",
        allow_abbrev=True,  # as SGLang (server_args.py:679): prefixes work, ambiguous ones fail
        description=(
            f"eagle3-tui's stand-in for SGLang {SGLANG_VERSION} (python -m sessions.emulator): takes the "
            "sglang.launch_server flags, prints SGLang's startup log, spawns sglang::scheduler_TP<n> ranks "
            "and serves SGLang's HTTP endpoints without a GPU."
        ),
    )
    for names, kwargs in _SGLANG_FLAGS:
        kwargs = dict(kwargs)
        if kwargs.get("default") is False and "type" not in kwargs:
            kwargs["action"] = "store_true"
        parser.add_argument(*names, **kwargs)
    emulator = parser.add_argument_group("emulator (not SGLang flags)")
    emulator.add_argument(
        "--time-scale",
        type=_non_negative_float,
        default=0.05,
        help="Multiply every startup duration of a Kimi-K2.5 TP8 start by this (default 0.05).",
    )
    emulator.add_argument(
        "--emulate-fault",
        choices=FAULT_IDS,
        default=Fault.NONE.value,
        help="Fail the way SGLang does: " + ", ".join(FAULT_IDS) + ".",
    )
    emulator.add_argument(
        "--emulate-gpu-memory-gb",
        type=_positive_float,
        default=None,
        help="Each rank holds this much real GPU memory when torch and CUDA are present.",
    )
    emulator.add_argument(
        "--emulate-spec-accept-length",
        type=_positive_float,
        default=None,
        help="Mean accepted tokens per verify step, the bonus token included (1 to num-draft-tokens).",
    )
    emulator.add_argument(
        "--emulate-spec-draft-cost",
        type=_positive_float,
        default=None,
        help="One draft forward's cost as a fraction of a decode step (default: from the draft's config).",
    )
    emulator.add_argument(
        "--emulate-spec-verify-cost",
        type=_positive_float,
        default=None,
        help="A verify step's cost in decode steps (>= 1; default 1.1).",
    )
    emulator.add_argument(
        "--emulate-thinking",
        action="store_true",
        help="The model-free backend answers like a thinking model (Qwen3's shape): <think>, a thought, "
        "</think>, then the answer, unless the prompt closed the think block (enable_thinking=false). "
        "Serve it with --reasoning-parser to get reasoning_content.",
    )
    emulator.add_argument(
        "--emulate-gpus",
        type=_positive_int,
        default=None,
        help="Emulated GPUs to publish in emulated_gpus.json (default max(8, tp)).",
    )
    emulator.add_argument(
        "--emulate-decode-tokens-per-s",
        type=_positive_float,
        default=DEFAULT_DECODE_TOKENS_PER_S,
        help="Single-stream decode rate: a decode step at batch 1 lasts 1/this seconds "
        f"(default {DEFAULT_DECODE_TOKENS_PER_S:g}; not time-scaled).",
    )
    emulator.add_argument(
        "--emulate-prefill-tokens-per-s",
        type=_positive_float,
        default=DEFAULT_PREFILL_TOKENS_PER_S,
        help=f"Prefill rate over new prompt tokens (default {DEFAULT_PREFILL_TOKENS_PER_S:g}).",
    )
    emulator.add_argument(
        "--emulate-batch-cost",
        type=_non_negative_float,
        default=DEFAULT_BATCH_COST_PER_REQ,
        help="Each extra request in a decode batch adds this fraction of a batch-1 step "
        f"(default {DEFAULT_BATCH_COST_PER_REQ:g}).",
    )
    return parser


@dataclass(frozen=True)
class EmulatorOptions:
    time_scale: float
    fault: Fault
    gpu_memory_gb: float | None
    gpus: int
    cost: DecodeCostModel = field(default_factory=DecodeCostModel)
    # Speculative decoding's modelled figures (`[emulator] spec_*`); None = the emulator's defaults.
    spec_accept_length: float | None = None
    spec_draft_cost: float | None = None
    spec_verify_cost: float | None = None
    thinking: bool = False  # --emulate-thinking: the model-free backend answers <think>...</think> first


DEFAULT_SPEC_VERIFY_COST = 1.1  # a verify forward (num-draft-tokens positions) vs a one-token decode step
_EMULATOR_DESTS = (
    "time_scale",
    "emulate_fault",
    "emulate_gpu_memory_gb",
    "emulate_gpus",
    "emulate_decode_tokens_per_s",
    "emulate_prefill_tokens_per_s",
    "emulate_batch_cost",
    "emulate_spec_accept_length",
    "emulate_spec_draft_cost",
    "emulate_spec_verify_cost",
    "emulate_thinking",
)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, EmulatorOptions]:
    """Parse like SGLang; bad flags exit 2 with argparse's message."""
    ns = build_parser().parse_args(argv)
    options = EmulatorOptions(
        time_scale=ns.time_scale,
        fault=Fault(ns.emulate_fault),
        gpu_memory_gb=ns.emulate_gpu_memory_gb,
        gpus=ns.emulate_gpus or max(8, ns.tp_size * dp_replicas(ns)),
        cost=DecodeCostModel(
            decode_tokens_per_s=ns.emulate_decode_tokens_per_s,
            prefill_tokens_per_s=ns.emulate_prefill_tokens_per_s,
            batch_cost_per_req=ns.emulate_batch_cost,
        ),
        spec_accept_length=ns.emulate_spec_accept_length,
        spec_draft_cost=ns.emulate_spec_draft_cost,
        spec_verify_cost=ns.emulate_spec_verify_cost,
        thinking=ns.emulate_thinking,
    )
    if options.spec_verify_cost is not None and options.spec_verify_cost < 1:
        build_parser().error(f"--emulate-spec-verify-cost must be >= 1 (a verify step is at least a decode "
                             f"step), not {options.spec_verify_cost}")
    if options.spec_draft_cost is not None and options.spec_draft_cost > 1:
        build_parser().error(f"--emulate-spec-draft-cost must be at most 1 (a fraction of a decode step), "
                             f"not {options.spec_draft_cost}")
    # the last GPU this node's ranks use: a multi-node server puts tp/nnodes ranks on each node
    last_gpu = gpu_id(vars(ns), ns.tp_size // max(1, ns.nnodes) - 1, dp_replicas(ns) - 1)
    if ns.base_gpu_id < 0 or last_gpu >= options.gpus:
        # SGLang's scheduler dies at torch.cuda.set_device ("invalid device ordinal"); the emulator says so
        # up front instead of wrapping onto GPUs another replica holds.
        dp_text = f" --dp-size {ns.dp_size}" if dp_replicas(ns) > 1 else ""
        build_parser().error(f"--base-gpu-id {ns.base_gpu_id} with --tp-size {ns.tp_size}{dp_text} would use GPU "
                             f"{last_gpu}, but there are {options.gpus} GPUs (0..{options.gpus - 1}; --emulate-gpus)")
    for dest in _EMULATOR_DESTS:
        delattr(ns, dest)
    return ns, options


def log_level_number(name: str | None) -> int:
    """``getattr(logging, level.upper())`` as SGLang does; a bad name raises ValueError."""
    if name is None:
        return logging.INFO
    level = logging.getLevelNamesMapping().get(str(name).upper())
    if level is None:
        raise ValueError(
            f"--log-level {name!r} is not a logging level (debug, info, warning, error, critical)"
        )
    return level


def deprecation_warnings(ns: argparse.Namespace) -> list[str]:
    """SGLang's yellow deprecation notes (argparse_actions.py:28-29 wraps them in ANSI 1;33)."""
    notes = []
    if ns.disable_cuda_graph:
        notes.append(
            "--disable-cuda-graph is deprecated; it disables both decode and prefill CUDA graphs. "
            "Use --disable-decode-cuda-graph / --disable-prefill-cuda-graph instead."
        )
    if ns.enable_dp_attention:
        notes.append("--enable-dp-attention is deprecated. Please use --attn-dp-size <dp-size> instead.")
    return [f"\033[1;33m{note}\033[0m" for note in notes]


def resolve_server_args(
    ns: argparse.Namespace,
    model: ModelConfig,
    rng: Callable[[int, int], int] | None = None,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The resolved ``server_args`` record (SGLang's field names, in flag order), or ValueError.

    ``warn`` receives the warnings SGLang's resolution logs (speculative decoding's adjustments)."""
    randint = rng or random.randint
    # One entry per SGLang flag, each of that flag's own type: the record is heterogeneous by design.
    args: dict[str, Any] = {names[0].lstrip("-").replace("-", "_"): None for names, _ in _SGLANG_FLAGS}
    args.update(vars(ns))
    if args["enable_dp_attention"] and args["attn_dp_size"] == 1:
        args["attn_dp_size"] = args["dp_size"]
    _check_parallel(args)
    if args["load_balance_method"] == "auto":  # serving_hook.py handle_load_balance_method, non-PD
        args["load_balance_method"] = "round_robin"
    log_level_number(args["log_level"])
    if args["log_level_http"] is not None:
        log_level_number(args["log_level_http"])
    args["tokenizer_path"] = args["tokenizer_path"] or args["model_path"]
    args["served_model_name"] = args["served_model_name"] or args["model_path"]
    if args["random_seed"] is None:
        args["random_seed"] = randint(0, 1 << 30)
    if args["nccl_port"] is None:
        args["nccl_port"] = randint(10000, 29999)  # SGLang: a random port below the ephemeral range
    # Attention backends: auto -> fa3 on Hopper for MLA and MHA alike (model_override_base.py:277-346).
    args["attention_backend"] = args["attention_backend"] or "fa3"
    args["prefill_attention_backend"] = args["prefill_attention_backend"] or args["attention_backend"]
    args["decode_attention_backend"] = args["decode_attention_backend"] or args["attention_backend"]
    # CUDA graphs, per phase (cuda_graph_hook.py): the deprecated flag turns both off.
    if args["disable_cuda_graph"]:
        args["disable_decode_cuda_graph"] = args["disable_prefill_cuda_graph"] = True
    if args["disable_decode_cuda_graph"]:
        args["cuda_graph_backend_decode"] = "disabled"
    if args["disable_prefill_cuda_graph"]:
        args["cuda_graph_backend_prefill"] = "disabled"
    args["cuda_graph_backend_decode"] = args["cuda_graph_backend_decode"] or "full"
    args["cuda_graph_backend_prefill"] = args["cuda_graph_backend_prefill"] or "breakable"
    if args["chunked_prefill_size"] is None:
        args["chunked_prefill_size"] = 8192  # H100/H200-class default (memory_hook.py:146-168)
    if args["cuda_graph_max_bs_decode"] is None:
        args["cuda_graph_max_bs_decode"] = 512 if args["tp_size"] >= 4 else 256  # memory_hook.py:146-157
    if args["cuda_graph_bs_decode"] is None:
        args["cuda_graph_bs_decode"] = [
            bs for bs in DEFAULT_DECODE_BS if bs <= args["cuda_graph_max_bs_decode"]
        ]
    if args["cuda_graph_max_bs_prefill"] is None:
        chunk = args["chunked_prefill_size"]
        args["cuda_graph_max_bs_prefill"] = chunk if chunk and chunk > 0 else 8192
    if args["cuda_graph_bs_prefill"] is None:
        args["cuda_graph_bs_prefill"] = [
            n for n in DEFAULT_PREFILL_NUM_TOKENS if n <= args["cuda_graph_max_bs_prefill"]
        ]
    if args["mem_fraction_static"] is None:
        # memory_hook.py:47-68 reserves room for activations (chunk size) and graph buffers (max bs).
        reserved_gb = (
            2.0
            + 6.0 * args["cuda_graph_max_bs_decode"] / 512
            + 4.0 * max(args["chunked_prefill_size"], 0) / 8192
        )
        args["mem_fraction_static"] = round(1 - reserved_gb / EMULATED_GPU_TOTAL_GB, 3)
    if not 0 < args["mem_fraction_static"] < 1:
        raise ValueError(f"--mem-fraction-static must be in (0, 1), not {args['mem_fraction_static']}")
    if args["enable_return_hidden_states"] and args["return_hidden_states_mode"] is None:
        args["return_hidden_states_mode"] = "full"
    _resolve_aux_capture(args, model)  # before speculative decoding, as SGLang's pipeline orders them
    resolve_speculative(args, model.architecture, warn or (lambda _message: None))
    if args["return_hidden_states_mode"] is not None:
        args["enable_return_hidden_states"] = True
    return args


def _check_parallel(args: dict[str, Any]) -> None:
    tp = args["tp_size"]
    if tp < 1:
        raise ValueError(f"--tp-size must be >= 1, not {tp}")
    for key in ("ep_size", "attn_dp_size", "dp_size", "pp_size"):
        if args[key] < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be >= 1, not {args[key]}")
    check_node_args(args)  # SGLang's node checks come first: they are what a user meets on a real server
    if tp % args["ep_size"]:
        raise ValueError(f"tp_size={tp} must be divisible by ep_size={args['ep_size']}")
    if tp % args["attn_dp_size"]:
        raise ValueError(f"tp_size={tp} must be divisible by attn_dp_size={args['attn_dp_size']}")
    if args["dp_size"] > 1 and args["attn_dp_size"] > 1 and not args["enable_dp_attention"]:
        # parallel_hook.py:287-292
        raise ValueError(
            f"--dp-size {args['dp_size']} with --attn-dp-size {args['attn_dp_size']}: data-parallel replicas "
            "combined with attention data parallelism are not supported."
        )
    if args["dp_size"] > 1 and args["nnodes"] != 1:
        # validation_hook.py:199-202
        raise ValueError(
            "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes"
        )
    if args["pp_size"] != 1:
        raise ValueError("the emulator runs without pipeline parallelism (--pp-size 1)")


def _resolve_aux_capture(args: dict[str, Any], model: ModelConfig) -> None:
    """The capture-only mode checks (validation_hook.py:694-754) and what resolution sets."""
    ids = args["return_aux_hidden_state_layer_ids"]
    args["aux_hidden_state_capture"] = None
    if not args["enable_return_aux_hidden_states"]:
        if ids is not None:
            raise ValueError("--return-aux-hidden-state-layer-ids requires --enable-return-aux-hidden-states")
        return
    algorithm = (args["speculative_algorithm"] or "EAGLE3").upper()
    if algorithm not in AUX_CAPTURE_ALGORITHMS:
        raise ValueError(
            "--enable-return-aux-hidden-states supports --speculative-algorithm "
            f"{'/'.join(AUX_CAPTURE_ALGORITHMS)}, "
            f"not {algorithm}"
        )
    if args["speculative_draft_model_path"]:
        raise ValueError(
            "--enable-return-aux-hidden-states is capture-only: do not pass --speculative-draft-model-path"
        )
    if algorithm in ("DFLASH", "DSPARK") and not ids:
        raise ValueError(
            f"--speculative-algorithm {algorithm} with aux capture needs --return-aux-hidden-state-layer-ids"
        )
    if ids is not None:
        if not ids:
            raise ValueError("--return-aux-hidden-state-layer-ids is empty")
        if any(i < 0 for i in ids):
            raise ValueError(f"--return-aux-hidden-state-layer-ids must not be negative: {ids}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"--return-aux-hidden-state-layer-ids has duplicates: {ids}")
    # The algorithm only names the convention: no draft or spec stack runs (sglang-facts §4.1).
    args["aux_hidden_state_capture"] = algorithm.lower()
    args["speculative_algorithm"] = None
    if args["return_hidden_states_mode"] is None:
        args["return_hidden_states_mode"] = "full"


def context_len(args: dict[str, Any], model: ModelConfig) -> int:
    return args["context_length"] or model.context_len


def dp_replicas(ns: argparse.Namespace | dict[str, Any]) -> int:
    """How many TP groups the server runs: ``--dp-size`` replicas under a DP controller (plain DP), else 1
    (attention DP splits one TP group's GPUs, it adds none)."""
    values = vars(ns) if isinstance(ns, argparse.Namespace) else ns
    if values["enable_dp_attention"] or values["attn_dp_size"] > 1:
        return 1
    return max(1, int(values["dp_size"]))


def rank_suffixes(args: dict[str, Any], tp_rank: int, dp_rank: int | None = None) -> list[str]:
    """The rank parts of a scheduler's title and log prefix (scheduler.py:6257-6300): DP, TP, EP.

    ``dp_rank`` is the replica of a plain-DP server (the DP controller's ``DPn``, with ``TPm`` local to
    the replica); under attention DP the DP rank is derived from the TP rank instead."""
    tp_size, attn_dp = args["tp_size"], args["attn_dp_size"]
    parts = []
    if dp_rank is not None:
        parts.append(f"DP{dp_rank}")
    elif attn_dp > 1:
        parts.append(f"DP{tp_rank // (tp_size // attn_dp)}")
    if tp_size > 1:
        parts.append(f"TP{tp_rank}")
    if args["ep_size"] > 1:
        parts.append(f"EP{tp_rank // (tp_size // args['ep_size'])}")
    return parts


def scheduler_title(args: dict[str, Any], tp_rank: int, dp_rank: int | None = None) -> str:
    """``sglang::scheduler_TP3`` (``sglang::scheduler`` at TP1, ``..._TP0_EP0`` with EP, ``_DP1_TP0``)."""
    suffix = "".join(f"_{part}" for part in rank_suffixes(args, tp_rank, dp_rank))
    return f"sglang::scheduler{suffix}"


def log_prefix(args: dict[str, Any], tp_rank: int, dp_rank: int | None = None) -> str:
    return "".join(f" {part}" for part in rank_suffixes(args, tp_rank, dp_rank))


def gpu_id(args: dict[str, Any], tp_rank: int, dp_rank: int = 0) -> int:
    """engine.py:931-940: base_gpu_id + (tp_rank % tp_per_node) * gpu_id_step, where a multi-node server puts
    tp_size / nnodes ranks on each node (pp = 1); replica ``dp_rank`` of a plain-DP server (one node) starts
    ``dp_rank * tp_size * pp_size * gpu_id_step`` further (data_parallel_controller.py:420-467)."""
    tp_per_node = max(1, args["tp_size"] // max(1, args.get("nnodes") or 1))
    replica_offset = dp_rank * args["tp_size"] * args["pp_size"] * args["gpu_id_step"]
    return args["base_gpu_id"] + replica_offset + (tp_rank % tp_per_node) * args["gpu_id_step"]
