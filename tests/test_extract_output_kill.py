"""The sample writer's fast paths against the plain ones, and a SIGKILL between a sample's write and its
group commit.

A sample's crc32 comes from torch's own record crcs joined by ``crc32_combine`` (no second pass over the
bytes), and each file's writeback starts before the commit's ``syncfs``.  The checks: the checksum is crc32
of the file's bytes whatever the sizes (also where torch's record crcs are off, or the stream is not what the
writer expects), the bytes are exactly ``torch.save``'s, and a process killed with samples written but not
committed leaves a dir that a resume completes and ``extract verify`` accepts, with the same tensors."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
import torch
from _extract_support import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from sessions.extraction.output import ChecksumWriter, ManifestEntry, OutputDir, crc32_combine

REPO = Path(__file__).resolve().parent.parent


def sample(index: int, tokens: int, hidden: int) -> dict:
    gen = torch.Generator().manual_seed(index)
    return {"input_ids": torch.arange(tokens), "loss_mask": torch.ones(tokens, dtype=torch.int64),
            "hidden_state": torch.randn(1, tokens, hidden, generator=gen).bfloat16(),
            "aux_hidden_state": torch.randn(1, tokens, 3 * hidden, generator=gen).bfloat16(),
            "sample_id": f"j-{index}"}


def torch_save_bytes(data: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=5000))
def test_crc32_combine_is_crc32_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize("tokens,hidden", [(1, 16), (6, 8), (40, 256), (300, 512), (1000, 64)])
def test_the_checksum_is_crc32_of_the_file_and_the_bytes_are_torch_saves(tmp_path: Path, tokens: int,
                                                                          hidden: int) -> None:
    """Small records (hashed as written) and large ones (crc from their descriptor) alike."""
    out = OutputDir(tmp_path / "out")
    out.acquire("j", fresh=True)
    data = sample(tokens, tokens, hidden)
    rel, size, checksum = out.write_sample(tokens, data)
    raw = (out.root / rel).read_bytes()
    assert raw == torch_save_bytes(data)
    assert (size, checksum) == (len(raw), f"crc32:{zlib.crc32(raw):08x}")
    out.release()


def test_without_torchs_record_crcs_every_byte_is_hashed(tmp_path: Path) -> None:
    """``set_crc32_options(False)`` leaves 0 in the descriptors: taking them would record a wrong checksum."""
    out = OutputDir(tmp_path / "out")
    out.acquire("j", fresh=True)
    torch.serialization.set_crc32_options(False)
    try:
        rel, _, checksum = out.write_sample(0, sample(0, 300, 256))
    finally:
        torch.serialization.set_crc32_options(True)
    assert checksum == f"crc32:{zlib.crc32((out.root / rel).read_bytes()):08x}"
    out.release()


def test_a_stream_without_the_expected_descriptor_is_read_back(tmp_path: Path) -> None:
    """A large write not followed by a matching data descriptor (another torch, another format): the
    checksum is still the file's, read back from it."""
    path = tmp_path / "f.bin"
    parts = [b"head", os.urandom(1 << 17), b"PK\x07\x08" + b"\0" * 12, os.urandom(1 << 17)]
    with open(path, "wb") as fh:
        writer = ChecksumWriter(fh)  # the writer itself, fed a stream that torch never writes
        for part in parts:
            writer.write(memoryview(part))
    assert writer.finish(path) == zlib.crc32(b"".join(parts))


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from test_extract_output_kill import sample
    from sessions.extraction.output import ManifestEntry, OutputDir
    out = OutputDir(Path(sys.argv[1]))
    out.acquire("j", fresh=True)
    out.write_dataset_json({"job_id": "j", "complete": False})
    entries = []
    for index in range(6):
        rel, size, checksum = out.write_sample(index, sample(index, 200, 256))
        entries.append(ManifestEntry(index, index + 1, f"j-{index}", "ok", 200, 200, rel, size, checksum))
    out.commit(entries[:3])  # 0-2 durable and recorded; 3-5 written, writeback started, never committed
    print("written", flush=True)
    time.sleep(600)
""")


def test_a_kill_between_write_and_commit_leaves_a_dataset_that_resumes_and_verifies(
        home, cli_env, tmp_path: Path) -> None:
    root = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(REPO / "tests")], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "written"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert len(list(root.rglob("data_*.ckpt"))) == 6  # the uncommitted files are there, but not recorded

    out = OutputDir(root)  # what a resume does: reconcile, then write what has no entry
    out.acquire("j", fresh=False)
    report = out.reconcile()
    assert sorted(report.entries) == [0, 1, 2] and report.removed_orphans == 3
    redo = []
    for index in range(3, 6):
        rel, size, checksum = out.write_sample(index, sample(index, 200, 256))
        redo.append(ManifestEntry(index, index + 1, f"j-{index}", "ok", 200, 200, rel, size, checksum))
    out.commit(redo)
    out.write_dataset_json({"job_id": "j", "complete": True, "hidden_size": 256, "aux_width": 768,
                            "counts": {"ok": 6}})
    out.release()

    result = run_cli(["extract", "verify", str(root)], cli_env)
    assert result.returncode == 0, result.stdout + result.stderr
    for index in range(6):
        expected = sample(index, 200, 256)
        path = root / "rows_0-2000" / f"data_{index}.ckpt"
        assert path.read_bytes() == torch_save_bytes(expected)
        loaded = torch.load(path, weights_only=True)
        assert all(torch.equal(loaded[k], expected[k]) for k in ("input_ids", "hidden_state", "aux_hidden_state"))
