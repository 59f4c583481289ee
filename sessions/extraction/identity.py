"""The identity of the server a job extracts from, so a job never mixes two servers' hidden states.

A job records, when it first reaches its server, everything that changes the hidden states it serves:
the model path and served model name (``/model_info``); the model folder's weights (the name, size and
modification time of every checkpoint file and index, read from the folder itself: two folders of the
same architecture with other weights differ here, issue 22 item 20); the capture layers the server was
started with and its chat template (``/server_info``'s server args, and the template files of the model
folder); the SGLang version (``/server_info``'s ``version``); and the capture dir and rid prefix the
serving process captures with (its ``EAGLE3_CAPTURE`` spec, read from the process that owns the listening
socket).  Whatever answers on the job's URL later (after a restart, a resume) must show the same
identity, else the job stays paused and the reason names what changed.  A relaunch of the same profile
has the same identity; ``extract resume JOB --accept-server`` accepts a changed one, on the record.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sessions import safe_files

IDENTITY_KEYS = ("model_path", "served_model_name", "weights", "model_config", "numerics", "capture_layers",
                 "chat_template", "sglang_version", "capture_dir", "rid_prefix")
# Server args that change the numbers a layer computes from the same weights (adv22: a server of the same
# folder started with --dtype float16, --quantization fp8 or a --json-model-override-args rope change
# passed the check).  Parallelism and scheduling flags do not change what a layer computes.
_NUMERICS_ARGS = ("dtype", "quantization", "kv_cache_dtype", "json_model_override_args", "revision",
                  "load_format", "model_loader_extra_config")
# The checkpoint files of a model folder: what its weights are (names, sizes, modification times).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
_WEIGHTS_NAMED = 3  # changed files named in a reason; the rest are counted
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
    # /server_info waits on every scheduler with no server-side timeout: bounded by our client timeout.
    server = probes.http_get_json(f"{base}/server_info", timeout_s)
    args = server.json if server.status == 200 and isinstance(server.json, dict) else {}
    capture_dir, rid_prefix = capture_of_listener(base)
    model_path = _text(info.json.get("model_path"))
    folder = Path(model_path) if model_path and os.path.isdir(model_path) else None
    return {
        "model_path": model_path,
        "served_model_name": _text(info.json.get("served_model_name")),
        "weights": weights_of(folder) if folder is not None else None,
        "model_config": _model_config_digest(folder) if folder is not None else None,
        "numerics": {k: args.get(k) for k in _NUMERICS_ARGS} if args else None,
        "capture_layers": _capture_layers(args) if args else None,
        "chat_template": _chat_template_digest(folder, args.get("chat_template")) if args or folder else None,
        "sglang_version": _text(args.get("version")),
        "capture_dir": capture_dir,
        "rid_prefix": rid_prefix,
    }


def weights_of(folder: Path) -> dict[str, list[int]] | None:
    """``{file name: [size, mtime_ns]}`` of the folder's checkpoint files (None when it has none)."""
    found = {}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.endswith(_WEIGHT_SUFFIXES) and entry.is_file():
                    st = entry.stat()
                    found[entry.name] = [st.st_size, st.st_mtime_ns]
    except OSError:
        return None
    return dict(sorted(found.items())) or None


def _model_config_digest(folder: Path) -> str | None:
    """sha256 of the model folder's ``config.json`` as parsed (an edited ``rope_scaling``, layer count or
    ``torch_dtype`` changes the states with the weights unchanged), read by `sessions.safe_files`."""
    try:
        config = safe_files.read_json(folder / "config.json", safe_files.MODEL_CONFIG)
    except OSError:
        return None
    return "sha256:" + hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def _capture_layers(args: dict[str, Any]) -> Any:
    """What the server captures: ``"off"``, ``"default"`` (SGLang's [2, L//2, L-3]) or the ids it was given."""
    if not args.get("enable_return_aux_hidden_states"):
        return "off"
    ids = args.get("return_aux_hidden_state_layer_ids")
    return [int(i) for i in ids] if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else "default"


