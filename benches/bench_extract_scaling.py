"""Bench: one extraction job over N servers scales with N (issue 24 item 5, last part).

Starts N emulator servers (N = 1, 2, 4 by default) serving a tiny demo model with capture on, each on its
own emulated GPU and capture dir, and runs the same job (the same dataset) over them with ``servers =
[...]`` (N = 1: the one-server job).  The servers' step time is *modelled*, not CPU-bound: the emulator's
cost model (``--emulate-prefill-tokens-per-s``, ``[emulator] decode_tokens_per_s``) makes each prefill last
``1/decode_rate + tokens/prefill_rate`` seconds of sleep, and the real forward of the tiny model is far
shorter, so N servers have N times the capacity, as N GPUs would, even on a 2-core machine.

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

    doc = {"server": {"launcher": "emulator", "python": sys.executable, "model_path": str(model), "tp_size": 1,
                      "host": "127.0.0.1", "port": free_port(), "env": {"CUDA_VISIBLE_DEVICES": ""},
                      "extra_args": ["--base-gpu-id", str(gpu), "--emulate-prefill-tokens-per-s",
                                     str(args.prefill_tps)]},
           "emulator": {"time_scale": 0.001, "fault": "none", "decode_tokens_per_s": args.decode_tps},
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
    args = parser.parse_args()
    counts = [int(n) for n in args.servers.split(",")]
    from _extract_support import chat_rows, write_dataset

    from sessions.demo_model import write_demo_model
    from sessions.home import HOME_ENV, resolve_home

    with tempfile.TemporaryDirectory(prefix="bench-scaling-home-") as tmp:
        os.environ[HOME_ENV] = tmp
        os.environ.pop("EAGLE3_TUI_DEMO", None)
        home = resolve_home().ensure()
        model = write_demo_model(home.state_root / "models" / "demo", num_layers=8, hidden_size=64)
        work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
        dataset = write_dataset(work / "data.jsonl", chat_rows(args.samples, words=args.answer_words))
        sessions = []
        try:
            for i in range(max(counts)):
                capture = work / f"capture-{i}"
                capture.mkdir(mode=0o700)
                sessions.append(launch(home, f"emu{i}", model, capture, i, args))
            wait_ready(sessions)
            print(f"{args.samples} samples; each server: modelled prefill {args.prefill_tps:g} tokens/s, decode "
                  f"{args.decode_tps:g} tokens/s; window ceiling {args.concurrency} per server; "
                  f"{os.cpu_count()} CPUs", flush=True)
            run(home, work, dataset, sessions[:1], "warm", args.concurrency)  # tokenizer caches, connections
            results: dict[int, list[float]] = {n: [] for n in counts}
            for r in range(args.rounds):
                for n in counts:
                    results[n].append(run(home, work, dataset, sessions[:n], f"n{n}-r{r}", args.concurrency))
            import statistics

            base = statistics.median(results[counts[0]]) if counts[0] == 1 else None
            for n in counts:
                sps = statistics.median(results[n])
                ratio = f"{sps / base:6.2f}" if base else "   n/a"
                print(f"sps[{n}]   {sps:8.1f} samples/s   ratio[{n}] {ratio}   [target >= {0.9 * n:.1f}]")
        finally:
            for session in sessions:
                session.stop(grace_s=10)
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
