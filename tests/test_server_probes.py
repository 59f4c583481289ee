"""Probes against real sockets, a real HTTP server and real processes titled like SGLang's ranks."""
from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import psutil
import pytest

from sessions import probes


def test_parse_title_recognises_sglang_rank_titles():
    cases = {
        "sglang::scheduler_TP3": ("scheduler", 3, None, None, None),
        "sglang::scheduler": ("scheduler", 0, None, None, None),  # tp_size 1 has no TP suffix
        "sglang::scheduler_TP0_EP0": ("scheduler", 0, None, None, 0),
        "sglang::scheduler_DP1_TP7_EP7": ("scheduler", 7, 1, None, 7),
        "sglang::scheduler_PP1_TP2": ("scheduler", 2, None, 1, None),
        "sglang::detokenizer": ("detokenizer", None, None, None, None),
        "sglang::data_parallel_controller": ("dp_controller", None, None, None, None),
        "python -m sglang.launch_server --tp 8": ("other", None, None, None, None),
        "sglang::scheduler_TPX": ("other", None, None, None, None),
    }
    for title, (role, tp, dp, pp, ep) in cases.items():
        parsed = probes.parse_title(title)
        assert (parsed.role, parsed.tp_rank, parsed.dp_rank, parsed.pp_rank, parsed.ep_rank) == (
            role, tp, dp, pp, ep
        ), title


def test_port_probes_see_a_listening_socket_and_its_owner():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.listen()
    try:
        assert probes.port_listening("127.0.0.1", port)
        assert not probes.port_free("127.0.0.1", port)
        assert probes.pid_listening_on(port, "127.0.0.1") == os.getpid()
        text = probes.describe_port_user("127.0.0.1", port)
        assert text.startswith(f"port {port} on 127.0.0.1 is in use by pid {os.getpid()} (")
    finally:
        server.close()
    assert not probes.port_listening("127.0.0.1", port)
    assert probes.port_free("127.0.0.1", port)
    assert probes.pid_listening_on(port) is None


def test_port_free_ignores_time_wait_sockets_left_by_a_dead_server():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT on `port`
    server.close()
    client.close()
    assert probes.port_free("127.0.0.1", port)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/ready":
            body, ctype, code = json.dumps({"status": "ok"}).encode(), "application/json", 200
        elif self.path == "/text":
            body, ctype, code = b"fired up", "text/plain", 200
        else:
            body, ctype, code = b'{"detail": "Not Found"}', "application/json", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_get_json_decodes_json_and_reports_other_bodies(http_server):
    assert probes.http_get_json(f"{http_server}/ready", 2.0) == (200, {"status": "ok"}, None)
    status, body, error = probes.http_get_json(f"{http_server}/text", 2.0)
    assert (status, body, error) == (200, None, None)
    status, body, error = probes.http_get_json(f"{http_server}/missing", 2.0)
    assert status == 404 and body == {"detail": "Not Found"}


def test_http_get_json_never_raises_on_refused_or_silent_servers(free_port, monkeypatch):
    status, body, error = probes.http_get_json(f"http://127.0.0.1:{free_port}/ready", 1.0)
    assert status is None and body is None and error == "connection refused"

    silent = socket.socket()  # accepts connections (kernel backlog) but never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/server_info"
        status, body, error = probes.http_get_json(url, 0.3)
        assert status is None and body is None and "timed out" in error
    finally:
        silent.close()


def test_http_get_json_ignores_proxy_environment(http_server, monkeypatch):
    # A proxy meant for the internet must not intercept probes of a local server (hang catalogue).
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert probes.http_get_json(f"{http_server}/ready", 2.0).status == 200


_TREE_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    titles = sys.argv[1:]
    child = "import setproctitle, sys, time; setproctitle.setproctitle(sys.argv[1]); time.sleep(120)"
    procs = [subprocess.Popen([sys.executable, "-c", child, t]) for t in titles]
    time.sleep(120)
    """
)

_TITLES = ["sglang::scheduler_TP0", "sglang::scheduler_TP1", "sglang::scheduler_TP2", "sglang::detokenizer"]


@pytest.fixture
def fake_rank_tree():
    """A real process with children titled like SGLang's ranks (setproctitle), killed by pid after."""
    marker = f"probe-test-{uuid.uuid4().hex}"
    env = dict(os.environ, EAGLE3_PROBE_TEST=marker)
    parent = subprocess.Popen([sys.executable, "-c", _TREE_SCRIPT, *_TITLES], env=env, start_new_session=True)
    create_time = psutil.Process(parent.pid).create_time()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            titles = {p.title for p in probes.process_tree(parent.pid, create_time)}
            if set(_TITLES) <= titles:
                break
            time.sleep(0.05)
        yield parent, create_time, marker
    finally:
        parent.kill()
        parent.wait()
        for proc in probes.processes_with_env("EAGLE3_PROBE_TEST", marker):  # the orphaned children
            proc.kill()


