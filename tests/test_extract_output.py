"""The collector (real capture dumps → checked sample) and the SpecForge output dir (atomic files, manifest,
reconcile after a crash)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sessions.capture.writer import write_chunks, write_error_marker
from sessions.extraction.client import AttemptFailed
from sessions.extraction.collector import collect_sample
from sessions.extraction.output import ManifestEntry, OutputDir, OutputDirError

H, K = 8, 3
META = {"layers": [2, 4, 5], "hidden_size": H, "sglang_version": "0.5.23"}


def dump(capture: Path, rid: str, ids: list[int], chunk: int | None = None, nan: bool = False) -> tuple:
    """Write ``rid``'s dumps with the capture writer, in chunks of ``chunk`` tokens (as chunked prefill)."""
    gen = torch.Generator().manual_seed(len(ids))
    aux = torch.randn(len(ids), K * H, generator=gen).bfloat16()
    last = torch.randn(len(ids), H, generator=gen).bfloat16()
    if nan:
        aux[1, 3] = float("nan")
    step = chunk or len(ids)
    for start in range(0, len(ids), step):
        end = min(len(ids), start + step)
        write_chunks(capture, [rid], [start], [end - start], aux[start:end], last[start:end],
                     torch.tensor(ids[start:end]), META, fsync=False)
    return aux, last


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    path = tmp_path / "capture"
    path.mkdir(mode=0o700)
    return path


def test_chunks_are_reassembled_and_checked(capture: Path) -> None:
    ids = list(range(10, 23))
    aux, last = dump(capture, "eagle3-j-0", ids, chunk=5)
    sample, shape = collect_sample(capture, "eagle3-j-0", "j-0", ids, [0] * 6 + [1] * 7, None, dump_wait_s=1)
    assert sample["input_ids"].dtype == torch.int64 and sample["input_ids"].tolist() == ids
    assert sample["loss_mask"].shape == (13,) and sample["loss_mask"].dtype == torch.int64
    assert sample["hidden_state"].shape == (1, 13, H) and sample["hidden_state"].dtype == torch.bfloat16
    assert sample["aux_hidden_state"].shape == (1, 13, K * H)
    assert torch.equal(sample["aux_hidden_state"][0], aux) and torch.equal(sample["hidden_state"][0], last)
    assert sample["sample_id"] == "j-0"
    assert (shape.layers, shape.sglang_version, shape.num_layers) == ((2, 4, 5), "0.5.23", 3)


def test_echo_mismatch_nan_missing_dumps_and_writer_errors_are_refused(capture: Path) -> None:
    dump(capture, "r-echo", [1, 2, 3])
    with pytest.raises(AttemptFailed, match="do not echo") as info:
        collect_sample(capture, "r-echo", "s", [1, 9, 3], [1, 1, 1], None, dump_wait_s=1)
    assert not info.value.retryable
    dump(capture, "r-nan", [4, 5, 6], nan=True)
    with pytest.raises(AttemptFailed, match="1 NaN/Inf values in the aux") as info:
        collect_sample(capture, "r-nan", "s", [4, 5, 6], [1, 1, 1], None, dump_wait_s=1)
    assert not info.value.retryable
    dump(capture, "r-short", [1, 2, 3, 4], chunk=2)
    os.unlink(capture / "r-short" / "2-4.safetensors")
    with pytest.raises(AttemptFailed, match="cover 2 of 4") as info:
        collect_sample(capture, "r-short", "s", [1, 2, 3, 4], [1] * 4, None, dump_wait_s=0.05)
    assert info.value.retryable
    write_error_marker(capture, "r-err", "No space left on device")
    with pytest.raises(AttemptFailed, match="No space left"):
        collect_sample(capture, "r-err", "s", [1], [1], None, dump_wait_s=1)


def sample_dict(index: int, tokens: int = 6) -> dict:
    return {"input_ids": torch.arange(tokens), "loss_mask": torch.ones(tokens, dtype=torch.int64),
            "hidden_state": torch.zeros(1, tokens, H, dtype=torch.bfloat16),
            "aux_hidden_state": torch.zeros(1, tokens, K * H, dtype=torch.bfloat16), "sample_id": f"j-{index}"}


