"""What the one file reader costs over a plain ``json.loads(path.read_text())``: results of 1, 1000 and 16000 runs
(a few KiB to 7 MB: the depth check blanks the strings and sums the brackets before parsing).

    python benches/safe_reader.py
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from sessions import safe_files


def _best_of(call, n: int) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    run = {"max_concurrency": 8, "output_throughput": 1234.5, "median_ttft_ms": 12.5, "failed": 0,
           "itls": [0.01] * 50, "note": "a [bracket] in a string"}
    with tempfile.TemporaryDirectory() as tmp:
        for label, runs in (("one run (a state.json size)", 1), ("1000 runs", 1000), ("16000 runs", 16000)):
            path = Path(tmp) / "x.json"
            path.write_text(json.dumps({"runs": [run] * runs, "profile": "p"}))
            size = path.stat().st_size
            plain = _best_of(lambda p=path: json.loads(p.read_text()), 5)
            safe = _best_of(lambda p=path: safe_files.read_json(p, safe_files.START_HISTORY), 5)
            print(f"{label:26} {size / 1024:9.0f} KiB  plain {plain * 1e3:8.2f} ms  safe_files {safe * 1e3:8.2f} ms"
                  f"  ({safe / plain:.1f}x)")


if __name__ == "__main__":
    main()
