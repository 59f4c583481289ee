"""Python stacks of live processes, read with ``py-spy dump --pid`` (DESIGN §4).

This module owns finding py-spy, running it on many pids at once (one thread each, each with a timeout),
and parsing its text into frames, so that the UI can say "TP3 blocked in all_reduce
(parallel_state.py:123)".  Every failure is a value (`StackDump.ok` False with `error` and
`error_kind`), never an exception: a missing py-spy or a missing ptrace permission must not stop a
diagnosis (the same rule SGLang learned the hard way, sglang issue #7783, hang-catalog row 15).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

PYSPY_NAME = "py-spy"
DEFAULT_TIMEOUT_S = 10.0

# error_kind values
MISSING = "missing"  # py-spy not installed
PERMISSION = "permission"  # ptrace not allowed
GONE = "gone"  # the process exited
NOT_PYTHON = "not_python"
TIMEOUT = "timeout"
FAILED = "failed"

# Frames from these stdlib files say *how* a thread waits, not *what* it waits for.
_PLUMBING_FILES = frozenset({"threading.py", "queue.py", "selectors.py"})
_PLUMBING_PATHS = ("multiprocessing/connection.py", "multiprocessing/synchronize.py", "asyncio/base_events.py")
# Python frames of a collective: torch.distributed, SGLang's communicators (parallel_state.py,
# communication_op.py, custom_all_reduce.py, pynccl.py).  NCCL itself is C++, so these are the innermost
# Python frames of a rank that waits for its peers.
_COLLECTIVE_FUNCTION = re.compile(
    r"all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all|nccl|_wait_for_work",
    re.IGNORECASE,
)
_COLLECTIVE_FILE = re.compile(r"distributed_c10d\.py|communication_op\.py|custom_all_reduce\.py|pynccl\.py")

_THREAD_RE = re.compile(r'^Thread (?P<id>\S+)(?: \((?P<status>[^)]*)\))?(?::\s*"(?P<name>.*)")?\s*$')
_FRAME_RE = re.compile(r"^ {4}(?P<function>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")


@dataclass(frozen=True)
class StackFrame:
    function: str
    file: str
    line: int | None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{self.function} ({where})"

    @property
    def name(self) -> str:
        """The function's own name: py-spy 0.4 prints methods as ``Class.method``."""
        return self.function.rsplit(".", 1)[-1]

    @property
    def file_name(self) -> str:
        return self.file.rsplit("/", 1)[-1]

    @property
    def is_plumbing(self) -> bool:
        return self.file_name in _PLUMBING_FILES or self.file.endswith(_PLUMBING_PATHS)

    @property
    def is_collective(self) -> bool:
        return bool(_COLLECTIVE_FUNCTION.search(self.function) or _COLLECTIVE_FILE.search(self.file))


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a dump; ``frames`` are innermost first, as py-spy prints them."""

    thread_id: str
    name: str | None
    status: str | None  # "idle", "active", "active+gil", ...
    frames: tuple[StackFrame, ...]


@dataclass(frozen=True)
class StackDump:
    """The outcome of one ``py-spy dump --pid``: the stacks, or why there are none."""

    pid: int
    ok: bool
    text: str
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None
    error_kind: str | None = None
    duration_s: float = 0.0

    @property
    def main_thread(self) -> ThreadStack | None:
        for thread in self.threads:
            if thread.name == "MainThread" or thread.thread_id == str(self.pid):
                return thread
        return self.threads[0] if self.threads else None

    @property
    def frames(self) -> tuple[StackFrame, ...]:
        """The main thread's frames, innermost first."""
        main = self.main_thread
        return main.frames if main else ()

    @property
    def collective_frame(self) -> StackFrame | None:
        """The innermost frame of the main thread that belongs to a collective (all_reduce, barrier, ...)."""
        return next((f for f in self.frames if f.is_collective), None)

    @property
    def blocked_in(self) -> StackFrame | None:
        """Where the main thread waits: its innermost collective frame, else its innermost frame that is
        not stdlib waiting plumbing (threading, queue, a multiprocessing pipe)."""
        frames = self.frames
        collective = self.collective_frame
        if collective is not None:
            return collective
        for frame in frames:
            if not frame.is_plumbing:
                return frame
        return frames[0] if frames else None

    def to_json(self) -> dict:
        blocked = self.blocked_in
        return {
            "ok": self.ok,
            "error": self.error,
            "error_kind": self.error_kind,
            "blocked_in": str(blocked) if blocked else None,
            "function": blocked.function if blocked else None,
            "in_collective": self.collective_frame is not None,
            "threads": [
                {
                    "thread_id": t.thread_id,
                    "name": t.name,
                    "status": t.status,
                    "frames": [str(f) for f in t.frames],
                }
                for t in self.threads
            ],
            "text": self.text,
        }