def write_ok(out: OutputDir, index: int) -> ManifestEntry:
    rel, size, checksum = out.write_sample(index, sample_dict(index))
    entry = ManifestEntry(index, index + 1, f"j-{index}", "ok", 6, 6, rel, size, checksum)
    out.append(entry)
    return entry


def test_samples_land_under_rows_groups_atomically(tmp_path: Path) -> None:
    out = OutputDir(tmp_path / "out", file_group_size=4)
    out.acquire("j", fresh=True)
    entries = [write_ok(out, i) for i in (0, 3, 4, 9)]
    assert [e.path for e in entries] == ["rows_0-4/data_0.ckpt", "rows_0-4/data_3.ckpt",
                                         "rows_4-8/data_4.ckpt", "rows_8-12/data_9.ckpt"]
    loaded = torch.load(out.root / entries[2].path, weights_only=True)
    assert loaded["sample_id"] == "j-4" and loaded["input_ids"].shape == (6,)
    assert not list(out.root.rglob("*.tmp"))
    out.append(ManifestEntry(10, 11, "j-10", "error", reason="not JSON"))
    assert [line for line in out.errors_path.read_text().splitlines()] == [
        '{"index": 10, "line": 11, "reason": "not JSON", "sample_id": "j-10", "status": "error"}']
    out.release()


def test_reconcile_repairs_what_a_crash_leaves(tmp_path: Path) -> None:
    out = OutputDir(tmp_path / "out", file_group_size=4)
    out.acquire("j", fresh=True)
    kept = write_ok(out, 0)
    lost = write_ok(out, 1)
    out.append(ManifestEntry(2, 3, "j-2", "failed", tokens=6, reason="server error"))
    out.append(ManifestEntry(3, 4, "j-3", "skipped", reason="too long"))
    out.write_sample(5, sample_dict(5))  # renamed, but the crash came before its manifest line
    (out.root / "rows_0-4" / ".data_6.ckpt.123.tmp").write_bytes(b"partial")
    (out.root / lost.path).write_bytes(b"short")  # a file that does not match its recorded size
    with open(out.manifest_path, "a") as fh:
        fh.write('{"index": 7, "line": 8, "sam')  # a line cut mid-append
    out.release()

    again = OutputDir(tmp_path / "out", file_group_size=4)
    again.acquire("j", fresh=False)
    report = again.reconcile()
    assert sorted(report.entries) == [0, 3]  # 1 redone (bad file), 2 retried (failed), 5 never recorded
    assert (report.dropped_partial_lines, report.redo_missing_files, report.retried_failed) == (1, 1, 1)
    assert (report.removed_orphans, report.removed_tmp) == (2, 1)
    assert sorted(p.name for p in again.root.rglob("*.ckpt")) == ["data_0.ckpt"]
    assert again.read_manifest() == ({0: kept, 3: report.entries[3]}, 0)
    assert "too long" in again.errors_path.read_text() and "server error" not in again.errors_path.read_text()
    again.release()


def test_the_group_commit_records_only_flushed_files(tmp_path: Path, monkeypatch) -> None:
    """Samples are written without an fsync each; ``commit`` flushes a batch, then appends its lines.
    A flush that fails records nothing: the files stay unrecorded and a reconcile removes them."""
    import sessions.extraction.output as output_module

    out = OutputDir(tmp_path / "out", file_group_size=4)
    out.acquire("j", fresh=True)
    flushed: list[int] = []
    real_syncfs = output_module._syncfs

    def observed_syncfs(fd: int) -> bool:
        flushed.append(fd)
        return real_syncfs(fd)

    monkeypatch.setattr(output_module, "_syncfs", observed_syncfs)
    batch = [_entry_for(out, i) for i in range(3)]
    assert out.read_manifest() == ({}, 0)  # written, not yet recorded
    out.commit(batch)
    assert len(flushed) == 1  # one flush for the whole batch
    assert sorted(out.read_manifest()[0]) == [0, 1, 2]

    def failing_syncfs(fd: int) -> bool:
        raise OSError(5, "syncfs failed: Input/output error")

    monkeypatch.setattr(output_module, "_syncfs", failing_syncfs)
    doomed = [_entry_for(out, i) for i in (3, 4)]
    with pytest.raises(OSError, match="Input/output error"):
        out.commit(doomed)
    assert sorted(out.read_manifest()[0]) == [0, 1, 2]
    out.release()
    again = OutputDir(tmp_path / "out", file_group_size=4)
    again.acquire("j", fresh=False)
    report = again.reconcile()
    assert sorted(report.entries) == [0, 1, 2] and report.removed_orphans == 2
    again.release()


