"""The EAGLE/EAGLE3 draft model's start-up on one emulated rank (SGLang 0.5.23's `EAGLEWorker` init): its
weights on every rank, then its CUDA graphs on TP0, in 0.5.23's log lines.  Kept apart from ranks.py, whose
`ModelRunner` starts it after the target's own weights."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sessions.emulator import pacing
from sessions.emulator.speculative import (
    check_draft_model,
    draft_architecture,
    draft_weight_gb,
    read_draft_config,
)


class DraftWorker:
    """The EAGLE/EAGLE3 draft model's start-up on one rank: its weights (every rank), then its CUDA graphs
    (TP0 logs them: ``log_info_on_rank0``), in SGLang 0.5.23's lines (sessions/emulator/speculative.py)."""

    def __init__(self, runner: Any) -> None:  # ranks.ModelRunner (ranks imports this module: typed loosely)
        self.runner = runner
        self.args = runner.args

    def initialize(self) -> None:
        runner = self.runner
        path = self.args["speculative_draft_model_path"]
        begin = time.monotonic()
        avail = runner.plan.avail_gb("decode_graph")
        runner.console.log(f"Load weight begin. avail mem={avail:.2f} GB")
        if path is None:
            # EAGLE3 on a target without MTP and no draft path: the draft's config load gets None (as read).
            raise TypeError("expected str, bytes or os.PathLike object, not NoneType")
        config = read_draft_config(path)
        check_draft_model(config, self.args["speculative_algorithm"])
        runner.draft_config = config
        size_gb = draft_weight_gb(config, Path(path).expanduser())
        runner.pacing.sleep(max(pacing.WEIGHT_LOAD_MIN_S / 4, size_gb / pacing.WEIGHT_LOAD_GB_PER_S))
        elapsed = time.monotonic() - begin
        runner.timings["load_weight"] = runner.timings.get("load_weight", 0.0) + elapsed
        runner.console.log(
            f"Load weight end. elapsed={elapsed:.2f} s, type={draft_architecture(config)}, "
            f"avail mem={avail - size_gb:.2f} GB, mem usage={size_gb:.2f} GB."
        )
        if runner.tp_rank == 0 and self.args["cuda_graph_backend_decode"] != "disabled":
            self.capture_graphs(avail - size_gb)

    def capture_graphs(self, avail_gb: float) -> None:
        runner, args = self.runner, self.args
        backend = args["decode_attention_backend"]
        sizes = list(args["cuda_graph_bs_decode"])
        phases = []
        if args["speculative_num_steps"] > 1:
            phases.append(("decode", args["speculative_eagle_topk"]))
        phases.append(("extend", args["speculative_num_draft_tokens"]))
        for phase, per_req in phases:
            begin = time.monotonic()
            runner.console.log(
                f"Capture draft {phase} CUDA graph begin. backend={backend}, num_tokens_per_req={per_req}, "
                f"bs={sizes}, avail mem={avail_gb:.2f} GB"
            )
            runner.pacing.sleep(pacing.DECODE_GRAPH_S / 4)
            used = 0.05 * len(sizes) / 52
            avail_gb -= used
            elapsed = time.monotonic() - begin
            runner.cuda_graph_timings[f"draft_{phase}"] = elapsed
            runner.console.log(
                f"Capture draft {phase} CUDA graph end. elapsed={elapsed:.2f} s, mem usage={used:.2f} GB, "
                f"avail mem={avail_gb:.2f} GB."
            )
