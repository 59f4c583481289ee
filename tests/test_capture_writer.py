"""The dump writer (DESIGN §5 contract): chunk files, reassembly, atomicity, and the capture dir's rules."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sessions.capture.writer import (
    CaptureDirError,
    ChunkError,
    check_capture_dir,
    chunks_complete,
    list_chunks,
    read_chunk_metadata,
    read_chunks,
    remove_chunks,
    write_chunks,
)

META = {"layers": [2, 4, 5], "hidden_size": 4, "sglang_version": "0.5.23", "draft_layer_ids": [1, 3, 4]}


def rows(n: int, width: int, start: int = 0) -> torch.Tensor:
    return (torch.arange(n * width, dtype=torch.float32).reshape(n, width) + start * width) / 8


def write(directory: Path, rid: str, start: int, n: int, **kwargs) -> list[str]:
    return write_chunks(directory, [rid], [start], [n], rows(n, 12, start), -rows(n, 4, start),
                        torch.arange(start, start + n), META, fsync=False, **kwargs)


def test_chunk_files_follow_the_contract(tmp_path):
    cap = tmp_path / "cap"
    paths = write_chunks(cap, ["eagle3-a", "eagle3-b"], [0, 16], [3, 2], rows(5, 12), -rows(5, 4),
                         torch.arange(5), META)
    assert paths == [str(cap / "eagle3-a" / "0-3.safetensors"), str(cap / "eagle3-b" / "16-18.safetensors")]
    from safetensors import safe_open

    with safe_open(paths[1], "pt") as fh:
        meta = fh.metadata()
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open is not a dict
    assert tensors["aux"].dtype == torch.bfloat16 and tensors["aux"].shape == (2, 12)
    assert tensors["last"].dtype == torch.bfloat16 and tensors["last"].shape == (2, 4)
    assert tensors["input_ids"].dtype == torch.int64 and tensors["input_ids"].tolist() == [3, 4]
    assert torch.equal(tensors["aux"], rows(5, 12)[3:5].bfloat16())
    assert meta["rid"] == "eagle3-b" and meta["start"] == "16" and meta["end"] == "18"
    assert json.loads(meta["layers"]) == [2, 4, 5] and meta["hidden_size"] == "4"
    assert meta["sglang_version"] == "0.5.23" and json.loads(meta["draft_layer_ids"]) == [1, 3, 4]
    assert stat.S_IMODE(cap.stat().st_mode) == 0o700
    assert stat.S_IMODE((cap / "eagle3-b").stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(paths[1]).st_mode) == 0o600


def test_chunks_written_out_of_order_reassemble_in_order(tmp_path):
    cap = tmp_path / "cap"
    write(cap, "eagle3-x", 8, 3)
    assert not chunks_complete(cap, "eagle3-x", 11)
    write(cap, "eagle3-x", 0, 4)
    assert not chunks_complete(cap, "eagle3-x", 11)
    with pytest.raises(ChunkError, match="gap at token 4"):
        read_chunks(cap, "eagle3-x")
    write(cap, "eagle3-x", 4, 4)
    assert chunks_complete(cap, "eagle3-x", 11)
    aux, last, ids = read_chunks(cap, "eagle3-x", expected_tokens=11)
    assert torch.equal(aux, rows(11, 12).bfloat16())
    assert torch.equal(last, (-rows(11, 4)).bfloat16())
    assert ids.tolist() == list(range(11))
    assert read_chunk_metadata(cap, "eagle3-x")["start"] == "0"
    with pytest.raises(ChunkError, match="expected 12"):
        read_chunks(cap, "eagle3-x", expected_tokens=12)


def test_short_writes_are_continued_until_the_whole_chunk_is_on_disk(tmp_path, monkeypatch):
    """The kernel may write less than asked (one writev is capped near 2 GiB, signals cut writes short)."""
    real_writev = os.writev
    calls = []

    def short_writev(fd, buffers):  # at most 1,000 bytes per call, split anywhere inside a buffer
        budget, taken = 1000, []
        for buf in buffers:
            view = memoryview(buf).cast("B")
            if budget <= 0:
                break
            taken.append(view[:budget])
            budget -= len(taken[-1])
        calls.append(len(taken))
        return real_writev(fd, taken)

    monkeypatch.setattr(os, "writev", short_writev)
    write(tmp_path, "eagle3-short", 0, 400)
    monkeypatch.setattr(os, "writev", real_writev)
    assert len(calls) > 10  # ~16 KB in 1,000-byte pieces
    aux, last, ids = read_chunks(tmp_path, "eagle3-short", expected_tokens=400)
    assert torch.equal(aux, rows(400, 12).bfloat16())
    assert torch.equal(last, (-rows(400, 4)).bfloat16())
    assert torch.equal(ids, torch.arange(400))


def test_overlapping_chunks_are_an_error(tmp_path):
    cap = tmp_path / "cap"
    write(cap, "eagle3-x", 0, 4)
    write(cap, "eagle3-x", 0, 6)
    with pytest.raises(ChunkError, match="overlap at token 4: next chunk is 0-6"):
        read_chunks(cap, "eagle3-x")


def test_a_chunk_whose_metadata_disagrees_with_its_name_is_refused(tmp_path):
    cap = tmp_path / "cap"
    write(cap, "eagle3-x", 0, 4)
    os.rename(cap / "eagle3-x" / "0-4.safetensors", cap / "eagle3-y-0-4.tmp")
    (cap / "eagle3-y").mkdir(mode=0o700)
    os.rename(cap / "eagle3-y-0-4.tmp", cap / "eagle3-y" / "0-4.safetensors")
    with pytest.raises(ChunkError, match=r"metadata \(rid, start, end\)"):
        read_chunks(cap, "eagle3-y")


def test_truncated_chunk_is_refused(tmp_path):
    cap = tmp_path / "cap"
    path = Path(write(cap, "eagle3-x", 0, 4)[0])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ChunkError):
        read_chunks(cap, "eagle3-x")


@pytest.mark.parametrize("rid", ["../escape", "a/b", "..", ".hidden", "x..y", "", "nul\0"])
def test_unsafe_rids_are_refused(tmp_path, rid):
    with pytest.raises(CaptureDirError, match=r"^rid .* refused: "):
        write(tmp_path / "cap", rid, 0, 2)
    assert not (tmp_path / "escape").exists()


def test_symlinked_capture_dir_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "cap"
    link.symlink_to(real)
    with pytest.raises(CaptureDirError, match="refused: it is a symlink"):
        write(link, "eagle3-a", 0, 2)
    with pytest.raises(CaptureDirError, match="refused: it is a symlink"):
        check_capture_dir(link)
    assert list(real.iterdir()) == []


def test_symlinked_rid_folder_is_refused(tmp_path):
    cap = tmp_path / "cap"
    cap.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (cap / "eagle3-a").symlink_to(elsewhere)
    with pytest.raises(CaptureDirError, match="refused: it is a symlink"):
        write(cap, "eagle3-a", 0, 2)
    assert list(elsewhere.iterdir()) == []


def test_symlinked_chunk_file_is_not_read(tmp_path):
    cap = tmp_path / "cap"
    write(cap, "eagle3-a", 0, 2)
    outside = tmp_path / "outside.safetensors"
    os.rename(cap / "eagle3-a" / "0-2.safetensors", outside)
    (cap / "eagle3-a" / "0-2.safetensors").symlink_to(outside)
    with pytest.raises(CaptureDirError, match="refused: it is a symlink"):
        read_chunks(cap, "eagle3-a")


def test_foreign_owner_is_refused(tmp_path):
    cap = tmp_path / "cap"
    if os.geteuid() == 0:
        cap.mkdir(mode=0o700)
        os.chown(cap, 12345, 12345)
        expected = "owned by uid 12345"
    else:  # without root, a folder of another user: / belongs to root
        cap = Path("/")
        expected = "owned by uid 0"
    with pytest.raises(CaptureDirError, match=expected):
        write(cap, "eagle3-a", 0, 2)
    with pytest.raises(CaptureDirError, match=expected):
        check_capture_dir(cap)


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701, 0o1777])
def test_wrong_mode_is_refused(tmp_path, mode):
    cap = tmp_path / "cap"
    cap.mkdir()
    os.chmod(cap, mode)
    with pytest.raises(CaptureDirError, match=f"mode {stat.S_IMODE(mode):04o}"):
        write(cap, "eagle3-a", 0, 2)
    assert list(cap.iterdir()) == []
    os.chmod(cap, 0o700)
    write(cap, "eagle3-a", 0, 2)


def test_a_file_in_place_of_the_dir_is_refused(tmp_path):
    path = tmp_path / "cap"
    path.write_text("not a folder")
    with pytest.raises(CaptureDirError, match="refused: not a directory"):
        write(path, "eagle3-a", 0, 2)


def test_remove_chunks_does_not_follow_links(tmp_path):
    cap = tmp_path / "cap"
    write(cap, "eagle3-a", 0, 2)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (cap / "eagle3-a" / "link").symlink_to(precious)
    assert remove_chunks(cap, "eagle3-a") == 2
    assert precious.read_text() == "keep me"
    assert not (cap / "eagle3-a").exists()
    assert list_chunks(cap, "eagle3-a") == []


_WRITER_LOOP = r"""
import sys, torch
from sessions.capture.writer import write_chunks
directory = sys.argv[1]
aux = torch.randn(2048, 3 * 2048)  # ~25 MB of bf16 per chunk: writes take a while
last = torch.randn(2048, 2048)
ids = torch.arange(2048)
i = 0
while True:
    write_chunks(directory, [f"eagle3-{i}"], [0], [2048], aux, last, ids, {"layers": [2, 4, 5]}, fsync=True)
    i += 1
