"""Reading a session's ``state.json`` so that a damaged file affects only its own session.

A state file may be damaged in many ways: deleted, a JSON list or string, invalid UTF-8, truncated JSON,
or a field of the wrong type (``"pid": "1234"``).  `read_state` never raises for any of them: it returns
the fields it can trust (a dict, always) and one sentence per problem, naming the file and the field.
Fields it does not know are kept as they are: other parts of the engine (the start history, restarts)
add their own.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.server_answers import kind_of

STATE_FILE = "state.json"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _is_phase_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _is_number(v) for k, v in value.items())


def _is_descendants(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(d, list) and len(d) == 2 and _is_int(d[0]) and d[0] > 0 and _is_number(d[1]) for d in value
    )


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_pid(value: Any) -> bool:
    return _is_int(value) and value > 0


def _is_port(value: Any) -> bool:
    return _is_int(value) and 0 < value < 65536


# field -> (check, what it should be).  None is allowed for the scalar facts (not known yet), not for the
# collections, which the engine always writes as such.
FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "version": (_is_int, "an integer"),
    "session_id": (_is_str, "a string"),
    "profile": (_is_str, "a string"),
    "profile_source": (_is_str, "a string"),
    "launcher": (_is_str, "a string"),
    "pid": (_is_pid, "a positive integer"),
    "create_time": (_is_number, "a number"),
    "pgid": (_is_pid, "a positive integer"),
    "host": (_is_str, "a string"),
    "port": (_is_port, "a port number (1-65535)"),
    "tp_size": (_is_int, "an integer"),
    "stall_after_s": (_is_number, "a number"),
    "started_at": (_is_number, "a number"),
    "argv_sha256": (_is_str, "a string"),
    "phase_entered_at": (_is_phase_map, "an object of phase -> time"),
    "descendants": (_is_descendants, "a list of [pid, create_time] pairs"),
    "outcome": (_is_str, "a string"),
    "start_outcome": (_is_str, "a string"),
    "stopped_at": (_is_number, "a number"),
    "stop_requested_at": (_is_number, "a number"),
    "ended_at": (_is_number, "a number"),
    "stop": (_is_dict, "an object"),
    "model_info": (_is_dict, "an object"),
    "history_recorded": (_is_bool, "true or false"),
    "restarted_from": (_is_str, "a string"),
    "restarted_as": (_is_str, "a string"),
    "restart_diff": (_is_str_list, "a list of strings"),
    "launch_state": (_is_str, "a string"),
}


_NOT_NULL = frozenset({"phase_entered_at", "descendants", "stop", "model_info", "restart_diff"})


@dataclass(frozen=True)
class StateRead:
    """What `read_state` found: the trusted fields, and what was wrong (empty when the file is sound)."""

    record: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    missing: bool = False  # no state file at all
    unreadable: bool = False  # not a JSON object at all: nothing of it could be used

    @property
    def damaged(self) -> bool:
        return bool(self.problems)

    @property
    def problem(self) -> str | None:
        return "; ".join(self.problems) if self.problems else None


def read_state(session_dir: Path) -> StateRead:
    """Read ``<session_dir>/state.json``; never raises for what is in (or missing from) the file.

    The file is read by `sessions.safe_files` as a private one: a FIFO, a directory, a symlink (to
    ``/dev/zero`` or anywhere), a hard link, a file over the cap, bad UTF-8 and JSON nested too deeply are
    each a problem of this session alone."""
    path = Path(session_dir) / STATE_FILE
    try:
        obj = safe_files.read_json(path, safe_files.STATE)
    except FileNotFoundError:
        return StateRead({}, (f"{path}: missing",), missing=True, unreadable=True)
    except safe_files.SpecialFileError as exc:
        return StateRead({}, (f"{path}: cannot be opened ({exc.kind}, not a regular file of its own)",),
                         unreadable=True)
    except safe_files.FileRefused as exc:
        return StateRead({}, (f"{path}: {str(exc).split(': ', 1)[-1]}",), unreadable=True)
    except OSError as exc:
        return StateRead({}, (f"{path}: cannot be opened ({safe_files.describe_os_error(exc, path)})",),
                         unreadable=True)
    if not isinstance(obj, dict):
        return StateRead({}, (f"{path}: holds {kind_of(obj)}, not an object",), unreadable=True)
    record, problems = check_fields(obj)
    return StateRead(record, tuple(f"{path}: {p}" for p in problems))


def check_fields(obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The fields of ``obj`` that have the right type, and one problem per field that has not."""
    record: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in obj.items():
        spec = FIELD_TYPES.get(key)
        if spec is None or (value is None and key not in _NOT_NULL) or (value is not None and spec[0](value)):
            record[key] = value
        else:
            problems.append(f"'{key}' should be {spec[1]}, not {_shown(value)}")
    return record, problems


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return f"{kind_of(value)} {text[:40]}{'…' if len(text) > 40 else ''}"
