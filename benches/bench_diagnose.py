"""Bench: seconds from the moment a TP8 start stalls to a complete diagnosis (issue 5 §8).

Setup: a private home; a TP8 emulator session with the ``hang-after-weights`` fault (eight
`sglang::scheduler_TP*` ranks blocked in the first all-reduce after ``Load weight end``), launched through
`ServerSession.launch` as the TUI does, with ``[watch] stall_after_s = --stall-after``.

The moment of stall is the log's last write plus the stall limit (the first instant `status()` may call
the session stalled).  The watcher polls `status()` every ``--poll`` seconds, as the TUI does, then runs
`diagnose()` with py-spy on all ranks.  Prints (per run and the worst run):
  detect_latency_s   from the moment of stall to the poll that reports ``stalled``  [<= poll + status cost]
  diagnose_s         `diagnose()` wall time: status, CPU sampling (0.5 s), GPU reading, py-spy dumps of the
                     main process, 8 ranks and the detokenizer (in parallel), hints
  pyspy_max_s        the slowest single py-spy dump (they run in parallel)
  stall_to_diag_s    from the moment of stall to the complete diagnosis                 [a few seconds]
It never asserts; it prints numbers.  Usage: ``python benches/bench_diagnose.py [--runs 3]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

KIMI_LIKE_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 61,
    "hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 163840,
    "torch_dtype": "bfloat16",
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_profile(home, tp: int, time_scale: float, stall_after_s: float):
    import tomli_w

    from sessions.profiles import load_profile

    model_dir = home.state_root / "models" / "kimi-like"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(KIMI_LIKE_CONFIG))
    doc = {
        "server": {"launcher": "emulator", "python": sys.executable, "model_path": str(model_dir),
                   "tp_size": tp, "host": "127.0.0.1", "port": free_port()},
        "watch": {"stall_after_s": stall_after_s},
        "emulator": {"time_scale": time_scale, "fault": "hang-after-weights"},
    }
    path = home.profiles_dir / "bench-hang-tp8.toml"
    path.write_text(tomli_w.dumps(doc))
    return load_profile(path)


def one_run(home, args) -> dict:
    from sessions.diagnosis import diagnose
    from sessions.server import ServerSession

    session = ServerSession.launch(write_profile(home, args.tp, args.time_scale, args.stall_after), home)
    try:
        deadline = time.monotonic() + 120
        while True:
            status = session.status()
            polled_at = time.time()
            # A spawned rank importing on a busy machine can look stalled in "launching" for a moment;
            # the stall under test is the one after the weights.
            if status.state in ("crashed", "exited", "stopped") or time.monotonic() > deadline:
                break
            if status.state == "stalled" and status.phase == "weights_loaded":
                break
            time.sleep(args.poll)
        if status.state != "stalled" or status.phase != "weights_loaded":
            return {"error": f"expected stalled, got {status.state} in {status.phase}"}
        stall_moment = session.log_path.stat().st_mtime + status.stall_limit_s
        d = diagnose(session, with_stacks=True, stack_timeout_s=10.0)
        done_at = time.time()
        dumps = [p.stack for p in d.processes if p.stack is not None]
        return {
            "stall_limit_s": status.stall_limit_s,
            "detect_latency_s": polled_at - stall_moment,
            "diagnose_s": d.collect_s,
            "pyspy_dumps": len(dumps),
            "pyspy_ok": sum(1 for s in dumps if s.ok),
            "pyspy_max_s": max((s.duration_s for s in dumps), default=0.0),
            "stall_to_diag_s": done_at - stall_moment,
            "phase": d.phase,
            "hints": [h.id for h in d.hints],
            "blocked_in": sorted({str(p.stack.blocked_in.function) for p in d.processes
                                  if p.role == "scheduler" and p.stack and p.stack.ok}),
        }
    finally:
        session.stop(grace_s=5.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--stall-after", type=float, default=5.0)
    parser.add_argument("--poll", type=float, default=1.0, help="status poll interval (the TUI uses 1 s)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-diagnose-") as root:
        os.environ["EAGLE3_TUI_HOME"] = root
        os.environ.pop("EAGLE3_TUI_DEMO", None)
        from sessions.home import resolve_home

        home = resolve_home().ensure()
        results = []
        for i in range(args.runs):
            result = one_run(home, args)
            results.append(result)
            if "error" in result:
                print(f"run {i + 1}: {result['error']}")
                continue
            print(
                f"run {i + 1}: TP{args.tp} {result['phase']}, limit {result['stall_limit_s']:.1f}s, "
                f"detect_latency_s={result['detect_latency_s']:.2f} diagnose_s={result['diagnose_s']:.2f} "
                f"(py-spy {result['pyspy_ok']}/{result['pyspy_dumps']} ok, slowest {result['pyspy_max_s']:.2f}s) "
                f"stall_to_diag_s={result['stall_to_diag_s']:.2f}  blocked in {result['blocked_in']}"
            )
        good = [r for r in results if "error" not in r]
        if good:
            print(
                f"worst of {len(good)}: detect_latency_s={max(r['detect_latency_s'] for r in good):.2f} "
                f"diagnose_s={max(r['diagnose_s'] for r in good):.2f} "
                f"stall_to_diag_s={max(r['stall_to_diag_s'] for r in good):.2f}"
            )
            print(f"hints: {', '.join(good[-1]['hints'])}")


if __name__ == "__main__":
    main()
