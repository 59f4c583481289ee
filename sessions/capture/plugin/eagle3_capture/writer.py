"""The capture dump format (DESIGN §5, contract): writing, reading and the capture dir's safety rules.

One file per request chunk: ``<dir>/<rid>/<prefix_len>-<end>.safetensors`` holding ``aux`` [n, K·H] bf16,
``last`` [n, H] bf16 and ``input_ids`` [n] int64, with string metadata ``format``, ``rid``, ``start``,
``end``, ``layers`` (JSON list of physical capture points), ``hidden_size``, ``sglang_version`` (and
``draft_layer_ids`` when known).  Chunks are keyed on (rid, prefix_len) because chunked prefill runs one
prompt as several extend forwards (sglang-facts §4.8).

Safety: the capture dir and every rid folder are 0700, owned by us, and never symlinks.  Everything is
opened relative to directory file descriptors with ``O_NOFOLLOW``, so a folder swapped for a symlink
after the check cannot redirect a write.  Files are written to a dot-named tmp file, fsynced and renamed,
so a reader never sees a partial chunk.  Nothing here pickles.

This module ships inside the self-contained plugin directory and is the same code that
``sessions.capture.writer`` re-exports.  The standard library is imported at the top; torch only inside
the functions that handle tensors, so the directory checks stay importable without torch.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import mmap
import os
import queue
import re
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

FORMAT = "eagle3-capture/1"
CHUNK_SUFFIX = ".safetensors"
ERROR_FILE = "error.json"
_CHUNK_NAME_RE = re.compile(r"^(\d+)-(\d+)\.safetensors$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_IOV_MAX = 64
_MAX_BATCH = 64  # chunks the background writer takes in one pass
_DTYPE_CODES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4}

logger = logging.getLogger("eagle3_capture")


class CaptureDirError(RuntimeError):
    """A refusal: the capture dir (or a rid folder) is unsafe, or a rid is not a safe folder name."""


class ChunkError(RuntimeError):
    """The chunks of one rid cannot be read back as one contiguous prompt."""


# -- the directory rules ------------------------------------------------------------------------------
def validate_rid(rid: object) -> str:
    """A rid becomes a folder name: refuse anything that could leave the capture dir or hide a file."""
    if not isinstance(rid, str) or not rid:
        raise CaptureDirError(f"rid {rid!r} refused: it must be a non-empty string")
    if "/" in rid or "\\" in rid or "\0" in rid or ".." in rid or rid.startswith("."):
        raise CaptureDirError(
            f"rid {rid!r} refused: a rid may not contain '/', '\\', NUL or '..', nor start with '.'"
        )
    if len(rid.encode("utf-8", "surrogateescape")) > 200:
        raise CaptureDirError(f"rid {rid[:40]!r}... refused: longer than 200 bytes")
    return rid


def _check_owned_private(st: os.stat_result, what: str) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise CaptureDirError(f"{what} refused: not a directory")
    if st.st_uid != os.geteuid():
        raise CaptureDirError(
            f"{what} refused: owned by uid {st.st_uid}, not by us (uid {os.geteuid()}); "
            "pick another capture dir"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise CaptureDirError(
            f"{what} refused: mode {mode:04o} lets other users in; capture dirs must be 0700 "
            "(chmod 700 it, or pick another dir)"
        )


def check_capture_dir(path: str | os.PathLike, create: bool = False) -> str:
    """Check (and with ``create``, make) the capture dir; return its absolute path or raise CaptureDirError.

    Refused: a symlink (even to a folder of ours), a non-directory, a folder owned by another user, and a
    folder with any group/other permission bits.  A missing dir is fine when ``create`` is False (the
    writer makes it 0700 on first use).
    """
    fd = _open_capture_dir(path, create=create, missing_ok=not create)
    if fd is not None:
        os.close(fd)
    return os.path.abspath(os.fspath(path))


def _open_capture_dir(path: str | os.PathLike, create: bool, missing_ok: bool = False) -> int | None:
    directory = os.path.abspath(os.fspath(path))
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        if create:  # first use: make it 0700 (and its parents), then open it like any existing folder
            os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
            return _open_capture_dir(directory, create=False)
        if missing_ok:
            return None
        raise CaptureDirError(f"capture dir {directory} does not exist") from None
    except OSError as exc:
        # O_NOFOLLOW on a symlink fails with ELOOP, or ENOTDIR together with O_DIRECTORY: ask lstat.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CaptureDirError(f"capture dir {directory} refused: {_not_a_dir_reason(directory)}") from None
        raise CaptureDirError(f"capture dir {directory} cannot be opened: {exc.strerror}") from None
    return _checked(fd, f"capture dir {directory}")


def _open_rid_dir(dir_fd: int, directory: str, rid: str, create: bool) -> int | None:
    made = False
    if create:
        try:
            os.mkdir(rid, 0o700, dir_fd=dir_fd)
            made = True  # ours and at most 0700; only our uid can write in the (checked) capture dir
        except FileExistsError:
            pass
    try:
        fd = os.open(rid, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CaptureDirError(f"rid folder {os.path.join(directory, rid)} refused: "
                                  f"{_not_a_dir_reason(rid, dir_fd)}") from None
        raise
    return fd if made else _checked(fd, f"rid folder {os.path.join(directory, rid)}")


def _checked(fd: int, what: str) -> int:
    """``fd`` when it is a private folder of ours; otherwise closed, and CaptureDirError."""
    try:
        _check_owned_private(os.fstat(fd), what)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class _Folder:
    directory: str  # the capture dir, absolute
    dir_fd: int
    rid_fd: int


@contextlib.contextmanager
def _capture_dir(directory: str | os.PathLike, create: bool = False,
                 missing_ok: bool = False) -> Iterator[tuple[int | None, str]]:
    """``(fd, absolute path)`` of the checked capture dir, closed on exit; fd None when missing_ok."""
    directory = os.path.abspath(os.fspath(directory))
    dir_fd = _open_capture_dir(directory, create=create, missing_ok=missing_ok)
    try:
        yield dir_fd, directory
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


@contextlib.contextmanager
def _rid_folder(directory: str | os.PathLike, rid: str, create: bool = False,
                missing_ok: bool = False) -> Iterator[_Folder | None]:
    """The checked capture dir and rid folder, opened without following links and closed on exit.
    None when the rid folder (or, with ``missing_ok``, the capture dir) does not exist."""
    validate_rid(rid)
    with _capture_dir(directory, create=create, missing_ok=missing_ok) as (dir_fd, path):
        rid_fd = None if dir_fd is None else _open_rid_dir(dir_fd, path, rid, create=create)
        try:
            yield None if rid_fd is None or dir_fd is None else _Folder(path, dir_fd, rid_fd)
        finally:
            if rid_fd is not None:
                os.close(rid_fd)


def _not_a_dir_reason(path: str, dir_fd: int | None = None) -> str:
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "not a directory"
    return "it is a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"


def chunk_name(start: int, end: int) -> str:
    return f"{start}-{end}{CHUNK_SUFFIX}"


# -- safetensors, written directly ----------------------------------------------------------------------
# The safetensors layout is: 8-byte little-endian header length, a JSON header (padded with spaces to a
# multiple of 8), then the raw tensor bytes in offset order.  Writing it ourselves streams each tensor's
# memory straight to the fd; ``safetensors.torch.save`` would first build one more full copy in memory.
_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_code(tensor: torch.Tensor) -> str:
    if not _DTYPE_NAMES:
        import torch

        _DTYPE_NAMES.update({torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
                             torch.int64: "I64", torch.int32: "I32"})
    try:
        return _DTYPE_NAMES[tensor.dtype]
    except KeyError:
        raise TypeError(f"unsupported dtype {tensor.dtype}") from None


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    import torch

    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12 (3.11 has the buffer protocol too).
    return memoryview(tensor.view(torch.uint8).numpy())  # type: ignore[arg-type]  # (_writev_all flattens it)


def _writev_all(fd: int, views: list[memoryview]) -> None:
    """Header and tensors in one ``writev`` (the kernel caps one call near 2 GiB: loop on short writes)."""
    pending = [v if v.ndim == 1 and v.format == "B" else v.cast("B") for v in views]  # 1-D bytes: len = size
    pending = [v for v in pending if len(v)]
    while pending:
        n = os.writev(fd, pending[:_IOV_MAX])
        while n and pending:
            if n >= len(pending[0]):
                n -= len(pending.pop(0))
            else:
                pending[0] = pending[0][n:]
                n = 0


def _safetensors_header(tensors: Sequence[tuple[str, torch.Tensor]], metadata: Mapping[str, str]) -> bytes:
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _dtype_code(tensor), "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def _write_chunk_file(rid_fd: int, name: str, tensors: Sequence[tuple[str, torch.Tensor]],
                      metadata: Mapping[str, str], fsync: bool) -> None:
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=rid_fd)
    try:
        try:
            _writev_all(fd, [memoryview(_safetensors_header(tensors, metadata)),
                             *(_as_bytes(tensor) for _, tensor in tensors)])
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=rid_fd, dst_dir_fd=rid_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=rid_fd)
        except OSError:
            pass
        raise
    if fsync:
        os.fsync(rid_fd)  # make the rename itself durable


def write_chunks(
    directory: str | os.PathLike,
    rids: Sequence[str],
    prefix_lens: Sequence[int],
    seq_lens: Sequence[int],
    aux: torch.Tensor,
    last: torch.Tensor | None,
    input_ids: torch.Tensor,
    meta: Mapping[str, Any],
    fsync: bool = True,
) -> list[str]:
    """Write one chunk file per request; return the paths written.

    ``aux``/``last``/``input_ids`` hold the rows of every request in ``rids`` order, ``seq_lens[i]`` rows
    each (how SGLang lays out an extend forward, sglang-facts §4.6).  ``meta``: ``layers`` (physical
    capture points), ``hidden_size``, ``sglang_version`` and optionally ``draft_layer_ids``.  CPU tensors
    are expected (the plugin copies off the GPU first); ``aux``/``last`` are stored as bf16 and
    ``input_ids`` as int64.
    """
    chunks = _prepare_chunks(rids, prefix_lens, seq_lens, aux, last, input_ids, meta)
    with _capture_dir(directory, create=True) as (dir_fd, path):
        assert dir_fd is not None
        return _write_prepared(dir_fd, path, chunks, fsync)


@dataclass
class _Chunk:
    rid: str
    start: int
    end: int
    tensors: list  # (name, tensor) in file order
    metadata: dict


def _prepare_chunks(rids: Sequence[str], prefix_lens: Sequence[int], seq_lens: Sequence[int], aux: Any,
                    last: Any, input_ids: Any, meta: Mapping[str, Any]) -> list[_Chunk]:
    """Check the arguments and cut the rows into one chunk per request (no I/O)."""
    import torch

    if sys.byteorder != "little":  # safetensors is little-endian and we write raw memory
        raise RuntimeError("the capture writer needs a little-endian host")
    if not (len(rids) == len(prefix_lens) == len(seq_lens)):
        raise ValueError(f"rids ({len(rids)}), prefix_lens ({len(prefix_lens)}) and seq_lens "
                         f"({len(seq_lens)}) must have the same length")
    for rid in rids:
        validate_rid(rid)
    total = sum(int(n) for n in seq_lens)
    for label, tensor, ndim in (("aux", aux, 2), ("last", last, 2), ("input_ids", input_ids, 1)):
        if tensor is None:
            if label == "last":
                continue
            raise ValueError(f"{label} is required")
        if tensor.dim() != ndim or tensor.shape[0] != total:
            raise ValueError(f"{label} has shape {tuple(tensor.shape)}; expected {ndim} dims and "
                             f"{total} rows (the sum of seq_lens)")
    if any(int(p) < 0 for p in prefix_lens) or any(int(n) < 0 for n in seq_lens):
        raise ValueError("prefix_lens and seq_lens must be >= 0")
    aux = _on_cpu_as(aux, torch.bfloat16)
    last = _on_cpu_as(last, torch.bfloat16) if last is not None else None
    input_ids = _on_cpu_as(input_ids, torch.int64)
    hidden_size = int(meta.get("hidden_size") or (last.shape[1] if last is not None else 0))
    base_meta = _base_metadata(tuple(meta.get("layers") or ()), hidden_size, meta.get("sglang_version"),
                               tuple(meta["draft_layer_ids"]) if meta.get("draft_layer_ids") is not None else None)
    chunks = []
    whole = len(rids) == 1  # the common case: one request, no slicing
    row = 0
    for rid, prefix, n in zip(rids, prefix_lens, seq_lens):
        start, n = int(prefix), int(n)
        rows = slice(row, row + n)
        row += n
        if n == 0:
            continue
        # input_ids first: right after the 8-byte-padded header, the int64 rows stay aligned.
        tensors = [("input_ids", input_ids if whole else input_ids[rows]), ("aux", aux if whole else aux[rows])]
        if last is not None:
            tensors.append(("last", last if whole else last[rows]))
        chunks.append(_Chunk(rid, start, start + n, tensors,
                             dict(base_meta, rid=rid, start=str(start), end=str(start + n))))
    return chunks


def _on_cpu_as(tensor: Any, dtype: Any) -> Any:
    """The tensor on the CPU in ``dtype``; itself when it already is (the writer's per-chunk cost is GIL
    time taken from the scheduler, so skip what is a no-op)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.dtype != dtype or tensor.device.type != "cpu":
        tensor = tensor.to("cpu", dtype)
    return tensor


