"""Bench (device): rank-to-GPU mapping, memory freed on every GPU, and the GPU-busy check on real NVML.

Three parts, each printing what it saw and adding it to one JSON document (``--out``):

1. ``mapping``: a TP-N emulator session (N = every GPU, 8 on an H200-x8) whose rank r holds ``--gb`` GB on
   GPU r (torch in the rank).  NVML's per-process pids on each GPU are compared with the rank pids, and
   ``eagle3-tui status --json`` must attribute GPU r to rank r.
2. ``release``: TP1, TP2, TP4 and TP8 placed as SGLang places ranks, with ``--base-gpu-id`` and with
   ``CUDA_VISIBLE_DEVICES``; after ``stop`` every GPU must be back at its baseline within ``--settle-s``
   and no pid of the session may hold memory anywhere.
3. ``busy``: while a TP4 session holds GPUs 0-3, ``eagle3-tui launch`` of a TP8 profile must exit 2
   naming GPU0-GPU3 and the holder; a TP4 profile with ``CUDA_VISIBLE_DEVICES=4,5,6,7`` must start.

With fewer GPUs every part shrinks to what fits (one GPU: mapping of TP1, release of TP1, busy = a TP1
holder on GPU0 and a second TP1 profile refused), and the JSON says what was skipped.  These are
emulator ranks holding real memory on real GPUs, not real SGLang.

NVLink multicast stays off in every process started here (NCCL_NVLS_ENABLE=0 and friends, set in this
process's environment, which the servers and CLIs inherit).

    python benches/gpu_x8.py --gb 10 --out benches/results/gpu_x8.json [--parts mapping,release,busy]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Before anything can start a CUDA or NCCL process: multicast off (KINDS.md of the device machines).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)

sys.path.insert(0, str(REPO_ROOT / "benches"))
from gpu_memory_release import MIB, Nvml, free_port

from sessions.demo import KIMI_K25_CONFIG


class Bench:
    """A private home, a config-only model dir, and helpers to write profiles and run the CLI."""

    def __init__(self, workdir: Path, gb: float, time_scale: float) -> None:
        from sessions.home import HOME_ENV, resolve_home

        os.environ[HOME_ENV] = str(workdir / "home")
        os.environ.pop("EAGLE3_TUI_DEMO", None)
        self.home = resolve_home(demo=False).ensure()
        self.model_dir = workdir / "model"
        self.model_dir.mkdir(parents=True, exist_ok=True)
        config = KIMI_K25_CONFIG["text_config"] | {"model_type": "deepseek_v3"}
        (self.model_dir / "config.json").write_text(json.dumps(config))
        self.gb = gb
        self.time_scale = time_scale
        self.sessions: list[Any] = []

    def profile(self, name: str, tp: int, base: int | None = None, cvd: str | None = None,
                fault: str = "none") -> Path:
        extra = f'extra_args = ["--base-gpu-id", "{base}"]\n' if base else ""
        env = f'[server.env]\nCUDA_VISIBLE_DEVICES = "{cvd}"\n' if cvd is not None else ""
        path = self.home.profiles_dir / f"{name}.toml"
        path.write_text(
            "[server]\n"
            'launcher = "emulator"\n'
            f"python = {json.dumps(sys.executable)}\n"
            f"model_path = {json.dumps(str(self.model_dir))}\n"
            f"tp_size = {tp}\n"
            'host = "127.0.0.1"\n'
            f"port = {free_port()}\n"
            + extra + env
            + "[watch]\nstall_after_s = 600\n"
            "[emulator]\n"
            f"time_scale = {self.time_scale}\n"
            f'fault = "{fault}"\n'
            f"gpu_memory_gb = {self.gb}\n"
            "gpus = 8\n"
        )
        return path

    def launch(self, name: str) -> Any:
        from sessions.profiles import load_profile
        from sessions.server import ServerSession

        session = ServerSession.launch(load_profile(self.home.profiles_dir / f"{name}.toml"), self.home)
        self.sessions.append(session)
        return session

    def cli(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        return subprocess.run([sys.executable, "-m", "app", *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)

    def stop_all(self) -> None:
        for session in self.sessions:
            if session.is_alive():
                session.stop(grace_s=30.0)


def wait_ready(session: Any, timeout_s: float) -> str:
    end = time.monotonic() + timeout_s
    state = "?"
    while time.monotonic() < end:
        state = session.status(probe_http=True).state
        if state in ("ready", "crashed", "exited", "stopped"):
            return state
        time.sleep(0.5)
    return state


def settle(nvml: Nvml, before: dict[int, int], tolerance: int, settle_s: float) -> tuple[dict[int, int], float]:
    t0 = time.monotonic()
    after = nvml.used()
    while time.monotonic() - t0 < settle_s and any(after[i] - before[i] > tolerance for i in before):
        time.sleep(0.25)
        after = nvml.used()
    return after, round(time.monotonic() - t0, 2)


def part_mapping(bench: Bench, nvml: Nvml, gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    tp = 8 if gpus >= 8 else max(1, gpus)
    bench.profile("map", tp)
    session = bench.launch("map")
    state = wait_ready(session, args.ready_timeout_s)
    pids_by_gpu = nvml.pids()
    rows = json.loads(bench.cli("status", "--json", session.session_id).stdout or "[]")
    ranks = [r for r in (rows[0]["ranks"] if rows else []) if r["role"] == "scheduler"]
    checks = []
    for r in ranks:
        on = sorted(g for g, pids in pids_by_gpu.items() if r["pid"] in pids)
        checks.append({"rank": r["rank"], "pid": r["pid"], "nvml_gpus": on, "status_gpu_index": r["gpu_index"],
                       "ok": on == [r["rank"] % gpus] and r["gpu_index"] == r["rank"] % gpus})
    report = session.stop(grace_s=30.0)
    result = {"tp": tp, "state": state, "ranks": checks, "ok": bool(checks) and all(c["ok"] for c in checks),
              "nvml_lists_pids": any(pids_by_gpu.values()), "stop": report.message}
    print(f"mapping TP{tp}: {state}; " + ", ".join(
        f"TP{c['rank']}->NVML GPU{c['nvml_gpus']} status GPU{c['status_gpu_index']}" for c in checks))
    if not result["nvml_lists_pids"]:
        print("mapping: NVML lists no per-process pids here; the panel falls back to the emulator's file")
    return result


def release_cases(gpus: int) -> list[tuple[str, int, int | None, str | None]]:
    cases = [("tp1", 1, None, None), ("tp2-base2", 2, 2, None), ("tp4-base4", 4, 4, None),
             ("tp4-cvd4567", 4, None, "4,5,6,7"), ("tp8", 8, None, None)]
    fits = []
    for name, tp, base, cvd in cases:
        highest = (base or 0) + tp - 1 if cvd is None else max(int(x) for x in cvd.split(","))
        if highest < gpus:
            fits.append((name, tp, base, cvd))
    return fits


def part_release(bench: Bench, nvml: Nvml, gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    tolerance = int(args.tolerance_mib * MIB)
    runs = []
    cases = release_cases(gpus)
    for name, tp, base, cvd in cases:
        bench.profile(name, tp, base=base, cvd=cvd)
        before = nvml.used()
        session = bench.launch(name)
        state = wait_ready(session, args.ready_timeout_s)
        at_ready = nvml.used()
        held_on = sorted(i for i in before if at_ready[i] - before[i] > tolerance)
        t0 = time.monotonic()
        report = session.stop(grace_s=30.0)
        stop_s = round(time.monotonic() - t0, 2)
        after, settle_s = settle(nvml, before, tolerance, args.settle_s)
        left = {i: round((after[i] - before[i]) / MIB) for i in before if after[i] - before[i] > tolerance}
        pids_left = sorted(set(report.gpu_pids_left))
        runs.append({"case": name, "tp": tp, "base_gpu_id": base, "cuda_visible_devices": cvd, "state": state,
                     "held_on_gpus": held_on, "stop_s": stop_s, "settle_s": settle_s, "left_mib": left,
                     "gpu_pids_left": pids_left, "released": not left and not pids_left})
        print(f"release {name}: {state}, held on GPUs {held_on}, stop {stop_s}s, settle {settle_s}s, "
              f"left {left or 'nothing'}, pids left {pids_left or 'none'}")
    skipped = [c[0] for c in (("tp2-base2",), ("tp4-base4",), ("tp4-cvd4567",), ("tp8",))
               if c[0] not in {r["case"] for r in runs}]
    return {"runs": runs, "skipped_for_gpu_count": skipped, "ok": all(r["released"] for r in runs)}


def part_busy(bench: Bench, nvml: Nvml, gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    holder_tp = 4 if gpus >= 8 else 1
    big_tp = 8 if gpus >= 8 else 1
    bench.profile("holder", holder_tp)
    bench.profile("big", big_tp)
    holder = bench.launch("holder")
    state = wait_ready(holder, args.ready_timeout_s)
    refused = bench.cli("launch", "big")
    named = [f"GPU{i}" for i in range(holder_tp) if f"GPU{i}" in refused.stderr]
    result: dict[str, Any] = {
        "holder": {"session": holder.session_id, "tp": holder_tp, "state": state},
        "refused": {"tp": big_tp, "rc": refused.returncode, "stderr": refused.stderr.strip(),
                    "names_gpus": named, "names_holder": holder.session_id in refused.stderr},
    }
    ok = refused.returncode == 2 and len(named) == holder_tp and holder.session_id in refused.stderr
    if refused.stdout.strip():  # it started after all: stop it
        from sessions.server import ServerSession

        bench.sessions.append(ServerSession.load(refused.stdout.strip(), bench.home))
    if gpus >= 8:
        bench.profile("beside", 4, cvd="4,5,6,7")
        started = bench.cli("launch", "beside")
        result["beside"] = {"rc": started.returncode, "session": started.stdout.strip(),
                            "stderr": started.stderr.strip()}
        if started.stdout.strip():
            from sessions.server import ServerSession

            beside = ServerSession.load(started.stdout.strip(), bench.home)
            bench.sessions.append(beside)
            result["beside"]["state"] = wait_ready(beside, args.ready_timeout_s)
        ok = ok and started.returncode == 0 and result["beside"].get("state") == "ready"
    else:
        result["beside"] = "skipped: needs 8 GPUs"
    bench.stop_all()
    result["ok"] = ok
    print(f"busy: TP{big_tp} launch rc {refused.returncode}, named {named}, holder named "
          f"{result['refused']['names_holder']}; beside: {result['beside'] if gpus < 8 else result['beside']['rc']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=10.0, help="GB each rank holds on its GPU (10)")
    parser.add_argument("--parts", default="mapping,release,busy")
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--settle-s", type=float, default=30.0)
    parser.add_argument("--tolerance-mib", type=float, default=256.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    nvml = Nvml()
    if not nvml.available:
        print(nvml.error)
        return 1
    gpus = nvml.count
    result: dict[str, Any] = {"gpus": gpus, "gb_per_rank": args.gb, "env": MULTICAST_OFF,
                              "note": "emulator ranks holding real memory on real GPUs, not real SGLang"}
    with tempfile.TemporaryDirectory(prefix="gpu-x8-") as tmp:
        bench = Bench(Path(tmp), args.gb, args.time_scale)
        try:
            for part, run in (("mapping", part_mapping), ("release", part_release), ("busy", part_busy)):
                if part in args.parts.split(","):
                    result[part] = run(bench, nvml, gpus, args)
        finally:
            bench.stop_all()
            nvml.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if all(result.get(p, {}).get("ok", True) for p in ("mapping", "release", "busy")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
