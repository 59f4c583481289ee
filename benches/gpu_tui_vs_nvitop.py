"""Bench (GPU machine): eagle3-tui reading real NVML next to nvitop, CPU time of each over the same window.

Setup: a private home and a TP``--tp`` emulator session whose ranks hold ``--gpu-memory-gb`` of real GPU
memory each (rank r on GPU r % count; needs torch with CUDA in this Python), so NVML shows a real start.
Then, over the same ``--seconds``:
  * the TUI headless under Pilot with `NvmlSource` (no fallback), in its own process; at the end it saves
    ``<out>/tui-nvml-<cols>x<rows>.svg`` (+ .png when cairosvg is there);
  * the TUI in a pseudo-terminal (`python -m app`), as a user runs it (skip with ``--no-pty-tui``);
  * nvitop in a pseudo-terminal at the same ``--interval``, imported from ``--nvitop-path`` (its wheel pins
    nvidia-ml-py < 13.596, so it lives in its own ``pip install --target`` dir).
Each process's CPU time (user + system) over the window is printed as % of one core, and written to
``<out>/gpu_tui_vs_nvitop.json``.  Without a GPU the same runs show the "NVML not available" path.

    python benches/gpu_tui_vs_nvitop.py --out /tmp/out --nvitop-path /tmp/nvitop-target [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benches"))


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_tui(home_root: str, seconds: float, columns: int, rows: int, svg: Path, refresh_s: float) -> int:
    """The headless TUI with NvmlSource: prints {"cpu_s", "wall_s", "polls", "gpu_message"} as JSON."""
    import asyncio

    os.environ["EAGLE3_TUI_HOME"] = home_root
    from app.tui import Eagle3App
    from sessions.gpus import NvmlSource
    from sessions.home import resolve_home

    result: dict = {}

    async def run() -> None:
        app = Eagle3App(resolve_home(), gpu_source=NvmlSource(), refresh_s=refresh_s)
        async with app.run_test(size=(columns, rows)) as pilot:
            while app.dashboard is None or app.dashboard.poll_count < 2:
                await pilot.pause(0.1)
            cpu0, wall0, polls0 = _cpu_s(), time.monotonic(), app.dashboard.poll_count
            await pilot.pause(seconds)
            result.update(
                cpu_s=_cpu_s() - cpu0,
                wall_s=time.monotonic() - wall0,
                polls=app.dashboard.poll_count - polls0,
            )
            snapshot = app.dashboard.last_snapshot
            result["gpu_message"] = snapshot.gpu.message if snapshot else None
            result["gpus"] = len(snapshot.gpu.samples) if snapshot else 0
            app.save_screenshot(filename=svg.name, path=str(svg.parent))
            await pilot.press("q")

    asyncio.run(run())
    print(json.dumps(result))
    return 0


def _nvml_count() -> int | None:
    from sessions.gpus import NvmlSource

    source = NvmlSource(wait_s=5.0)
    try:
        snapshot = source.snapshot()
    finally:
        source.close()
    return len(snapshot.samples) if snapshot.available else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the screenshot and results")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--nvitop-path", type=Path, help="a `pip install --target` dir holding nvitop")
    parser.add_argument("--gpu-memory-gb", type=float, default=8.0, help="real memory per emulated rank")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0, help="refresh of both tools, seconds")
    parser.add_argument("--columns", type=int, default=200)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--time-scale", type=float, default=0.003)
    parser.add_argument("--no-pty-tui", action="store_true", help="skip the TUI-in-a-terminal run")
    parser.add_argument("--child-tui", nargs=2, metavar=("HOME", "SVG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_tui:
        return child_tui(
            args.child_tui[0], args.seconds, args.columns, args.rows, Path(args.child_tui[1]), args.interval
        )

    import psutil
    from bench_tui import TuiInPty, launch_session

    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "seconds": args.seconds,
        "interval_s": args.interval,
        "terminal": f"{args.columns}x{args.rows}",
    }
    gpu_count = _nvml_count()
    results["nvml_gpus"] = gpu_count
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-gpu-") as tmp:
        os.environ["EAGLE3_TUI_HOME"] = tmp
        os.environ.pop("EAGLE3_TUI_DEMO", None)
        from sessions.home import resolve_home

        home = resolve_home().ensure()
        memory = args.gpu_memory_gb if gpu_count else None  # nothing to hold without a GPU
        session, status = launch_session(home, args.tp, args.time_scale, gpu_memory_gb=memory)
        results["session"] = {"state": status.state, "ranks": len(status.ranks), "gpu_memory_gb": memory}
        print(f"session {session.session_id}: {status.state}; NVML GPUs: {gpu_count}", file=sys.stderr)
        svg = args.out / f"tui-nvml-{args.columns}x{args.rows}.svg"
        env = dict(os.environ, TERM="xterm-256color", EAGLE3_TUI_HOME=tmp, PYTHONUNBUFFERED="1")
        processes: dict[str, dict] = {}
        nvitop = pty_tui = None
        try:
            headless = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--out",
                    str(args.out),
                    "--seconds",
                    str(args.seconds),
                    "--interval",
                    str(args.interval),
                    "--columns",
                    str(args.columns),
                    "--rows",
                    str(args.rows),
                    "--child-tui",
                    tmp,
                    str(svg),
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=REPO_ROOT,
            )
            if not args.no_pty_tui:
                pty_tui = TuiInPty(env, args.columns, args.rows)
                pty_tui.start(watch=(b"GPUs",))
                pty_tui.wait_marker(b"GPUs", 30.0)
            if args.nvitop_path:
                nvitop_env = dict(
                    env, PYTHONPATH=os.pathsep.join([str(args.nvitop_path), env.get("PYTHONPATH", "")])
                )
                nvitop = TuiInPty(
                    nvitop_env,
                    args.columns,
                    args.rows,
                    argv=[sys.executable, "-m", "nvitop", "--interval", str(args.interval)],
                )
                nvitop.start()
            time.sleep(2.0)  # both past their start-up
            watched = {"tui_pty": pty_tui, "nvitop_pty": nvitop}
            before = {}
            for name, proc in watched.items():
                if proc is not None:
                    try:
                        before[name] = psutil.Process(proc.pid).cpu_times()
                    except psutil.Error as exc:
                        processes[name] = {"error": f"not running: {exc}"}
            wall0 = time.monotonic()
            time.sleep(args.seconds)
            wall = time.monotonic() - wall0
            for name, times in before.items():
                proc = watched[name]
                try:
                    ps = psutil.Process(proc.pid)
                    if ps.status() == psutil.STATUS_ZOMBIE:
                        raise psutil.NoSuchProcess(proc.pid)
                    after = ps.cpu_times()
                except psutil.Error:
                    tail = bytes(proc.output[-400:]).decode(errors="replace").replace("\r", "")
                    processes[name] = {"error": f"exited early: {tail.strip()[-200:]!r}"}
                    continue
                cpu = (after.user - times.user) + (after.system - times.system)
                processes[name] = {"cpu_s": round(cpu, 3), "cpu_percent": round(100 * cpu / wall, 2)}
            out, _ = headless.communicate(timeout=args.seconds + 120)
            try:
                child = json.loads(out.strip().splitlines()[-1])
                processes["tui_headless"] = {
                    "cpu_s": round(child["cpu_s"], 3),
                    "cpu_percent": round(100 * child["cpu_s"] / child["wall_s"], 2),
                    "polls": child["polls"],
                    "gpus": child["gpus"],
                    "gpu_message": child["gpu_message"],
                }
            except (ValueError, IndexError, KeyError):
                processes["tui_headless"] = {"error": f"no result (exit {headless.returncode})"}
        finally:
            for proc in (pty_tui, nvitop):
                if proc is not None:
                    proc.quit()
            session.stop(grace_s=15.0)
        if svg.exists():
            results["screenshot"] = str(svg)
            try:
                from screenshots.make_screenshots import to_png

                png = to_png(svg, args.columns)
                if png:
                    results["screenshot_png"] = str(png)
            except Exception as exc:  # noqa: BLE001 - the SVG is the result; PNG is a convenience
                results["png_error"] = str(exc)
    if not args.nvitop_path:
        processes["nvitop_pty"] = {"error": "not run: give --nvitop-path (pip install --target DIR nvitop)"}
    results["processes"] = processes
    window = f"over {args.seconds:.0f} s at a {args.interval} s refresh"
    print(f"{'process':<14} {'CPU % of one core':>18}   {window}")
    for name in ("tui_headless", "tui_pty", "nvitop_pty"):
        entry = processes.get(name, {"error": "not run"})
        shown = f"{entry['cpu_percent']:.2f}" if "cpu_percent" in entry else entry.get("error", "")
        print(f"{name:<14} {shown:>18}")
    print(json.dumps(results))
    (args.out / "gpu_tui_vs_nvitop.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise SystemExit(main())
