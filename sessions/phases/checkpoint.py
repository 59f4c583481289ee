"""A `StartupTracker`'s state as plain JSON, and back: what `sessions.server.log_checkpoint` saves.

The tracker's fields are written as JSON values with a small tag for what JSON lacks (tuples, sets, bytes,
the phase enum, the model's dataclasses, the topology's arguments).  Reading builds objects only of the
classes named here (never pickle: the session folder is a file a user or another process could write),
and only into the fields a fresh tracker has: a tracker of another shape (another eagle3-tui version)
is refused with `CheckpointError`, never half-restored.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from enum import Enum
from typing import Any

from sessions.phases.model import LogError, PhaseEvent, PhaseProgress, StartupPhase
from sessions.phases.topology import Topology
from sessions.phases.tracker import StartupTracker

_DATACLASSES: dict[str, type] = {cls.__name__: cls for cls in (PhaseEvent, PhaseProgress, LogError)}
_ENUMS: dict[str, type[Enum]] = {"StartupPhase": StartupPhase}


class CheckpointError(ValueError):
    """A saved state that cannot be a tracker's: another shape, an unknown tag, a wrong type."""


def encode_tracker(tracker: StartupTracker) -> dict[str, Any]:
    """The tracker's fields as JSON values (`CheckpointError` for a value this codec does not know)."""
    return {name: _encode(value, name) for name, value in vars(tracker).items()}


def decode_tracker(state: object) -> StartupTracker:
    """A tracker with exactly the saved fields; `CheckpointError` when they are not a tracker's."""
    tracker = StartupTracker()
    fields = vars(tracker)
    if not isinstance(state, dict) or sorted(state) != sorted(fields):
        raise CheckpointError("the saved tracker has other fields than this version's")
    for name, value in state.items():
        decoded = _decode(value, name)
        if type(decoded) is not type(fields[name]) and fields[name] is not None and decoded is not None:
            raise CheckpointError(f"field {name}: {type(decoded).__name__}, not {type(fields[name]).__name__}")
        setattr(tracker, name, decoded)
    return tracker


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)) and not isinstance(value, Enum):
        return value
    if isinstance(value, Enum):
        if type(value).__name__ not in _ENUMS:
            raise CheckpointError(f"{where}: enum {type(value).__name__} is not saved")
        return {"enum": type(value).__name__, "v": value.value}
    if isinstance(value, list):
        return [_encode(v, where) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, where) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"set": sorted((_encode(v, where) for v in value), key=repr)}
    if isinstance(value, deque):
        return {"deque": [_encode(v, where) for v in value], "maxlen": value.maxlen}
    if isinstance(value, (bytes, bytearray)):
        return {"bytearray" if isinstance(value, bytearray) else "bytes": value.decode("latin-1")}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, where), _encode(v, where)] for k, v in value.items()]}
    if isinstance(value, re.Pattern):  # a wrapper format the tracker learned from this log
        return {"re": value.pattern, "flags": value.flags}
    if isinstance(value, Topology):
        return {"topology": _encode(value.args, where)}
    if dataclasses.is_dataclass(value) and type(value).__name__ in _DATACLASSES:
        return {"data": type(value).__name__,
                "v": {f.name: _encode(getattr(value, f.name), where) for f in dataclasses.fields(value)}}
    raise CheckpointError(f"{where}: a {type(value).__name__} is not saved")


def _decode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v, where) for v in value]
    if not isinstance(value, dict) or not value:
        raise CheckpointError(f"{where}: {type(value).__name__} is not a saved value")
    tag = next(iter(value))
    body = value[tag]
    try:
        if tag == "enum":
            return _ENUMS[body](value["v"])
        if tag == "tuple":
            return tuple(_decode(v, where) for v in body)
        if tag == "set":
            return {_decode(v, where) for v in body}
        if tag == "deque":
            return deque((_decode(v, where) for v in body), maxlen=value.get("maxlen"))
        if tag in ("bytes", "bytearray"):
            raw = body.encode("latin-1")
            return bytearray(raw) if tag == "bytearray" else raw
        if tag == "dict":
            return {_decode(k, where): _decode(v, where) for k, v in body}
        if tag == "re":
            return re.compile(str(body), int(value.get("flags", 0)))
        if tag == "topology":
            topology = Topology()
            args = _decode(body, where)
            if not isinstance(args, dict):
                raise CheckpointError(f"{where}: the topology's arguments are not a mapping")
            topology.args = args
            return topology
        if tag == "data":
            cls = _DATACLASSES[body]
            return cls(**{k: _decode(v, where) for k, v in value["v"].items()})
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, UnicodeError, re.error) as exc:
        raise CheckpointError(f"{where}: a damaged {tag} value ({exc})") from None
    raise CheckpointError(f"{where}: unknown tag {tag!r}")

