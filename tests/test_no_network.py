"""No network traffic the user did not ask for (issue 22 item 19): validating a profile never resolves a
typed host name (the profile editor validates on every key), and the emulator refuses request bodies over
its cap with 413, chunked ones too, without reading them into memory.
"""
from __future__ import annotations

import ipaddress
import json
import select
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _extract_support import wait_for

from sessions.emulator.http import MAX_BODY_BYTES
from sessions.profiles import LaunchProfile, ServerSection, validate_profile
from sessions.profiles.validation import is_local_name

# --- validation resolves nothing --------------------------------------------------------------------------

_RESOLVERS = ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo", "getfqdn")


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return True
    except ValueError:
        return host == ""


@pytest.fixture
def resolver_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every name resolution made while the test runs: the resolver functions of `socket`, and bind() and
    connect() given a name (C code resolves that name itself, without calling socket.getaddrinfo)."""
    calls: list[tuple[str, Any]] = []
    for name in _RESOLVERS:
        real = getattr(socket, name)

        def record(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls.append((_name, args[0] if args else None))
            return _real(*args, **kwargs)

        monkeypatch.setattr(socket, name, record)

    class RecordingSocket(socket.socket):
        def _check(self, what: str, address: Any) -> None:
            if isinstance(address, tuple) and address and isinstance(address[0], str) \
                    and not _is_literal(address[0]):
                calls.append((what, address[0]))

        def bind(self, address: Any) -> None:
            self._check("bind", address)
            super().bind(address)

        def connect(self, address: Any) -> None:
            self._check("connect", address)
            super().connect(address)

        def connect_ex(self, address: Any) -> int:
            self._check("connect_ex", address)
            return super().connect_ex(address)

    monkeypatch.setattr(socket, "socket", RecordingSocket)
    return calls


def _profile(model_dir: Path, host: str, port: int) -> LaunchProfile:
    return LaunchProfile(name="t", server=ServerSection(python=sys.executable, model_path=str(model_dir),
                                                         host=host, port=port))


@pytest.mark.parametrize("host", ["example.invalid", "evil.example.com", "a", "xn--bcher-kva.example",
                                  "metadata.google.internal", "localhost.example.invalid", "10.0.0.1.nip.io"])
def test_validation_of_a_typed_host_name_makes_no_resolver_call(model_dir_for_hosts: Path, free_port: int,
                                                                 host: str, resolver_calls) -> None:
    """Before: ``bind((host, 0))`` and the port probes resolved whatever was typed (DNS from every key)."""
    problems = validate_profile(_profile(model_dir_for_hosts, host, free_port))
    assert resolver_calls == [], resolver_calls
    (problem,) = [p for p in problems if p.field == "server.host"]
    assert problem.severity == "warning" and "not looked up" in problem.message and host in problem.message
    assert not [p for p in problems if p.field == "server.port"]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "0.0.0.0", "localhost", socket.gethostname()])
def test_addresses_and_this_machines_own_names_are_still_checked(model_dir_for_hosts: Path, host: str,
                                                                 resolver_calls) -> None:
    holder = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    holder.bind((host if ":" in host else "127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        problems = validate_profile(_profile(model_dir_for_hosts, host, port))
    finally:
        holder.close()
    assert is_local_name(host)
    assert not [p for p in problems if p.field == "server.host" and "not looked up" in p.message]
    if host in ("127.0.0.1", "::1", "0.0.0.0"):
        assert resolver_calls == [] and [p for p in problems if p.field == "server.port"], problems


@pytest.fixture
def model_dir_for_hosts(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    return folder


# --- the emulator caps request bodies ------------------------------------------------------------------------


def _post(port: int, head: bytes, chunks: Iterator[bytes]) -> bytes:
    """Send ``head`` then ``chunks`` until the server answers (a proper client stops sending once an early
    answer is readable), then read the answer to the end."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        sock.sendall(head)
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + _length(answer):
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
        return answer
    finally:
        sock.close()


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _endless(size: int) -> Iterator[bytes]:
    block = b"1," * (size // 2)
    sent = 0
    while sent <= 4 * MAX_BODY_BYTES:  # a bound for the test itself: the server must answer long before
        yield block
        sent += len(block)


@pytest.fixture
def emulator_port(make_emulator_profile, launched) -> int:
    profile = make_emulator_profile("bodycap", tp=1)
    session = launched.launch(profile)
    wait_for(lambda: session.status().state == "ready", "emulator ready", 180)
    launched.remember(session)
    return profile.server.port


def test_the_emulator_answers_413_past_its_body_cap_chunked_or_not(emulator_port: int) -> None:
    """Before: a chunked body of any size was read whole into memory."""
    port = emulator_port
    chunked_head = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")
    chunks = (f"{len(b):x}\r\n".encode() + b + b"\r\n" for b in _endless(1 << 20))
    answer = _post(port, chunked_head, chunks)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"over" in answer and str(MAX_BODY_BYTES).encode() in answer

    claimed = MAX_BODY_BYTES + 1
    head = (f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {claimed}\r\n\r\n").encode()
    answer = _post(port, head, iter([b"{"]))
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]

    bad = _post(port, b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", iter([]))
    assert bad.startswith(b"HTTP/1.1 400 "), bad[:200]

    # Within the cap the server still serves (the cap refused the requests above, not the server).
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 2}}).encode()
    ok = _post(port, b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body, iter([]))
    assert ok.startswith(b"HTTP/1.1 200 "), ok[:300]


def test_a_body_within_the_cap_sent_in_chunks_is_read_whole(emulator_port: int) -> None:
    body = json.dumps({"text": "hello " * 1000, "sampling_params": {"max_new_tokens": 1}}).encode()
    parts = [body[i:i + 777] for i in range(0, len(body), 777)]
    encoded = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
    answer = _post(emulator_port, b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + encoded, iter([]))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
