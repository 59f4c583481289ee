"""The one reader of every file the app reads: regular files only, never waited on, bounded, parsed safely.

Every file eagle3-tui reads goes through here (tests/test_one_file_reader.py fails when a module reads one
another way): profiles, ``state.json``, start facts, command records, bench and compare results, the start
history, job specs, manifests, model configs, settings, datasets and the session log's descriptor.

- **Never waited on.** A FIFO blocks ``open()`` until a writer comes, ``/dev/zero`` and ``/dev/urandom``
  never end, a directory or a socket is no file at all.  Files are opened with ``O_NONBLOCK`` (a FIFO
  opens at once), then ``fstat`` on the open descriptor (no race with a swapped path) refuses anything but
  a regular file, with an error naming the path and what it is.
- **Private files stay private.** A file eagle3-tui wrote under its home (`Kind.private`) is opened with
  ``O_NOFOLLOW`` and refused when it has more than one name (``st_nlink > 1``): a ``server.log`` hard-linked
  to ``/etc/shadow`` must not reach ``logs`` or the bundle.
- **Bounded.** Each kind of file has a size cap (`Kind.max_bytes`); the cap is checked on the bytes read,
  not on ``st_size`` (which ``/proc`` files and growing files get wrong).
- **Parsed safely.** JSON is checked for nesting depth before it is parsed (a deeply nested ``state.json``
  raised RecursionError), text for UTF-8.  `finite`, `integer`, `text` and `text_list` are the field
  checks the typed records built from a parsed file use.

Every refusal is a `FileRefused` (an OSError): callers list it with its file and skip that file alone.
`describe_os_error` words any other OSError the same way (a name over 255 characters, a file where a folder
is expected), for the CLI's last line of defence.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, BinaryIO

KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True)
class Kind:
    """What a file is to the app: its name in messages, its size cap, and whether it is private."""

    what: str
    max_bytes: int | None  # None: read in bounded pieces by its reader (a log, a dataset), never whole
    private: bool = False  # written by eagle3-tui under its home: no symlink followed, no hard link
    nofollow: bool | None = None  # None: as ``private``; False: a private kind reached through a symlink
    max_depth: int = 64  # JSON nesting allowed (our files nest 5 deep at most)


# Files eagle3-tui writes under its home (private).
STATE = Kind("state file", 16 * MiB, private=True)
START_FACTS = Kind("start facts", 4 * MiB, private=True)
SESSION_RECORD = Kind("session record", 16 * MiB, private=True)  # command.json, emulated_gpus.json, ...
SECRETS = Kind("secrets file", 1 * MiB, private=True)
SERVER_LOG = Kind("server log", None, private=True)
BENCH_RESULT = Kind("bench result", 32 * MiB, private=True)
START_HISTORY = Kind("start history", 64 * MiB, private=True)
JOB_RECORD = Kind("job record", 16 * MiB, private=True)  # job.json, dataset.json, errors
NOTE = Kind("note", 64 * KiB, private=True)
# Files the user names or keeps (may be symlinks, as a Hugging Face cache is; may be hard links).
PROFILE = Kind("profile", 1 * MiB)
JOB_SPEC = Kind("job spec", 1 * MiB)
SETTINGS = Kind("settings file", 1 * MiB)
MODEL_CONFIG = Kind("model config", 16 * MiB)
WEIGHT_INDEX = Kind("weight index", 64 * MiB)
WEIGHTS = Kind("model weights", None)  # hashed in bounded pieces, or mapped by safetensors (`opened_path`)
DATASET = Kind("dataset", None)
SOURCE = Kind("source file", 16 * MiB)  # an installed SGLang's sources, read as text, never run
LOG = Kind("log", None)
CATALOGUE = Kind("known causes catalogue", 4 * MiB)
# What an extraction job writes to its output folder (SpecForge's layout, meant to be shared: 0644).
MANIFEST = Kind("manifest", 1024 * MiB)
OUTPUT_RECORD = Kind("output record", 16 * MiB)  # dataset.json
OUTPUT_DATA = Kind("output file", None)  # tensors, errors.jsonl: read in bounded pieces
ANY_FILE = Kind("file", 16 * MiB)


class FileRefused(OSError):
    """The file was not read: not a regular file, a hard link, too large, not text or JSON, nested too
    deeply.  The message names the file and the problem; ``kind`` names the problem in a few words
    ("a FIFO (named pipe)", "a symlink", "a hard link", "too large", ...) for callers that word it
    their way."""

    def __init__(self, err: int, message: str, kind: str = "not a regular file") -> None:
        super().__init__(err, message)
        self.kind = kind

    def __str__(self) -> str:
        return str(self.strerror)


class SpecialFileError(FileRefused):
    """The path is not a regular file (or is a symlink or hard link where none is allowed)."""


def file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "not a regular file"


def _open_fd(path: str | os.PathLike, what: str, nofollow: bool, single_link: bool) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if nofollow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except ValueError:  # "embedded null byte": a name from a JSON or TOML value may hold a \u0000
        raise FileRefused(errno.EINVAL, f"{what} {str(path)!r}: the name holds a NUL byte; it is not read",
                          "a NUL in the name") from None
    except OSError as exc:
        if nofollow and exc.errno == errno.ELOOP:
            raise SpecialFileError(errno.ELOOP, f"{what} {path} is a symlink; it is not followed",
                                   "a symlink") from None
        if exc.errno == errno.ENXIO:  # a socket file, or a FIFO opened for writing without a reader
            raise SpecialFileError(errno.ENXIO, f"{what} {path} is a socket (or a device with nothing behind it), "
                                                "not a regular file", "a socket") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = file_kind(st.st_mode)
            raise SpecialFileError(errno.EINVAL, f"{what} {path} is {kind}, not a regular file", kind)
        if single_link and st.st_nlink > 1:
            raise SpecialFileError(errno.EPERM, f"{what} {path} has {st.st_nlink} names (a hard link): its "
                                                "content may be another file's, so it is not read", "a hard link")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_fd(path: str | os.PathLike, kind: Kind) -> int:
    """A blocking read-only fd of the regular file at ``path`` as ``kind`` allows; `FileRefused` else.

    Other OSErrors (missing, no permission, a name too long) pass through for the caller to word
    (`describe_os_error`)."""
    return _open_fd(path, kind.what, kind.private if kind.nofollow is None else kind.nofollow, kind.private)


@contextmanager
def open_file(path: str | os.PathLike, kind: Kind) -> Iterator[BinaryIO]:
    """``open(path, "rb")`` as ``kind`` allows (for readers that stream: datasets, logs)."""
    with os.fdopen(open_fd(path, kind), "rb") as fh:
        yield fh


@contextmanager
def opened_path(path: str | os.PathLike, kind: Kind) -> Iterator[str]:
    """A path to the regular file ``path`` opened as ``kind`` allows, for a library that opens files by name
    itself (``torch.load(..., mmap=True)``, safetensors' ``safe_open``): ``/proc/self/fd/N`` of the fd held
    here, so the library reopens the very file checked (a FIFO planted as ``model.safetensors`` or
    ``data_3.ckpt`` made them wait for a writer for good; a path swapped after a check reaches nothing)."""
    fd = open_fd(path, kind)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _read_capped(fh: BinaryIO, path: str | os.PathLike, what: str, limit: int | None) -> bytes:
    if limit is None:
        return fh.read()
    data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(errno.EFBIG, f"{what} {path} is larger than {_size(limit)}; it is not read", "too large")
    return data


def read_file_tail(path: str | os.PathLike, kind: Kind, max_bytes: int) -> tuple[bytes, int]:
    """The last ``max_bytes`` of ``path`` (opened as ``kind`` allows) and the offset they start at: the
    bounded read of a file that may be larger than anyone wants whole (a log, errors.jsonl)."""
    with open_file(path, kind) as fh:
        start = max(0, os.fstat(fh.fileno()).st_size - max_bytes)
        fh.seek(start)
        return fh.read(max_bytes), start


def check_file(path: str | os.PathLike, kind: Kind) -> None:
    """Raise `FileRefused` now when ``path`` exists and is no file ``kind`` allows (never opens a FIFO)."""
    os.close(open_fd(path, kind))


def read_bytes(path: str | os.PathLike, kind: Kind) -> bytes:
    """The bytes of ``path``: `FileRefused` when it is not a regular file, or is over ``kind``'s cap."""
    with open_file(path, kind) as fh:
        return _read_capped(fh, path, kind.what, kind.max_bytes if kind.max_bytes is not None else 256 * MiB)


def read_text(path: str | os.PathLike, kind: Kind, errors: str = "strict") -> str:
    """The UTF-8 text of ``path`` (see `read_bytes`); with ``errors="strict"`` bad UTF-8 is a `FileRefused`."""
    return _decode(read_bytes(path, kind), f"{kind.what} {path}", errors)


def read_lines(path: str | os.PathLike, kind: Kind) -> list[str]:
    """The lines of ``path`` (undecodable bytes replaced); a missing file has none."""
    try:
        return read_text(path, kind, errors="replace").splitlines()
    except FileNotFoundError:
        return []


def read_json(path: str | os.PathLike, kind: Kind) -> Any:
    """The JSON value in ``path``; `FileRefused` for a special file, a hard link (private kinds), a file over
    the cap, bad UTF-8, bad JSON or nesting deeper than ``kind.max_depth``.  FileNotFoundError passes."""
    return parse_json(read_bytes(path, kind), f"{kind.what} {path}", kind.max_depth)


def parse_json(data: bytes | str, where: str, max_depth: int = 64) -> Any:
    """``json.loads`` that never recurses past ``max_depth`` (checked first, without recursion) and words
    every failure as a `FileRefused` naming ``where``."""
    text = _decode(data, where, "strict") if isinstance(data, bytes) else data
    depth = json_depth(text)
    if depth > max_depth:
        raise FileRefused(errno.EINVAL, f"{where}: JSON nested {depth} deep (at most {max_depth} is read)",
                          "nested too deeply")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        problem = "empty" if not text.strip() else f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        raise FileRefused(errno.EINVAL, f"{where}: {problem}", "not JSON") from None
    except ValueError as exc:  # an integer past Python's 4300-digit conversion limit is no JSONDecodeError
        raise FileRefused(errno.EINVAL, f"{where}: not valid JSON ({str(exc).split(':')[0]})", "not JSON") from None
    except RecursionError:  # the depth check counts brackets; this is its backstop
        raise FileRefused(errno.EINVAL, f"{where}: JSON nested too deeply", "nested too deeply") from None


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))


