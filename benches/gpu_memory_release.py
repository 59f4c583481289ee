"""Bench: GPU memory of an emulated TP1..N server, read with NVML before launch, when ready and after stop.

Each rank of the emulator holds ``--gb`` GB of real GPU memory (``--emulate-gpu-memory-gb``; needs torch
with CUDA in the server's Python).  For every TP size the bench launches a session through
``sessions.server.ServerSession``, waits until it is ready, stops it, and waits up to ``--settle-s``
for the memory to return.
It prints a table and a JSON document (also written to ``--out``).  Without NVML it still runs the
lifecycle and says that NVML is unavailable.

    python benches/gpu_memory_release.py --tp 1,2,4,8 --gb 20 --out gpu_release.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from sessions.demo import KIMI_K25_CONFIG

MIB = 1 << 20


# -- NVML ------------------------------------------------------------------------------------------------


class Nvml:
    """Used memory per GPU (bytes) and the pids on each GPU; ``error`` says why NVML is unavailable."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.count = 0
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self.count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001 - no package, no driver, no permission: all "unavailable"
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return self.error is None

    def used(self) -> dict[int, int]:
        if not self.available:
            return {}
        out = {}
        for index in range(self.count):
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            out[index] = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
        return out

    def pids(self) -> dict[int, list[int]]:
        if not self.available:
            return {}
        out = {}
        for index in range(self.count):
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:  # noqa: BLE001 - not supported under MIG, etc.
                procs = []
            out[index] = sorted(p.pid for p in procs)
        return out

    def close(self) -> None:
        if self.available:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()


