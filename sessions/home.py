"""Where eagle3-tui keeps its state, and how it writes files there.

Roots (DESIGN §1): profiles under ``user_config_dir("eagle3-tui")/profiles``, sessions under
``user_state_dir("eagle3-tui")/sessions``, jobs under ``<state>/jobs``.  ``EAGLE3_TUI_HOME`` overrides
both roots (``<home>/config`` and ``<home>/state``); ``--demo`` uses ``<home>/demo`` as the home, where
``<home>`` is ``EAGLE3_TUI_HOME`` or the default state root.  Folders are 0700, files 0600, writes atomic.
"""
from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

APP_NAME = "eagle3-tui"
HOME_ENV = "EAGLE3_TUI_HOME"
DEMO_ENV = "EAGLE3_TUI_DEMO"  # set by `--demo` so that every part (and child processes) agree


@dataclass(frozen=True)
class Home:
    """The two roots of one eagle3-tui home (normal or demo)."""

    config_root: Path
    state_root: Path
    demo: bool = False

    @property
    def profiles_dir(self) -> Path:
        return self.config_root / "profiles"

    @property
    def sessions_dir(self) -> Path:
        return self.state_root / "sessions"

    @property
    def jobs_dir(self) -> Path:
        return self.state_root / "jobs"

    @property
    def history_dir(self) -> Path:
        return self.state_root / "history"

    @property
    def config_file(self) -> Path:
        """User settings (key remaps, refresh interval): ``<config>/config.toml``."""
        return self.config_root / "config.toml"

    def ensure(self) -> Home:
        for d in (self.config_root, self.state_root, self.profiles_dir, self.sessions_dir, self.jobs_dir):
            ensure_private_dir(d)
        return self


def _default_state_root() -> Path:
    import platformdirs

    return Path(platformdirs.user_state_dir(APP_NAME))


def resolve_home(demo: bool | None = None) -> Home:
    """The home to use now; ``demo=None`` reads ``EAGLE3_TUI_DEMO`` (set by ``--demo``)."""
    if demo is None:
        demo = os.environ.get(DEMO_ENV, "") not in ("", "0")
    override = os.environ.get(HOME_ENV)
    if demo:
        base = Path(override) if override else _default_state_root()
        root = base / "demo"
        return Home(config_root=root / "config", state_root=root / "state", demo=True)
    if override:
        root = Path(override)
        return Home(config_root=root / "config", state_root=root / "state")
    import platformdirs

    return Home(
        config_root=Path(platformdirs.user_config_dir(APP_NAME)),
        state_root=_default_state_root(),
    )


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with mode 0700; tighten an existing folder of ours to 0700."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (FileExistsError, NotADirectoryError):  # a file stands where the folder (or a parent) should be
        from sessions.safe_files import describe_os_error

        err = OSError(errno.ENOTDIR, "Not a directory", str(path))
        raise NotADirectoryError(errno.ENOTDIR, describe_os_error(err), str(path)) from None
    st = path.stat()
    if st.st_uid == os.getuid() and (st.st_mode & 0o777) != 0o700:
        os.chmod(path, 0o700)
    return path


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` via tmp file + fsync + rename, so readers never see a partial file."""
    path = Path(path)
    tmp = _write_temp_file(path.parent, path.name, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _sync_folder(path.parent)  # make the rename itself durable


def _write_temp_file(folder: Path, name: str, data: bytes, mode: int) -> str:
    """A fsynced temp file ``.<name>.*.tmp`` in ``folder`` holding ``data`` with ``mode``; its path.

    The first half of both writers below: the caller renames or links it into place (a partial temp
    file is removed here when the write fails)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_new_file(folder: Path, stem: str, data: bytes | Callable[[str], bytes], suffix: str = ".json",
                   mode: int = 0o600, ours: bool = True) -> Path:
    """Keep ``data`` as ``<folder>/<stem>[-N]<suffix>`` under a name no other writer gets; the path.

    The one primitive of the result store (issue 22 item 12): the bytes go to a temp file created with
    O_EXCL (mkstemp) and fsynced, then ``link``ed to the final name.  A link never replaces an existing
    file (EEXIST: the next N is tried), so two runs saving in the same second never share a path, and a
    reader sees either no file or the whole one.  The temp name is removed after, so the kept file has
    one link (the readers refuse hard links in private folders).  ``data`` may be a function of the
    chosen name (a record that holds its own id).  ``ours=False``: a folder the user named (a bundle into
    ``~/reports``) is used as it is, neither created nor tightened to 0700."""
    folder = ensure_private_dir(folder) if ours else Path(folder)
    for n in range(1, 10_000):
        name = stem if n == 1 else f"{stem}-{n}"
        path = folder / f"{name}{suffix}"
        if os.path.lexists(path):
            continue
        payload = data(name) if callable(data) else data
        tmp = _write_temp_file(folder, name, payload, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            continue  # another writer took this name between the check and the link
        finally:
            os.unlink(tmp)
        _sync_folder(folder)
        return path
    raise FileExistsError(errno.EEXIST, f"no free name for {stem}{suffix} after 9999 tries", str(folder))


def _sync_folder(folder: Path) -> None:
    try:  # make a new name (rename or link) itself durable
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_json(path: Path, obj: Any, mode: int = 0o600) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", mode)


def read_json(path: Path, default: Any = None, kind: Any = None) -> Any:
    """The JSON in ``path`` read by `sessions.safe_files` as ``kind`` (default: any file, 16 MiB at most),
    or ``default`` when it is missing, too large, not UTF-8, not JSON or nested too deeply.  A FIFO, a
    device, or (for a private kind) a symlink or hard link raises ``SpecialFileError`` (an OSError) at
    once instead of blocking or being read."""
    from sessions import safe_files

    try:
        return safe_files.read_json(path, kind or safe_files.ANY_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return default
    except safe_files.SpecialFileError:
        raise
    except safe_files.FileRefused:
        return default
