"""Bench: `status --json` and the TUI's log tail of a session whose server.log is 2 GB, as a user meets them.

Setup: a private home and a TP1 emulator session started through `ServerSession.launch` (the TUI's and
``eagle3-tui start``'s path), run until ready.  Then, in this order:
  1. small log: ``eagle3-tui status SESSION --json`` in a fresh process (x ``--runs``), and the TUI in a
     real pseudo-terminal (``python -m app``, 120x40): seconds from its first frame to the log's last line
     (a marker line appended just before the TUI starts) on screen;
  2. the log grows to ``--size-gb`` (default 2): a week of a serving SGLang (``Prefill batch`` /
     ``Decode batch`` lines, uvicorn access lines), written by repeating hour blocks whose date and hour
     are rewritten per block, appended to the live session's log as its server keeps running;
  3. big log: the same two measurements.  The first ``status`` after the growth is printed apart (it is
     the one that meets the week unread), then the following ones.
The log is in the page cache when it is read (it was just written): "warm cache"; the app's bytecode is
compiled once into the bench's own cache first, as an installed package's is.  Targets (issue 23):
status of the 2 GB log within 0.3 s; the TUI's tail within the small log's + 0.5 s.  It never asserts;
it prints numbers (and one JSON line).  Usage: ``python benches/bench_status_size.py [--size-gb 2]``.
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

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benches"))

from bench_tui import TuiInPty, launch_session

HOUR_LINES = 40_000  # lines per hour block (~6 MB): a busy server's Decode/Prefill cadence


def hour_block() -> bytes:
    """One hour of serving, with ``@D@`` (date) and ``@H@`` (hour) for the block writer to fill in."""
    out: list[str] = []
    for i in range(HOUR_LINES):
        mm, ss = divmod(i * 3600 // HOUR_LINES, 60)
        stamp = f"[@D@ @H@:{mm:02d}:{ss:02d}]"
        k = i % 10
        if k == 0:
            out.append(
                f"{stamp} Prefill batch, #new-seq: 1, #new-token: {512 + i % 97}, #cached-token: {i % 300}, "
                f"token usage: 0.{10 + i % 80:02d}, #running-req: {i % 16}, #queue-req: 0, "
                f"#pending-token: 0, cuda graph: False, input throughput (token/s): {9000 + i % 1000}.00\n"
            )
        elif k == 5:
            out.append(f'INFO:     127.0.0.1:{40000 + i % 20000} - "POST /generate HTTP/1.1" 200 OK\n')
        else:
            out.append(
                f"{stamp} Decode batch, #running-req: {1 + i % 16}, #token: {20000 + i % 9000}, "
                f"token usage: 0.{10 + i % 80:02d}, cuda graph: True, gen throughput (token/s): "
                f"{600 + i % 200}.{i % 100:02d}, #queue-req: 0\n"
            )
    return "".join(out).encode()


def grow_log(path: Path, size_bytes: int) -> int:
    """Append hour blocks (a week and more, day by day) to ``path`` until it holds ``size_bytes``."""
    block = hour_block()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        hour = 0
        while os.fstat(fd).st_size < size_bytes:
            day = 1 + (hour // 24) % 28
            data = block.replace(b"@D@", f"2026-11-{day:02d}".encode()).replace(b"@H@", f"{hour % 24:02d}".encode())
            os.write(fd, data)
            hour += 1
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def append_marker(path: Path, tag: str) -> str:
    """A last line that nothing else prints; the TUI shows it when it shows the log's end."""
    marker = f"perf-tail-marker-{tag}"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(path, "ab") as f:
        f.write(f"[{stamp}] Decode batch, #running-req: 1, #token: 7, {marker}\n".encode())
    return marker


def time_status(env: dict[str, str], session_id: str, runs: int) -> list[dict]:
    """``eagle3-tui status SESSION --json`` in a fresh process, ``runs`` times: wall seconds, the process's
    CPU seconds (user + system: what load from other processes does not inflate), exit code."""
    out = []
    for _ in range(runs):
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "app", "status", session_id, "--json"],
            check=False, env=env, cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=600,
        )
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            doc = None
        row = doc[0] if isinstance(doc, list) and doc else doc if isinstance(doc, dict) else {}
        out.append({
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "rc": proc.returncode,
            "state": row.get("state") if isinstance(row, dict) else None,
            "phase": row.get("phase") if isinstance(row, dict) else None,
        })
    return out


