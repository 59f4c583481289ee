"""The output dir in SpecForge's offline format (DESIGN §6 contract, extraction-anchors §1.4), kept consistent.

Layout: ``rows_<a>-<b>/data_<i>.ckpt`` (one ``torch.save`` dict per sample, default zipfile format, never
padded), ``manifest.jsonl`` (one line per source line that reached an outcome), ``errors.jsonl`` (the
non-ok lines, derived from the manifest), ``dataset.json`` and optionally ``vocab_mapping/vocab_mapping.pt``.
Nothing else lives here: job state is under the jobs dir.

Safer than SpecForge's own script (anchors §1.6b/d): each file is written to a ``.tmp`` name (which
SpecForge's reader ignores: it keeps only ``*.ckpt``/``*.ckpt.gz``), then renamed, so no reader ever
sees a partial file.  Durability is a group commit (``commit``): a batch of renamed files is flushed with
one ``syncfs`` of the output filesystem (per-file ``fsync`` where ``syncfs`` is missing), and only then
are their manifest lines appended.  So the manifest never names a file that a power loss could take
back, and the writer threads never wait for the disk one file at a time (a per-file ``fsync`` made the
collector ~3x slower than ``cp`` of the same bytes).  ``reconcile`` makes the dir agree with its
manifest before a (re)start: a partial last line is dropped, entries whose file is missing or has the
wrong size are redone, ``.tmp`` leftovers and files without an entry (written, never committed) are
deleted.  So a SIGKILL at any instant leaves each sample either complete and listed once, or absent.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import threading
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.home import atomic_write_json

STATUSES = ("ok", "skipped", "error", "failed")
# "failed" = extraction failed (server error, bad capture): a resume tries those lines again.
_RETRY_ON_RESUME = ("failed",)
_DATA_RE = re.compile(r"^data_(\d+)\.ckpt$")
_ROWS_RE = re.compile(r"^rows_(\d+)-(\d+)$")
OUTPUT_NAMES = ("manifest.jsonl", "errors.jsonl", "dataset.json", "vocab_mapping")


class OutputDirError(RuntimeError):
    """The output dir cannot be used (in use, owned by another job, not ours)."""


@dataclass(frozen=True)
class ManifestEntry:
    """One source line's outcome.  ``path`` is relative to the output dir; ``checksum`` is ``crc32:<hex>``
    of the file's bytes."""

    index: int
    line: int
    sample_id: str
    status: str
    tokens: int = 0
    supervised_tokens: int = 0
    path: str | None = None
    bytes: int = 0
    checksum: str | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        # The one place every outcome passes: no reason, whatever raised it, is copied whole into a line.
        if self.reason is not None:
            from sessions.extraction.datasets import cut_reason

            object.__setattr__(self, "reason", cut_reason(self.reason))

    def to_json(self) -> str:
        record = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(record, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ManifestEntry:
        raw = json.loads(text)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


@dataclass(frozen=True)
class ReconcileReport:
    """What ``reconcile`` found and repaired."""

    entries: dict[int, ManifestEntry]
    dropped_partial_lines: int
    redo_missing_files: int
    removed_orphans: int
    removed_tmp: int
    retried_failed: int


# -- the checksum, in the one pass torch.save already makes ---------------------------------------------
# torch.save writes a zip whose every record is stored (not compressed) and followed by a data descriptor
# (``PK\x07\x08``, then crc32, compressed and uncompressed size) holding the crc32 that torch computed
# over the record's bytes.  A sample's bytes are almost all in its two hidden-state records (26 and 8 MB
# at H=4096, 1,000 tokens).  Computing crc32 of those again in Python was a whole extra pass over the
# sample (14 % of the job process's samples in a py-spy profile), so the writer takes the record's crc from its
# descriptor and joins it to the running file crc with ``crc32_combine``: the result is, bit for bit, crc32
# of the file's bytes.  Where the stream is not what this expects (a torch that writes differently), the
# skipped bytes are read back from the file instead (``ChecksumWriter.needs_reread``), never guessed.
_LARGE_WRITE = 1 << 16  # writes at least this big are record data whose crc comes from their descriptor
_DESCRIPTOR = b"PK\x07\x08"
_CRC_POLY = 0xEDB88320  # crc32's polynomial, bit-reflected


def _multmodp(a: int, b: int) -> int:
    """a(x)·b(x) modulo the crc32 polynomial (zlib 1.2.12 crc32.c ``multmodp``)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^n) modulo the polynomial, n = 0..31 (zlib's ``x2n_table``)
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """crc32 of A + B from crc32(A), crc32(B) and len(B) (zlib's ``crc32_combine``, missing from Python's
    ``zlib``)."""
    p, k, n = 1 << 31, 3, len2  # x^(8·len2): shift crc1 past B's bytes
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


class ChecksumWriter:
    """A write-only file wrapper that computes crc32 of what passes through (no second read of the file).

    Large writes (a record's tensor bytes) are not hashed here: their crc32 arrives in the data descriptor
    that torch writes right after them, and is combined in (see above)."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self.crc = 0
        self.size = 0
        self.needs_reread = False  # a skipped span whose descriptor did not come: read the file back
        self._pending_crc = 0  # crc of the bytes before the skipped span
        self._pending = 0  # bytes skipped since then, awaiting their descriptor

    def write(self, data: Any) -> int:
        n = len(data) if isinstance(data, bytes | bytearray) else memoryview(data).nbytes
        if n >= _LARGE_WRITE and not self.needs_reread:
            if not self._pending:
                self._pending_crc = self.crc
            self._pending += n
        else:
            if self._pending:
                self._settle(data)
            self.crc = zlib.crc32(data, self.crc)
        self.size += n
        return self._fh.write(data)

    def _settle(self, data: Any) -> None:
        """The write after a skipped span: its descriptor names the span's crc and size, or we re-read."""
        head = bytes(memoryview(data)[:16])
        if len(head) == 16 and head[:4] == _DESCRIPTOR:
            crc, compressed, size = (int.from_bytes(head[i:i + 4], "little") for i in (4, 8, 12))
            if compressed == size == self._pending:
                self.crc = crc32_combine(self._pending_crc, crc, size)
                self._pending = 0
                return
        self.needs_reread = True
        self._pending = 0

    def finish(self, path: Path) -> int:
        """The file's crc32, once everything is written (``path``: the file, if it must be read back)."""
        if self._pending:
            self.needs_reread = True
        if self.needs_reread:
            self.crc = _crc32_of(path)
        return self.crc

    def flush(self) -> None:
        self._fh.flush()


def _crc32_of(path: Path) -> int:
    """crc32 of the whole file, read through safe_files (a link or a FIFO in its place is refused)."""
    crc = 0
    with safe_files.open_file(path, safe_files.OUTPUT_DATA) as fh:
        while chunk := fh.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_crc32(path: Path) -> str:
    return f"crc32:{_crc32_of(path):08x}"


class OutputDir:
    """A SpecForge output dir owned by one job at a time (an flock on the folder itself)."""

    def __init__(self, root: Path, file_group_size: int = 2000) -> None:
        self.root = Path(root)
        self.file_group_size = file_group_size
        self._lock_fd: int | None = None
        self._manifest_fh: Any = None
        self._append_lock = threading.Lock()  # commit() runs in a worker thread, append() in the loop
        self._writeback = WritebackStarter()

    # -- paths -------------------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.jsonl"

    @property
    def errors_path(self) -> Path:
        return self.root / "errors.jsonl"

    @property
    def dataset_json_path(self) -> Path:
        return self.root / "dataset.json"

    @property
    def vocab_mapping_path(self) -> Path:
        return self.root / "vocab_mapping" / "vocab_mapping.pt"

    def relative_sample_path(self, index: int) -> str:
        group = (index // self.file_group_size) * self.file_group_size
        return f"rows_{group}-{group + self.file_group_size}/data_{index}.ckpt"

    # -- ownership ---------------------------------------------------------------------------------------
    def acquire(self, job_id: str, fresh: bool) -> None:
        """Create the dir if needed and lock it.  A fresh job refuses a dir that holds another dataset."""
        if self.root.is_symlink():
            raise OutputDirError(f"output_dir {self.root} is a symlink; give the real folder")
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise OutputDirError(f"output_dir {self.root} is in use by another running job") from None
            raise
        self._lock_fd = fd
        owner = self.owner_job_id()
        if fresh:
            foreign = [p.name for p in self.root.iterdir() if p.name != "dataset.json" or owner != job_id]
            if foreign:
                self.release()
                shown = ", ".join(sorted(foreign)[:5])
                hint = f" (it holds the dataset of job {owner})" if owner else ""
                raise OutputDirError(f"output_dir {self.root} is not empty: {shown}{hint}")
        elif owner is not None and owner != job_id:
            self.release()
            raise OutputDirError(f"output_dir {self.root} belongs to job {owner}, not {job_id}")

    def owner_job_id(self) -> str | None:
        try:
            return safe_files.read_json(self.dataset_json_path, safe_files.OUTPUT_RECORD).get("job_id")
        except (OSError, ValueError, AttributeError):
            return None

    def release(self) -> None:
        self._writeback.close()
        if self._manifest_fh is not None:
            self._manifest_fh.close()
            self._manifest_fh = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- manifest ----------------------------------------------------------------------------------------
    def read_manifest(self) -> tuple[dict[int, ManifestEntry], int]:
        """Entries by index (a later line for the same index wins) and the count of unreadable lines."""
        entries: dict[int, ManifestEntry] = {}
        bad = 0
        try:
            text = safe_files.read_text(self.manifest_path, safe_files.MANIFEST, errors="replace")
        except FileNotFoundError:
            return entries, 0
        for raw in text.splitlines():
            if not raw.strip():
                continue
            try:
                entry = ManifestEntry.from_json(raw)
            except (ValueError, TypeError):
                bad += 1  # a line cut by a crash mid-append
                continue
            entries[entry.index] = entry
        return entries, bad

    def reconcile(self, retry_failed: bool = True) -> ReconcileReport:
        """Make files and manifest agree (see the module docstring); rewrites manifest and errors."""
        entries, bad = self.read_manifest()
        redo = retried = 0
        kept: dict[int, ManifestEntry] = {}
        for index, entry in entries.items():
            if entry.status in _RETRY_ON_RESUME and retry_failed:
                retried += 1
                continue
            if entry.status == "ok":
                path = self.root / (entry.path or "")
                try:
                    ok = entry.path is not None and path.stat().st_size == entry.bytes
                except OSError:
                    ok = False
                if not ok:
                    redo += 1
                    continue
            kept[index] = entry
        wanted = {e.path for e in kept.values() if e.status == "ok"}
        orphans = tmps = 0
        for rows in self.root.iterdir():
            if not (rows.is_dir() and not rows.is_symlink() and _ROWS_RE.match(rows.name)):
                continue
            for child in rows.iterdir():
                rel = f"{rows.name}/{child.name}"
                if child.name.endswith(".tmp"):
                    child.unlink()
                    tmps += 1
                elif _DATA_RE.match(child.name) and rel not in wanted:
                    child.unlink()
                    orphans += 1
        self._rewrite(kept.values())
        return ReconcileReport(kept, bad, redo, orphans, tmps, retried)

    def _rewrite(self, entries: Iterable[ManifestEntry]) -> None:
        ordered = sorted(entries, key=lambda e: e.index)
        from sessions.home import atomic_write_text

        atomic_write_text(self.manifest_path, "".join(e.to_json() + "\n" for e in ordered), mode=0o644)
        self._rewrite_errors(ordered)

    def _rewrite_errors(self, ordered: list[ManifestEntry]) -> None:
        from sessions.home import atomic_write_text

        lines = [json.dumps(_error_record(e), sort_keys=True) + "\n" for e in ordered if e.status != "ok"]
        atomic_write_text(self.errors_path, "".join(lines), mode=0o644)

    def append(self, entry: ManifestEntry) -> None:
        """Record one outcome.  An ``ok`` entry goes through ``commit`` (its file must be durable first)."""
        with self._append_lock:
            if self._manifest_fh is None:
                self._manifest_fh = open(self.manifest_path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
            # One write() per line: a SIGKILL cannot interleave two lines; a crash can only cut the last one.
            self._manifest_fh.write(entry.to_json() + "\n")
            self._manifest_fh.flush()
            if entry.status != "ok":
                with open(self.errors_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(_error_record(entry), sort_keys=True) + "\n")

    def commit(self, entries: list[ManifestEntry]) -> None:
        """Group commit: make the entries' files durable (one ``syncfs``), then append their lines.

        Raises OSError when the flush fails; then nothing of the batch is recorded (``reconcile`` deletes
        the unrecorded files and a resume writes them again)."""
        if not entries:
            return
        self.make_durable([e.path for e in entries if e.path])
        for entry in entries:
            self.append(entry)

    def make_durable(self, rel_paths: list[str]) -> None:
        """Flush the written files, their ``rows_*`` folders and the renames to stable storage."""
        if not rel_paths:
            return
        if self._lock_fd is not None and _syncfs(self._lock_fd):
            return
        folders = set()
        for rel in rel_paths:  # no syncfs (not Linux): one fsync per file, then per folder
            fd = os.open(self.root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            folders.add((self.root / rel).parent)
        for folder in (*folders, self.root):
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def sync_manifest(self) -> None:
        with self._append_lock:
            if self._manifest_fh is not None:
                os.fsync(self._manifest_fh.fileno())

    # -- samples -----------------------------------------------------------------------------------------
    def write_sample(self, index: int, sample: dict[str, Any]) -> tuple[str, int, str]:
        """``torch.save`` one sample dict under its final name (tmp + rename: never seen partial); returns
        (relative path, bytes, checksum).  Not yet durable: pass its entry to ``commit``."""
        import torch

        rel = self.relative_sample_path(index)
        final = self.root / rel
        final.parent.mkdir(exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                writer = ChecksumWriter(fh)
                # With torch's own record crc32 turned off its descriptors hold 0: hash every byte here.
                writer.needs_reread = not getattr(torch.serialization, "get_crc32_options", lambda: True)()
                # torch.save uses only write() and flush(); its annotation asks for a whole IO[bytes].
                # The default zipfile format: SpecForge mmaps it (anchors §1.4.2).
                torch.save(sample, writer)  # type: ignore[arg-type]
                fh.flush()
                # Start the disk on this file soon: the group commit's syncfs then finds most of the batch
                # written, and the disk streams between commits instead of idling.  A thread of its own does
                # it: ``sync_file_range`` blocks until the pages are queued at the disk (ext4 allocates the
                # blocks there), which in this thread was 37-50 % of a collector's busy time on the H200
                # (py-spy, both item-5 shapes).  Durability is still claimed only by the syncfs (``commit``).
                self._writeback.submit(fh.fileno())
            crc = writer.finish(tmp)
            os.replace(tmp, final)
        except BaseException:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            raise
        return rel, writer.size, f"crc32:{crc:08x}"

    # -- dataset.json and the vocab map -------------------------------------------------------------------
    def write_dataset_json(self, info: dict[str, Any]) -> None:
        atomic_write_json(self.dataset_json_path, info, mode=0o644)

    def read_dataset_json(self) -> dict[str, Any] | None:
        try:
            data = safe_files.read_json(self.dataset_json_path, safe_files.OUTPUT_RECORD)
            return data if isinstance(data, dict) else None
        except OSError:
            return None

    def token_counts(self, entries: Iterable[ManifestEntry]) -> dict[int, int]:
        """Frequencies of supervised token ids over the written samples (what SpecForge counts)."""
        import torch

        counts: dict[int, int] = {}
        for entry in entries:
            if entry.status != "ok" or entry.path is None:
                continue
            with safe_files.opened_path(self.root / entry.path, safe_files.OUTPUT_DATA) as opened:
                data = torch.load(opened, weights_only=True, mmap=True)
            ids = data["input_ids"][data["loss_mask"] == 1]
            uniq, freq = ids.unique(return_counts=True)
            for token, n in zip(uniq.tolist(), freq.tolist()):
                counts[token] = counts.get(token, 0) + n
        return counts

    def write_vocab_mapping(self, counts: dict[int, int], draft_vocab_size: int, target_vocab_size: int) -> None:
        """``{"d2t": int64[draft], "t2d": bool[target]}`` as SpecForge builds it (data/preprocessing.py
        ``process_token_dict_to_mappings``): the most frequent supervised ids, padded with the lowest unused
        ids, sorted; ``d2t[i] = target_id - i``."""
        import io

        import torch

        chosen = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:draft_vocab_size]
        used = {token for token, _ in chosen}
        filler = 0
        while len(used) < min(draft_vocab_size, target_vocab_size):
            if filler not in used:
                used.add(filler)
            filler += 1
        ordered = sorted(used)
        d2t = torch.tensor([t - i for i, t in enumerate(ordered)], dtype=torch.int64)
        t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
        t2d[torch.tensor(ordered, dtype=torch.int64)] = True
        buffer = io.BytesIO()
        torch.save({"d2t": d2t, "t2d": t2d}, buffer)
        self.vocab_mapping_path.parent.mkdir(exist_ok=True)
        from sessions.home import atomic_write_bytes

        atomic_write_bytes(self.vocab_mapping_path, buffer.getvalue(), mode=0o644)


_LIBC: Any = None


def _syncfs(fd: int) -> bool:
    """``syncfs(2)`` on the filesystem of ``fd``; False where the C library has none.  Raises OSError when
    the kernel reports a writeback error."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _LIBC = False
    function = getattr(_LIBC, "syncfs", None) if _LIBC else None
    if function is None:
        return False
    if function(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs failed: {os.strerror(err)}")
    return True


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the dirty pages, do not wait for it


def _start_writeback(fd: int) -> None:
    """``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)`` where the C library has it; else nothing.

    Only an early start: it makes nothing durable (no metadata, no cache flush), so nothing relies on it;
    an error here is the commit's to report."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _LIBC = False
    function = getattr(_LIBC, "sync_file_range", None) if _LIBC else None
    if function is not None:
        function(ctypes.c_int(fd), ctypes.c_int64(0), ctypes.c_int64(0), ctypes.c_uint(_SYNC_FILE_RANGE_WRITE))


class WritebackStarter:
    """Starts the writeback of written files (``_start_writeback``) in one thread of its own, so that the
    threads that write never wait for the disk's queue.

    ``submit`` takes a duplicate of the file's descriptor (the file may be renamed meanwhile) and never
    blocks: when ``max_pending`` files are already waiting (the disk is behind), the hint is dropped, since
    the group commit's syncfs writes everything anyway.  Nothing relies on it for durability."""

    def __init__(self, max_pending: int = 64) -> None:
        import queue

        self.max_pending = max_pending
        self.dropped = 0
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fd: int) -> None:
        with self._lock:
            if self._closed or self._queue.qsize() >= self.max_pending:
                self.dropped += 1
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="writeback", daemon=True)
                self._thread.start()
            self._queue.put(os.dup(fd))

    def _run(self) -> None:
        while (fd := self._queue.get()) is not None:
            try:
                _start_writeback(fd)
            except OSError:
                pass  # a hint only: the commit's syncfs reports a failing disk
            finally:
                os.close(fd)

    def close(self) -> None:
        """Stop the thread once what is queued has been started; a later ``submit`` starts a new one."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        with self._lock:
            self._closed = False


def _error_record(entry: ManifestEntry) -> dict[str, Any]:
    return {"index": entry.index, "line": entry.line, "sample_id": entry.sample_id, "status": entry.status,
            "reason": entry.reason or ""}