@functools.lru_cache(maxsize=16)
def _base_metadata(layers: tuple, hidden_size: int, sglang_version: Any,
                   draft_layer_ids: tuple | None) -> dict[str, str]:
    base = {
        "format": FORMAT,
        "layers": json.dumps([int(v) for v in layers]),
        "hidden_size": str(hidden_size),
        "sglang_version": str(sglang_version or "unknown"),
    }
    if draft_layer_ids is not None:
        base["draft_layer_ids"] = json.dumps([int(v) for v in draft_layer_ids])
    return base


def _write_prepared(dir_fd: int, directory: str, chunks: Sequence[_Chunk], fsync: bool) -> list[str]:
    written: list[str] = []
    for chunk in chunks:
        rid_fd = _open_rid_dir(dir_fd, directory, chunk.rid, create=True)
        assert rid_fd is not None
        try:
            name = chunk_name(chunk.start, chunk.end)
            _write_chunk_file(rid_fd, name, chunk.tensors, chunk.metadata, fsync)
            written.append(f"{directory}/{chunk.rid}/{name}")
        finally:
            os.close(rid_fd)
    return written


def write_error_marker(directory: str | os.PathLike, rid: str, message: str) -> None:
    """Best effort: tell the collector that a chunk of ``rid`` was lost (``<dir>/<rid>/error.json``)."""
    with _rid_folder(directory, rid, create=True) as folder:
        assert folder is not None
        fd = os.open(ERROR_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=folder.rid_fd)
        try:
            os.write(fd, json.dumps({"rid": rid, "error": message}).encode("utf-8") + b"\n")
        finally:
            os.close(fd)


