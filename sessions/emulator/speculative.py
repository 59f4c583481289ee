"""EAGLE/EAGLE3 speculative decoding at start-up, as SGLang 0.5.23 resolves, checks and logs it.

Resolution (main process, before ``server_args=``; ``speculative_hook.py``): the algorithm is upper-cased
(an unknown name is ``Unknown speculative algorithm name: X``); a draft path is read right away (its
``config.json``, the way transformers' ``AutoConfig`` does), so a missing or unreadable draft dir fails
here with transformers' messages; DeepSeek-style targets use their own checkpoint as the MTP draft;
``--max-running-requests`` becomes 48; ``(steps, topk, draft tokens)`` are auto-chosen from the target's
architecture when ``--speculative-num-steps`` is not given (Llama (5, 4, 8), everything else (3, 1, 4)),
and giving topk or draft tokens without steps is a bare ``AssertionError``; topk 1 forces draft tokens to
steps + 1 (with SGLang's warning); ``trtllm_mha`` refuses topk > 1; topk > 1 with page size > 1 needs
flashinfer, fa3 or triton.  As read in the source (not run): steps without topk leaves topk None, and the
first ``topk > 1`` comparison raises a TypeError.

Capture-only mode (``--enable-return-aux-hidden-states``) resets the algorithm to None before this runs
(`args._resolve_aux_capture`), so none of it applies there.

Start-up (every scheduler rank, after the target's graphs): the draft model's ``Load weight begin`` /
``Load weight end. ... type=LlamaForCausalLMEagle3`` pair (a ``LlamaForCausalLM`` config is loaded as
``LlamaForCausalLMEagle3``; a draft with more than one decoder layer fails there with
``EAGLE3 currently only supports 1 layer``, as ``llama_eagle3.py`` raises it), then on TP0 only the draft
decode graph (when steps > 1) and the draft extend graph.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

EAGLE_FAMILY = ("EAGLE", "EAGLE3")
# Targets that carry their own MTP draft (speculative_hook.py): the draft path defaults to the model path.
MTP_TARGETS = frozenset({
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
    "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
    "HYV3ForCausalLM",
})
_AUTO_5_4_8 = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})
_PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# transformers' AutoConfig messages for a draft path it cannot read (transformers 5, offline)
_HUB_OFFLINE = (
    "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
    "cached files.\nCheck your internet connection or see how to run the library in offline mode at "
    "'https://huggingface.co/docs/transformers/installation#offline-mode'."
)

Warn = Callable[[str], None]


def read_draft_config(path: str) -> dict[str, Any]:
    """The draft's config.json, or the OSError/ValueError transformers' ``AutoConfig`` raises."""
    draft = Path(path).expanduser()
    if not draft.exists():
        if _REPO_ID.match(path):
            raise OSError(_HUB_OFFLINE)  # a hub id: the emulator, like an offline host, cannot fetch it
        raise OSError(
            f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. "
            "Use `repo_type` argument if needed."
        )
    config = draft / "config.json" if draft.is_dir() else draft
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"Unrecognized model in {path}. Should have a `model_type` key in its config.json."
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise OSError(f"It looks like the config file at '{config}' is not a valid JSON file.") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ValueError(f"Unrecognized model in {path}. Should have a `model_type` key in its config.json.")
    return raw


def auto_choose(algorithm: str, architecture: str) -> tuple[int, int, int]:
    """SGLang's default (steps, topk, draft tokens) for a target architecture."""
    if algorithm == "STANDALONE":
        return 3, 1, 4
    return (5, 4, 8) if architecture in _AUTO_5_4_8 else (3, 1, 4)


def resolve_speculative(args: dict[str, Any], architecture: str, warn: Warn) -> None:
    """Resolve the speculative flags in ``args`` in place (SGLang's order); raises what SGLang raises."""
    args.setdefault("speculative_draft_model_revision", None)
    if args["speculative_draft_model_path"] is not None and args["speculative_draft_model_revision"] is None:
        args["speculative_draft_model_revision"] = "main"
    algorithm = args["speculative_algorithm"]
    if algorithm is None:
        return
    algorithm = args["speculative_algorithm"] = str(algorithm).upper()
    if args["speculative_draft_model_path"]:
        read_draft_config(args["speculative_draft_model_path"])  # _resolve_speculative_algorithm_alias
    if algorithm == "NEXTN":
        algorithm = args["speculative_algorithm"] = "EAGLE"
    known = ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")
    if algorithm not in known:
        raise ValueError(f"Unknown speculative algorithm name: {algorithm}")
    if algorithm not in EAGLE_FAMILY:
        raise ValueError(f"the emulator implements EAGLE and EAGLE3 speculative decoding, not {algorithm}")
    _handle_eagle_family(args, architecture, warn)


