"""The target model's shape from its config.json, and what it implies for the output (bytes, layer ids)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.home import read_json


@dataclass(frozen=True)
class ModelDims:
    hidden_size: int | None
    num_layers: int | None
    vocab_size: int | None
    architectures: tuple[str, ...]
    model_type: str | None


def read_model_dims(model_path: Path) -> ModelDims:
    """The model's shape from config.json; Kimi-K2.5 nests the text model under ``text_config``."""
    config = read_json(model_path / "config.json", default={}) or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}

    def pick(key: str) -> Any:
        return config.get(key) if config.get(key) is not None else text.get(key)

    return ModelDims(pick("hidden_size"), pick("num_hidden_layers"), pick("vocab_size"),
                     tuple(config.get("architectures") or ()), config.get("model_type"))


def bytes_per_token(hidden_size: int, num_aux_layers: int) -> int:
    """Output bytes per token: bf16 aux (K·H) and final (H) states, int64 ids and mask (anchors §5.1)."""
    return 2 * hidden_size * (num_aux_layers + 1) + 16


def draft_layer_ids(points: tuple[int, ...] | None, dims: ModelDims) -> list[int] | None:
    """The draft-config spelling of the capture points, by the model family's +1 rule (DESIGN §5)."""
    if not points or not dims.num_layers:
        return None
    from sessions.capture.layers import LayerConvention, LayerError, LayerRule, rule_for

    rule = next((r for a in dims.architectures if (r := rule_for(a)) is not None), LayerRule.PLUS_ONE)
    try:
        return LayerConvention(rule, dims.num_layers).ids_for_points(points)
    except LayerError:
        return None
