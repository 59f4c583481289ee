"""Bench: the TUI's own CPU at a 1 s refresh while it watches a ready session that serves nothing.

This is `benches/gpu_tui_vs_nvitop.py`'s TUI side without a GPU: a private home, a TP``--tp`` emulator
session started through `ServerSession.launch` and run until ready, then ``python -m app`` in a real
pseudo-terminal (120x40, its output drained as a terminal does).  After ``--warmup`` seconds, the TUI
process's CPU time (user + system) over ``--seconds`` is printed as % of one core.  With ``--py-spy OUT``
py-spy samples the TUI over the same window (``OUT.txt``: raw stacks) and the top functions, by own and
by total samples, are printed: where the poll path spends its CPU.  ``--in-process`` times the poll path
alone instead (`DashboardFeed.poll` once a second in this process, the TUI's GPU source, the CPU time of
each poll): less noisy on a shared machine than a whole process's CPU.  It never asserts; it prints numbers.

    python benches/bench_tui_idle_cpu.py [--seconds 60] [--py-spy /tmp/profile] [--in-process]
"""

from __future__ import annotations

import argparse
import collections
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
sys.path.insert(0, str(REPO_ROOT / "benches"))

from bench_tui import TuiInPty, launch_session


def top_functions(raw: Path, n: int = 20) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
    """(by own samples, by total samples, samples) of py-spy's raw (collapsed) stacks."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    return own.most_common(n), total.most_common(n), samples


def poll_cpu(home, seconds: float) -> dict:
    """`DashboardFeed.poll` at the TUI's 1 s refresh for ``seconds``: CPU ms per poll (thread time)."""
    from app.feed import DashboardFeed, PollRequest
    from sessions.gpus import default_gpu_source

    feed = DashboardFeed(home, default_gpu_source(home))
    request = PollRequest(None, None)
    for _ in range(3):  # the first polls open the log, read the tree, import what they need
        snapshot = feed.poll(request)
        request = PollRequest(snapshot.selected, None)
        time.sleep(1.0)
    costs = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.thread_time()
        feed.poll(request)
        costs.append(time.thread_time() - t0)
        time.sleep(1.0)
    costs.sort()
    return {"polls": len(costs), "cpu_ms_per_poll_mean": round(1000 * sum(costs) / len(costs), 2),
            "cpu_ms_per_poll_median": round(1000 * costs[len(costs) // 2], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--py-spy", dest="py_spy", default=None, help="write py-spy's raw stacks to OUT.txt")
    parser.add_argument("--in-process", action="store_true", help="time DashboardFeed.poll alone")
    args = parser.parse_args(argv)

    import psutil

    root = Path(tempfile.mkdtemp(prefix="eagle3-bench-idle-"))
    os.environ["EAGLE3_TUI_HOME"] = str(root)
    os.environ.pop("EAGLE3_TUI_DEMO", None)
    from sessions.home import resolve_home

    home = resolve_home().ensure()
    session, status = launch_session(home, args.tp, 0.003)
    print(f"session {session.session_id}: {status.state}, {len(status.ranks)} processes", file=sys.stderr)
    if args.in_process:
        try:
            got = poll_cpu(home, args.seconds)
        finally:
            session.stop(grace_s=10.0)
            shutil.rmtree(root, ignore_errors=True)
        print(f"poll path at 1 s refresh, ready TP{args.tp} session, no traffic: "
              f"{got['cpu_ms_per_poll_mean']} ms CPU per poll (median {got['cpu_ms_per_poll_median']}), "
              f"{got['polls']} polls")
        print(json.dumps(got))
        return 0
    env = dict(os.environ, TERM="xterm-256color", EAGLE3_TUI_HOME=str(root), PYTHONPATH=str(REPO_ROOT))
    tui = TuiInPty(env, 120, 40)
    results: dict = {"session_state": status.state, "tp": args.tp}
    spy = None
    try:
        tui.start(watch=(b"GPUs",))
        tui.wait_marker(b"GPUs", 60.0)
        time.sleep(args.warmup)
        proc = psutil.Process(tui.pid)
        if args.py_spy:
            py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            spy = subprocess.Popen(
                [py_spy, "record", "--pid", str(tui.pid), "--duration", str(int(args.seconds)), "--rate", "200",
                 "--format", "raw", "--output", f"{args.py_spy}.txt", "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
        before, wall0 = proc.cpu_times(), time.monotonic()
        time.sleep(args.seconds)
        after, wall = proc.cpu_times(), time.monotonic() - wall0
        cpu = (after.user - before.user) + (after.system - before.system)
        results.update(cpu_s=round(cpu, 3), wall_s=round(wall, 1), cpu_percent_of_one_core=round(100 * cpu / wall, 2))
        if spy is not None:
            _, err = spy.communicate(timeout=120)
            results["py_spy_rc"] = spy.returncode
            if spy.returncode != 0:
                results["py_spy_error"] = err.strip()[-300:]
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        results["tui_exit_code"] = tui.quit()
        session.stop(grace_s=10.0)
        shutil.rmtree(root, ignore_errors=True)
    print(f"TUI CPU at 1 s refresh, ready TP{args.tp} session, no traffic: {results.get('cpu_percent_of_one_core')} % "
          f"of one core over {results.get('wall_s')} s")
    if args.py_spy and Path(f"{args.py_spy}.txt").exists():
        own, total, samples = top_functions(Path(f"{args.py_spy}.txt"))
        print(f"py-spy: {samples} samples (non-idle threads only)")
        print("top by own samples:")
        for frame, count in own:
            print(f"  {count:6d}  {frame}")
        print("top by total samples:")
        for frame, count in total:
            print(f"  {count:6d}  {frame}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