def _chat_template_digest(folder: Path | None, server_template: Any) -> str | None:
    """sha256 of the chat template the server applies: its ``--chat-template`` (a file's text, or the
    name given), else the model folder's (tokenizer_config.json's ``chat_template`` and template files)."""
    # Read by `sessions.safe_files` (adv22: a FIFO planted as chat_template.jinja held the job's start for
    # good, and a deeply nested tokenizer_config.json raised RecursionError out of the identity check).
    digest = hashlib.sha256()
    parts = 0
    if isinstance(server_template, str) and server_template:
        path = Path(server_template)
        try:
            digest.update(b"server:" + (safe_files.read_bytes(path, safe_files.MODEL_CONFIG) if path.is_file()
                                        else server_template.encode()))
        except OSError as exc:
            digest.update(b"server:" + server_template.encode() + b":unreadable:" + str(exc).encode())
        parts += 1
    for name in ("tokenizer_config.json", *_TEMPLATE_FILES) if folder is not None else ():
        assert folder is not None
        try:
            raw = safe_files.read_bytes(folder / name, safe_files.MODEL_CONFIG)
        except FileNotFoundError:
            continue
        except OSError as exc:  # there but unreadable (a FIFO, too large): that is part of what it is
            digest.update(name.encode() + b":unreadable:" + getattr(exc, "kind", type(exc).__name__).encode())
            parts += 1
            continue
        if name == "tokenizer_config.json":
            try:
                config = safe_files.parse_json(raw, f"{folder / name}")
            except OSError:
                continue
            template = config.get("chat_template") if isinstance(config, dict) else None
            if template is None:
                continue
            raw = json.dumps(template, sort_keys=True).encode()
        digest.update(name.encode() + b":" + raw)
        parts += 1
    return f"sha256:{digest.hexdigest()[:16]}" if parts else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def capture_of_listener(base_url: str) -> tuple[str | None, str | None]:
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
        if got == want:
            continue
        if key == "weights" and isinstance(want, dict) and isinstance(got, dict):
            differences.append(f"weights: {_weights_change(want, got)}")
        else:
            differences.append(f"{key}: {want} → {got if got is not None else 'unknown'}")
    return differences


def _weights_change(want: dict[str, Any], got: dict[str, Any]) -> str:
    """``model-00002-of-00004.safetensors changed (size 4.2 GB → 4.2 GB, modified …); 1 added`` in words."""
    from datetime import datetime

    def when(ns: Any) -> str:
        return datetime.fromtimestamp(ns / 1e9).isoformat(sep=" ", timespec="seconds") if isinstance(ns, int) else "?"

    def pair(entry: Any) -> tuple[Any, Any]:  # [size, mtime_ns]; a job.json edited by hand may hold anything
        return (entry[0], entry[1]) if isinstance(entry, list) and len(entry) == 2 else ("?", None)

    words = []
    changed = sorted(n for n in set(want) & set(got) if want[n] != got[n])
    for name in changed[:_WEIGHTS_NAMED]:
        (size_a, time_a), (size_b, time_b) = pair(want[name]), pair(got[name])
        words.append(f"{name} changed (size {size_a} → {size_b} bytes, modified {when(time_a)} → {when(time_b)})")
    if len(changed) > _WEIGHTS_NAMED:
        words.append(f"{len(changed) - _WEIGHTS_NAMED} more changed")
    for label, names in (("added", sorted(set(got) - set(want))), ("removed", sorted(set(want) - set(got)))):
        if names:
            words.append(f"{label} {', '.join(names[:_WEIGHTS_NAMED])}"
                         + (f" and {len(names) - _WEIGHTS_NAMED} more" if len(names) > _WEIGHTS_NAMED else ""))
    return "; ".join(words) or "changed"


def mismatch_reason(base_url: str, differences: list[str], job_id: str | None = None) -> str:
    accept = f", or accept this one: `eagle3-tui extract resume {job_id} --accept-server`" if job_id else ""
    return (f"a different server answers at {base_url} ({'; '.join(differences)}); the job continues only "
            f"against the server it started with (relaunch that profile, or start a new job{accept})")