def cli_baseline(env: dict[str, str], runs: int) -> float:
    """The CLI's own start (``eagle3-tui --help``'s wall time, best of ``runs``): the floor of any call."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "app", "--help"], check=False, env=env, cwd=str(REPO_ROOT),
                       capture_output=True, timeout=60)
        best = min(best, time.monotonic() - t0)
    return round(best, 3)


def tui_tail(env: dict[str, str], marker: str, timeout_s: float) -> dict:
    """The TUI in a pty: seconds from spawn to first frame, and from first frame to ``marker`` on screen."""
    tui = TuiInPty(env, 120, 40)
    started = tui.start(watch=(b"GPUs", marker.encode()))
    try:
        frame = tui.wait_marker(b"GPUs", 60.0)
        shown = tui.wait_marker(marker.encode(), timeout_s)
    finally:
        code = tui.quit()
    return {
        "first_frame_s": None if frame is None else round(frame - started, 3),
        "tail_after_first_frame_s": None if frame is None or shown is None else round(shown - frame, 3),
        "tui_exit_code": code,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3, help="status calls per log size (default 3)")
    parser.add_argument("--tui-timeout", type=float, default=120.0)
    parser.add_argument("--dir", default=None, help="where the home goes (default: a temp dir, removed)")
    args = parser.parse_args(argv)

    root = Path(args.dir or tempfile.mkdtemp(prefix="eagle3-bench-size-"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["EAGLE3_TUI_HOME"] = str(root)
    os.environ.pop("EAGLE3_TUI_DEMO", None)
    env = dict(os.environ, TERM="xterm-256color", EAGLE3_TUI_HOME=str(root),
               PYTHONPATH=str(REPO_ROOT), PYTHONPYCACHEPREFIX=str(root / "pycache"))
    # As an installed package runs: its bytecode compiled once (PYTHONDONTWRITEBYTECODE would make every
    # cold process compile the whole app again, most of a small status's time); the cache is the bench's own.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "app", "sessions", "widgets"], check=False,
                   env=env, cwd=str(REPO_ROOT), capture_output=True, timeout=300)
    from sessions.home import resolve_home

    home = resolve_home().ensure()
    session, status = launch_session(home, 1, 0.003)
    print(f"session {session.session_id}: {status.state}", file=sys.stderr)
    results: dict = {"session_state": status.state}
    try:
        results["cli_start_s"] = cli_baseline(env, 3)
        small_size = session.log_path.stat().st_size
        results["small"] = {"log_bytes": small_size, "status": time_status(env, session.session_id, args.runs)}
        results["small"]["tui"] = tui_tail(env, append_marker(session.log_path, "small"), args.tui_timeout)
        t0 = time.monotonic()
        size = grow_log(session.log_path, int(args.size_gb * (1 << 30)))
        results["grow_s"] = round(time.monotonic() - t0, 1)
        marker = append_marker(session.log_path, "big")
        first = time_status(env, session.session_id, 1)
        results["big"] = {
            "log_bytes": size,
            "first_status_after_growth": first,
            "status": time_status(env, session.session_id, args.runs),
        }
        results["big"]["tui"] = tui_tail(env, marker, args.tui_timeout)
    finally:
        session.stop(grace_s=10.0)
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    small, big = results["small"], results["big"]
    print(f"CLI start (eagle3-tui --help): {results['cli_start_s']} s wall")
    print(f"small log ({small['log_bytes']} B): status --json {[r['wall_s'] for r in small['status']]} s wall, "
          f"{[r['cpu_s'] for r in small['status']]} s CPU; "
          f"TUI first frame {small['tui']['first_frame_s']} s, last line on screen "
          f"{small['tui']['tail_after_first_frame_s']} s after it")
    print(f"log grown to {big['log_bytes'] / 2**30:.2f} GiB in {results['grow_s']} s (page cache warm)")
    first_big = big["first_status_after_growth"][0]
    print(f"big log: first status --json after the growth {first_big['wall_s']} s wall ({first_big['cpu_s']} s CPU), "
          f"then {[r['wall_s'] for r in big['status']]} s wall, {[r['cpu_s'] for r in big['status']]} s CPU "
          f"(target 0.3); "
          f"state/phase {big['status'][-1]['state']}/{big['status'][-1]['phase']}")
    print(f"big log: TUI first frame {big['tui']['first_frame_s']} s, last line on screen "
          f"{big['tui']['tail_after_first_frame_s']} s after it (target: small's + 0.5)")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