# -- reading back -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkInfo:
    """One chunk file of a rid, by name: ``<start>-<end>.safetensors``."""

    start: int
    end: int
    name: str


def list_chunks(directory: str | os.PathLike, rid: str) -> list[ChunkInfo]:
    """The chunk files of ``rid`` sorted by start (tmp files and markers are skipped); [] when none."""
    with _rid_folder(directory, rid, missing_ok=True) as folder:
        return [] if folder is None else _list_chunk_names(folder.rid_fd)


def _list_chunk_names(rid_fd: int) -> list[ChunkInfo]:
    chunks = []
    for name in os.listdir(rid_fd):
        m = _CHUNK_NAME_RE.match(name)
        if m:
            chunks.append(ChunkInfo(int(m.group(1)), int(m.group(2)), name))
    chunks.sort(key=lambda c: (c.start, c.end))
    return chunks


def covered_tokens(chunks: Sequence[ChunkInfo]) -> int:
    """How many tokens from position 0 the chunks cover without a gap (0 when the first is missing)."""
    end = 0
    for chunk in chunks:
        if chunk.start == end and chunk.end > end:
            end = chunk.end
        elif chunk.start > end:
            break
    return end


def chunks_complete(directory: str | os.PathLike, rid: str, total_tokens: int) -> bool:
    """Whether ``rid``'s chunks cover tokens [0, total_tokens).

    The plugin writes in a background thread, so a response can arrive before its last chunk is renamed
    into place: the collector polls this before `read_chunks`.
    """
    return covered_tokens(list_chunks(directory, rid)) >= total_tokens


