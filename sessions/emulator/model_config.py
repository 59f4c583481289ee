"""What the emulator reads from a model dir: ``config.json`` (flat, or nested like Kimi-K2.5) and shard files.

Kimi-K2.5 declares ``KimiK25ForConditionalGeneration`` at the top and keeps the text model's keys
(``num_hidden_layers``, ``hidden_size``, ...) under ``text_config`` (DESIGN §2), so every field is looked
up in ``text_config`` first, then at the top.  The model class SGLang logs (``type=`` in ``Load weight
end``) is the top-level architecture.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_BYTES_PER_PARAM = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0}


class ModelDirError(ValueError):
    """The model dir cannot be used; the message names the path and what is wrong."""


@dataclass(frozen=True)
class ModelConfig:
    """The parts of a model's config that shape an SGLang start (memory, KV cache, capture layers)."""

    model_dir: Path
    architecture: str
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    context_len: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    kv_lora_rank: int | None  # MLA (DeepSeek-V3 / Kimi): KV cache holds (kv_lora_rank + rope dim) per layer
    qk_rope_head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    first_k_dense_replace: int
    torch_dtype: str
    quant_method: str | None
    quant_bits: int | None
    safetensors_files: tuple[str, ...]
    raw: dict[str, Any]

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def param_count(self) -> int:
        """A rough parameter count (attention + MLP/MoE + embeddings), enough to size emulated memory."""
        h, layers = self.hidden_size, self.num_hidden_layers
        attention = 4 * h * h
        dense_mlp = 3 * h * self.intermediate_size
        if self.n_routed_experts > 0:
            moe = (self.n_routed_experts + self.n_shared_experts) * 3 * h * self.moe_intermediate_size
            moe += h * self.n_routed_experts  # router
            dense_layers = min(self.first_k_dense_replace, layers)
            mlp = dense_layers * dense_mlp + (layers - dense_layers) * moe
        else:
            mlp = layers * dense_mlp
        return layers * attention + mlp + 2 * self.vocab_size * h

    def weight_bytes(self) -> int:
        """Bytes of all weights: the shard files when there are any, else estimated from the config."""
        if self.safetensors_files:
            return sum((self.model_dir / name).stat().st_size for name in self.safetensors_files)
        if self.quant_bits is not None:
            per_param = self.quant_bits / 8 + 0.05  # scales and the unquantised attention/embeddings
        elif self.quant_method == "fp8":
            per_param = 1.0
        else:
            per_param = _BYTES_PER_PARAM.get(self.torch_dtype, 2.0)
        return int(self.param_count() * per_param)

    def shard_count(self) -> int:
        """Weight files SGLang's loader walks: the real count, else about one per 5 GB (64 for Kimi)."""
        if self.safetensors_files:
            return len(self.safetensors_files)
        return max(1, min(64, math.ceil(self.weight_bytes() / (5 << 30))))

    def kv_bytes_per_token(self, tp_size: int, kv_dtype_bytes: int = 2) -> int:
        """Bytes of KV cache one token takes on one rank (MLA is not sharded over TP; MHA heads are)."""
        if self.kv_lora_rank is not None:  # is_mla
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_hidden_layers * kv_dtype_bytes
        heads = max(1, self.num_key_value_heads // max(1, tp_size))
        return 2 * heads * self.head_dim * self.num_hidden_layers * kv_dtype_bytes


def load_model_config(model_path: str | Path) -> ModelConfig:
    """Read ``<model_path>/config.json``; raises ModelDirError naming the path and the problem."""
    model_dir = Path(model_path).expanduser()
    if not model_dir.is_dir():
        raise ModelDirError(
            f"model path {str(model_path)!r} is not a directory (the emulator needs a local model dir "
            f"holding config.json; it never downloads)"
        )
    config_path = model_dir / "config.json"
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(f"model path {str(model_path)!r} has no config.json") from None
    except json.JSONDecodeError as exc:
        raise ModelDirError(
            f"{config_path}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})"
        ) from None
    except OSError as exc:
        raise ModelDirError(f"{config_path}: cannot be read ({exc.strerror})") from None
    if not isinstance(raw, dict):
        raise ModelDirError(f"{config_path}: the top level must be a JSON object")
    text_config = raw.get("text_config")
    text: dict[str, Any] = text_config if isinstance(text_config, dict) else {}

    def get(key: str, default: Any = None) -> Any:
        value = text.get(key)
        return raw.get(key, default) if value is None else value

    def get_int(key: str, default: int | None) -> int | None:
        value = get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelDirError(f"{config_path}: {key} must be a number, not {value!r}")
        return int(value)

    architectures = raw.get("architectures") or text.get("architectures") or ["LlamaForCausalLM"]
    if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
        raise ModelDirError(f"{config_path}: architectures must be a list of class names")
    layers = get_int("num_hidden_layers", None)
    hidden = get_int("hidden_size", None)
    if layers is None or hidden is None:
        missing = [k for k, v in (("num_hidden_layers", layers), ("hidden_size", hidden)) if v is None]
        raise ModelDirError(
            f"{config_path}: missing {', '.join(missing)} (looked at the top and in text_config)"
        )
    if layers <= 0 or hidden <= 0:
        raise ModelDirError(f"{config_path}: num_hidden_layers and hidden_size must be positive")
    heads = get_int("num_attention_heads", max(1, hidden // 128)) or 1
    quant_config = get("quantization_config")
    quant: dict[str, Any] = quant_config if isinstance(quant_config, dict) else {}
    quant_bits = _quant_bits(quant)
    return ModelConfig(
        model_dir=model_dir,
        architecture=architectures[0],
        model_type=str(raw.get("model_type") or text.get("model_type") or "llama"),
        num_hidden_layers=layers,
        hidden_size=hidden,
        vocab_size=get_int("vocab_size", 32000) or 32000,
        context_len=get_int("max_position_embeddings", 4096) or 4096,
        num_attention_heads=heads,
        num_key_value_heads=get_int("num_key_value_heads", heads) or heads,
        head_dim=get_int("head_dim", None) or max(1, hidden // heads),
        kv_lora_rank=get_int("kv_lora_rank", None),
        qk_rope_head_dim=get_int("qk_rope_head_dim", 64) or 0,
        intermediate_size=get_int("intermediate_size", 4 * hidden) or 4 * hidden,
        moe_intermediate_size=get_int("moe_intermediate_size", 0) or 0,
        n_routed_experts=get_int("n_routed_experts", None) or get_int("num_experts", 0) or 0,
        n_shared_experts=get_int("n_shared_experts", 0) or 0,
        first_k_dense_replace=get_int("first_k_dense_replace", 0) or 0,
        torch_dtype=str(get("torch_dtype") or get("dtype") or "bfloat16"),
        quant_method=quant.get("quant_method") if isinstance(quant.get("quant_method"), str) else None,
        quant_bits=quant_bits,
        safetensors_files=tuple(sorted(p.name for p in model_dir.glob("*.safetensors"))),
        raw=raw,
    )


def _quant_bits(quant: dict[str, Any]) -> int | None:
    """Weight bits of an int-quantised checkpoint (compressed-tensors int4 for Kimi-K2.5), else None."""
    bits = quant.get("bits") or quant.get("w_bit")
    if isinstance(bits, int):
        return bits
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict) and isinstance(weights.get("num_bits"), int):
            return weights["num_bits"]
    return None
