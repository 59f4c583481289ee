"""The collector: one request's capture dumps → one checked SpecForge sample dict.

It reads the chunks with the capture writer's own reader (``sessions.capture.writer.read_chunks``, the
dump format contract of DESIGN §5), then checks what SpecForge never does (anchors §1.6, §8.2): the dumped
token ids echo the request, T matches across the tensors, the widths agree with the first sample of the
job, and no value is NaN or Inf.  The plugin writes in a background thread, so a response can arrive
before its last chunk is renamed into place: the collector waits for the chunks to cover the prompt.
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions.extraction.client import AttemptFailed

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CaptureShape:
    """What every sample of one job must share; taken from the first sample's dumps."""

    hidden_size: int
    aux_width: int
    layers: tuple[int, ...] | None
    draft_layer_ids: tuple[int, ...] | None
    sglang_version: str | None

    @property
    def num_layers(self) -> int:
        return self.aux_width // self.hidden_size


def _writer() -> Any:
    from sessions.capture import writer

    return writer


def wait_for_dumps(capture_dir: Path, rid: str, tokens: int, timeout_s: float) -> None:
    """Return once ``rid``'s chunks cover ``tokens``; AttemptFailed (retryable) when they do not arrive."""
    writer = _writer()
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        marker = writer.read_error_marker(capture_dir, rid)
        if marker is not None:
            raise AttemptFailed(f"the capture writer failed for {rid}: {marker}")
        if writer.chunks_complete(capture_dir, rid, tokens):
            return
        if time.monotonic() >= deadline:
            covered = writer.covered_tokens(writer.list_chunks(capture_dir, rid))
            hint = "" if covered else " (is capture on for this server, and is the rid prefix its own?)"
            raise AttemptFailed(f"dumps for {rid} cover {covered} of {tokens} tokens after "
                                f"{timeout_s:g} s{hint}")
        time.sleep(delay)
        delay = min(0.05, delay * 2)


def _parse_int_list(text: str | None) -> tuple[int, ...] | None:
    import json

    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def read_capture_shape(capture_dir: Path, rid: str, aux: torch.Tensor, last: torch.Tensor) -> CaptureShape:
    meta = _writer().read_chunk_metadata(capture_dir, rid)
    return CaptureShape(
        hidden_size=int(last.shape[1]),
        aux_width=int(aux.shape[1]),
        layers=_parse_int_list(meta.get("layers")),
        draft_layer_ids=_parse_int_list(meta.get("draft_layer_ids")),
        sglang_version=meta.get("sglang_version") or None,
    )


def collect_sample(capture_dir: Path, rid: str, sample_id: str, input_ids: Sequence[int],
                   loss_mask: Sequence[int], expected: CaptureShape | None,
                   dump_wait_s: float) -> tuple[dict[str, Any], CaptureShape]:
    """Read, check and assemble the sample; raises AttemptFailed (``retryable`` as appropriate)."""
    import torch

    writer = _writer()
    tokens = len(input_ids)
    wait_for_dumps(capture_dir, rid, tokens, dump_wait_s)
    try:
        aux, last, dumped_ids = writer.read_chunks(capture_dir, rid, expected_tokens=tokens)
    except writer.ChunkError as exc:
        raise AttemptFailed(f"unreadable dumps: {exc}") from None
    if last is None:
        raise AttemptFailed("the dumps hold no final hidden states ('last'); the capture must dump them",
                            retryable=False)
    ids = torch.tensor(list(input_ids), dtype=torch.int64)
    if dumped_ids.shape != ids.shape or not torch.equal(dumped_ids.to(torch.int64), ids):
        first = _first_difference(dumped_ids, ids)
        raise AttemptFailed(f"dumped token ids do not echo the request ({first})", retryable=False)
    if aux.dim() != 2 or last.dim() != 2 or aux.shape[0] != tokens or last.shape[0] != tokens:
        raise AttemptFailed(f"T mismatch: sent {tokens} tokens, aux {tuple(aux.shape)}, last {tuple(last.shape)}",
                            retryable=False)
    shape = read_capture_shape(capture_dir, rid, aux, last) if expected is None else expected
    if aux.shape[1] != shape.aux_width or last.shape[1] != shape.hidden_size:
        raise AttemptFailed(f"widths changed mid-job: aux {aux.shape[1]} (job: {shape.aux_width}), "
                            f"last {last.shape[1]} (job: {shape.hidden_size})", retryable=False)
    if shape.aux_width % shape.hidden_size:
        raise AttemptFailed(f"aux width {shape.aux_width} is not a multiple of hidden size {shape.hidden_size}",
                            retryable=False)
    for name, tensor in (("aux", aux), ("last", last)):
        bad = count_nonfinite(tensor)
        if bad:
            raise AttemptFailed(f"{bad} NaN/Inf values in the {name} hidden states", retryable=False)
    if aux.dtype != torch.bfloat16:
        aux = aux.to(torch.bfloat16)
    if last.dtype != torch.bfloat16:
        last = last.to(torch.bfloat16)
    sample = {
        "input_ids": ids,  # 1-D [T]: a [1, T] shape breaks SpecForge's normaliser (anchors §1.4.3)
        "loss_mask": torch.tensor(list(loss_mask), dtype=torch.int64),
        "hidden_state": last.unsqueeze(0),  # [1, T, H], post-norm final (the lm_head input)
        "aux_hidden_state": aux.unsqueeze(0),  # [1, T, K·H], low → high capture points
        "sample_id": sample_id,
    }
    return sample, shape


def count_nonfinite(tensor: torch.Tensor, block: int = 1 << 18) -> int:
    """NaN/Inf values in ``tensor``.  For bf16 it reads the bits (exponent all ones), ~100x faster than
    ``torch.isfinite`` on CPU, which would otherwise make the check the collector's bottleneck."""
    import numpy as np
    import torch

    if tensor.dtype != torch.bfloat16:
        return tensor.numel() - int(torch.isfinite(tensor).sum())
    bits = tensor.detach().reshape(-1).contiguous().view(torch.int16).numpy().view(np.uint16)
    scratch = np.empty(min(block, bits.size), dtype=np.uint16)
    for start in range(0, bits.size, block):
        chunk = bits[start:start + block]
        magnitude = scratch[: chunk.size]
        np.bitwise_and(chunk, 0x7FFF, out=magnitude)  # drop the sign: >= 0x7F80 is Inf or NaN
        if chunk.size and magnitude.max() >= 0x7F80:
            return tensor.numel() - int(torch.isfinite(tensor).sum())  # rare: count them exactly
    return 0


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"{a.numel()} ids dumped, {b.numel()} sent"
    at = int((a.to(b.dtype) != b).nonzero()[0][0])
    return f"first difference at position {at}: dumped {int(a[at])}, sent {int(b[at])}"


def remove_dumps(capture_dir: Path, rid: str) -> None:
    _writer().remove_chunks(capture_dir, rid)


def may_have_dumps(capture_dir: Path, rid: str) -> bool:
    """Whether anything of ``rid`` is in the capture dir (one ``lstat``, cheap enough for the event loop).

    Before a request's first attempt there is almost never anything: the job cleared stale dumps at its
    start.  The clearing (`remove_dumps`) runs in the collector pool, behind every sample being written;
    skipping the hop when there is nothing to clear keeps a new request from waiting for the disk."""
    return os.path.lexists(os.path.join(capture_dir, _writer().validate_rid(rid)))
