"""The diagnosis bundle: a 0600 tar.gz with the diagnosis, the report, the log's tail, the stacks, the
profile, the command and the relevant environment, every file redacted again on the way in."""
from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

from sessions.diagnosis.evidence import (
    _command_argv,
    _process_environ,
    _Redactor,
    _secret_argv_values,
    _tail_texts,
)
from sessions.diagnosis.model import BUNDLE_LOG_BYTES, Diagnosis, ProcessReport
from sessions.diagnosis.report import format_report
from sessions.home import atomic_write_bytes, write_new_file
from sessions.redaction import collect_secrets, secret_values
from sessions.safe_files import Kind, MiB, SpecialFileError, read_text


def _stack_file_name(p: ProcessReport) -> str:
    return f"stacks/{p.label.replace(' ', '_')}-{p.pid}.txt"  # "DP1 TP0" -> DP1_TP0: no spaces in names


def write_bundle(diagnosis: Diagnosis, session: Any, path: str | Path) -> Path:
    """Write a tar.gz (0600) with the diagnosis, report, log tail, stacks, profile, command and env.

    Every file is redacted again on the way in, with the secrets known from the profile env, the server's
    environment and its argv.  ``path`` may be a folder: the bundle is named after the session then.
    """
    target = Path(path)
    folder = target if target.is_dir() else None
    try:
        profile_env = dict(getattr(getattr(session.profile, "server", None), "env", {}) or {})
    except Exception:  # noqa: BLE001 - a damaged snapshot: the diagnosis already says so
        profile_env = {}
    # Only a live, verified (pid, create_time) is read: a reused pid would leak a stranger's environment.
    environ = _process_environ(session.pid) if session.is_alive() else {}
    argv = _command_argv(session)
    redactor = _Redactor(secret_values(profile_env) + collect_secrets((), environ) + _secret_argv_values(argv),
                         session)
    session_dir = Path(session.session_dir)

    files: dict[str, str] = {
        "diagnosis.json": json.dumps(diagnosis.to_json(), indent=2, sort_keys=True) + "\n",
        "report.txt": format_report(diagnosis),
        "server.log.tail": "\n".join(
            _tail_texts(Path(diagnosis.log_path), BUNDLE_LOG_BYTES, follow_symlinks=False)  # no symlink followed
        ) + "\n",
        "env.txt": "".join(f"{k}={v}\n" for k, v in sorted(diagnosis.env.items())),
    }
    for name in ("profile.toml", "command.json", "state.json"):
        # Regular files only, never through a link: a planted symlink must not carry /etc/shadow into the tar.
        try:
            files[name] = read_text(session_dir / name, Kind(name, 256 * MiB, private=True), errors="replace")
        except SpecialFileError as exc:
            files[f"{name}.refused"] = f"{exc.strerror}\n"
        except OSError:
            pass
    for p in diagnosis.processes:
        if p.stack is not None:
            files[_stack_file_name(p)] = (
                p.stack.text if p.stack.ok else f"no stack: [{p.stack.error_kind}] {p.stack.error}\n"
            )

    buffer = io.BytesIO()
    now = time.time()
    prefix = f"eagle3-diagnosis-{diagnosis.session_id}"
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = redactor.text(text).encode("utf-8")
            info = tarfile.TarInfo(f"{prefix}/{name}")
            info.size = len(data)
            info.mode = 0o600
            info.mtime = int(now)
            tar.addfile(info, io.BytesIO(data))
    if folder is not None:
        # The result store's primitive: two diagnoses of one session in the same second into one folder got
        # one name, and the second replaced the first (adv22); now the second is ``…-2.tar.gz``.
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(diagnosis.taken_at or time.time()))
        return write_new_file(folder, f"eagle3-diagnosis-{diagnosis.session_id}-{stamp}", buffer.getvalue(),
                              suffix=".tar.gz", ours=False)
    atomic_write_bytes(target, buffer.getvalue(), mode=0o600)
    return target


def default_bundle_path(session: Any, taken_at: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(taken_at or time.time()))
    return Path(session.session_dir) / f"diagnosis-{stamp}.tar.gz"