def read_error_marker(directory: str | os.PathLike, rid: str) -> str | None:
    """The writer's error message for ``rid`` (`write_error_marker`), or None."""
    with _rid_folder(directory, rid, missing_ok=True) as folder:
        if folder is None:
            return None
        try:
            fd = os.open(ERROR_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder.rid_fd)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(1 << 16)
    try:
        return str(json.loads(data).get("error", ""))
    except (ValueError, AttributeError):
        return data.decode("utf-8", "replace")


_MAP_FLAGS = getattr(mmap, "MAP_SHARED", 0) | getattr(mmap, "MAP_POPULATE", 0)
_READ_ONLY_WARNING_FILTERED = False


def _map_read_only(fd: int, size: int) -> Any:
    """The file's pages, mapped read-only and populated in one call: on tmpfs (/dev/shm) that is the
    page cache itself, so the collector's ``torch.save`` is the only copy of the bytes (a ``read`` into
    fresh memory cost a second copy plus a page fault per 4 KiB, ~3x the time).  Chunk files are never
    written again after their rename, and the capture dir is private to us."""
    global _READ_ONLY_WARNING_FILTERED
    if not _READ_ONLY_WARNING_FILTERED:
        import warnings

        # torch.frombuffer warns for every read-only buffer; these tensors are never written.
        warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
        _READ_ONLY_WARNING_FILTERED = True
    return mmap.mmap(fd, size, flags=_MAP_FLAGS, prot=mmap.PROT_READ)