def json_kind(value: Any) -> str:
    """What JSON calls ``value``'s kind ("object", "array", "string", "number", "boolean", "null"): the one
    naming every reason about a JSON value of the wrong kind uses (state files, server answers, the bench)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string", type(None): "null"}.get(type(value), type(value).__name__)


def json_depth(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (brackets inside strings do not count).
    Strings are blanked by one regex, the brackets kept by ``bytes.translate`` and summed by
    ``accumulate``: no recursion and no Python loop per character."""
    if text.count("[") + text.count("{") <= 1:
        return int("[" in text or "{" in text)
    brackets = _JSON_STRING.sub('""', text).encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


def _decode(data: bytes, where: str, errors: str) -> str:
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise FileRefused(errno.EILSEQ, f"{where}: not UTF-8 text (byte {exc.start})", "not UTF-8") from None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= MiB else f"{n >> 10} KiB"


# -- typed fields of a parsed record ---------------------------------------------------------------------


def finite(value: Any, lo: float = -1e18, hi: float = 1e18) -> float | None:
    """``value`` as a float when it is a finite number within [lo, hi] (not a bool, NaN, 1e300 or "12")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) and lo <= number <= hi else None


def integer(value: Any, lo: int = -(1 << 62), hi: int = 1 << 62) -> int | None:
    """``value`` when it is an int within [lo, hi] (not a bool, not a float, not a string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if lo <= value <= hi else None


def text(value: Any, max_chars: int = 4096) -> str | None:
    """``value`` when it is a string of at most ``max_chars``."""
    return value if isinstance(value, str) and len(value) <= max_chars else None


def text_list(value: Any, max_items: int = 4096) -> list[str] | None:
    """``value`` when it is a list of strings (a command line), else None."""
    if not isinstance(value, list) or len(value) > max_items or not all(isinstance(v, str) for v in value):
        return None
    return list(value)


def epoch(value: Any) -> float | None:
    """A wall-clock time (seconds since 1970) that ``time.localtime`` can show: 1970..9999."""
    return finite(value, 0.0, 253402300799.0)


# -- wording any other OSError ----------------------------------------------------------------------------


def describe_os_error(exc: OSError, path: str | os.PathLike | None = None) -> str:
    """One sentence naming the path and the problem: a file where a folder is expected, a name over 255
    characters, no permission, ... (the CLI prints it instead of a traceback)."""
    if isinstance(exc, FileRefused) or (exc.errno == errno.ENOTDIR and "folder is expected" in str(exc.strerror)):
        return str(exc.strerror)
    where = path if path is not None else exc.filename
    shown = _shown_path(where)
    if exc.errno == errno.ENAMETOOLONG:
        longest = max((len(part) for part in Path(str(where)).parts), default=0) if where is not None else 0
        detail = f" (a part has {longest} characters; at most 255 are allowed)" if longest > 255 else ""
        return f"{shown}: name too long{detail}"
    if exc.errno == errno.ENOTDIR and where is not None:
        blocker = _file_in_the_way(Path(str(where)))
        if blocker is not None:
            needed = "" if blocker == Path(str(where)) else f" (needed for {shown})"
            return f"{_shown_path(blocker)} is a file where a folder is expected{needed}"
        return f"{shown}: a part of this path is not a folder"
    if exc.errno == errno.EISDIR:
        return f"{shown} is a folder where a file is expected"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{shown}: permission denied"
    if exc.errno == errno.ELOOP:
        return f"{shown}: too many levels of symlinks"
    if exc.errno == errno.ENOSPC:
        return f"{shown}: no space left on the device"
    return f"{shown}: {exc.strerror or exc}"


def folder_exists(path: str | os.PathLike, what: str = "folder") -> bool:
    """True for a folder, False when it is simply not there yet; NotADirectoryError naming the file when it,
    or a folder above it, is a file (adv22: ``<home>/config`` or ``<state>/jobs`` as a file listed "no
    profiles" and "no extraction jobs", which hid every one of them)."""
    folder = Path(path)
    if folder.is_dir():
        return True
    blocker = _file_in_the_way(folder)
    if blocker is None:
        return False
    needed = "" if blocker == folder else f" (needed for the {what} {_shown_path(folder)})"
    raise NotADirectoryError(errno.ENOTDIR, f"{_shown_path(blocker)} is a file where a folder is expected{needed}",
                             str(folder))


def _shown_path(path: str | os.PathLike | None) -> str:
    if path is None:
        return "a file"
    shown = str(path)
    return shown if len(shown) <= 200 else shown[:120] + f"…({len(shown)} characters)…" + shown[-60:]


def _file_in_the_way(path: Path) -> Path | None:
    """The first part of ``path`` (or ``path`` itself) that exists and is not a folder (the cause of ENOTDIR)."""
    for parent in (*reversed(path.parents), path):
        try:
            mode = os.lstat(parent).st_mode
        except OSError:
            return None
        if not stat.S_ISDIR(mode) and not stat.S_ISLNK(mode):
            return parent
    return None
