"""The emulator's model backend writes dumps like the SGLang plugin, through the plugin's bounded
background writer, so a response can come back before its chunks are on disk.  These tests hold the
writer thread at a gate (a ``ready`` object, the hook the plugin uses for CUDA events) to make that
ordering certain rather than likely, and check that the collector waits for every chunk, times out with
a clear error, fails fast on the writer's error marker, and that a full queue blocks instead of dropping.
"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from sessions.capture.plugin.eagle3_capture.spec import ENV_NAME, CaptureSpec
from sessions.capture.writer import chunks_complete, list_chunks
from sessions.extraction.client import AttemptFailed
from sessions.extraction.collector import collect_sample, wait_for_dumps

FLAGS = ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
         "--chunked-prefill-size", "16"]
PROMPT = list(range(10, 50))  # 40 tokens: chunks 0-16, 16-32, 32-40
WAIT_S = 60.0


class Gate:
    """Stands where a CUDA event would: the writer thread calls ``synchronize()`` before writing."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def synchronize(self) -> None:
        self.entered.set()
        assert self.opened.wait(WAIT_S), "the test never opened the gate"


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory) -> Path:
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "tiny-llama", seed=5)


def make_backend(demo_model: Path, cap: Path, queue_depth: int = 4):
    from sessions.emulator.model_backend import ModelBackend

    spec = CaptureSpec(dir=str(cap), rid_prefix="eagle3-", fsync=False, queue_depth=queue_depth)
    return ModelBackend(demo_model, FLAGS, environ={ENV_NAME: spec.to_json()}, device="cpu")


def hold_writer(backend) -> Gate:
    """Queue an empty job whose readiness waits on a gate: everything queued after it waits too."""
    gate = Gate()
    empty = torch.empty(0, 1)
    backend.writer.submit([], [], [], empty, None, torch.empty(0, dtype=torch.int64), {}, ready=gate)
    assert gate.entered.wait(WAIT_S)
    return gate


def request(rid: str) -> dict:
    return {"input_ids": PROMPT, "rid": rid, "sampling_params": {"max_new_tokens": 1}}


def test_the_response_returns_before_the_dumps_and_the_collector_waits_for_all_chunks(demo_model, tmp_path):
    cap = tmp_path / "cap"
    backend = make_backend(demo_model, cap)
    try:
        gate = hold_writer(backend)
        response = backend.generate(request("eagle3-j-0"))
        assert response["meta_info"]["prompt_tokens"] == len(PROMPT)
        assert list_chunks(cap, "eagle3-j-0") == []  # answered, nothing on disk yet
        results: list = []
        collector = threading.Thread(target=lambda: results.append(collect_sample(
            cap, "eagle3-j-0", "j-0", PROMPT, [1] * len(PROMPT), None, WAIT_S)))
        collector.start()
        gate.opened.set()
        collector.join(WAIT_S + 5)
        assert not collector.is_alive() and len(results) == 1
        sample, shape = results[0]
        assert sample["input_ids"].tolist() == PROMPT
        assert sample["aux_hidden_state"].shape == (1, len(PROMPT), 3 * 64)
        assert sample["hidden_state"].shape == (1, len(PROMPT), 64)
        assert shape.hidden_size == 64 and shape.layers == (2, 4, 5)
        # what the collector read is what the backend computed: the same rows written synchronously
        from sessions.capture.writer import read_chunks

        aux, last, _ = read_chunks(cap, "eagle3-j-0", expected_tokens=len(PROMPT))
        assert torch.equal(sample["aux_hidden_state"][0], aux) and torch.equal(sample["hidden_state"][0], last)
    finally:
        backend.close()


def test_the_collector_times_out_with_a_clear_error_when_chunks_do_not_arrive(demo_model, tmp_path):
    cap = tmp_path / "cap"
    backend = make_backend(demo_model, cap)
    try:
        gate = hold_writer(backend)
        backend.generate(request("eagle3-j-1"))
        with pytest.raises(AttemptFailed, match=r"dumps for eagle3-j-1 cover 0 of 40 tokens after 0.2 s") as info:
            wait_for_dumps(cap, "eagle3-j-1", len(PROMPT), timeout_s=0.2)
        assert info.value.retryable  # a late capture is retried, not a failed sample
        gate.opened.set()
        backend.flush()
        wait_for_dumps(cap, "eagle3-j-1", len(PROMPT), timeout_s=WAIT_S)  # all of them once released
        assert [c.name for c in list_chunks(cap, "eagle3-j-1")] == [
            "0-16.safetensors", "16-32.safetensors", "32-40.safetensors"]
    finally:
        backend.close()


def test_a_partial_chunk_set_is_never_complete(demo_model, tmp_path):
    """Chunks land one by one: the collector must not take the first two as the sample."""
    cap = tmp_path / "cap"
    backend = make_backend(demo_model, cap)
    try:
        backend.generate(request("eagle3-j-2"))
        backend.flush()
        (cap / "eagle3-j-2" / "32-40.safetensors").unlink()  # as if the last rename had not happened yet
        assert not chunks_complete(cap, "eagle3-j-2", len(PROMPT))
        with pytest.raises(AttemptFailed, match="cover 32 of 40 tokens"):
            wait_for_dumps(cap, "eagle3-j-2", len(PROMPT), timeout_s=0.1)
    finally:
        backend.close()


def test_a_failed_background_write_fails_the_wait_at_once_with_the_writers_reason(demo_model, tmp_path):
    cap = tmp_path / "cap"
    backend = make_backend(demo_model, cap)
    try:
        assert backend.writer.failures == 0  # made on first use: checks and creates the 0700 capture dir
        rid_dir = cap / "eagle3-j-3"
        rid_dir.mkdir(mode=0o700)
        (rid_dir / "16-32.safetensors").mkdir()  # the rename onto it fails: IsADirectoryError
        backend.generate(request("eagle3-j-3"))
        backend.flush()
        assert backend.writer.failures == 1
        with pytest.raises(AttemptFailed, match="the capture writer failed for eagle3-j-3: IsADirectoryError"):
            wait_for_dumps(cap, "eagle3-j-3", len(PROMPT), timeout_s=WAIT_S)
    finally:
        backend.close()


def test_a_full_writer_queue_blocks_the_request_and_drops_nothing(demo_model, tmp_path):
    cap = tmp_path / "cap"
    backend = make_backend(demo_model, cap, queue_depth=1)
    try:
        gate = hold_writer(backend)
        answered: list = []
        server = threading.Thread(target=lambda: answered.append(backend.generate(request("eagle3-j-4"))))
        server.start()
        # One chunk fits in the queue; the request then blocks handing over the second one.
        queue = backend.writer._queue
        while not queue.full():
            assert server.is_alive(), "the request ended without handing over its chunks"
            server.join(0.01)
        assert not answered  # still inside the request: the queue is full and the writer is held
        gate.opened.set()
        server.join(WAIT_S)
        assert answered and answered[0]["meta_info"]["prompt_tokens"] == len(PROMPT)
        backend.flush()
        assert [c.name for c in list_chunks(cap, "eagle3-j-4")] == [
            "0-16.safetensors", "16-32.safetensors", "32-40.safetensors"]
        assert backend.writer.failures == 0 and backend.writer.chunks_written == 3
    finally:
        backend.close()
