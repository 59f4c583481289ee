"""Log reading benchmarks (DESIGN §8: a 2 GB log opens with its tail visible in < 0.5 s, following at 50k
lines/s falls less than 1 s behind, RSS stays < 200 MB).  Prints numbers; asserts nothing.

    .venv/bin/python benches/bench_logs.py [--size-gb 2] [--dir DIR] [--follow-s 10] [--keep]

It writes a synthetic SGLang 0.5.23 log (a TP8 startup, then runtime lines: decode/prefill batches,
access lines and a sprinkle of other messages) into a temporary folder and measures, each in a fresh
process so that peak RSS belongs to that measurement alone:

* parse: `summarize_file` over the whole file (lines/s, MB/s), next to `grep -c` on the same file;
* tui: the TUI's own path: a headless Textual app with the real `LogView`, fed by the real `LogFeed.poll`
  in a thread worker as the dashboard does; first paint = from the first poll's start to the first frame
  whose view shows the log's last line; "poll" = how long that poll held the dashboard's snapshot (the
  GPU and status panels wait for it); "max tick gap" = the longest pause of a 20 ms UI timer meanwhile.
  Next to it, `tail -n 1000` on the same file, and the same app on a small log;
* tail: `LogFile.open` + `tail_lines(1000)`, then building the full line index;
* follow: a writer process appends 50k lines/s while a reader polls (`LogFile.poll` every 50 ms, each new
  line fed to a `StartupTracker` as the TUI would); lag = when the reader got a line - when it was written.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# BENCH_REPO runs the measurements against another checkout (the "before" of a change) with this script.
sys.path.insert(0, os.environ.get("BENCH_REPO") or str(REPO))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


# --- the synthetic log ------------------------------------------------------------------------------------


def _startup_lines(tp: int = 8) -> list[str]:
    ts = "2026-11-01 10:00:00"
    out = [(f"[{ts}] server_args={{'model_path': '/models/kimi-k2.5', 'tp_size': {tp}, 'ep_size': {tp}, "
           "'watchdog_timeout': 300.0, 'attention_backend': 'fa3'}")]
    per_rank = [
        "Init parallel begin.",
        "Init parallel ends. elapsed=1.25 s",
        "Memory baseline taken. mem usage=0.52 GB",
        "Load weight begin. avail mem=138.42 GB",
    ]
    for msg in per_rank:
        out += [f"[{ts} TP{r} EP{r}] {msg}" for r in range(tp)]
    out.append("".join(f"\rMulti-thread loading shards: {100 * k // 64:3d}% Completed | {k}/64 [00:{k:02d}<01:00,  1.06it/s]"
                       for k in range(65)))
    for msg in (
        ("Load weight end. elapsed=412.10 s, type=KimiK25ForConditionalGeneration, quant=fp8, avail mem=60.00 GB, "
        "mem usage=78.42 GB."),
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, KV size: 40.21 GB",
        "Memory pool end. avail mem=18.00 GB",
        "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=16.50 GB",
    ):
        out += [f"[{ts} TP{r} EP{r}] {msg}" for r in range(tp)]
    out.append("".join(f"\rCapturing batches (bs={512 - 8 * k} avail_mem=16.40 GB): {2 * k:3d}%|#   | {k}/52 "
                       f"[00:{k:02d}<00:40,  1.20it/s]" for k in range(53)))
    out += [f"[{ts} TP{r} EP{r}] Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=20.00 s, "
            f"mem usage=2.00 GB, avail mem=14.50 GB." for r in range(tp)]
    out += [
        (f"[{ts}] Engine startup timings (s): load_weight=412.10, kv_cache_allocation=1.00, scheduler_e2e=480.00, "
        "cuda_graph={decode=20.00}, tokenizer_e2e=2.00"),
        f"[{ts}] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
        f"[{ts}] The server is fired up and ready to roll!",
    ]
    return out


def _runtime_block(second: int, n: int = 6000) -> bytes:
    """About 1 MB of runtime lines for one wall-clock second of the log."""
    minute, sec = divmod(second, 60)
    hour, minute = divmod(minute, 60)
    ts = f"2026-11-01 {10 + hour % 14:02d}:{minute:02d}:{sec:02d}"
    lines = []
    for i in range(n):
        kind = i % 200
        if kind == 0:
            lines.append(f"[{ts} TP{i % 8} EP{i % 8}] Cache flushed successfully: tree nodes {i}, evictable {i * 3}")
        elif kind % 3 == 0:
            lines.append(f'[{ts}] INFO:     127.0.0.1:{40000 + i % 20000} - "POST /generate HTTP/1.1" 200 OK')
        elif kind % 3 == 1:
            lines.append(f"[{ts} TP0 EP0] Decode batch, #running-req: {i % 64}, #token: {i * 7 % 99991}, token usage: "
                         f"0.{i % 97:02d}, cuda graph: True, gen throughput (token/s): {i % 4000}.25, #queue-req: 0, ")
        else:
            lines.append(f"[{ts} TP0 EP0] Prefill batch, #new-seq: 1, #new-token: {i % 4096}, #cached-token: "
                         f"{i % 128}, token usage: 0.{i % 97:02d}, #running-req: {i % 64}, #queue-req: 0, ")
    return ("\n".join(lines) + "\n").encode()


def write_log(path: Path, size_bytes: int) -> tuple[int, float]:
    """(lines written, seconds)."""
    start = time.perf_counter()
    lines = 0
    with open(path, "wb", buffering=1 << 20) as fh:
        head = ("\n".join(_startup_lines()) + "\n").encode()
        fh.write(head)
        written = len(head)
        lines += head.count(b"\n")
        second = 0
        while written < size_bytes:
            block = _runtime_block(second)
            fh.write(block)
            written += len(block)
            lines += block.count(b"\n")
            second += 1
    return lines, time.perf_counter() - start


# --- measurements (each run in its own process) ---------------------------------------------------------


def measure_parse(path: str) -> dict:
    from sessions.phases import summarize_file

    start, cpu0 = time.perf_counter(), time.process_time()
    summary = summarize_file(path)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    size = os.path.getsize(path)
    return {"seconds": elapsed, "cpu_s": cpu, "lines": summary.line_count, "lines_per_s": summary.line_count / elapsed,
            "mb_per_s": size / elapsed / 1e6, "phase": str(summary.phase), "outcome": summary.outcome,
            "rss_mb": _rss_mb()}


def measure_tail(path: str) -> dict:
    from sessions.logs import LogFile

    start = time.perf_counter()
    log = LogFile.open(path)
    tail = log.tail_lines(1000)
    tail_s = time.perf_counter() - start
    estimate = log.line_count
    rss_after_tail = _rss_mb()
    start = time.perf_counter()
    log.build_index(background=False)
    index_s = time.perf_counter() - start
    start = time.perf_counter()
    middle = log.lines(log.line_count // 2, 50)
    window_s = time.perf_counter() - start
    exact = log.line_count
    log.close()
    return {"tail_s": tail_s, "tail_lines": len(tail), "estimate": estimate, "exact": exact,
            "index_s": index_s, "window_s": window_s, "window_lines": len(middle),
            "rss_after_tail_mb": rss_after_tail, "rss_mb": _rss_mb()}


def measure_tui(path: str) -> dict:
    """First paint of the log view through the TUI's path (see the module docstring)."""
    import asyncio

    from textual.app import App, ComposeResult

    from app.feed import LogFeed
    from widgets.log_view import LogView

    last_line = ""
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - 4096))
        tail = fh.read().rstrip(b"\n").split(b"\n")
        last_line = tail[-1].decode("utf-8", "replace")[:40]
    result: dict = {}

    class _Bench(App):
        def compose(self) -> ComposeResult:
            yield LogView(id="log")

        def on_mount(self) -> None:
            self.feed = LogFeed(Path(path))
            self.view_ = self.query_one(LogView)
            self.view_.show_file(path)
            self.ticks: list[float] = []
            self.set_interval(0.02, lambda: self.ticks.append(time.perf_counter()))
            self.t0 = time.perf_counter()
            self.run_worker(self._poll, thread=True)

        def _poll(self) -> None:
            start = time.perf_counter()
            chunk = self.feed.poll(None)
            result["poll_s"] = time.perf_counter() - start
            self.call_from_thread(self._apply, chunk)

        def _apply(self, chunk) -> None:
            self.view_.apply_chunk(chunk)
            self.call_after_refresh(self._painted)

        def _painted(self) -> None:
            # (Pilot.pause is not used: it waits for the whole process to go idle, and the background
            # count keeps it busy, so it would measure that instead of the frame.)
            if last_line in self.view_.visible_text():
                result["first_paint_s"] = time.perf_counter() - self.t0
                self.painted.set()
            else:
                self.call_after_refresh(self._painted)

    async def run() -> None:
        app = _Bench()
        app.painted = asyncio.Event()
        async with app.run_test(size=(160, 50)):
            await asyncio.wait_for(app.painted.wait(), 120)
            await asyncio.sleep(1.0)  # the panels' timer keeps ticking while the rest is counted
            gaps = [b - a for a, b in zip(app.ticks, app.ticks[1:], strict=False)]
            result["max_tick_gap_s"] = max(gaps, default=0.0)
            app.feed.close()

    asyncio.run(run())
    result["rss_mb"] = _rss_mb()
    return result