def _handle_eagle_family(args: dict[str, Any], architecture: str, warn: Warn) -> None:
    if args["max_running_requests"] is None:
        args["max_running_requests"] = 48
        warn("Max running requests is reset to 48 for speculative decoding. You can override this by "
             "explicitly setting --max-running-requests.")
    if args["disable_overlap_schedule"]:
        warn("Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding.")
    if args["enable_mixed_chunk"]:
        args["enable_mixed_chunk"] = False
        warn(f"Mixed chunked prefill is disabled: {args['speculative_algorithm']} speculative decoding does "
             "not support it.")
    if architecture in MTP_TARGETS:
        if args["speculative_draft_model_path"] is None:
            args["speculative_draft_model_path"] = args["model_path"]
            args["speculative_draft_model_revision"] = args.get("revision")
        elif architecture not in ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration"):
            warn("DeepSeek MTP does not require setting speculative_draft_model_path.")
    if args["speculative_num_steps"] is None:
        # a bare assert in SGLang: the message is empty
        assert args["speculative_eagle_topk"] is None and args["speculative_num_draft_tokens"] is None
        steps, topk, tokens = auto_choose(args["speculative_algorithm"], architecture)
        args["speculative_num_steps"] = steps
        args["speculative_eagle_topk"] = topk
        args["speculative_num_draft_tokens"] = tokens
    topk = args["speculative_eagle_topk"]
    backends = {args["attention_backend"], args["prefill_attention_backend"], args["decode_attention_backend"]}
    if "trtllm_mha" in backends and _gt(topk, 1):
        raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
    if topk == 1 and args["speculative_num_draft_tokens"] != args["speculative_num_steps"] + 1:
        warn("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
             "speculative_eagle_topk == 1")
        args["speculative_num_draft_tokens"] = args["speculative_num_steps"] + 1
    if _gt(topk, 1) and args["page_size"] > 1 and args["attention_backend"] not in _PAGE_TREE_BACKENDS:
        raise ValueError(
            f"speculative_eagle_topk > 1 with page_size > 1 is only supported on {_PAGE_TREE_BACKENDS}; got "
            f"attention_backend={args['attention_backend']!r}. Use page_size == 1 or one of those backends."
        )


def _gt(value: Any, bound: int) -> bool:
    """``value > bound`` as Python evaluates it: None raises the TypeError SGLang would hit."""
    if value is None:
        raise TypeError(f"'>' not supported between instances of 'NoneType' and '{type(bound).__name__}'")
    return value > bound


def is_speculative(args: dict[str, Any]) -> bool:
    return args.get("speculative_algorithm") in EAGLE_FAMILY


def draft_architecture(config: dict[str, Any]) -> str:
    """The class SGLang loads for an EAGLE3 draft config (model_config.py renames a plain Llama)."""
    archs = config.get("architectures") or ["LlamaForCausalLM"]
    arch = str(archs[0])
    return "LlamaForCausalLMEagle3" if arch == "LlamaForCausalLM" else arch


def check_draft_model(config: dict[str, Any], algorithm: str) -> None:
    """What the draft model's constructor refuses (llama_eagle3.py: one decoder layer only)."""
    layers = config.get("num_hidden_layers")
    if algorithm == "EAGLE3" and draft_architecture(config).endswith("Eagle3") and layers != 1:
        raise ValueError("EAGLE3 currently only supports 1 layer")


def draft_weight_gb(config: dict[str, Any], draft_dir: Path | None) -> float:
    """The draft's weight size: its safetensors files, else estimated from the config (bf16)."""
    if draft_dir is not None and draft_dir.is_dir():
        files = list(draft_dir.glob("*.safetensors"))
        if files:
            return sum(f.stat().st_size for f in files) / (1 << 30)
    h = int(config.get("hidden_size") or 4096)
    inter = int(config.get("intermediate_size") or 4 * h)
    vocab = int(config.get("draft_vocab_size") or config.get("vocab_size") or 32000)
    params = 3 * h * h + 2 * h * 2 * h + 3 * h * inter + vocab * h  # fc, attention on 2h, MLP, lm_head
    return params * 2 / (1 << 30)


# A forward's fixed cost however small the model (kernel launches, sampling, the tree bookkeeping), as a
# fraction of a target decode step.
DRAFT_FORWARD_OVERHEAD = 0.1


def draft_step_cost(target_params: int, draft_config: dict[str, Any]) -> float:
    """A draft forward's cost as a fraction of a target decode step: the fixed cost of a forward plus the
    ratio of weights each reads (decode is memory-bound), at most 1."""
    h = int(draft_config.get("hidden_size") or 4096)
    inter = int(draft_config.get("intermediate_size") or 4 * h)
    vocab = int(draft_config.get("draft_vocab_size") or draft_config.get("vocab_size") or 32000)
    draft_params = 3 * h * h + 4 * h * h + 3 * h * inter + vocab * h
    return min(1.0, DRAFT_FORWARD_OVERHEAD + draft_params / max(1, target_params))
