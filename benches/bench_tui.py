"""Bench: the TUI's time to first frame and its CPU use while it watches a busy TP8 session (DESIGN §8).

Setup: a private home; a TP8 emulator session (eight `sglang::scheduler_TP*` ranks, eight emulated GPUs)
started through `ServerSession.launch`, as the TUI would; then `eagle3-tui` in a real pseudo-terminal
(120x40) at a 1 s refresh while this script appends ``--lines-per-s`` SGLang-style lines to the
session's log.  The terminal output is drained continuously, as a terminal emulator would.

Prints (targets in brackets):
  first_frame_s    from spawning `eagle3-tui` to the first frame that shows the dashboard  [< 1.0]
  cpu_percent      the TUI process's CPU time / wall time over ``--seconds``, % of one core  [< 3]
It never asserts; it prints numbers.  Usage: ``python benches/bench_tui.py [--seconds 60]``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import signal
import struct
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

KIMI_LIKE_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "vocab_size": 163840,
    "torch_dtype": "bfloat16",
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_session(home, tp: int, time_scale: float, gpu_memory_gb: float | None = None):
    """A TP``tp`` emulator session in ``home``; returns it once it is ready (or after 120 s)."""
    import tomli_w

    from sessions.profiles import load_profile
    from sessions.server import ServerSession

    model_dir = home.state_root / "models" / "kimi-like"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(KIMI_LIKE_CONFIG))
    emulator: dict = {"time_scale": time_scale, "fault": "none"}
    if gpu_memory_gb:
        emulator["gpu_memory_gb"] = gpu_memory_gb
    doc = {
        "server": {
            "launcher": "emulator",
            "python": sys.executable,
            "model_path": str(model_dir),
            "tp_size": tp,
            "host": "127.0.0.1",
            "port": free_port(),
        },
        "emulator": emulator,
    }
    path = home.profiles_dir / "bench-tp8.toml"
    path.write_text(tomli_w.dumps(doc))
    session = ServerSession.launch(load_profile(path), home)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = session.status(probe_http=True)
        if status.state == "ready" or status.state in ("crashed", "exited"):
            break
        time.sleep(0.5)
    return session, status


class LogWriter(threading.Thread):
    """Appends SGLang-shaped lines to the log at a steady rate (a chatty decode phase)."""

    def __init__(self, path: Path, lines_per_s: int, tp: int) -> None:
        super().__init__(daemon=True)
        self.path, self.lines_per_s, self.tp = path, lines_per_s, tp
        self.stop_event = threading.Event()
        self.written = 0

    def run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            tick = 0.1
            per_tick = max(1, round(self.lines_per_s * tick))
            next_at = time.monotonic()
            while not self.stop_event.is_set():
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                chunk = "".join(
                    f"[{stamp} TP{(self.written + i) % self.tp}] Decode batch. #running-req: 8, #token: "
                    f"{1000 + self.written + i}, token usage: 0.01, gen throughput (token/s): 612.3\n"
                    for i in range(per_tick)
                )
                os.write(fd, chunk.encode())
                self.written += per_tick
                next_at += tick
                self.stop_event.wait(max(0.0, next_at - time.monotonic()))
        finally:
            os.close(fd)


class TuiInPty:
    """`eagle3-tui` in a pseudo-terminal of a given size; its output is drained in a thread."""

    def __init__(self, env: dict[str, str], columns: int, rows: int, argv: list[str] | None = None,
                 cwd: Path = REPO_ROOT) -> None:
        self.argv = argv or [sys.executable, "-m", "app"]
        self.env = env
        self.cwd = cwd  # `python -m app` imports the app of its working folder first
        self.columns, self.rows = columns, rows
        self.output = bytearray()
        self.first_output_at: float | None = None
        self.marker_at: dict[bytes, float] = {}
        self.watch: tuple[bytes, ...] = ()
        self._lock = threading.Lock()

    def start(self, watch: tuple[bytes, ...] = ()) -> float:
        self.watch = watch
        self.started_at = time.monotonic()
        pid, fd = pty.fork()
        if pid == 0:  # the child: the TUI
            os.chdir(str(self.cwd))
            os.execve(self.argv[0], self.argv, self.env)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", self.rows, self.columns, 0, 0))
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        return self.started_at

    def _drain(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if not ready:
                    if self._exited():
                        return
                    continue
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            now = time.monotonic()
            with self._lock:
                if self.first_output_at is None:
                    self.first_output_at = now
                self.output += data
                if len(self.output) > (4 << 20):
                    del self.output[: len(self.output) - (1 << 20)]
                for marker in self.watch:
                    if marker not in self.marker_at and marker in self.output:
                        self.marker_at[marker] = now

    def _exited(self) -> bool:
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        return done != 0

    def wait_marker(self, marker: bytes, timeout_s: float) -> float | None:
        """When ``marker`` (one of ``watch``) was first seen; None after ``timeout_s`` or once the TUI ended
        without it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if marker in self.marker_at:
                    return self.marker_at[marker]
            if not self._reader.is_alive():  # the TUI ended (its terminal closed): nothing more comes
                with self._lock:
                    return self.marker_at.get(marker)
            time.sleep(0.01)
        return None

    def send(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def quit(self, timeout_s: float = 10.0) -> int | None:
        try:
            self.send(b"q")
        except OSError:
            pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement window (default 60)")
    parser.add_argument("--lines-per-s", type=int, default=100)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.003, help="emulator startup speed")
    parser.add_argument("--columns", type=int, default=120)
    parser.add_argument("--rows", type=int, default=40)
    args = parser.parse_args(argv)

    import psutil

    with tempfile.TemporaryDirectory(prefix="eagle3-bench-tui-") as tmp:
        os.environ["EAGLE3_TUI_HOME"] = tmp
        os.environ.pop("EAGLE3_TUI_DEMO", None)
        from sessions.home import resolve_home

        home = resolve_home().ensure()
        session, status = launch_session(home, args.tp, args.time_scale)
        print(f"session {session.session_id}: {status.state}, {len(status.ranks)} processes", file=sys.stderr)
        env = dict(os.environ, TERM="xterm-256color", EAGLE3_TUI_HOME=tmp)
        tui = TuiInPty(env, args.columns, args.rows)
        writer = LogWriter(session.log_path, args.lines_per_s, args.tp)
        try:
            started = tui.start(watch=(b"Profiles", b"GPUs"))
            drawn = tui.wait_marker(b"GPUs", 30.0)
            first_frame_s = None if drawn is None else drawn - started
            time.sleep(2.0)  # the first polls (imports of the engine) are not the steady state
            writer.start()
            proc = psutil.Process(tui.pid)
            cpu_before = proc.cpu_times()
            wall_before = time.monotonic()
            rss_max = 0
            end = wall_before + args.seconds
            while time.monotonic() < end:
                rss_max = max(rss_max, proc.memory_info().rss)
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            cpu_after = proc.cpu_times()
            wall_s = time.monotonic() - wall_before
            cpu_s = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
            lines = writer.written
        finally:
            writer.stop_event.set()
            code = tui.quit()
            session.stop(grace_s=10.0)
        results = {
            "first_frame_s": None if first_frame_s is None else round(first_frame_s, 3),
            "cpu_percent_of_one_core": round(100.0 * cpu_s / wall_s, 2),
            "cpu_s": round(cpu_s, 3),
            "wall_s": round(wall_s, 1),
            "log_lines_appended": lines,
            "tp": args.tp,
            "terminal": f"{args.columns}x{args.rows}",
            "rss_max_mb": round(rss_max / 2**20, 1),
            "tui_exit_code": code,
        }
        print(f"first frame: {results['first_frame_s']} s (target < 1.0)")
        print(
            f"cpu: {results['cpu_percent_of_one_core']} % of one core over {results['wall_s']} s "
            f"(target < 3), {lines} log lines appended, RSS max {results['rss_max_mb']} MB"
        )
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