def run_writer(path: str, lines_per_s: int, seconds: float) -> dict:
    """Append ``lines_per_s`` lines/s in 10 ms batches; each line carries its batch's write time."""
    batch = max(1, lines_per_s // 100)
    written = 0
    start = time.time()
    with open(path, "ab", buffering=0) as fh:
        tick = 0
        while time.time() - start < seconds:
            now = time.time()
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            payload = "".join(
                f"[{ts} TP0] Decode batch, #running-req: 12, #token: {written + i}, token usage: 0.10, "
                f"gen throughput (token/s): 4242.00, wrote_at={now:.6f}\n" for i in range(batch)
            ).encode()
            fh.write(payload)
            written += batch
            tick += 1
            sleep = start + tick * 0.01 - time.time()
            if sleep > 0:
                time.sleep(sleep)
    return {"written": written, "seconds": time.time() - start, "rate": written / (time.time() - start)}


def measure_follow(path: str, lines_per_s: int, seconds: float) -> dict:
    from sessions.logs import LogFile
    from sessions.phases import StartupTracker

    Path(path).write_bytes(("\n".join(_startup_lines()) + "\n").encode())
    log = LogFile.open(path)
    tracker = StartupTracker()
    writer = subprocess.Popen([sys.executable, __file__, "_writer", path, str(lines_per_s), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    lags: list[float] = []
    received = 0
    cpu0 = time.process_time()
    wall0 = time.monotonic()
    while True:
        done = writer.poll() is not None
        result = log.poll()
        now = time.time()
        if result.lines:
            received += len(result.lines)
            tracker.feed_text("".join(line.raw + "\n" for line in result.lines))
            last = result.lines[-1].raw
            at = last.rfind("wrote_at=")
            if at >= 0:
                lags.append(now - float(last[at + 9:]))
        if done and not result.more and not result.lines:
            break
        if not result.more:
            time.sleep(0.05)
    cpu = time.process_time() - cpu0
    wall = time.monotonic() - wall0
    writer_report = json.loads(writer.stdout.read())
    log.close()
    lags.sort()
    return {
        "written": writer_report["written"], "writer_rate": writer_report["rate"], "received": received,
        "lag_p50_s": lags[len(lags) // 2] if lags else None,
        "lag_p99_s": lags[int(len(lags) * 0.99)] if lags else None,
        "lag_max_s": lags[-1] if lags else None,
        "reader_cpu_percent": 100.0 * cpu / wall, "rss_mb": _rss_mb(), "tracker_lines": tracker.line_count,
    }


def _in_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _grep(pattern: str, path: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the child, count)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(["grep", "-c", pattern, str(path)], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu, int(out.stdout.strip() or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_parse":
        print(json.dumps(measure_parse(argv[1])))
        return 0
    if argv and argv[0] == "_tail":
        print(json.dumps(measure_tail(argv[1])))
        return 0
    if argv and argv[0] == "_tui":
        print(json.dumps(measure_tui(argv[1])))
        return 0
    if argv and argv[0] == "_follow":
        print(json.dumps(measure_follow(argv[1], int(argv[2]), float(argv[3]))))
        return 0
    if argv and argv[0] == "_writer":
        print(json.dumps(run_writer(argv[1], int(argv[2]), float(argv[3]))))
        return 0

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--dir", default=None, help="where to write the log (default: a temp dir)")
    parser.add_argument("--follow-s", type=float, default=10.0, help="how long the 50k lines/s writer runs")
    parser.add_argument("--follow-rate", type=int, default=50_000)
    parser.add_argument("--keep", action="store_true", help="keep the generated log")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="bench-logs-", dir=args.dir))
    try:
        path = folder / "server.log"
        size = int(args.size_gb * (1 << 30))
        lines, gen_s = write_log(path, size)
        real_size = path.stat().st_size
        print(f"log: {path} {real_size / (1 << 30):.2f} GiB, {lines:,} lines (written in {gen_s:.1f} s)")
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache for all

        parse = _in_child("_parse", str(path))
        grep_all_s, grep_all_cpu, grep_all = _grep("", path)
        grep_s, grep_cpu, grep_n = _grep("Load weight end", path)
        print(f"parse: summarize_file {parse['seconds']:.2f} s wall ({parse['cpu_s']:.2f} s CPU) = "
              f"{parse['lines_per_s'] / 1e6:.2f} M lines/s ({parse['mb_per_s']:.0f} MB/s); phase={parse['phase']} "
              f"outcome={parse['outcome']}; peak RSS {parse['rss_mb']:.0f} MB")
        print(f"grep:  grep -c 'Load weight end' {grep_s:.2f} s wall ({grep_cpu:.2f} s CPU, {grep_n} hits); "
              f"grep -c '' {grep_all_s:.2f} s wall ({grep_all_cpu:.2f} s CPU, {grep_all:,} lines)")
        print(f"ratio: parse / grep -c 'Load weight end' = {parse['seconds'] / grep_s:.1f}x wall, "
              f"{parse['cpu_s'] / max(grep_cpu, 1e-9):.1f}x CPU; parse / grep -c '' = "
              f"{parse['seconds'] / grep_all_s:.1f}x wall, {parse['cpu_s'] / max(grep_all_cpu, 1e-9):.1f}x CPU")

        small = folder / "small.log"
        write_log(small, 1 << 20)
        tui_small = _in_child("_tui", str(small))
        tui = _in_child("_tui", str(path))
        t0 = time.perf_counter()
        subprocess.run(["tail", "-n", "1000", str(path)], stdout=subprocess.DEVNULL, check=True)
        tail_n_s = time.perf_counter() - t0
        print(f"tui:   first paint of the log view {tui['first_paint_s'] * 1000:.0f} ms on this log, "
              f"{tui_small['first_paint_s'] * 1000:.0f} ms on a 1 MiB log; the opening poll held the snapshot "
              f"{tui['poll_s'] * 1000:.0f} ms; max UI tick gap {tui['max_tick_gap_s'] * 1000:.0f} ms; "
              f"`tail -n 1000` {tail_n_s * 1000:.0f} ms")

        tail = _in_child("_tail", str(path))
        print(f"tail:  open + last 1,000 lines {tail['tail_s'] * 1000:.1f} ms ({tail['tail_lines']} lines; "
              f"line count estimate {tail['estimate']:,} before indexing, exact {tail['exact']:,}); "
              f"RSS {tail['rss_after_tail_mb']:.0f} MB")
        print(f"index: full line index {tail['index_s']:.2f} s; then 50 lines from the middle "
              f"{tail['window_s'] * 1000:.1f} ms; peak RSS {tail['rss_mb']:.0f} MB")

        follow = _in_child("_follow", str(folder / "follow.log"), str(args.follow_rate), str(args.follow_s))
        print(f"follow: writer {follow['writer_rate']:,.0f} lines/s ({follow['written']:,} lines), reader got "
              f"{follow['received']:,}; lag p50 {follow['lag_p50_s']:.3f} s, p99 {follow['lag_p99_s']:.3f} s, "
              f"max {follow['lag_max_s']:.3f} s; reader CPU {follow['reader_cpu_percent']:.0f}% of a core; "
              f"peak RSS {follow['rss_mb']:.0f} MB")
        print("targets (DESIGN §8): tail visible < 0.5 s on 2 GB (the tui line); follow lag < 1 s at 50k lines/s; RSS < 200 MB")
    finally:
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