# -- launching -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SessionRun:
    """One emulator launch through ServerSession (the product's own launch/stop path)."""

    via = "ServerSession"

    def __init__(self, workdir: Path, model_dir: Path, tp: int, gb: float, time_scale: float) -> None:
        from sessions.home import HOME_ENV, resolve_home
        from sessions.profiles import load_profile
        from sessions.server import ServerSession

        os.environ[HOME_ENV] = str(workdir / "home")
        home = resolve_home(demo=False).ensure()
        profile_path = home.profiles_dir / f"gpu-release-tp{tp}.toml"
        profile_path.write_text(
            "[server]\n"
            'launcher = "emulator"\n'
            f"python = {json.dumps(sys.executable)}\n"
            f"model_path = {json.dumps(str(model_dir))}\n"
            f"tp_size = {tp}\n"
            'host = "127.0.0.1"\n'
            f"port = {free_port()}\n"
            "[watch]\nstall_after_s = 600\n"
            "[emulator]\n"
            f"time_scale = {time_scale}\n"
            'fault = "none"\n'
            f"gpu_memory_gb = {gb}\n"
            f"gpus = {max(8, tp)}\n"
        )
        self.session = ServerSession.launch(load_profile(profile_path), home)
        self.log_path = Path(self.session.log_path)

    def wait_ready(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            status = self.session.status(probe_http=True)
            if status.state == "ready":
                return True
            if status.state in ("crashed", "exited", "stopped"):
                return False
            time.sleep(0.5)
        return False

    def stop(self) -> dict[str, Any]:
        report = self.session.stop(grace_s=30.0)
        return report.to_json() if hasattr(report, "to_json") else {"repr": repr(report)}


def make_run(workdir: Path, model_dir: Path, tp: int, gb: float, time_scale: float) -> SessionRun:
    return SessionRun(workdir, model_dir, tp, gb, time_scale)


# -- the bench -------------------------------------------------------------------------------------------


def measure(nvml: Nvml, tp: int, args: argparse.Namespace, workdir: Path, model_dir: Path) -> dict[str, Any]:
    before = nvml.used()
    t0 = time.monotonic()
    run = make_run(workdir / f"tp{tp}", model_dir, tp, args.gb, args.time_scale)
    ready = run.wait_ready(args.ready_timeout_s)
    ready_s = time.monotonic() - t0
    at_ready = nvml.used()
    pids_at_ready = nvml.pids()
    t1 = time.monotonic()
    stop_report = run.stop()
    stop_s = time.monotonic() - t1
    tolerance = args.tolerance_mib * MIB
    after = nvml.used()
    end = time.monotonic() + args.settle_s
    while nvml.available and time.monotonic() < end and any(after[i] - before[i] > tolerance for i in before):
        time.sleep(0.5)
        after = nvml.used()
    settle_s = time.monotonic() - t1 - stop_s
    gpus = []
    for index in sorted(before):
        gpus.append(
            {
                "index": index,
                "before_mib": round(before[index] / MIB),
                "ready_mib": round(at_ready[index] / MIB),
                "after_mib": round(after[index] / MIB),
                "held_at_ready_mib": round((at_ready[index] - before[index]) / MIB),
                "left_after_stop_mib": round((after[index] - before[index]) / MIB),
                "pids_at_ready": pids_at_ready.get(index, []),
                "released": after[index] - before[index] <= tolerance,
            }
        )
    return {
        "tp": tp,
        "via": run.via,
        "gb_per_rank": args.gb,
        "ready": ready,
        "ready_s": round(ready_s, 2),
        "stop_s": round(stop_s, 2),
        "settle_s": round(settle_s, 2),
        "stop": stop_report,
        "log": str(run.log_path),
        "gpus": gpus,
        "released": all(g["released"] for g in gpus) if gpus else None,
        "held_total_mib": sum(g["held_at_ready_mib"] for g in gpus),
    }


def print_table(result: dict[str, Any]) -> None:
    print(result["message"])
    header = (
        f"{'tp':>3} {'gpu':>3} {'before MiB':>11} {'ready MiB':>10} {'after MiB':>10} {'held':>8} "
        f"{'left':>6}  released"
    )
    for run in result["runs"]:
        print(
            f"\nTP{run['tp']} via {run['via']}: ready={run['ready']} in {run['ready_s']} s, "
            f"stop {run['stop_s']} s, settle {run['settle_s']} s, held {run['held_total_mib']} MiB in total"
        )
        if not run["gpus"]:
            print("  (no NVML readings)")
            continue
        print(header)
        for g in run["gpus"]:
            print(
                f"{run['tp']:>3} {g['index']:>3} {g['before_mib']:>11} {g['ready_mib']:>10} "
                f"{g['after_mib']:>10} "
                f"{g['held_at_ready_mib']:>8} {g['left_after_stop_mib']:>6}  {g['released']}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tp", default=None, help="comma-separated TP sizes (default: 1,2,4,8 up to the GPU count)"
    )
    parser.add_argument(
        "--gb", type=float, default=20.0, help="GB of real GPU memory each rank holds (default 20)"
    )
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--model-path", type=Path, default=None, help="default: a config-only Kimi-like dir")
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    parser.add_argument("--settle-s", type=float, default=30.0, help="wait this long for memory to return")
    parser.add_argument("--tolerance-mib", type=float, default=256.0)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    nvml = Nvml()
    gpu_count = nvml.count if nvml.available else 0
    if args.tp:
        sizes = [int(x) for x in args.tp.split(",") if x.strip()]
    else:
        sizes = [t for t in (1, 2, 4, 8) if t <= max(gpu_count, 2)]
    message = (
        f"NVML: {gpu_count} GPU(s)"
        if nvml.available
        else f"{nvml.error}; running the lifecycle anyway (emulated GPU numbers only)"
    )
    workdir = Path(tempfile.mkdtemp(prefix="gpu-release-"))  # kept: the server logs are worth reading
    model_dir = args.model_path
    if model_dir is None:
        model_dir = workdir / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(KIMI_K25_CONFIG))
    runs = [measure(nvml, tp, args, workdir, model_dir) for tp in sizes]
    nvml.close()
    result = {
        "nvml": nvml.available,
        "message": message,
        "gpu_count": gpu_count,
        "workdir": str(workdir),
        "runs": runs,
        "all_released": all(r["released"] for r in runs) if nvml.available else None,
    }
    print_table(result)
    text = json.dumps(result, indent=2)
    print("\n" + text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