@dataclass(frozen=True)
class PySpyStatus:
    """Whether py-spy can be used, where it is, and what to tell the user when it cannot."""

    available: bool
    path: str | None
    message: str | None


def find_pyspy() -> str | None:
    """py-spy on ``PATH``, else next to ``sys.executable`` (pipx and unactivated venvs only have that)."""
    found = shutil.which(PYSPY_NAME)
    if found:
        return found
    candidates = [Path(sys.executable).parent]
    try:
        # A venv's python is often a symlink into the base interpreter; check both folders.
        candidates.append(Path(sys.executable).resolve().parent)
    except OSError:
        pass
    for folder in candidates:
        path = folder / PYSPY_NAME
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def pyspy_status(pyspy: str | None = None) -> PySpyStatus:
    path = pyspy or find_pyspy()
    if path is None:
        return PySpyStatus(False, None, missing_message())
    return PySpyStatus(True, path, None)


def missing_message() -> str:
    return (
        f"py-spy not found on PATH or next to {sys.executable}; install it into the same environment "
        "(pip install py-spy) to see where each rank is blocked"
    )


def ptrace_scope() -> int | None:
    """The yama ptrace_scope (0 = classic, 1 = only descendants, 2 = admin only, 3 = none), if present."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def permission_message(pid: int) -> str:
    scope = ptrace_scope()
    why = f"kernel.yama.ptrace_scope is {scope}" if scope else "ptrace is not allowed for this user"
    return (
        f"py-spy may not attach to pid {pid} (Operation not permitted: {why}). Run as the same user with "
        "`sudo sysctl kernel.yama.ptrace_scope=0`, or give py-spy CAP_SYS_PTRACE "
        "(containers: --cap-add SYS_PTRACE), or run py-spy with sudo"
    )


def parse_dump(text: str) -> tuple[ThreadStack, ...]:
    """Threads and frames from py-spy's text output (0.3 and 0.4 formats; locals lines are skipped)."""
    threads: list[ThreadStack] = []
    current: dict | None = None

    def close() -> None:
        if current is not None:
            threads.append(
                ThreadStack(current["id"], current["name"], current["status"], tuple(current["frames"]))
            )

    for raw in text.splitlines():
        line = raw.rstrip()
        thread = _THREAD_RE.match(line)
        if thread:
            close()
            current = {
                "id": thread.group("id"),
                "name": thread.group("name"),
                "status": thread.group("status"),
                "frames": [],
            }
            continue
        if current is None:
            continue  # header: "Process N: <cmdline>" (may span lines), "Python v…"
        frame = _FRAME_RE.match(line)
        if frame:
            line_no = frame.group("line")
            current["frames"].append(
                StackFrame(frame.group("function"), frame.group("file"), int(line_no) if line_no else None)
            )
    close()
    return tuple(threads)


def _error_text(stdout: str, stderr: str) -> str:
    """The first meaningful lines of py-spy's complaint, without the Rust backtrace."""
    lines: list[str] = []
    for line in (stderr or stdout).splitlines():
        if line.strip().startswith("Stack backtrace"):
            break
        if line.strip():
            lines.append(line.strip())
    return " ".join(lines[:4]) or "py-spy failed without a message"


