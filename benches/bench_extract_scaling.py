"""Bench: one extraction job over N servers scales with N (issue 24 item 5, last part).

Starts N emulator servers (N = 1, 2, 4 by default) serving a tiny demo model with capture on, each on its
own emulated GPU and capture dir, and runs the same job (the same dataset) over them with ``servers =
[...]`` (N = 1: the one-server job).  The servers' step time is *modelled*, not CPU-bound: the emulator's
cost model (``--emulate-prefill-tokens-per-s``, ``[emulator] decode_tokens_per_s``) makes each prefill last
``1/decode_rate + tokens/prefill_rate`` seconds of sleep, and the real forward of the tiny model is far
shorter, so N servers have N times the capacity, as N GPUs would, even on a 2-core machine.

``--device cuda`` runs real-model replicas instead (issue 24 item 5 on the H200): N emulator servers, each
serving a full-width demo model (``--hidden-size``, ``--layers``) on the one GPU (each replica's rank on
GPU 0, as N replicas of a small target share a card), with no modelled step time: the rate is the GPU's
and the job's own.  Dumps go to ``/dev/shm`` there, as in a real job.

Prints (it never asserts):
  sps[N]        samples/s of the job, from its first request to its last recorded outcome
  ratio[N]      sps[N] / sps[1]                                                  [target >= 0.9 * N]

Usage: ``python benches/bench_extract_scaling.py [--servers 1,2,4] [--samples 240] [--prefill-tps 1500]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(home, name: str, model: Path, capture: Path, gpu: int, args) -> object:
    import tomli_w

    from sessions.profiles import load_profile
    from sessions.server import ServerSession

    server: dict = {"launcher": "emulator", "python": sys.executable, "model_path": str(model), "tp_size": 1,
                    "host": "127.0.0.1", "port": free_port()}
    emulator: dict = {"time_scale": 0.001, "fault": "none"}
    if args.device == "cuda":  # a real forward on the one GPU: every replica's rank is on GPU 0
        server["chunked_prefill_size"] = -1
    else:  # the modelled step time; the emulated GPUs are disjoint, as replicas' are
        server["env"] = {"CUDA_VISIBLE_DEVICES": ""}
        server["extra_args"] = ["--base-gpu-id", str(gpu), "--emulate-prefill-tokens-per-s", str(args.prefill_tps)]
        emulator["decode_tokens_per_s"] = args.decode_tps
    doc = {"server": server, "emulator": emulator,
           "capture": {"enabled": True, "dir": str(capture), "rid_prefix": "eagle3-"}}
    path = home.profiles_dir / f"{name}.toml"
    path.write_text(tomli_w.dumps(doc))
    return ServerSession.launch(load_profile(path), home)


def wait_ready(sessions: list) -> None:
    deadline = time.monotonic() + 300
    for session in sessions:
        while session.status().state != "ready":
            if time.monotonic() > deadline:
                raise SystemExit(f"{session.session_id}: the emulator did not get ready; see {session.log_path}")
            time.sleep(0.2)


def run(home, work: Path, dataset: Path, sessions: list, tag: str, concurrency: int) -> float:
    from _extract_support import write_spec

    from sessions.extraction.job import job_status, run_job

    names = [s.session_id for s in sessions]
    keys = {"session": names[0]} if len(names) == 1 else {"servers": names}
    spec = write_spec(work / f"{tag}.toml", name=tag, dataset=dataset, output_dir=work / f"out-{tag}",
                      concurrency=concurrency, **keys)
    job_id = run_job(spec, home)
    deadline = time.monotonic() + 1800
    while (progress := job_status(job_id, home)).state not in ("done", "failed", "cancelled", "interrupted"):
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} did not finish")
        time.sleep(0.2)
    if progress.state != "done":
        raise SystemExit(f"job {job_id} {progress.state}: {progress.reason}")
    raw = json.loads((Path(progress.job_dir) / "progress.json").read_text())
    rows = ", ".join(f"{r['name'][-4:]} {r['done']}" for r in raw.get("servers") or [])
    sps = raw["done_this_run"] / (raw["last_progress_at"] - raw["pipeline_started_at"])
    print(f"  job {tag}: {raw['done_this_run']} samples, {sps:.1f} samples/s" + (f" (per server: {rows})" if rows
                                                                                   else ""), flush=True)
    shutil.rmtree(work / f"out-{tag}", ignore_errors=True)
    return sps


def capture_only(sessions: list, renderer, dataset: Path, tag: str, concurrency: int) -> float:
    """The same samples sent straight to the N servers (round robin, ``concurrency`` each) with the capture
    prefix, nobody collecting: what the servers (and the one GPU they share) give without the job."""
    import asyncio

    sys.path.insert(0, str(REPO_ROOT / "benches"))
    from bench_extract import fire

    from sessions.extraction.datasets import iter_dataset

    ids = [renderer.render(r).input_ids for r in iter_dataset(dataset)]
    urls = [f"http://127.0.0.1:{s.status().port}" for s in sessions]

    async def all_servers() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(fire(url, [{"rid": f"eagle3-{tag}-{k}-{i}", "input_ids": list(x)}
                                          for i, x in enumerate(ids) if i % len(urls) == k], concurrency)
                               for k, url in enumerate(urls)))
        return len(ids) / (time.perf_counter() - started)

    sps = asyncio.run(all_servers())
    print(f"  capture-only {tag}: {sps:.1f} samples/s", flush=True)
    return sps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default="1,2,4", help="the server counts to run")
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--answer-words", type=int, default=12)
    parser.add_argument("--prefill-tps", type=float, default=1500.0,
                        help="modelled prefill tokens/s of each server (the step time is this, not the CPU)")
    parser.add_argument("--decode-tps", type=float, default=90.0, help="modelled single-stream decode rate")
    parser.add_argument("--concurrency", type=int, default=8, help="the job's window ceiling per server")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: real-model replicas on the one GPU, no modelled step time")
    parser.add_argument("--hidden-size", type=int, default=None, help="the demo model's width (64; cuda: 1024)")
    parser.add_argument("--layers", type=int, default=8, help="the demo model's depth")
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no GPU here")
    hidden = args.hidden_size or (1024 if args.device == "cuda" else 64)
    counts = [int(n) for n in args.servers.split(",")]
    from _extract_support import chat_rows, write_dataset

    from sessions.demo_model import write_demo_model
    from sessions.home import HOME_ENV, resolve_home

    with tempfile.TemporaryDirectory(prefix="bench-scaling-home-") as tmp:
        os.environ[HOME_ENV] = tmp
        os.environ.pop("EAGLE3_TUI_DEMO", None)
        home = resolve_home().ensure()
        model = write_demo_model(home.state_root / "models" / "demo", num_layers=args.layers, hidden_size=hidden)
        work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
        shm = Path("/dev/shm") if args.device == "cuda" and os.path.isdir("/dev/shm") else None
        dumps = Path(tempfile.mkdtemp(prefix="bench-scaling-capture-", dir=shm)) if shm else work
        dataset = write_dataset(work / "data.jsonl", chat_rows(args.samples, words=args.answer_words))
        sessions = []
        try:
            for i in range(max(counts)):
                capture = dumps / f"capture-{i}"
                capture.mkdir(mode=0o700)
                sessions.append(launch(home, f"emu{i}", model, capture, i, args))
            wait_ready(sessions)
            each = (f"a real forward of the demo model (H={hidden}, {args.layers} layers) on the one GPU"
                    if args.device == "cuda" else
                    f"modelled prefill {args.prefill_tps:g} tokens/s, decode {args.decode_tps:g} tokens/s")
            print(f"{args.samples} samples; each server: {each}; window ceiling {args.concurrency} per server; "
                  f"{os.cpu_count()} CPUs", flush=True)
            run(home, work, dataset, sessions[:1], "warm", args.concurrency)  # tokenizer caches, connections
            results: dict[int, list[float]] = {n: [] for n in counts}
            direct: dict[int, list[float]] = {n: [] for n in counts}
            renderer = None
            if args.device == "cuda":
                from sessions.extraction.rendering import ChatRenderer

                renderer = ChatRenderer.load(model, max_length=4096)
            for r in range(args.rounds):
                for n in counts:
                    results[n].append(run(home, work, dataset, sessions[:n], f"n{n}-r{r}", args.concurrency))
                    if renderer is not None:
                        direct[n].append(capture_only(sessions[:n], renderer, dataset, f"n{n}-r{r}",
                                                      args.concurrency))
                        for i in range(n):
                            for entry in (dumps / f"capture-{i}").iterdir():
                                shutil.rmtree(entry, ignore_errors=True)
            import statistics

            base = statistics.median(results[counts[0]]) if counts[0] == 1 else None
            for n in counts:
                sps = statistics.median(results[n])
                ratio = f"{sps / base:6.2f}" if base else "   n/a"
                print(f"sps[{n}]   {sps:8.1f} samples/s   ratio[{n}] {ratio}   [target >= {0.9 * n:.1f}]")
                if direct[n]:
                    own = statistics.median(direct[n])
                    print(f"capture_only[{n}] {own:8.1f} samples/s (the servers without the job); job / that "
                          f"{sps / own:5.2f}")
        finally:
            for session in sessions:
                session.stop(grace_s=10)
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(dumps, ignore_errors=True)


if __name__ == "__main__":
    main()
