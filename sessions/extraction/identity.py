"""The identity of the server a job extracts from, so a job never mixes two servers' hidden states.

A job records, when it first reaches its server: the model path and served model name (``/model_info``),
the SGLang version (``/server_info``'s ``version``), and the capture dir and rid prefix the serving
process captures with (its ``EAGLE3_CAPTURE`` spec, read from the process that owns the listening socket).
Whatever answers on the job's URL later (after a restart, a resume) must show the same identity, else the
job stays paused and the reason names what differs.  A relaunch of the same profile has the same identity.
"""
from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import urlsplit

IDENTITY_KEYS = ("model_path", "served_model_name", "sglang_version", "capture_dir", "rid_prefix")
_TIMEOUT_S = 5.0


class IdentityUnavailable(Exception):
    """The server did not answer ``/model_info``: it is not up (the caller keeps waiting)."""


def server_identity(base_url: str, timeout_s: float = _TIMEOUT_S) -> dict[str, Any]:
    """Read the identity of the server at ``base_url`` (blocking; call it from a worker thread)."""
    from sessions import probes

    base = base_url.rstrip("/")
    info = probes.http_get_json(f"{base}/model_info", timeout_s)
    if info.status != 200 or not isinstance(info.json, dict):
        raise IdentityUnavailable(info.error or f"/model_info answered {info.status}")
    version = None
    # /server_info waits on every scheduler with no server-side timeout: bounded by our client timeout.
    server = probes.http_get_json(f"{base}/server_info", timeout_s)
    if server.status == 200 and isinstance(server.json, dict) and isinstance(server.json.get("version"), str):
        version = server.json["version"]
    capture_dir, rid_prefix = _capture_of_listener(base)
    return {
        "model_path": _text(info.json.get("model_path")),
        "served_model_name": _text(info.json.get("served_model_name")),
        "sglang_version": version,
        "capture_dir": capture_dir,
        "rid_prefix": rid_prefix,
    }


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _capture_of_listener(base_url: str) -> tuple[str | None, str | None]:
    """The capture dir and rid prefix of the process listening on the URL's port (None when unreadable)."""
    import psutil

    from sessions import probes

    url = urlsplit(base_url)
    if not url.port:
        return None, None
    pid = probes.pid_listening_on(url.port, url.hostname)
    if pid is None:
        return None, None
    try:
        raw = psutil.Process(pid).environ().get("EAGLE3_CAPTURE", "")
    except (psutil.Error, OSError):
        return None, None
    try:
        spec = json.loads(raw) if raw else {}
    except ValueError:
        return None, None
    if not isinstance(spec, dict):
        return None, None
    directory = spec.get("dir")
    prefix = spec.get("rid_prefix")
    return (os.path.realpath(directory) if isinstance(directory, str) and directory else None,
            prefix if isinstance(prefix, str) else None)


def identity_differences(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """``["model_path: /a → /b", ...]`` for every recorded part that the found server does not match.

    A part the job never knew (None when recorded) is not compared; one it knew but cannot see now is a
    difference (``→ unknown``): a job continues only against what it can confirm.
    """
    differences = []
    for key in IDENTITY_KEYS:
        want = expected.get(key)
        if want is None:
            continue
        got = found.get(key)
        if got != want:
            differences.append(f"{key}: {want} → {got if got is not None else 'unknown'}")
    return differences


def mismatch_reason(base_url: str, differences: list[str]) -> str:
    return (f"a different server answers at {base_url} ({'; '.join(differences)}); the job continues only "
            "against the server it started with (relaunch that profile, or start a new job)")
