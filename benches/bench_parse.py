"""Parse throughput of the log reader (issue 23: reading any wrapper must not cost more than 10 %).

    .venv/bin/python benches/bench_parse.py [--size-mb 200] [--rounds 3]
    BENCH_REPO=/path/to/other/checkout .venv/bin/python benches/bench_parse.py   # the "before" of a change

Writes the synthetic SGLang 0.5.23 log of `benches/bench_logs.py` (a TP8 startup, then runtime lines), and
the same log with a Kubernetes CRI wrapper (``<ts> stdout F ``) before every line, then times, in this
process, the startup tracker (`summarize_file`) and the serving tracker (`summarize_serving`) over each
file.  Prints MB/s per reader and file (the best of ``--rounds``, CPU time); asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benches"))
from bench_logs import write_log

sys.path.insert(0, os.environ.get("BENCH_REPO") or str(REPO))


def _wrapped(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin, open(dst, "wb", buffering=1 << 20) as fout:
        fout.writelines(b"2026-05-01T10:00:00.123456789Z stdout F " + line for line in fin)


def _best(fn, path: Path, rounds: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(rounds):
        cpu0 = time.process_time()
        result = fn(path)
        best = min(best, time.process_time() - cpu0)
    return best, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from sessions.phases import summarize_file
    from sessions.serving import summarize_serving

    with tempfile.TemporaryDirectory(prefix="bench-parse-") as tmp:
        plain = Path(tmp) / "plain.log"
        wrapped = Path(tmp) / "wrapped.log"
        write_log(plain, int(args.size_mb * 1e6))
        _wrapped(plain, wrapped)
        print(f"code: {os.environ.get('BENCH_REPO') or REPO}")
        for name, path in (("plain", plain), ("k8s-wrapped", wrapped)):
            size = path.stat().st_size
            for reader, fn in (("startup tracker", summarize_file), ("serving tracker", summarize_serving)):
                cpu, result = _best(fn, path, args.rounds)
                extra = ""
                if reader == "startup tracker":
                    extra = f"  phase {result.phase}, outcome {result.outcome}"  # type: ignore[attr-defined]
                print(f"{name:12s} {reader}: {size / cpu / 1e6:8.1f} MB/s ({cpu:.2f} s CPU for "
                      f"{size / 1e6:.0f} MB){extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