"""


def _run_and_kill_writer(cap: Path) -> int:
    """Run the writer loop, read every final chunk while it writes, SIGKILL it while a tmp file exists;
    returns how many chunks were read during the run."""
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", _WRITER_LOOP, str(cap)], cwd=repo,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    reads = 0
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if cap.exists():
                for rid in sorted(os.listdir(cap)):
                    if list_chunks(cap, rid):  # final names only: always complete
                        aux, _last, ids = read_chunks(cap, rid, expected_tokens=2048)
                        assert aux.shape == (2048, 6144) and ids[-1] == 2047
                        reads += 1
                if reads >= 2 and list(cap.glob("*/.*.tmp")):
                    os.kill(proc.pid, signal.SIGKILL)
                    break
            time.sleep(0.005)
        assert proc.poll() is None or proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    return reads


def test_killing_a_writer_mid_write_leaves_no_partial_chunk_visible(tmp_path):
    """A reader polling while a writer process runs never sees a partial file, and SIGKILL during a write
    leaves only complete chunks under their final names (the tmp file is invisible to readers)."""
    for attempt in range(5):  # the kill may land between two writes; try again until it lands inside one
        cap = tmp_path / f"cap{attempt}"
        assert _run_and_kill_writer(cap) >= 2
        if list(cap.glob("*/.*.tmp")):
            break
    else:
        pytest.fail("never killed the writer inside a write")
    interrupted = {p.parent.name for p in cap.glob("*/.*.tmp")}
    for rid in sorted(os.listdir(cap)):
        if rid in interrupted:
            assert list_chunks(cap, rid) == []  # no final name for the interrupted chunk
            continue
        _aux, last, _ids = read_chunks(cap, rid, expected_tokens=2048)
        assert last.shape == (2048, 2048)
