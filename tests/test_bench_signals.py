"""`bench compare` stops what it launched when it is told to stop (issue 22, item 15): a real `eagle3-tui
bench compare` process launches a real emulator session, and a real SIGTERM, SIGHUP (an SSH drop) or
SIGINT (Ctrl-C) arrives while it benchmarks.  The process must exit with 128 + the signal, and no
session it launched may be left running."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest
from test_bench_compare import _profiles, llama  # noqa: F401 - llama is a fixture


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_stops_the_compare_and_every_server_it_launched(sig, make_emulator_profile, llama, cli_env,  # noqa: F811
                                                                  home, launched):
    from sessions.server import list_sessions

    _profiles(make_emulator_profile, llama, 2.0)
    # long requests (400 tokens at 100 tok/s): the signal lands while a run is in flight
    proc = subprocess.Popen([sys.executable, "-m", "app", "bench", "compare", "plain", "eagle", "--input-len", "8",
                             "--output-len", "400", "--num-prompts", "2", "--concurrency", "1", "--rounds", "2"],
                            env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if "round 1/2: benchmarking A = plain" in line:
                break
        else:
            pytest.fail(f"the compare never started benchmarking: {''.join(seen)}")
        sessions = list_sessions(home)
        assert len(sessions) == 1, [s.session_id for s in sessions]
        for session in sessions:
            launched.track(session)
        server = sessions[0].main_identity()
        assert server is not None
        proc.send_signal(sig)
        rest = proc.stderr.read()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + sig, (code, "".join(seen) + rest)
    assert f"stopped by {signal.Signals(sig).name}; what it launched is stopped" in rest
    assert "Traceback" not in rest
    for session in list_sessions(home):
        assert session.status(probe_http=False).state == "stopped", session.session_id
    pid, create_time = server
    alive = psutil.pid_exists(pid) and psutil.Process(pid).create_time() == pytest.approx(create_time, abs=0.01) \
        and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert not alive, "the launched server outlived the compare"