def _read_chunk_file(rid_fd: int, chunk: ChunkInfo, path_for_errors: str) -> tuple[dict[str, torch.Tensor], dict]:
    import torch

    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
              "I64": torch.int64, "I32": torch.int32}
    try:
        fd = os.open(chunk.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=rid_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW refused a symlink
            raise CaptureDirError(f"{path_for_errors} refused: it is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ChunkError(f"{path_for_errors}: not a regular file")
        size = st.st_size
        if size < 8:
            raise ChunkError(f"{path_for_errors}: truncated file ({size} bytes)")
        buf = _map_read_only(fd, size)
    finally:
        os.close(fd)
    header_len = int.from_bytes(bytes(buf[:8]), "little")
    if header_len <= 0 or 8 + header_len > size:
        raise ChunkError(f"{path_for_errors}: bad safetensors header length {header_len}")
    try:
        header = json.loads(bytes(buf[8 : 8 + header_len]))
    except ValueError as exc:
        raise ChunkError(f"{path_for_errors}: unreadable safetensors header ({exc})") from None
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_len
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        try:
            dtype = dtypes[entry["dtype"]]
            shape = [int(v) for v in entry["shape"]]
            begin, end = (int(v) for v in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ChunkError(f"{path_for_errors}: bad header entry for {name!r}") from None
        count = 1
        for v in shape:
            count *= v
        if end - begin != count * _DTYPE_CODES[entry["dtype"]] or data_start + end > size or begin < 0:
            raise ChunkError(f"{path_for_errors}: tensor {name!r} does not fit the file")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(buf, dtype=dtype, count=count,
                                             offset=data_start + begin).view(shape)
    return tensors, metadata


def read_chunks(
    directory: str | os.PathLike, rid: str, expected_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Reassemble ``rid``'s chunks in order: ``(aux [T, K·H], last [T, H] or None, input_ids [T])``.

    Raises ChunkError when there are no chunks, when they do not start at 0, leave a gap or overlap,
    when a file's metadata or row counts disagree with its name, or (with ``expected_tokens``) when they
    do not cover exactly that many tokens.
    """
    import torch

    where = os.path.join(os.path.abspath(os.fspath(directory)), rid)
    with _rid_folder(directory, rid) as folder:
        if folder is None:
            raise ChunkError(f"{where}: no chunks (folder missing)")
        rid_fd = folder.rid_fd
        chunks = _list_chunk_names(rid_fd)
        if not chunks:
            raise ChunkError(f"{where}: no chunks")
        position = 0
        for chunk in chunks:
            if chunk.start != position:
                kind = "gap" if chunk.start > position else "overlap"
                raise ChunkError(f"{where}: {kind} at token {position}: next chunk is {chunk.name}")
            if chunk.end <= chunk.start:
                raise ChunkError(f"{where}: empty chunk {chunk.name}")
            position = chunk.end
        if expected_tokens is not None and position != expected_tokens:
            raise ChunkError(f"{where}: chunks cover {position} tokens, expected {expected_tokens}")
        parts: dict[str, list[torch.Tensor]] = {"aux": [], "last": [], "input_ids": []}
        for chunk in chunks:
            path = os.path.join(where, chunk.name)
            tensors, metadata = _read_chunk_file(rid_fd, chunk, path)
            n = chunk.end - chunk.start
            if metadata.get("rid") != rid or metadata.get("start") != str(chunk.start) \
                    or metadata.get("end") != str(chunk.end):
                raise ChunkError(f"{path}: metadata (rid, start, end) does not match the file name")
            for key in ("aux", "input_ids"):
                if key not in tensors:
                    raise ChunkError(f"{path}: no {key!r} tensor")
            for key, tensor in tensors.items():
                if key in parts:
                    if tensor.shape[0] != n:
                        raise ChunkError(f"{path}: {key!r} has {tensor.shape[0]} rows, expected {n}")
                    parts[key].append(tensor)
        if parts["last"] and len(parts["last"]) != len(chunks):
            raise ChunkError(f"{where}: 'last' is missing from some chunks")

    def joined(items: list[torch.Tensor]) -> torch.Tensor:
        return items[0] if len(items) == 1 else torch.cat(items, dim=0)

    last = joined(parts["last"]) if parts["last"] else None
    return joined(parts["aux"]), last, joined(parts["input_ids"])


def read_chunk_metadata(directory: str | os.PathLike, rid: str) -> dict[str, str]:
    """The metadata of ``rid``'s first chunk (layers, hidden size, SGLang version, ...)."""
    with _rid_folder(directory, rid) as folder:
        chunks = [] if folder is None else _list_chunk_names(folder.rid_fd)
        if folder is None or not chunks:
            raise ChunkError(f"{os.path.join(os.fspath(directory), rid)}: no chunks")
        fd = os.open(chunks[0].name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder.rid_fd)
        with os.fdopen(fd, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(header_len))
    return dict(header.get("__metadata__") or {})


def remove_chunks(directory: str | os.PathLike, rid: str) -> int:
    """Delete ``rid``'s folder (chunks, tmp leftovers, error marker) once consumed; return files removed.

    Only plain files directly inside the rid folder are removed, through the folder's fd, so nothing
    outside the capture dir can be reached.
    """
    removed = 0
    with _rid_folder(directory, rid, missing_ok=True) as folder:
        if folder is None:
            return 0
        for name in os.listdir(folder.rid_fd):
            st = os.stat(name, dir_fd=folder.rid_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                os.unlink(name, dir_fd=folder.rid_fd)
                removed += 1
        with contextlib.suppress(OSError):  # something else (a folder) was put there: leave it
            os.rmdir(rid, dir_fd=folder.dir_fd)
    return removed


# -- the background writer used inside SGLang ---------------------------------------------------------
@dataclass
class _Job:
    rids: list[str]
    prefix_lens: list[int]
    seq_lens: list[int]
    aux: Any
    last: Any
    input_ids: Any
    meta: dict
    ready: Any = None  # an object with .synchronize() (a CUDA event) when the copies are asynchronous


class BackgroundWriter:
    """Hands chunks to a thread so the forward never waits for the disk.

    The queue is bounded: when the disk falls behind, `submit` blocks (back-pressure), so nothing is
    dropped silently.  A failed write is logged with its rids and leaves an ``error.json`` marker in each
    rid folder so the collector fails that sample instead of waiting for it.
    """

    def __init__(self, directory: str, queue_depth: int = 4, fsync: bool = False,
                 on_error: Callable[[list[str], BaseException], None] | None = None) -> None:
        self.directory = directory
        self.fsync = fsync
        self.on_error = on_error
        self.chunks_written = 0
        self.bytes_written = 0
        self.failures = 0
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max(1, queue_depth))
        self._thread = threading.Thread(target=self._run, name="eagle3-capture-writer", daemon=True)
        self._thread.start()

    def submit(self, rids: Sequence[str], prefix_lens: Sequence[int], seq_lens: Sequence[int],
               aux: Any, last: Any, input_ids: Any, meta: Mapping[str, Any], ready: Any = None) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the capture writer thread has stopped")
        self._queue.put(_Job(list(rids), [int(v) for v in prefix_lens], [int(v) for v in seq_lens],
                             aux, last, input_ids, dict(meta), ready))

    def flush(self) -> None:
        """Wait until every submitted chunk is on disk (or has failed)."""
        self._queue.join()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            # Take what else is queued: one pass over the capture dir, and the forward's thread gives up
            # the GIL to this one fewer times (the cost that shows with small, fast forwards).
            while batch[-1] is not None and len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write([job for job in batch if job is not None])
            finally:
                for _ in batch:
                    self._queue.task_done()
            if batch[-1] is None:
                return

    def _write(self, jobs: list[_Job]) -> None:
        prepared = []
        for job in jobs:
            try:
                if job.ready is not None:
                    job.ready.synchronize()
                prepared.append((job, _prepare_chunks(job.rids, job.prefix_lens, job.seq_lens, job.aux,
                                                      job.last, job.input_ids, job.meta)))
            except BaseException as exc:  # noqa: BLE001 - a failed write must be reported, never lost
                self._failed(job, exc)
        if not prepared:
            return
        try:
            with _capture_dir(self.directory, create=True) as (dir_fd, path):
                assert dir_fd is not None
                for job, chunks in prepared:
                    try:
                        self.chunks_written += len(_write_prepared(dir_fd, path, chunks, self.fsync))
                        for tensor in (job.aux, job.last, job.input_ids):
                            if tensor is not None:
                                self.bytes_written += tensor.numel() * tensor.element_size()
                    except BaseException as exc:  # noqa: BLE001
                        self._failed(job, exc)
        except BaseException as exc:  # noqa: BLE001 - the capture dir itself is refused or gone
            for job, _ in prepared:
                self._failed(job, exc)

    def _failed(self, job: _Job, exc: BaseException) -> None:
        self.failures += 1
        logger.error("eagle3-capture: writing chunks of %s failed: %s", job.rids, exc)
        for rid in job.rids:
            with contextlib.suppress(Exception):  # the disk may be full; the log line stands
                write_error_marker(self.directory, rid, f"{type(exc).__name__}: {exc}")
        if self.on_error is not None:
            self.on_error(job.rids, exc)
