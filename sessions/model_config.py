"""The model's ``config.json``, read for the fields a launch needs (`read_model_config`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --- the model's config.json -----------------------------------------------------------------------------


class ModelConfigError(ValueError):
    """config.json is missing, unreadable or not a JSON object."""


@dataclass(frozen=True)
class ModelShape:
    """What eagle3-tui needs from a model's config.json.  Multimodal wrappers such as Kimi-K2.5
    (``KimiK25ForConditionalGeneration``) keep the text model's keys under ``text_config``: those are
    read from there, while ``architecture`` and ``model_type`` stay the wrapper's own."""

    architecture: str | None
    num_hidden_layers: int | None
    hidden_size: int | None
    model_type: str | None
    text_model_type: str | None = None
    text_config_nested: bool = False


def read_model_config(model_path: str | Path) -> ModelShape:
    """Read ``<model_path>/config.json`` (both flat and ``text_config``-nested shapes)."""
    from sessions import safe_files

    path = Path(model_path).expanduser() / "config.json"
    try:  # a FIFO, /dev/zero, over 16 MiB, deep JSON: refused at once, never waited on
        raw = safe_files.read_json(path, safe_files.MODEL_CONFIG)
    except FileNotFoundError:
        raise ModelConfigError(f"{path} does not exist") from None
    except safe_files.FileRefused as exc:
        raise ModelConfigError(str(exc)) from None
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{path} must hold a JSON object")
    text_config = raw.get("text_config")
    text: dict[str, Any] = text_config if isinstance(text_config, dict) else {}

    def pick(key: str, kind: type) -> Any:
        for source in (raw, text):
            value = source.get(key)
            if isinstance(value, kind) and not isinstance(value, bool):
                return value
        return None

    archs = raw.get("architectures") or text.get("architectures") or []
    architecture = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    return ModelShape(
        architecture=architecture,
        num_hidden_layers=pick("num_hidden_layers", int),
        hidden_size=pick("hidden_size", int),
        model_type=raw.get("model_type") if isinstance(raw.get("model_type"), str) else None,
        text_model_type=text.get("model_type") if isinstance(text.get("model_type"), str) else None,
        text_config_nested=bool(text) and not isinstance(raw.get("num_hidden_layers"), int),
    )
