"""Check: `eagle3-tui bench` against SGLang 0.5.23's own `sglang.bench_serving`, on one emulator session.

Both clients run against the same demo server (by default the Kimi TP8 demo profile; bench_serving loads
the demo's tiny-llama tokenizer, which with ``--tokenize-prompt`` only bounds the ids), with the same
request shape: random-id prompts of --input-len tokens sent as input_ids (bench_serving's
``--tokenize-prompt``, range ratio 1), --output-len tokens each with ``ignore_eos``, --num-prompts requests
per concurrency.  Each run starts on a flushed prefix cache (bench_serving's ``--flush-cache`` after its
warm-up; `eagle3-tui bench` flushes before each concurrency by default): every run sends the same seeded
prompts, so without it a run after the first would time cached prefills (at concurrency 32 the 4096 prompt
tokens cost about 200 ms of modelled prefill uncached, one step cached).  It prints both figures and the
relative gap of output throughput, median TTFT and median ITL per concurrency, with the target: every gap
within 10 %.  It never asserts; the exit code is 0 either way.

At the concurrencies of ``--gc-off`` (default 32) bench_serving also runs a second time per round with its
own process's garbage collector off, printed as a diagnostic line.  Its process holds torch, transformers
and SGLang (about 630,000 objects), and on the 16-core H200 host a full collection during the run lasted
350-400 ms: at concurrency 32 it landed between the first chunks of one wave, and 18 of 32 requests got
their first token that much later than the other 14, though the server had prefilled all 32 in one
forward (its ``Prefill batch, #new-seq: 32`` line).

Each concurrency is run --repeat times by each client, back to back and in alternating order (ours
first, then theirs first), so that both see the same machine load; the figures are the median over the
rounds, printed with their min-max range.  On a shared 2-core machine one round's TTFT moves by tens of
percent with the load of other processes, for both clients alike.

bench_serving lives in its own venv outside the repository (it is not a dependency of the panel):
``--sglang-python`` (default ``/work/wt/.sglang-venv/bin/python``, or ``$SGLANG_BENCH_PYTHON``).  Make it with
``python -m venv DIR && DIR/bin/pip install torch==2.14.1 torchvision==0.29.1 && DIR/bin/pip install --no-deps
sglang==0.5.23 && DIR/bin/pip install transformers aiohttp msgspec orjson requests tqdm numpy pybase64 psutil
triton pillow starlette pyzmq ipython datasets apache-tvm-ffi==0.1.11 sentencepiece compressed-tensors gguf``.

Usage: ``python benches/bench_vs_sglang.py [--concurrency 1,8] [--input-len 128] [--output-len 64]
[--num-prompts 16] [--repeat 3] [--out benches/results/bench_vs_sglang.json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
KEYS = ("output_throughput", "median_ttft_ms", "median_itl_ms", "median_tpot_ms", "median_e2e_latency_ms")
CHECKED = ("output_throughput", "median_ttft_ms", "median_itl_ms")
TOLERANCE = 0.10


def panel(home: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, EAGLE3_TUI_HOME=home, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "app", "--demo", *args], capture_output=True, text=True,
                          env=env, check=check, cwd=REPO_ROOT, timeout=900)


# bench_serving as it is, but with its process's garbage collector off: the diagnostic run (see --gc-off).
_GC_OFF = ("import gc, runpy, sys; gc.disable(); sys.argv[0] = 'bench_serving'; "
           "runpy.run_module('sglang.bench_serving', run_name='__main__', alter_sys=True)")


def relative_gap(ours: float, theirs: float) -> float:
    return abs(ours - theirs) / theirs if theirs else math.inf


def sglang_bench(python: str, port: int, tokenizer: str, concurrency: int, args: argparse.Namespace,
                 out_file: Path, gc_off: bool = False) -> dict:
    launcher = ["-c", _GC_OFF] if gc_off else ["-m", "sglang.bench_serving"]
    cmd = [python, *launcher, "--backend", "sglang", "--host", "127.0.0.1", "--port",
           str(port), "--dataset-name", "random-ids", "--tokenize-prompt", "--random-input-len",
           str(args.input_len), "--random-output-len", str(args.output_len), "--random-range-ratio", "1",
           "--num-prompts", str(args.num_prompts), "--max-concurrency", str(concurrency), "--tokenizer",
           tokenizer, "--seed", str(args.seed), "--output-file", str(out_file), "--warmup-requests", "1",
           "--flush-cache"]
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=out_file.parent,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_serving failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    line = out_file.read_text().strip().splitlines()[-1]
    # bench_serving writes "request_rate": Infinity, which strict JSON parsers refuse
    return json.loads(line, parse_constant=lambda c: math.inf if c == "Infinity" else None) | {
        "stdout_tail": proc.stdout[-2500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-python", default=os.environ.get("SGLANG_BENCH_PYTHON",
                                                                  "/work/wt/.sglang-venv/bin/python"))
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="rounds per client and concurrency (median)")
    parser.add_argument("--profile", default="kimi-k25-tp8",
                        help="demo profile to serve (default the Kimi TP8 demo: config-only, modelled steps)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer dir for bench_serving (default: the demo's tiny-llama model dir; "
                        "with --tokenize-prompt it only draws ids below its vocab size)")
    parser.add_argument("--gc-off", default="32", metavar="C,C,...",
                        help="concurrencies at which bench_serving also runs with its own garbage collector "
                        "off, a diagnostic column (default 32; '' for none): its process holds torch, "
                        "transformers and SGLang, and one full collection there lasts hundreds of ms")
    parser.add_argument("--out", default=str(REPO_ROOT / "benches" / "results" / "bench_vs_sglang.json"))
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    gc_off = {int(c) for c in args.gc_off.split(",") if c.strip()}
    if not Path(args.sglang_python).exists():
        print(f"no bench_serving venv at {args.sglang_python}; see this file's docstring", file=sys.stderr)
        return 0

    from sessions.demo import ensure_demo_home
    from sessions.home import resolve_home
    from sessions.profiles import load_profile

    work = Path(tempfile.mkdtemp(prefix="bench-vs-sglang-"))
    home = str(work / "home")
    os.environ["EAGLE3_TUI_HOME"] = home
    demo = ensure_demo_home(resolve_home(demo=True))
    load_profile(args.profile, demo)  # a missing profile fails here, before anything starts
    from sessions.demo import tiny_model_dir

    tokenizer = args.tokenizer or str(tiny_model_dir(demo))
    if not (Path(tokenizer) / "tokenizer.json").exists() and not (Path(tokenizer) / "tokenizer_config.json").exists():
        print(f"no tokenizer in {tokenizer} (the demo's tiny model needs torch to be made)", file=sys.stderr)
        return 0
    session = panel(home, "launch", args.profile, "--wait-ready", "--timeout", "300").stdout.strip()
    try:
        status = json.loads(panel(home, "status", session, "--json").stdout)[0]
        port = status["port"]
        ours_rounds: dict[int, list[dict]] = {c: [] for c in concurrencies}
        theirs_rounds: dict[int, list[dict]] = {c: [] for c in concurrencies}
        gc_off_rounds: dict[int, list[dict]] = {c: [] for c in concurrencies if c in gc_off}
        for round_no in range(args.repeat):
            for c in concurrencies:
                bench_args = ["--concurrency", str(c), "--input-len", str(args.input_len), "--output-len",
                              str(args.output_len), "--num-prompts", str(args.num_prompts), "--seed",
                              str(args.seed)]
                order = ["ours", "theirs"] if round_no % 2 == 0 else ["theirs", "ours"]
                if c in gc_off:
                    order.insert(1, "theirs-gc-off")
                for who in order:
                    if who == "ours":
                        ours_rounds[c].append(json.loads(panel(home, "bench", session, "--json",
                                                               *bench_args).stdout)["runs"][0])
                    else:
                        rounds = theirs_rounds if who == "theirs" else gc_off_rounds
                        rounds[c].append(sglang_bench(args.sglang_python, port, tokenizer, c, args,
                                                      work / f"{who}_{c}_{round_no}.jsonl",
                                                      gc_off=who != "theirs"))
    finally:
        panel(home, "stop", session, "--grace", "20", check=False)
    report = {"request": {"input_len": args.input_len, "output_len": args.output_len,
                          "num_prompts": args.num_prompts, "seed": args.seed, "profile": args.profile,
                          "repeat": args.repeat},
              "tolerance": TOLERANCE, "runs": [], "time": time.time()}
    title = (f"bench_vs_sglang: profile {args.profile}, input {args.input_len}, output {args.output_len}, "
             f"{args.num_prompts} prompts per concurrency, median of {args.repeat} alternating rounds "
             f"[min-max] (target: every gap within {TOLERANCE:.0%})")
    lines = [title]
    all_ok = True
    gc_agree: dict[int, bool] = {}
    for c in concurrencies:
        ours_runs, theirs_runs = ours_rounds[c], theirs_rounds[c]
        row: dict = {"max_concurrency": c, "eagle3_tui": {}, "bench_serving": {}, "gap": {},
                     "rounds": {"eagle3_tui": [{k: r[k] for k in KEYS} for r in ours_runs],
                                "bench_serving": [{k: r.get(k) for k in KEYS} for r in theirs_runs]}}
        lines.append(f"concurrency {c}:  {'metric':<24}{'eagle3-tui':>12}{'':>16}{'bench_serving':>15}"
                     f"{'':>16}{'gap':>9}")
        for key in KEYS:
            mine = [r[key] for r in ours_runs]
            other = [r.get(key) or 0.0 for r in theirs_runs]
            a, b = statistics.median(mine), statistics.median(other)
            row["eagle3_tui"][key], row["bench_serving"][key] = a, b
            gap = relative_gap(a, b)
            row["gap"][key] = gap
            mark = ""
            if key in CHECKED:
                ok = gap <= TOLERANCE
                all_ok &= ok
                mark = "  ok" if ok else "  OVER"
            spread_a = f"[{min(mine):.1f}-{max(mine):.1f}]"
            spread_b = f"[{min(other):.1f}-{max(other):.1f}]"
            lines.append(f"                {key:<24}{a:>12.2f}{spread_a:>16}{b:>15.2f}{spread_b:>16}"
                         f"{gap:>8.1%}{mark}")
        lines.append(f"                completed per round: bench_serving "
                     f"{[r.get('completed') for r in theirs_runs]}, ours {[r['completed'] for r in ours_runs]}")
        if gc_off_rounds.get(c):
            off = gc_off_rounds[c]
            row["bench_serving_gc_off"] = {k: statistics.median([r.get(k) or 0.0 for r in off]) for k in KEYS}
            row["rounds"]["bench_serving_gc_off"] = [{k: r.get(k) for k in KEYS} for r in off]
            theirs = row["bench_serving_gc_off"]
            row["gap_gc_off"] = {key: relative_gap(row["eagle3_tui"][key], theirs[key]) for key in CHECKED}
            gc_agree[c] = all(gap <= TOLERANCE for gap in row["gap_gc_off"].values())
            lines.append(f"                bench_serving with its own GC off (median of {len(off)}): " + ", ".join(
                f"{key} {theirs[key]:.2f} ({gap:.1%} {'ok' if gap <= TOLERANCE else 'OVER'})"
                for key, gap in row["gap_gc_off"].items()))
        report["runs"].append(row)
    lines.append("AGREE within 10% on output throughput, median TTFT and median ITL" if all_ok
                 else "DISAGREE: a checked gap is over 10%")
    if not all_ok and gc_agree:
        lines.append("with bench_serving's GC off: " + ", ".join(
            f"concurrency {c} {'agrees' if ok else 'still disagrees'}" for c, ok in gc_agree.items()))
    report["agree"] = all_ok
    report["agree_gc_off"] = gc_agree
    report["bench_serving_stdout_c1"] = theirs_rounds[concurrencies[0]][-1]["stdout_tail"]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
