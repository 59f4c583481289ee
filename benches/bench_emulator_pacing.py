"""Bench: how the emulator's paced weight load compares with its plan (prints numbers; asserts nothing).

    .venv/bin/python benches/bench_emulator_pacing.py [--time-scale 0.01] [--runs 3]

Runs ``python -m sessions.emulator`` at TP1 on a small model, once with no fault and once with
``slow-weights``, per run, until ``The server is fired up``.  Reads the load time the emulator itself logs
(``Load weight end. elapsed=X s``) and prints, per fault, the planned seconds (the pacing constants times
the time scale and rank 0's jitter), the logged seconds, what the log adds to the plan and the ratio, then the slow/normal ratio of the logged times
(the plan says ``SLOW_WEIGHTS_FACTOR``).  A logged time below its plan would mean a paced sleep ended
early; far above it, that the machine is too busy for the scale.  The tests check the plan itself
(tests/test_emulator.py); wall-clock figures belong here.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SMALL = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 8,
         "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
         "vocab_size": 1000, "max_position_embeddings": 2048}
LOAD_END = re.compile(r"Load weight end\. elapsed=([\d.]+) s, .*mem usage=([\d.]+) GB\.")
READY = "The server is fired up and ready to roll!"
GUARD_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(workdir: Path, model: Path, fault: str, scale: float) -> tuple[float, float]:
    """(logged load seconds, logged weights GB) of one emulated start; the tree is killed by its pid."""
    workdir.mkdir(parents=True)
    err_path = workdir / "stderr.log"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessions.emulator", "--model-path", str(model), "--tp-size", "1",
             "--port", str(_free_port()), "--time-scale", str(scale), "--emulate-fault", fault],
            cwd=workdir, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
    try:
        deadline = time.monotonic() + GUARD_S
        while READY not in (text := err_path.read_bytes().decode(errors="replace")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{fault}: no ready line (exit {proc.returncode}):\n{text[-2000:]}")
            time.sleep(0.05)
        match = LOAD_END.search(text)
        if match is None:
            raise SystemExit(f"{fault}: no Load weight end line:\n{text[-2000:]}")
        return float(match.group(1)), float(match.group(2))
    finally:
        os.killpg(proc.pid, 9)  # the emulator's own session, led by the pid we started
        proc.wait(30)


def main() -> int:
    from sessions.emulator import pacing

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pacing-") as tmp:
        root = Path(tmp)
        model = root / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(SMALL))
        jitter = pacing.Pacing.for_rank(args.time_scale, 0).jitter
        print(f"time_scale={args.time_scale} runs={args.runs} TP1 (rank 0's pacing jitter {jitter:.3f})")
        logged: dict[str, list[float]] = {"none": [], "slow-weights": []}
        for run in range(args.runs):
            for fault, times in logged.items():
                seconds, gb = _run(root / f"{fault}-{run}", model, fault, args.time_scale)
                factor = pacing.SLOW_WEIGHTS_FACTOR if fault == "slow-weights" else 1.0
                plan = max(pacing.WEIGHT_LOAD_MIN_S, gb / pacing.WEIGHT_LOAD_GB_PER_S) * factor * args.time_scale * jitter
                times.append(seconds)
                print(f"run {run} {fault:13s} planned_s={plan:.3f} logged_s={seconds:.3f} "
                      f"over_plan_s={seconds - plan:.3f} logged/planned={seconds / plan:.3f}")
        normal = sum(logged["none"]) / len(logged["none"])
        slow = sum(logged["slow-weights"]) / len(logged["slow-weights"])
        print(f"mean logged_s: none={normal:.3f} slow-weights={slow:.3f} "
              f"slow/none={slow / normal:.2f} (plan {pacing.SLOW_WEIGHTS_FACTOR:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
