"""Bench: the extraction client and collector are never the bottleneck (DESIGN §8).

Prints (targets in brackets; it never asserts):
  dispatch_rps        /generate requests/s our client sustains against the emulator answering with its
                      FixedBackend on a config-only model dir (no model, near no-op)      [>= 2000]
  collector_gbps      output GB/s of the collector (map dumps, check, torch.save, rename, delete dumps,
                      group commit alongside) vs `cp -r` of the same dump bytes           [>= 0.90 of cp]
                      (and until durable, vs `cp -r` + `sync`); collector_cpu_ms: CPU a sample on that path
  extraction          rounds of (plain prefill, extraction job, capture-only) on one emulator server with a
                      real model behind it; medians.  ``--shape llama8b`` (H=4096, 16 layers, ~1,000 tokens a
                      sample) and ``--shape kimi`` (H=7168, 8 layers, ~522 tokens, 30 MB a sample) set the
                      width, depth and sample length of issue 24 item 5.  Printed:
                        plain_prefill_sps, capture_only_sps, extraction_sps
                        collect_overhead_ratio  extraction vs capture-only              [target >= 0.97]
                        disk_durable_mbps / disk_durable_sps  `dd ... conv=fsync` into the output filesystem
                        vs_limit  extraction vs min(capture-only, disk durable sps)      [target >= 0.95]
                        job_cpu_ms_per_sample  the job process's own CPU time per sample (steadier than the
                                      rates on a shared machine)

Usage: ``python benches/bench_extract.py [--device cpu|cuda] [--only dispatch,collector,extraction]
[--shape llama8b|kimi]``.  ``--device cuda`` puts the emulator's model on the GPU (the lead runs it on the
H200); size the model with ``--hidden-size``/``--layers`` and the load with ``--samples``/``--answer-words``
(or ``--tokens``), which override the shape's.  On the H200 (a full-width demo model, its rank holding
GPU memory):

    python3 benches/bench_extract.py --device cuda --only extraction --shape llama8b --samples 600
    python3 benches/bench_extract.py --device cuda --only extraction --shape kimi --samples 600

On a CPU-only machine the model is ``--thin`` by default (the real hidden size, so the dumps have the
real width, but 2 attention heads and a 64-wide MLP, so a forward takes a second, not a minute):

    python benches/bench_extract.py --only extraction --shape llama8b --samples 12
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(home, name: str, model_dir: Path, capture_dir: Path | None, env_device: str, **server) -> object:
    import tomli_w

    from sessions.profiles import load_profile
    from sessions.server import ServerSession

    doc: dict = {"server": {"launcher": "emulator", "python": sys.executable, "model_path": str(model_dir),
                            "tp_size": 1, "host": "127.0.0.1", "port": free_port(), **server},
                 "emulator": {"time_scale": 0.001, "fault": "none"}}
    if env_device == "cpu":
        doc["server"]["env"] = {"CUDA_VISIBLE_DEVICES": ""}
    if capture_dir is not None:
        doc["capture"] = {"enabled": True, "dir": str(capture_dir), "rid_prefix": "eagle3-"}
    path = home.profiles_dir / f"{name}.toml"
    path.write_text(tomli_w.dumps(doc))
    session = ServerSession.launch(load_profile(path), home)
    deadline = time.monotonic() + 300
    while session.status().state != "ready":
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: the emulator did not get ready; see {session.log_path}")
        time.sleep(0.2)
    return session


async def fire(url: str, payloads: list[dict], concurrency: int, cpu: list | None = None,
               finished: list | None = None) -> float:
    """Send every payload through our client's request path; returns requests/s (``cpu`` gets the
    client's own CPU seconds, so its capacity can be told apart from the server's; ``finished`` gets
    (seconds since the start, answers so far) at each answer, for `steady_rate`)."""
    from sessions.extraction.client import ExtractionClient

    client = ExtractionClient(url, concurrency=concurrency, request_timeout_s=120)
    queue = list(reversed(payloads))

    answered = 0

    async def worker() -> None:
        nonlocal answered
        while queue:
            payload = queue.pop()
            await client.post_generate(payload["rid"], payload["input_ids"])
            answered += 1
            if finished is not None:
                finished.append((time.perf_counter() - started, answered))

    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    if cpu is not None:
        cpu.append(time.process_time() - cpu_started)
    await client.aclose()
    return len(payloads) / elapsed


def bench_dispatch(home, args) -> None:
    model_dir = home.state_root / "models" / "config-only"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024}))
    session = launch(home, "noop", model_dir, None, "cpu", radix_cache=False)
    try:
        url = f"http://127.0.0.1:{session.status().port}"
        payloads = [{"rid": f"bench-{i}", "input_ids": [1, 2, 3, 4, 5, 6, 7, 8]} for i in range(args.requests)]
        asyncio.run(fire(url, payloads[:200], args.concurrency))  # warm up connections
        cpu: list[float] = []
        rps = asyncio.run(fire(url, payloads, args.concurrency, cpu))
        print(f"dispatch_rps           {rps:9.0f}  requests/s end to end, concurrency {args.concurrency}, "
              f"{args.requests} requests (the emulator's FixedBackend answering)")
        print(f"client_capacity_rps    {args.requests / cpu[0]:9.0f}  requests per client CPU second "
              f"({1e6 * cpu[0] / args.requests:.0f} us each; one core's worth)       [target >= 2000]")
    finally:
        session.stop(grace_s=10)


def bench_collector(home, args) -> None:
    """The job's collector path on the same bytes as ``cp``: dumps in the capture dir (``/dev/shm`` as in
    a real job) → read, check, ``torch.save`` into the output dir by ``--collector-workers`` threads, with
    the job's group commit (``OutputDir.commit``: one ``syncfs`` per batch, then the manifest lines) running
    alongside.  Timed twice: until every file is written (vs ``cp -r`` of the dumps, which never syncs) and
    until the last batch is durable and recorded (vs ``cp -r`` + ``sync``)."""
    import threading

    import torch

    from sessions.capture.writer import write_chunks
    from sessions.extraction.bookkeeping import COMMIT_INTERVAL_S
    from sessions.extraction.collector import collect_sample, remove_dumps
    from sessions.extraction.output import ManifestEntry, OutputDir

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    capture = Path(tempfile.mkdtemp(prefix="bench-collector-capture-", dir=shm))
    os.chmod(capture, 0o700)
    work = Path(tempfile.mkdtemp(prefix="bench-collector-", dir=args.scratch))
    hidden, layers, tokens, count = args.collector_hidden, 3, args.collector_tokens, args.collector_samples
    aux = torch.randn(tokens, layers * hidden).bfloat16()
    last = torch.randn(tokens, hidden).bfloat16()
    ids = torch.arange(tokens)
    for i in range(count):
        write_chunks(capture, [f"eagle3-b-{i}"], [0], [tokens], aux, last, ids, {"layers": [2, 4, 5]}, fsync=False)
    dump_bytes = sum(p.stat().st_size for p in capture.rglob("*.safetensors"))

    def cp(sync: bool) -> float:
        subprocess.run(["sync"], check=True)  # start from a clean page cache state, as the collector does
        dst = work / f"cp-{'sync' if sync else 'plain'}"
        started = time.perf_counter()
        subprocess.run(["cp", "-r", str(capture), str(dst)], check=True)
        if sync:
            subprocess.run(["sync", "-f", str(dst)], check=True)
        elapsed = time.perf_counter() - started
        shutil.rmtree(dst)
        return dump_bytes / elapsed / 1e9

    cp_gbps, cp_sync_gbps = cp(False), cp(True)

    out = OutputDir(work / "out")
    out.acquire("b", fresh=True)
    mask = [1] * tokens
    written: list[ManifestEntry] = []
    lock = threading.Lock()
    all_written = threading.Event()

    def collect_one(i: int) -> int:  # what a job's collector thread does per sample
        rid = f"eagle3-b-{i}"
        sample, _ = collect_sample(capture, rid, f"b-{i}", ids.tolist(), mask, None, 5.0)
        rel, size, checksum = out.write_sample(i, sample)
        remove_dumps(capture, rid)
        with lock:
            written.append(ManifestEntry(index=i, line=i + 1, sample_id=f"b-{i}", status="ok", tokens=tokens,
                                         path=rel, bytes=size, checksum=checksum))
        return size

    def committer() -> None:  # the job's commit loop: every COMMIT_INTERVAL_S, one flush per batch
        while True:
            done = all_written.wait(COMMIT_INTERVAL_S)
            with lock:
                batch = written[:]
                written.clear()
            out.commit(batch)
            if done and not written:
                return

    from concurrent.futures import ThreadPoolExecutor

    subprocess.run(["sync"], check=True)
    commit_thread = threading.Thread(target=committer)
    started, cpu_started = time.perf_counter(), time.process_time()
    commit_thread.start()
    with ThreadPoolExecutor(max_workers=args.collector_workers) as pool:
        total = sum(pool.map(collect_one, range(count)))
    written_s = time.perf_counter() - started
    all_written.set()
    commit_thread.join()
    durable_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    recorded = len(out.read_manifest()[0])
    out.release()
    shutil.rmtree(work)
    shutil.rmtree(capture, ignore_errors=True)
    collector_gbps, durable_gbps = total / written_s / 1e9, total / durable_s / 1e9
    print(f"collector_gbps         {collector_gbps:9.2f}  GB/s until every file is written ({count} samples x {tokens} "
          f"tokens, H={hidden}, {total / count / 1e6:.1f} MB each, {args.collector_workers} threads, dumps in "
          f"{shm or 'tmp'}, output on {args.scratch})")
    print(f"cp_gbps                {cp_gbps:9.2f}  GB/s (cp -r of the same dump bytes to the same place, no sync)")
    print(f"collector_vs_cp        {collector_gbps / cp_gbps:9.2f}                                               "
          "[target >= 0.90]")
    print(f"collector_durable_gbps {durable_gbps:9.2f}  GB/s until the last group commit (syncfs) recorded all "
          f"{recorded} samples in the manifest")
    print(f"cp_sync_gbps           {cp_sync_gbps:9.2f}  GB/s (cp -r + sync)")
    print(f"collector_cpu_ms       {1e3 * cpu_s / count:9.1f}  ms of CPU a sample (read, check, save, checksum, "
          "commit), steadier than GB/s on a shared machine")
    print(f"durable_vs_cp_sync     {durable_gbps / cp_sync_gbps:9.2f}")


SHAPES = {  # issue 24 item 5: (hidden size, layers, tokens a sample)
    "llama8b": (4096, 16, 1000),
    "kimi": (7168, 8, 522),
    "toy": (256, 8, 93),
}


def disk_durable_rate(where: str, megabytes: int) -> float:
    """MB/s that ``dd if=/dev/zero bs=4M conv=fsync`` writes durably into ``where`` (the output filesystem)."""
    target = Path(tempfile.mkdtemp(prefix="bench-dd-", dir=where)) / "dd.bin"
    try:
        subprocess.run(["sync"], check=True)
        started = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={max(1, megabytes // 4)}",
                        "conv=fsync", "status=none"], check=True)
        elapsed = time.perf_counter() - started
        return target.stat().st_size / elapsed / 1e6
    finally:
        shutil.rmtree(target.parent, ignore_errors=True)


def steady_rate(timeline: list[tuple[float, int]], total: int, low: float = 0.1, high: float = 0.9) -> float:
    """Samples/s between the moments ``low`` and ``high`` of ``total`` were done: the rate without the
    fixed costs at either end (the first forward, the last flush), which weigh ~10 % in a 4-s round."""
    first = next(((t, n) for t, n in timeline if n >= low * total), None)
    last = next(((t, n) for t, n in timeline if n >= high * total), None)
    if first is None or last is None or last[0] <= first[0]:
        return float("nan")
    return (last[1] - first[1]) / (last[0] - first[0])


def manifest_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


def rows_for_tokens(renderer, count: int, tokens: int, path: Path) -> tuple[Path, list[list[int]]]:
    """A dataset at ``path`` whose rendered samples average ``tokens`` (the answer length found by bisection)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from _extract_support import write_dataset

    from sessions.extraction.datasets import iter_dataset

    def rows(words: int) -> list[dict]:  # answers of 0.5x to 1.5x ``words`` repeats: T differs per sample
        out = []
        for i in range(count):
            answer = " ".join(["the capital of France is Paris"] * max(1, round(words * (0.5 + (i % 11) / 10))))
            out.append({"conversations": [{"from": "human", "value": f"Question {i}: where is Paris?"},
                                          {"from": "gpt", "value": f"Answer {i}: {answer}."}]})
        return out

    def render(words: int) -> tuple[Path, list[list[int]]]:
        write_dataset(path, rows(words))
        return path, [list(renderer.render(r).input_ids) for r in iter_dataset(path)]

    low, high = 1, 1024
    while low < high:
        mid = (low + high) // 2
        _, ids = render(mid)
        if sum(map(len, ids)) / count < tokens:
            low = mid + 1
        else:
            high = mid
    return render(low)