def dump_stack(pid: int, timeout_s: float = DEFAULT_TIMEOUT_S, pyspy: str | None = None) -> StackDump:
    """``py-spy dump --pid PID`` with a timeout; every failure comes back as a value.

    A process that is itself stopped (SIGSTOP, a debugger) cannot be suspended by py-spy ("Failed to
    suspend process"); its stack cannot change either, so it is read again with ``--nonblocking``.
    """
    start = time.monotonic()
    dump = _run_pyspy(pid, timeout_s, pyspy, nonblocking=False)
    if dump.error_kind == FAILED and "failed to suspend" in (dump.error or "").lower():
        left_s = max(0.5, timeout_s - (time.monotonic() - start))
        retry = _run_pyspy(pid, left_s, pyspy, nonblocking=True)
        if retry.ok:
            dump = retry
    return dump


def _run_pyspy(pid: int, timeout_s: float, pyspy: str | None, nonblocking: bool) -> StackDump:
    path = pyspy or find_pyspy()
    if path is None:
        return StackDump(pid, False, "", error=missing_message(), error_kind=MISSING)
    env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
    argv = [path, "dump", "--pid", str(pid)] + (["--nonblocking"] if nonblocking else [])
    start = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return StackDump(
            pid,
            False,
            "",
            error=f"py-spy dump --pid {pid} took longer than {timeout_s:g}s (process in D state?)",
            error_kind=TIMEOUT,
            duration_s=time.monotonic() - start,
        )
    except FileNotFoundError:
        return StackDump(pid, False, "", error=missing_message(), error_kind=MISSING)
    except PermissionError as exc:
        return StackDump(pid, False, "", error=f"cannot run {path}: {exc}", error_kind=FAILED)
    elapsed = time.monotonic() - start
    threads = parse_dump(done.stdout)
    if done.returncode == 0 and threads:
        return StackDump(pid, True, done.stdout, threads, duration_s=elapsed)
    message = _error_text(done.stdout, done.stderr)
    lowered = message.lower()
    if "failed to suspend" in lowered:
        return StackDump(pid, False, "", error=message, error_kind=FAILED, duration_s=elapsed)
    if "permission denied" in lowered or "operation not permitted" in lowered or "(os error 1)" in lowered:
        return StackDump(
            pid, False, "", error=f"{permission_message(pid)} [py-spy: {message}]",
            error_kind=PERMISSION, duration_s=elapsed,
        )
    if not psutil.pid_exists(pid) or "no such process" in lowered or "failed to get process executable" in lowered:
        return StackDump(pid, False, "", error=f"process {pid} is gone", error_kind=GONE, duration_s=elapsed)
    if "python version" in lowered or "failed to find python" in lowered:
        return StackDump(
            pid, False, "", error=f"pid {pid} is not a Python process py-spy can read: {message}",
            error_kind=NOT_PYTHON, duration_s=elapsed,
        )
    return StackDump(pid, False, done.stdout, threads, error=message, error_kind=FAILED, duration_s=elapsed)


def dump_stacks(
    pids: Iterable[int], timeout_s: float = DEFAULT_TIMEOUT_S, pyspy: str | None = None
) -> dict[int, StackDump]:
    """Dump every pid in parallel (one thread each); the result has one `StackDump` per pid, in order."""
    unique = list(dict.fromkeys(int(p) for p in pids))
    if not unique:
        return {}
    path = pyspy or find_pyspy()
    if path is None:
        return {pid: StackDump(pid, False, "", error=missing_message(), error_kind=MISSING) for pid in unique}
    with ThreadPoolExecutor(max_workers=min(len(unique), 32), thread_name_prefix="py-spy") as pool:
        results = pool.map(lambda pid: dump_stack(pid, timeout_s, path), unique)
        return dict(zip(unique, results))
