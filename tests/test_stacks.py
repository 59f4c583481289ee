"""py-spy stacks of real processes: found where pipx/venvs put it, run in parallel, failures as values."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessions import stacks
from sessions.stacks import GONE, MISSING, PERMISSION, TIMEOUT, dump_stacks, find_pyspy, parse_dump

BLOCKER = textwrap.dedent(
    """
    import sys, threading, time
    def helper_thread_waits():
        threading.Event().wait()
    threading.Thread(target=helper_thread_waits, name="helper", daemon=True).start()
    def {name}():
        print("ready", flush=True)
        time.sleep(600)
    def caller():
        {name}()
    caller()
    """
)


def _spawn_blocked(name: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKER.format(name=name)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def blocked_processes():
    procs: list[subprocess.Popen] = []

    def spawn(name: str) -> subprocess.Popen:
        proc = _spawn_blocked(name)
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        proc.kill()
        proc.wait()


def test_pyspy_is_found_next_to_the_interpreter_when_path_has_none(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    found = find_pyspy()
    assert found is not None
    assert Path(found).parent in (Path(sys.executable).parent, Path(sys.executable).resolve().parent)


def test_a_missing_pyspy_is_reported_for_every_pid_not_raised(monkeypatch, tmp_path, blocked_processes):
    proc = blocked_processes("waits_here")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert find_pyspy() is None
    result = dump_stacks([proc.pid, proc.pid + 100000], timeout_s=5)
    assert set(result) == {proc.pid, proc.pid + 100000}
    for dump in result.values():
        assert not dump.ok and dump.error_kind == MISSING
        assert "py-spy" in dump.error and "pip install py-spy" in dump.error
    assert not stacks.pyspy_status().available


def test_every_process_is_dumped_in_parallel_with_the_function_it_blocks_in(blocked_processes):
    names = ["all_reduce_rank0", "load_weights_rank1", "capture_graph_rank2"]
    procs = {name: blocked_processes(name) for name in names}
    result = dump_stacks([p.pid for p in procs.values()], timeout_s=20)
    for name, proc in procs.items():
        dump = result[proc.pid]
        assert dump.ok, dump.error
        assert dump.blocked_in is not None and dump.blocked_in.function == name
        assert [f.function for f in dump.frames[:2]] == [name, "caller"]
        # the helper thread is parsed too, innermost first, and blocked_in skips threading plumbing
        helper = [t for t in dump.threads if t.name == "helper"]
        assert helper and helper[0].frames[0].file_name == "threading.py"
        assert f"{name} (<string>:" in str(dump.blocked_in)


def test_a_stopped_process_is_read_without_suspending_it(blocked_processes):
    proc = blocked_processes("stopped_in_here")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        dump = dump_stacks([proc.pid], timeout_s=20)[proc.pid]
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert dump.ok, dump.error
    assert dump.blocked_in.function == "stopped_in_here"


def test_a_process_that_is_gone_is_reported_as_gone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dump = dump_stacks([proc.pid], timeout_s=10)[proc.pid]
    assert not dump.ok and dump.error_kind == GONE and str(proc.pid) in dump.error


def test_a_dump_slower_than_its_timeout_is_cut_off_and_reported(blocked_processes):
    proc = blocked_processes("slow_to_read")
    dump = dump_stacks([proc.pid], timeout_s=0.001)[proc.pid]
    assert not dump.ok and dump.error_kind == TIMEOUT
    assert "longer than" in dump.error
    assert proc.poll() is None  # cutting py-spy off leaves the rank running


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run py-spy as an unprivileged user",
)
def test_missing_ptrace_permission_is_explained_not_raised(tmp_path, blocked_processes):
    proc = blocked_processes("owned_by_root")
    real = find_pyspy()
    wrapper = tmp_path / "py-spy"
    # The real py-spy, run as nobody without capabilities: the kernel refuses ptrace on root's process.
    wrapper.write_text(
        "#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all "
        f'{real} "$@"\n'
    )
    wrapper.chmod(0o755)
    dump = dump_stacks([proc.pid], timeout_s=20, pyspy=str(wrapper))[proc.pid]
    assert not dump.ok and dump.error_kind == PERMISSION
    assert "ptrace" in dump.error.lower() and "CAP_SYS_PTRACE" in dump.error


def test_parser_reads_pyspy_03_hex_threads_and_skips_locals():
    text = textwrap.dedent(
        """\
        Process 4242: python -m sglang.launch_server
            --model /m
        Python v3.10.12 (/usr/bin/python3.10)

        Thread 0x7F3A12345740 (idle): "MainThread"
            all_reduce (sglang/srt/distributed/parallel_state.py:123)
                Arguments:
                    input_: <Tensor at 0x7f>
            forward (sglang/srt/layers/linear.py:77)
            <module> (launch_server.py)
        Thread 0x7F3A00000001 (active+gil): "watchdog"
            run (sglang/srt/utils/watchdog.py:103)
        """
    )
    threads = parse_dump(text)
    assert [t.name for t in threads] == ["MainThread", "watchdog"]
    main = threads[0]
    assert main.status == "idle"
    assert [str(f) for f in main.frames] == [
        "all_reduce (sglang/srt/distributed/parallel_state.py:123)",
        "forward (sglang/srt/layers/linear.py:77)",
        "<module> (launch_server.py)",
    ]
    assert threads[1].status == "active+gil"