class CpuWatch:
    """The job process's CPU seconds while its pipeline runs (polled: it exits at the end)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0

    def poll(self, pid: int | None, running: bool) -> None:
        import psutil

        if not pid or not running:
            return
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return
        total = times.user + times.system
        if self.first is None:
            self.first = total
        self.last = total

    @property
    def seconds(self) -> float:
        return self.last - (self.first or 0.0)


def bench_extraction(home, args) -> None:
    """Rounds of (plain prefill, extraction job, capture-only) on one server, interleaved so that drift of
    the machine hits all three alike; medians are compared.  Each job is fresh (its own output dir) and is
    timed from its first request to its last recorded outcome (tokenizer load and the final dataset.json
    are fixed costs outside that window)."""
    import statistics

    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from _extract_support import chat_rows, write_dataset, write_spec

    from sessions.demo_model import write_demo_model
    from sessions.extraction.datasets import iter_dataset
    from sessions.extraction.job import job_status, run_job
    from sessions.extraction.rendering import ChatRenderer

    thin = args.thin if args.thin is not None else args.device == "cpu"
    model = write_demo_model(home.state_root / "models" / "demo", num_layers=args.layers,
                             hidden_size=args.hidden_size, attention_heads=2 if thin else None,
                             intermediate_size=64 if thin else None)
    capture = Path(tempfile.mkdtemp(prefix="bench-capture-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    os.chmod(capture, 0o700)
    session = launch(home, "capture", model, capture, args.device, chunked_prefill_size=-1)
    work = Path(tempfile.mkdtemp(prefix="bench-extract-", dir=args.scratch))
    try:
        url = f"http://127.0.0.1:{session.status().port}"
        renderer = ChatRenderer.load(model, max_length=4096)
        if args.tokens:
            dataset, ids = rows_for_tokens(renderer, args.samples, args.tokens, work / "data.jsonl")
        else:
            dataset = write_dataset(work / "data.jsonl", chat_rows(args.samples, words=args.answer_words))
            ids = [renderer.render(r).input_ids for r in iter_dataset(dataset)]
        tokens = sum(len(x) for x in ids)
        for warm in range(args.warmups):  # warm up the model (the first GPU calls are slow) and the connections
            asyncio.run(fire(url, [{"rid": f"warm-{warm}-{i}", "input_ids": list(x)} for i, x in enumerate(ids)],
                             args.concurrency))
        plain, job, capture_only, cpu_per_sample, written = [], [], [], [], 0.0
        job_steady: list[float] = []
        capture_steady: list[float] = []
        for r in range(args.rounds):
            plain.append(asyncio.run(fire(url, [{"rid": f"plain-{r}-{i}", "input_ids": list(x)}  # no capture prefix
                                                for i, x in enumerate(ids)], args.concurrency)))
            spec = write_spec(work / f"job-{r}.toml", name=f"bench-{r}", session=session.session_id,
                              dataset=dataset, output_dir=work / f"out-{r}", concurrency=args.concurrency)
            job_id = run_job(spec, home)
            deadline = time.monotonic() + 1800
            watch = CpuWatch()
            profiler = None
            timeline: list[tuple[float, int]] = []  # (wall clock, manifest lines): the commits as they land
            manifest = work / f"out-{r}" / "manifest.jsonl"
            while (progress := job_status(job_id, home)).state not in ("done", "failed", "cancelled", "interrupted"):
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job_id} did not finish")
                watch.poll(progress.pid, progress.state == "running")
                if args.py_spy and r == 0 and profiler is None and progress.state == "running" and progress.pid:
                    profiler = subprocess.Popen([args.py_spy, "record", "--nonblocking", "--threads", "--rate", "50",
                                                 *(["--idle"] if args.py_spy_idle else []),
                                                 "-f", "raw", "-o", str(Path(args.py_spy_out).resolve()),
                                                 "--pid", str(progress.pid)],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(10):  # the manifest every 20 ms, the job's state every 200 ms
                    timeline.append((time.time(), manifest_lines(manifest)))
                    time.sleep(0.02)
            if profiler is not None:
                profiler.wait(timeout=60)  # it ends with the job process
            if progress.state != "done":
                raise SystemExit(f"job {job_id} {progress.state}: {progress.reason}")
            raw = json.loads((Path(progress.job_dir) / "progress.json").read_text())
            job.append(raw["done_this_run"] / (raw["last_progress_at"] - raw["pipeline_started_at"]))
            job_steady.append(steady_rate([(t - raw["pipeline_started_at"], n) for t, n in timeline],
                                          raw["done_this_run"]))
            cpu_per_sample.append(watch.seconds / max(1, raw["done_this_run"]))
            written = raw["bytes"]
            shutil.rmtree(work / f"out-{r}")
            # The same requests with the capture rid prefix: the server dumps, nobody collects (deleted after).
            answers: list[tuple[float, int]] = []
            capture_only.append(asyncio.run(fire(url, [{"rid": f"eagle3-capture-only-{r}-{i}", "input_ids": list(x)}
                                                       for i, x in enumerate(ids)], args.concurrency,
                                                 finished=answers)))
            capture_steady.append(steady_rate(answers, len(ids)))
            for entry in capture.iterdir():
                shutil.rmtree(entry, ignore_errors=True)
            print(f"round {r + 1}: plain {plain[-1]:.2f}, extraction {job[-1]:.2f}, capture-only "
                  f"{capture_only[-1]:.2f} samples/s; job CPU {1e3 * cpu_per_sample[-1]:.0f} ms a sample; "
                  f"steady (10-90 %): extraction {job_steady[-1]:.2f}, capture-only {capture_steady[-1]:.2f}",
                  flush=True)
        med_plain, med_job, med_capture = (statistics.median(v) for v in (plain, job, capture_only))
        disk_mbps = disk_durable_rate(args.scratch, args.dd_mb)
        sample_mb = written / args.samples / 1e6
        disk_sps = disk_mbps / sample_mb
        limit = min(med_capture, disk_sps)

        def spread(values: list[float]) -> str:
            return ", ".join(f"{v:.2f}" for v in values)

        width = (f"H={args.hidden_size}, {args.layers} layers{' (thin)' if thin else ''}, "
                 f"{tokens / args.samples:.0f} tokens a sample, {sample_mb:.1f} MB a sample, device {args.device}")
        print(f"shape                  {args.shape or 'custom'}: {width}")
        print(f"plain_prefill_sps      {med_plain:9.2f}  samples/s, median of {args.rounds} rounds ({spread(plain)}); "
              f"{args.samples} samples")
        print(f"capture_only_sps       {med_capture:9.2f}  samples/s, median ({spread(capture_only)}): the same "
              "requests with the capture rid prefix, the server dumps, nothing collects")
        print(f"extraction_sps         {med_job:9.2f}  samples/s, median ({spread(job)}); {written / 1e6:.1f} MB "
              "written per job")
        print(f"job_cpu_ms_per_sample  {1e3 * statistics.median(cpu_per_sample):9.1f}  ms of the job process's CPU "
              f"a sample, median ({', '.join(f'{1e3 * v:.0f}' for v in cpu_per_sample)})")
        print(f"server_dump_ratio      {med_capture / med_plain:9.3f}  capture-only vs plain: the server-side cost "
              "of dumping")
        print(f"collect_overhead_ratio {med_job / med_capture:9.3f}  extraction vs capture-only: our client + "
              "collector alone                           [target >= 0.97]")
        print(f"disk_durable_mbps      {disk_mbps:9.1f}  MB/s, dd bs=4M conv=fsync of {args.dd_mb} MB into "
              f"{args.scratch}")
        print(f"disk_durable_sps       {disk_sps:9.2f}  samples/s the disk takes durably at {sample_mb:.1f} MB a "
              "sample")
        steady_job, steady_capture = statistics.median(job_steady), statistics.median(capture_steady)
        print(f"steady_ratio           {steady_job / steady_capture:9.3f}  the same between 10 % and 90 % of each "
              f"run's samples (extraction {steady_job:.2f}, capture-only {steady_capture:.2f}): the per-sample "
              "cost without either end's fixed cost")
        verdict = "ok" if med_job >= 0.95 * limit else "BELOW"
        print(f"vs_limit               {med_job / limit:9.3f}  extraction vs min(capture-only {med_capture:.2f}, "
              f"disk {disk_sps:.2f}) = {limit:.2f}; 0.95 x limit = {0.95 * limit:.2f}: {verdict}  [target >= 0.95]")
    finally:
        session.stop(grace_s=10)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(capture, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="dispatch,collector,extraction")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--collector-samples", type=int, default=40)
    parser.add_argument("--collector-tokens", type=int, default=None, help="default 1024, or the shape's")
    parser.add_argument("--collector-hidden", type=int, default=None, help="default 4096, or the shape's")
    parser.add_argument("--collector-workers", type=int, default=8,
                        help="collector threads (a job uses min(8, concurrency))")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved (plain, job, capture-only) rounds")
    parser.add_argument("--warmups", type=int, default=2, help="passes over the samples before the rounds")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None,
                        help="hidden size, layers and tokens a sample of issue 24 item 5 (llama8b, kimi)")
    parser.add_argument("--answer-words", type=int, default=None, help="answer repeats (default 12)")
    parser.add_argument("--tokens", type=int, default=0, help="average tokens a sample (sets the answer length)")
    parser.add_argument("--hidden-size", type=int, default=None, help="default 256, or the shape's")
    parser.add_argument("--layers", type=int, default=None, help="default 8, or the shape's")
    parser.add_argument("--thin", action=argparse.BooleanOptionalAction, default=None,
                        help="2 attention heads and a 64-wide MLP at the real hidden size (default: on for cpu)")
    parser.add_argument("--dd-mb", type=int, default=1024, help="MB that the durable disk rate is measured on")
    parser.add_argument("--py-spy", default=None, help="py-spy binary: record the first round's job process")
    parser.add_argument("--py-spy-idle", action="store_true", help="py-spy --idle: threads waiting too")
    parser.add_argument("--py-spy-out", default="bench-extract-job.pyspy.txt", help="where py-spy writes (raw)")
    parser.add_argument("--scratch", default=tempfile.gettempdir(), help="where output files are written")
    args = parser.parse_args()
    shape = SHAPES.get(args.shape or "", (256, 8, 0))
    args.hidden_size = args.hidden_size or shape[0]
    args.layers = args.layers or shape[1]
    if not args.tokens and args.answer_words is None:
        args.tokens = shape[2]  # 0 without a shape: the answer length below
    args.answer_words = args.answer_words or 12
    args.collector_hidden = args.collector_hidden or (shape[0] if args.shape else 4096)
    args.collector_tokens = args.collector_tokens or (shape[2] if args.shape else 1024)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no GPU here")
    from sessions.home import HOME_ENV, resolve_home

    with tempfile.TemporaryDirectory(prefix="bench-extract-home-") as tmp:
        os.environ[HOME_ENV] = tmp
        os.environ.pop("EAGLE3_TUI_DEMO", None)
        home = resolve_home().ensure()
        chosen = set(args.only.split(","))
        if "dispatch" in chosen:
            bench_dispatch(home, args)
        if "collector" in chosen:
            bench_collector(home, args)
        if "extraction" in chosen:
            bench_extraction(home, args)


if __name__ == "__main__":
    main()
