"""The generated PYTHONPATH folder that puts the capture plugin into SGLang without pip (DESIGN §5).

Layout (enough for ``importlib.metadata.entry_points``, sglang-facts §5.1)::

    <state>/capture-plugin/eagle3_capture-<ver>-<hash>/
        eagle3_capture/{__init__,hook,spec,writer}.py          copied from sessions/capture/plugin/
        eagle3_capture-<ver>.dist-info/METADATA
        eagle3_capture-<ver>.dist-info/entry_points.txt        [sglang.srt.plugins] eagle3_capture = ...

The folder name carries a hash of its content, so a running server keeps the files it started with when
eagle3-tui is upgraded.  Only the plugin goes on SGLang's path, never ``app``/``widgets``/``sessions``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from sessions import safe_files
from sessions.home import Home, ensure_private_dir, resolve_home

PLUGIN_SOURCE_DIR = Path(__file__).resolve().parent / "plugin" / "eagle3_capture"
PLUGIN_NAME = "eagle3_capture"
PLUGIN_VERSION = "0.1.0"
ENTRY_POINT_GROUP = "sglang.srt.plugins"


def _plugin_files() -> dict[str, bytes]:
    """Relative path → content of everything the generated folder holds."""
    files: dict[str, bytes] = {}
    for path in sorted(PLUGIN_SOURCE_DIR.glob("*.py")):
        files[f"{PLUGIN_NAME}/{path.name}"] = safe_files.read_bytes(path, safe_files.SOURCE)
    dist = f"{PLUGIN_NAME}-{PLUGIN_VERSION}.dist-info"
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {PLUGIN_NAME}\nVersion: {PLUGIN_VERSION}\n"
        "Summary: eagle3-tui hidden-state capture plugin for SGLang (generated; do not edit)\n"
    ).encode()
    files[f"{dist}/entry_points.txt"] = (
        f"[{ENTRY_POINT_GROUP}]\n{PLUGIN_NAME} = {PLUGIN_NAME}:register\n"
    ).encode()
    return files


def _content_hash(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()[:12]


def _matches(folder: Path, files: dict[str, bytes]) -> bool:
    try:
        present = {
            str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        }
        if present != set(files):
            return False
        return all(safe_files.read_bytes(folder / name, safe_files.SOURCE) == data for name, data in files.items())
    except OSError:
        return False


def plugin_path(home: Home | None = None) -> Path:
    """The folder to prepend to the server's PYTHONPATH, created (or repaired) on demand."""
    home = home or resolve_home()
    files = _plugin_files()
    root = ensure_private_dir(home.state_root / "capture-plugin")
    folder = root / f"{PLUGIN_NAME}-{PLUGIN_VERSION}-{_content_hash(files)}"
    if folder.is_dir() and not folder.is_symlink() and _matches(folder, files):
        return folder
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        for name, data in files.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            target.write_bytes(data)
            os.chmod(target, 0o600)
        if folder.is_symlink() or folder.exists():
            # A damaged or tampered copy: replace it (a running server already imported its files).
            if folder.is_symlink() or not folder.is_dir():
                folder.unlink()
            else:
                shutil.rmtree(folder)
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder.is_dir() and _matches(folder, files)):  # another process won the race
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return folder
