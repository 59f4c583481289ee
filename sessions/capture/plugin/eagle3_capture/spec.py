"""The capture job's spec, passed to every SGLang process as JSON in ``EAGLE3_CAPTURE``.

This file ships inside the self-contained plugin directory (DESIGN §5, "Injection without pip"), so it
uses the standard library only.  The launcher (``sessions.profiles.capture_toggle``) writes the JSON; the plugin
inside SGLang and the emulator's model backend read it with `CaptureSpec.from_environ`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ENV_NAME = "EAGLE3_CAPTURE"
DEFAULT_RID_PREFIX = "eagle3-"
DEFAULT_QUEUE_DEPTH = 4
DUMP_KEYS = ("aux", "last", "input_ids")
# The log reader parses this prefix (DESIGN §5: the plugin's line is the ground truth the UI shows).
ACTIVE_LINE_PREFIX = "eagle3-capture active: "


class CaptureSpecError(ValueError):
    """``EAGLE3_CAPTURE`` is not a valid capture spec; the message names the key and what is wrong."""


@dataclass(frozen=True)
class CaptureSpec:
    """Where and what to dump, for which requests."""

    dir: str
    rid_prefix: str = DEFAULT_RID_PREFIX
    dump: tuple[str, ...] = DUMP_KEYS
    queue_depth: int = DEFAULT_QUEUE_DEPTH  # chunks in flight between the forward and the disk
    layers: tuple[int, ...] | None = None  # physical capture points the profile asked for (informational)
    draft_layer_ids: tuple[int, ...] | None = None  # the same points in the draft-config convention
    # Dumps live for milliseconds: the collector deletes them once the sample is written, and after a
    # power loss the job re-requests whatever its manifest lacks.  The rename alone makes a chunk appear
    # whole; an fsync per chunk would only add GIL round trips to the scheduler's writer thread.
    fsync: bool = False

    def to_json(self) -> str:
        obj: dict = {
            "dir": self.dir,
            "rid_prefix": self.rid_prefix,
            "dump": list(self.dump),
            "queue_depth": self.queue_depth,
            "fsync": self.fsync,
        }
        if self.layers is not None:
            obj["layers"] = list(self.layers)
        if self.draft_layer_ids is not None:
            obj["draft_layer_ids"] = list(self.draft_layer_ids)
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CaptureSpec:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CaptureSpecError(f"{ENV_NAME} is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise CaptureSpecError(f"{ENV_NAME} must be a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - {"dir", "rid_prefix", "dump", "queue_depth", "layers",
                                     "draft_layer_ids", "fsync"})
        if unknown:
            raise CaptureSpecError(f"{ENV_NAME}: unknown key {unknown[0]!r}")
        directory = obj.get("dir")
        if not isinstance(directory, str) or not directory:
            raise CaptureSpecError(f"{ENV_NAME}: 'dir' must be a non-empty string")
        if not os.path.isabs(directory):
            raise CaptureSpecError(f"{ENV_NAME}: 'dir' must be an absolute path, got {directory!r}")
        prefix = obj.get("rid_prefix", DEFAULT_RID_PREFIX)
        if not isinstance(prefix, str) or not prefix:
            # An empty prefix would dump the server's own warmup request as well.
            raise CaptureSpecError(f"{ENV_NAME}: 'rid_prefix' must be a non-empty string")
        dump = obj.get("dump", list(DUMP_KEYS))
        if not isinstance(dump, list) or not dump or any(k not in DUMP_KEYS for k in dump):
            raise CaptureSpecError(f"{ENV_NAME}: 'dump' must be a list drawn from {list(DUMP_KEYS)}")
        if "aux" not in dump or "input_ids" not in dump:
            raise CaptureSpecError(f"{ENV_NAME}: 'dump' must include 'aux' and 'input_ids'")
        depth = obj.get("queue_depth", DEFAULT_QUEUE_DEPTH)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise CaptureSpecError(f"{ENV_NAME}: 'queue_depth' must be an integer >= 1")
        fsync = obj.get("fsync", False)
        if not isinstance(fsync, bool):
            raise CaptureSpecError(f"{ENV_NAME}: 'fsync' must be true or false")
        return cls(
            dir=directory,
            rid_prefix=prefix,
            dump=tuple(k for k in DUMP_KEYS if k in dump),
            queue_depth=depth,
            layers=_int_tuple(obj.get("layers"), "layers"),
            draft_layer_ids=_int_tuple(obj.get("draft_layer_ids"), "draft_layer_ids"),
            fsync=fsync,
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> CaptureSpec | None:
        """The spec in ``EAGLE3_CAPTURE``, or None when capture is off (the variable unset or empty)."""
        text = (os.environ if environ is None else environ).get(ENV_NAME, "")
        if not text.strip():
            return None
        return cls.from_json(text)


def _int_tuple(value: object, key: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or any(not isinstance(v, int) or isinstance(v, bool) for v in value):
        raise CaptureSpecError(f"{ENV_NAME}: {key!r} must be a list of integers")
    return tuple(value)


def capture_active_line(layers: Iterable[int] | None, spec: CaptureSpec) -> str:
    """The one line each writing rank logs once the model is loaded (parsed by the log reader).

    ``layers`` is the model's actual ``layers_to_capture`` (physical capture points).
    """
    shown = [int(v) for v in layers] if layers is not None else None
    return f"{ACTIVE_LINE_PREFIX}layers_to_capture={shown}, dir={spec.dir}, rid_prefix={spec.rid_prefix}"