def test_process_tree_finds_ranks_by_title_and_identity(fake_rank_tree):
    parent, create_time, _ = fake_rank_tree
    tree = probes.process_tree(parent.pid, create_time)
    assert tree[0].pid == parent.pid and tree[0].role == "main"
    by_title = {p.title: p for p in tree[1:]}
    assert set(_TITLES) <= set(by_title)
    assert [by_title[f"sglang::scheduler_TP{i}"].rank for i in range(3)] == [0, 1, 2]
    assert by_title["sglang::detokenizer"].role == "detokenizer"
    assert by_title["sglang::detokenizer"].rank is None
    for info in tree:
        assert info.rss_bytes and info.rss_bytes > 0
        assert info.num_threads and info.num_threads >= 1
    assert len(tree[0].children) == len(_TITLES)
    # The first reading of a process cannot know its CPU%; a measured one can.
    measured = probes.process_tree(parent.pid, create_time, cpu_interval_s=0.1)
    assert all(p.cpu_percent is not None for p in measured)


def test_a_pid_with_another_create_time_is_another_process(fake_rank_tree):
    parent, create_time, _ = fake_rank_tree
    assert probes.process_alive(parent.pid, create_time)
    assert not probes.process_alive(parent.pid, create_time - 5.0)
    assert probes.process_tree(parent.pid, create_time + 5.0) == []
    assert not probes.kill_identity(parent.pid, create_time - 5.0, signal.SIGKILL)
    assert parent.poll() is None  # the wrong identity was not signalled


def test_orphaned_ranks_are_found_by_their_process_group(fake_rank_tree):
    # setproctitle wipes /proc/PID/environ, so retitled ranks are found by group, not by environment.
    parent, create_time, _ = fake_rank_tree
    children = {p.pid for p in probes.process_tree(parent.pid, create_time)[1:]}
    parent.kill()
    parent.wait()
    assert probes.group_is_ours(parent.pid, create_time)  # its pid stays reserved while the group lives
    found = probes.processes_in_group(parent.pid, create_time)
    assert {p.pid for p in found} == children
    for proc in found:
        proc.kill()
    _wait_until_gone([(p.pid, p.create_time()) for p in found])
    assert probes.processes_in_group(parent.pid, create_time) == []


def _wait_until_gone(identities, timeout_s=10.0):
    """Wait for killed orphans: their zombies are reaped by init, not by us (a zombie counts as gone)."""
    deadline = time.monotonic() + timeout_s
    while any(probes.process_alive(*i) for i in identities) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [i for i in identities if probes.process_alive(*i)]


_DAEMON_SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    # A grandchild that leaves the process group (as a daemon would) and keeps our environment.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def test_processes_with_env_finds_strays_that_left_the_group():
    marker = f"probe-test-{uuid.uuid4().hex}"
    env = dict(os.environ, EAGLE3_PROBE_TEST=marker)
    parent = subprocess.Popen(
        [sys.executable, "-c", _DAEMON_SCRIPT], env=env, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        stray_pid = int(parent.stdout.readline())
        stray_ct = psutil.Process(stray_pid).create_time()
        parent.kill()
        parent.wait()
        assert stray_pid not in {p.pid for p in probes.processes_in_group(parent.pid, 0.0)}
        found = probes.processes_with_env("EAGLE3_PROBE_TEST", marker)
        assert [p.pid for p in found] == [stray_pid]
    finally:
        parent.kill()
        parent.wait()
        for proc in probes.processes_with_env("EAGLE3_PROBE_TEST", marker):
            proc.kill()
    _wait_until_gone([(stray_pid, stray_ct)])


def test_dead_child_zombie_counts_as_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    create_time = psutil.Process(child.pid).create_time()
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not probes.process_alive(child.pid, create_time)
    child.wait()
