"""Capture writer throughput at Kimi-K2.5 width, next to a plain ``torch.save`` of the same tensors.

One request chunk of ``--tokens`` tokens: ``aux`` [T, K·H] bf16, ``last`` [T, H] bf16, ``input_ids`` [T]
int64 (H = 7168, K = 3: about 470 MB for 8k tokens).  The target is ``/dev/shm`` when it has room (checked
with ``shutil.disk_usage``), else the local temp dir, and the script says which.  ``--device cuda`` starts
from GPU tensors and times the plugin's path: async copy into pinned memory + event sync, then the write.
Prints numbers only; no assertion (DESIGN §8).

    python benches/bench_capture_writer.py                       # CPU tensors, 8k tokens
    python benches/bench_capture_writer.py --device cuda         # on the H200
    python benches/bench_capture_writer.py --tokens 2048 --repeat 5
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _pick_dir(requested: str | None, need_bytes: int) -> tuple[Path, str]:
    if requested:
        return Path(requested), "as requested"
    shm = Path("/dev/shm")
    if shm.is_dir():
        free = shutil.disk_usage(shm).free
        if free > 3 * need_bytes:
            return shm, f"/dev/shm ({free / 1e9:.1f} GB free)"
        note = f"/dev/shm has only {free / 1e9:.1f} GB free, need {3 * need_bytes / 1e9:.1f} GB"
    else:
        note = "no /dev/shm"
    tmp = Path(tempfile.gettempdir())
    return tmp, f"local disk {tmp} ({note})"


def _gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:6.2f} GB/s" if seconds > 0 else "   inf"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per chunk (8192)")
    parser.add_argument("--hidden", type=int, default=7168, help="hidden size H (7168, Kimi-K2.5)")
    parser.add_argument("--k", type=int, default=3, help="captured layers K (3)")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (3)")
    parser.add_argument("--dir", default=None, help="where to write (default: /dev/shm if it has room)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync (the plugin fsyncs by default)")
    args = parser.parse_args(argv)

    import torch

    from sessions.capture.plugin.eagle3_capture.hook import _to_host
    from sessions.capture.writer import write_chunks

    t, h, k = args.tokens, args.hidden, args.k
    nbytes = t * k * h * 2 + t * h * 2 + t * 8
    base, where = _pick_dir(args.dir, nbytes)
    workdir = Path(tempfile.mkdtemp(prefix="eagle3-bench-", dir=base))
    os.chmod(workdir, 0o700)
    cap = workdir / "cap"
    print(f"chunk: {t} tokens, H={h}, K={k}: {nbytes / 1e6:.0f} MB  ->  {where}")
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    aux = torch.randn(t, k * h, generator=gen).to(torch.bfloat16).to(device)
    last = torch.randn(t, h, generator=gen).to(torch.bfloat16).to(device)
    ids = torch.arange(t, dtype=torch.int64).to(device)
    meta = {"layers": [2, 30, 58], "hidden_size": h, "sglang_version": "bench"}
    fsync = not args.no_fsync
    rows = []
    try:
        for i in range(args.repeat):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            if device.type == "cuda":  # the plugin's copy: pinned host memory, async on the stream, then sync
                host = [_to_host(x) for x in (aux, last, ids)]
                event = torch.cuda.Event()
                event.record()
                event.synchronize()
            else:
                host = [aux, last, ids]
            copied = time.perf_counter()
            write_chunks(cap, [f"eagle3-bench-{i}"], [0], [t], host[0], host[1], host[2], meta, fsync=fsync)
            written = time.perf_counter()
            path = workdir / f"torch-save-{i}.pt"
            with open(path, "wb") as fh:
                torch.save({"aux": host[0], "last": host[1], "input_ids": host[2]}, fh)
                fh.flush()
                if fsync:
                    os.fsync(fh.fileno())
            saved = time.perf_counter()
            rows.append((copied - start, written - copied, saved - written))
            shutil.rmtree(cap / f"eagle3-bench-{i}")
            path.unlink()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"{'run':>4} {'copy s':>8} {'writer s':>9} {'writer':>12} {'torch.save s':>13} {'torch.save':>12}")
    for i, (copy_s, write_s, save_s) in enumerate(rows):
        print(f"{i:>4} {copy_s:8.3f} {write_s:9.3f} {_gbps(nbytes, write_s):>12} {save_s:13.3f} "
              f"{_gbps(nbytes, save_s):>12}")
    best = min(rows, key=lambda r: r[1])
    best_save = min(r[2] for r in rows)
    line = f"best: writer {_gbps(nbytes, best[1]).strip()}, torch.save {_gbps(nbytes, best_save).strip()}"
    if device.type == "cuda":
        line += f", GPU->pinned copy {_gbps(nbytes, min(r[0] for r in rows)).strip()}, " \
                f"copy+write {_gbps(nbytes, min(r[0] + r[1] for r in rows)).strip()}"
    print(line + f" (fsync {'on' if fsync else 'off'})")
    print(_check_hook_copy(device, base))
    return 0


def _check_hook_copy(device, base: Path) -> str:
    """The plugin's hook on ``device`` tensors: overwrite them right after the hook returns (as the next
    CUDA-graph replay would) and check the dump still holds the values of the forward it saw."""
    import torch

    from sessions.capture.plugin.eagle3_capture.hook import CaptureHook
    from sessions.capture.plugin.eagle3_capture.spec import CaptureSpec
    from sessions.capture.writer import read_chunks

    class Mode:
        def is_extend_without_speculative(self) -> bool:
            return True

    class Batch:
        forward_mode = Mode()
        rids = ("eagle3-check-0", "HEALTH_CHECK_0", "eagle3-check-1")
        extend_prefix_lens_cpu = (0, 0, 0)
        extend_seq_lens_cpu = (1500, 1, 2500)

    class Output:
        pass

    class Result:
        logits_output = Output()

    class Model:
        layers_to_capture = (2, 30, 58)

    class Runner:
        is_draft_worker = False
        model = Model()

    total = sum(Batch.extend_seq_lens_cpu)
    workdir = Path(tempfile.mkdtemp(prefix="eagle3-hook-check-", dir=base))
    try:
        aux = torch.randn(total, 3 * 1024, device=device).to(torch.bfloat16)
        last = torch.randn(total, 1024, device=device).to(torch.bfloat16)
        Batch.input_ids = torch.arange(total, device=device)
        want_aux, want_last = aux.cpu().clone(), last.cpu().clone()
        Result.logits_output.hidden_states, Result.logits_output.last_hidden_states = aux, last
        hook = CaptureHook(CaptureSpec(dir=str(workdir / "cap"), fsync=False), writer_rank=True)
        hook.after_forward(Result(), Runner(), Batch())
        aux.fill_(7.0)  # the next replay reuses the buffers
        last.fill_(-7.0)
        hook.flush()
        hook.close()
        got0, _, _ = read_chunks(workdir / "cap", "eagle3-check-0")
        got1, last1, ids1 = read_chunks(workdir / "cap", "eagle3-check-1")
        ok = (torch.equal(got0, want_aux[:1500]) and torch.equal(got1, want_aux[1501:])
              and torch.equal(last1, want_last[1501:]) and ids1[0].item() == 1501
              and not (workdir / "cap" / "HEALTH_CHECK_0").exists())
        return f"hook copy check on {device}: {'ok' if ok else 'MISMATCH'}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
