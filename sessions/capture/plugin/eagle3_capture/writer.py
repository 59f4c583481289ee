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
import json
import logging
import mmap
import os
import queue
import re
import stat
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
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
    what = f"capture dir {directory}"
    if create:
        parent = os.path.dirname(directory)
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o700, exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass  # checked below like any pre-existing folder
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise CaptureDirError(f"{what} does not exist") from None
    except OSError as exc:
        # O_NOFOLLOW on a symlink fails with ELOOP, or ENOTDIR together with O_DIRECTORY: ask lstat.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CaptureDirError(f"{what} refused: {_not_a_dir_reason(directory)}") from None
        raise CaptureDirError(f"{what} cannot be opened: {exc.strerror}") from None
    try:
        _check_owned_private(os.fstat(fd), what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_rid_dir(dir_fd: int, directory: str, rid: str, create: bool) -> int | None:
    what = f"rid folder {os.path.join(directory, rid)}"
    if create:
        try:
            os.mkdir(rid, 0o700, dir_fd=dir_fd)
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
            raise CaptureDirError(f"{what} refused: {_not_a_dir_reason(rid, dir_fd)}") from None
        raise
    try:
        _check_owned_private(os.fstat(fd), what)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
def _dtype_code(tensor: torch.Tensor) -> str:
    import torch

    codes = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
             torch.int64: "I64", torch.int32: "I32"}
    try:
        return codes[tensor.dtype]
    except KeyError:
        raise TypeError(f"unsupported dtype {tensor.dtype}") from None


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    import torch

    flat = tensor.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return memoryview(flat.view(torch.uint8).numpy())


def _writev_all(fd: int, views: list[memoryview]) -> None:
    """Header and tensors in one ``writev`` (the kernel caps one call near 2 GiB: loop on short writes)."""
    pending = [v.cast("B") if v.format != "B" else v for v in views]
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
    aux = aux.detach().to("cpu", torch.bfloat16)
    last = last.detach().to("cpu", torch.bfloat16) if last is not None else None
    input_ids = input_ids.detach().to("cpu", torch.int64)
    hidden_size = int(meta.get("hidden_size") or (last.shape[1] if last is not None else 0))
    base_meta = {
        "format": FORMAT,
        "layers": json.dumps([int(v) for v in (meta.get("layers") or [])]),
        "hidden_size": str(hidden_size),
        "sglang_version": str(meta.get("sglang_version") or "unknown"),
    }
    if meta.get("draft_layer_ids") is not None:
        base_meta["draft_layer_ids"] = json.dumps([int(v) for v in meta["draft_layer_ids"]])

    directory = os.path.abspath(os.fspath(directory))
    written: list[str] = []
    dir_fd = _open_capture_dir(directory, create=True)
    assert dir_fd is not None
    try:
        row = 0
        for rid, prefix, n in zip(rids, prefix_lens, seq_lens):
            start, n = int(prefix), int(n)
            end = start + n
            rows = slice(row, row + n)
            row += n
            if n == 0:
                continue
            # input_ids first: right after the 8-byte-padded header, the int64 rows stay aligned.
            tensors = [("input_ids", input_ids[rows]), ("aux", aux[rows])]
            if last is not None:
                tensors.append(("last", last[rows]))
            metadata = dict(base_meta, rid=rid, start=str(start), end=str(end))
            rid_fd = _open_rid_dir(dir_fd, directory, rid, create=True)
            assert rid_fd is not None
            try:
                name = chunk_name(start, end)
                _write_chunk_file(rid_fd, name, tensors, metadata, fsync)
                written.append(os.path.join(directory, rid, name))
            finally:
                os.close(rid_fd)
    finally:
        os.close(dir_fd)
    return written


def write_error_marker(directory: str | os.PathLike, rid: str, message: str) -> None:
    """Best effort: tell the collector that a chunk of ``rid`` was lost (``<dir>/<rid>/error.json``)."""
    validate_rid(rid)
    directory = os.path.abspath(os.fspath(directory))
    dir_fd = _open_capture_dir(directory, create=True)
    assert dir_fd is not None
    try:
        rid_fd = _open_rid_dir(dir_fd, directory, rid, create=True)
        assert rid_fd is not None
        try:
            fd = os.open(ERROR_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=rid_fd)
            try:
                os.write(fd, json.dumps({"rid": rid, "error": message}).encode("utf-8") + b"\n")
            finally:
                os.close(fd)
        finally:
            os.close(rid_fd)
    finally:
        os.close(dir_fd)


# -- reading back -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkInfo:
    """One chunk file of a rid, by name: ``<start>-<end>.safetensors``."""

    start: int
    end: int
    name: str