def test_without_syncfs_each_file_and_folder_is_fsynced(tmp_path: Path, monkeypatch) -> None:
    import sessions.extraction.output as output_module

    out = OutputDir(tmp_path / "out", file_group_size=2)
    out.acquire("j", fresh=True)
    monkeypatch.setattr(output_module, "_syncfs", lambda fd: False)  # a C library without syncfs
    synced: list[str] = []
    real_fsync = os.fsync

    def observed_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", observed_fsync)
    out.commit([_entry_for(out, i) for i in range(3)])
    root = str(out.root)
    assert {f"{root}/rows_0-2/data_0.ckpt", f"{root}/rows_0-2/data_1.ckpt", f"{root}/rows_2-4/data_2.ckpt",
            f"{root}/rows_0-2", f"{root}/rows_2-4", root} <= set(synced)
    assert sorted(out.read_manifest()[0]) == [0, 1, 2]
    out.release()


def _entry_for(out: OutputDir, index: int) -> ManifestEntry:
    rel, size, checksum = out.write_sample(index, sample_dict(index))
    return ManifestEntry(index, index + 1, f"j-{index}", "ok", tokens=6, path=rel, bytes=size, checksum=checksum)


def test_an_output_dir_has_one_owner(tmp_path: Path) -> None:
    first = OutputDir(tmp_path / "out")
    first.acquire("job-a", fresh=True)
    with pytest.raises(OutputDirError, match="in use"):
        OutputDir(tmp_path / "out").acquire("job-b", fresh=False)
    first.write_dataset_json({"job_id": "job-a"})
    first.release()
    with pytest.raises(OutputDirError, match="job-a"):
        OutputDir(tmp_path / "out").acquire("job-b", fresh=True)
    with pytest.raises(OutputDirError, match="belongs to job job-a"):
        OutputDir(tmp_path / "out").acquire("job-b", fresh=False)
    (tmp_path / "link").symlink_to(tmp_path / "out")
    with pytest.raises(OutputDirError, match="symlink"):
        OutputDir(tmp_path / "link").acquire("job-a", fresh=False)


def test_the_nan_inf_check_finds_every_kind_anywhere() -> None:
    from sessions.extraction.collector import count_nonfinite

    base = torch.randn(700, 1000).bfloat16()  # several blocks of the bit scan
    assert count_nonfinite(base) == 0
    for value, where in ((float("nan"), (0, 0)), (float("inf"), (699, 999)), (float("-inf"), (350, 3)),
                         (-float("nan"), (262, 144))):
        damaged = base.clone()
        damaged[where] = value
        assert count_nonfinite(damaged) == 1, (value, where)
    assert count_nonfinite(torch.tensor([1.0, float("nan"), float("inf")])) == 2  # other dtypes too