def list_chunks(directory: str | os.PathLike, rid: str) -> list[ChunkInfo]:
    """The chunk files of ``rid`` sorted by start (tmp files and markers are skipped); [] when none."""
    validate_rid(rid)
    directory = os.path.abspath(os.fspath(directory))
    dir_fd = _open_capture_dir(directory, create=False, missing_ok=True)
    if dir_fd is None:
        return []
    try:
        rid_fd = _open_rid_dir(dir_fd, directory, rid, create=False)
        if rid_fd is None:
            return []
        try:
            return _list_chunk_names(rid_fd)
        finally:
            os.close(rid_fd)
    finally:
        os.close(dir_fd)


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
    validate_rid(rid)
    directory = os.path.abspath(os.fspath(directory))
    dir_fd = _open_capture_dir(directory, create=False, missing_ok=True)
    if dir_fd is None:
        return None
    try:
        rid_fd = _open_rid_dir(dir_fd, directory, rid, create=False)
        if rid_fd is None:
            return None
        try:
            try:
                fd = os.open(ERROR_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=rid_fd)
            except FileNotFoundError:
                return None
            with os.fdopen(fd, "rb") as fh:
                data = fh.read(1 << 16)
            try:
                return str(json.loads(data).get("error", ""))
            except (ValueError, AttributeError):
                return data.decode("utf-8", "replace")
        finally:
            os.close(rid_fd)
    finally:
        os.close(dir_fd)


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

    validate_rid(rid)
    directory = os.path.abspath(os.fspath(directory))
    where = os.path.join(directory, rid)
    dir_fd = _open_capture_dir(directory, create=False)
    assert dir_fd is not None
    try:
        rid_fd = _open_rid_dir(dir_fd, directory, rid, create=False)
        if rid_fd is None:
            raise ChunkError(f"{where}: no chunks (folder missing)")
        try:
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
        finally:
            os.close(rid_fd)
    finally:
        os.close(dir_fd)

    def joined(items: list[torch.Tensor]) -> torch.Tensor:
        return items[0] if len(items) == 1 else torch.cat(items, dim=0)

    last = joined(parts["last"]) if parts["last"] else None
    return joined(parts["aux"]), last, joined(parts["input_ids"])


def read_chunk_metadata(directory: str | os.PathLike, rid: str) -> dict[str, str]:
    """The metadata of ``rid``'s first chunk (layers, hidden size, SGLang version, ...)."""
    chunks = list_chunks(directory, rid)
    if not chunks:
        raise ChunkError(f"{os.path.join(os.fspath(directory), rid)}: no chunks")
    directory = os.path.abspath(os.fspath(directory))
    dir_fd = _open_capture_dir(directory, create=False)
    assert dir_fd is not None
    try:
        rid_fd = _open_rid_dir(dir_fd, directory, rid, create=False)
        assert rid_fd is not None
        try:
            fd = os.open(chunks[0].name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=rid_fd)
            with os.fdopen(fd, "rb") as fh:
                header_len = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(header_len))
        finally:
            os.close(rid_fd)
    finally:
        os.close(dir_fd)
    return dict(header.get("__metadata__") or {})


def remove_chunks(directory: str | os.PathLike, rid: str) -> int:
    """Delete ``rid``'s folder (chunks, tmp leftovers, error marker) once consumed; return files removed.

    Only plain files directly inside the rid folder are removed, through the folder's fd, so nothing
    outside the capture dir can be reached.
    """
    validate_rid(rid)
    directory = os.path.abspath(os.fspath(directory))
    dir_fd = _open_capture_dir(directory, create=False, missing_ok=True)
    if dir_fd is None:
        return 0
    removed = 0
    try:
        rid_fd = _open_rid_dir(dir_fd, directory, rid, create=False)
        if rid_fd is None:
            return 0
        try:
            for name in os.listdir(rid_fd):
                st = os.stat(name, dir_fd=rid_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    os.unlink(name, dir_fd=rid_fd)
                    removed += 1
        finally:
            os.close(rid_fd)
        try:
            os.rmdir(rid, dir_fd=dir_fd)
        except OSError:
            pass  # something else (a folder) was put there: leave it
    finally:
        os.close(dir_fd)
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

    def __init__(self, directory: str, queue_depth: int = 4, fsync: bool = True,
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
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(job)
            finally:
                self._queue.task_done()

    def _write(self, job: _Job) -> None:
        try:
            if job.ready is not None:
                job.ready.synchronize()
            paths = write_chunks(self.directory, job.rids, job.prefix_lens, job.seq_lens, job.aux,
                                 job.last, job.input_ids, job.meta, fsync=self.fsync)
            self.chunks_written += len(paths)
            for tensor in (job.aux, job.last, job.input_ids):
                if tensor is not None:
                    self.bytes_written += tensor.numel() * tensor.element_size()
        except BaseException as exc:  # noqa: BLE001 - a failed write must be reported, never lost
            self.failures += 1
            logger.error("eagle3-capture: writing chunks of %s failed: %s", job.rids, exc)
            for rid in job.rids:
                with contextlib.suppress(Exception):  # the disk may be full; the log line stands
                    write_error_marker(self.directory, rid, f"{type(exc).__name__}: {exc}")
            if self.on_error is not None:
                self.on_error(job.rids, exc)