def test_a_failed_group_commit_stops_the_job_and_records_nothing(tmp_path: Path, monkeypatch) -> None:
    """The bookkeeping's side of a failed flush (EIO, a full disk at writeback): no manifest line, no count,
    and the job stops sending with a reason that says how to continue.  The bookkeeping object is driven
    alone, on a real output dir and a real job state (issue 24 item 6: it owns this concern)."""
    import asyncio
    import json

    import sessions.extraction.output as output_module
    from sessions.extraction.bookkeeping import OutputBookkeeping
    from sessions.extraction.job import JOB_FILE
    from sessions.extraction.job_state import JobState

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / JOB_FILE).write_text(json.dumps({"job_id": "j"}))
    logged: list[str] = []
    state = JobState(job_dir, {"job_id": "j"}, resume=False, log=logged.append)
    stops: list[bool] = []
    state.on_stop(lambda: stops.append(True))  # the runner's "send no more requests"
    books = OutputBookkeeping(state)
    output = OutputDir(tmp_path / "out", file_group_size=4)
    output.acquire("j", fresh=True)
    books.attach(output)
    books.record(_entry_for(output, 0))
    assert state.counts["ok"] == 0  # written, waiting for the group commit

    def failing_syncfs(fd: int) -> bool:
        raise OSError(5, "syncfs failed: Input/output error")

    monkeypatch.setattr(output_module, "_syncfs", failing_syncfs)
    asyncio.run(books.commit())
    assert state.counts["ok"] == 0 and output.read_manifest() == ({}, 0)
    assert state.abort_reason is not None and "Input/output error" in state.abort_reason
    assert "extract resume" in state.abort_reason and stops == [True]
    assert any(line.startswith("aborting: ") for line in logged)
    output.release()


def test_the_writer_thread_never_waits_for_the_disk_queue(tmp_path: Path, monkeypatch) -> None:
    """``sync_file_range`` blocks until the pages are queued at the disk (py-spy on the H200: 37-50 % of a
    collector thread's busy time was there): it runs in the writeback thread, never in the writer's, and
    every descriptor handed over is closed again."""
    import threading

    from sessions.extraction import output as output_module

    seen: list[str] = []
    real = output_module._start_writeback

    def recording(fd: int) -> None:
        seen.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(output_module, "_start_writeback", recording)
    fds_before = len(os.listdir("/proc/self/fd"))
    out = OutputDir(tmp_path / "out")
    out.acquire("job", fresh=True)
    for index in range(5):
        out.write_sample(index, sample_dict(index, tokens=64))
    out.release()  # waits for the writeback thread
    assert seen == ["writeback"] * 5
    assert threading.current_thread().name not in seen
    assert len(os.listdir("/proc/self/fd")) == fds_before  # the dup'd descriptors and the lock are closed
    out.acquire("job", fresh=False)  # a dir used again starts a new writeback thread
    out.write_sample(5, sample_dict(5))
    out.release()
    assert seen == ["writeback"] * 6


def test_writeback_hints_are_dropped_not_waited_for_when_the_disk_is_behind(tmp_path: Path) -> None:
    import threading

    from sessions.extraction.output import WritebackStarter

    starter = WritebackStarter(max_pending=0)  # as if 64 files already waited for the disk
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    fds_before = len(os.listdir("/proc/self/fd"))
    threads_before = set(threading.enumerate())
    with open(path, "rb") as fh:
        starter.submit(fh.fileno())
    assert starter.dropped == 1
    assert set(threading.enumerate()) <= threads_before  # none was started for it
    assert len(os.listdir("/proc/self/fd")) == fds_before
    starter.close()


def test_may_have_dumps_sees_any_leftover_of_a_rid(capture: Path) -> None:
    from sessions.capture.writer import CaptureDirError
    from sessions.extraction.collector import may_have_dumps, remove_dumps

    assert not may_have_dumps(capture, "eagle3-j-1")
    dump(capture, "eagle3-j-1", [1, 2, 3, 4])
    assert may_have_dumps(capture, "eagle3-j-1")
    remove_dumps(capture, "eagle3-j-1")
    assert not may_have_dumps(capture, "eagle3-j-1")
    write_error_marker(capture, "eagle3-j-2", "lost")  # only a marker: still something to clear
    assert may_have_dumps(capture, "eagle3-j-2")
    with pytest.raises(CaptureDirError):
        may_have_dumps(capture, "../escape")
