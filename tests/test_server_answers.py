"""One bounded reader for every server answer (issue 22 item 8), against real local HTTP servers that
trickle, flood, and send NaN, +Inf, garbage and the wrong JSON types.

The reads run in a thread joined with a generous guard: the guard is there so that a reader that never
ends fails the test instead of hanging the suite; nothing asserts how long a read took.
"""
from __future__ import annotations

import ast
import http.server
import socket
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from sessions import probes, server_answers
from sessions.serving import SessionServing, fetch_metrics_reading, read_metrics

GUARD_S = 60.0  # far beyond any deadline below: only a reader that never ends reaches it


def finish(call: Callable[[], Any]) -> Any:
    """``call()`` in a thread; fails when it has not returned within the guard."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(GUARD_S)
    assert box, "the read did not end (no total deadline)"
    return box[0]


class RawServer:
    """A TCP server on 127.0.0.1 whose ``serve(conn)`` writes whatever bytes a test wants."""

    def __init__(self, serve: Callable[[socket.socket, threading.Event], None]) -> None:
        self.stop = threading.Event()
        self.sent = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self._serve = serve
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _loop(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)  # the request
            self._serve(conn, self.stop)
        except OSError:
            pass  # the reader hung up: what these servers wait for
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    made: list[RawServer] = []

    def make(serve: Callable[[socket.socket, threading.Event], None]) -> RawServer:
        made.append(RawServer(serve))
        return made[-1]

    yield make
    for server in made:
        server.close()


def trickle(data: bytes) -> Callable[[socket.socket, threading.Event], None]:
    """Send ``data`` then one byte every 0.5 s until the reader hangs up."""
    def serve(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)
        while not stop.wait(0.5):
            conn.sendall(b"x")
    return serve


@pytest.mark.parametrize("head", [b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\n"])
def test_a_trickle_ends_at_the_total_deadline(raw_server, head: bytes) -> None:
    """Before: httpx's read timeout restarts at every byte, so a byte per 0.5 s kept a probe reading for
    good (25 s and more in the attack).  The trickle here goes on until the reader hangs up."""
    server = raw_server(trickle(head))
    answer = finish(lambda: server_answers.fetch(f"{server.url}/metrics", deadline_s=1.0))
    assert answer.error is not None and "timed out after 1s with no complete answer" in answer.error
    assert answer.body == b""
    result = finish(lambda: probes.http_get_json(f"{server.url}/model_info", 1.0))
    assert result.json is None and "timed out after 1s" in result.error


def flood(claim: int | None) -> Callable[[socket.socket, threading.Event], None]:
    def serve(conn: socket.socket, stop: threading.Event) -> None:
        length = f"Content-Length: {claim}\r\n" if claim else "Connection: close\r\n"
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{length}\r\n".encode())
        block = b"sglang:num_running_reqs 1\n" * 40000  # ~1 MB
        for _ in range(400):  # 400 MB, unless the reader hangs up first
            if stop.is_set():
                return
            conn.sendall(block)
    return serve


@pytest.mark.parametrize("claim", [None, 400 << 20])
def test_a_flood_is_cut_at_the_cap_and_never_held(raw_server, claim: int | None) -> None:
    """Before: a 400 MB /metrics body took 1.6 GB.  Now the read stops past the cap, keeps nothing."""
    server = raw_server(flood(claim))
    cap = 1 << 20
    tracemalloc.start()
    try:
        answer = finish(lambda: server_answers.fetch(f"{server.url}/metrics", deadline_s=30.0, max_bytes=cap))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.status == 200 and answer.body == b""
    assert answer.error is not None and f"over the {cap}-byte cap" in answer.error
    assert peak < 4 * cap, f"the reader held {peak} bytes for a {cap}-byte cap"
    reading = finish(lambda: fetch_metrics_reading(server.url, 30.0))
    assert reading.values == {} and "cap" in (reading.error or "")


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, str, bytes]]] = {}

    def do_GET(self) -> None:
        code, ctype, body = self.routes.get(self.path, (404, "application/json", b'{"detail": "Not Found"}'))
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # /generate: the request body is read, then answered as a GET
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[Callable[[dict[str, tuple[int, str, bytes]]], str]]:
    servers = []

    def start(routes: dict[str, tuple[int, str, bytes]]) -> str:
        handler = type("H", (_Handler,), {"routes": routes})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


METRICS_OK = b"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
sglang:num_queue_reqs{model_name="m"} 1.0
sglang:gen_throughput{model_name="m"} 88.5
sglang:token_usage{model_name="m"} 0.25
"""


@pytest.mark.parametrize(("bad", "reason"), [
    (b"NaN", "not a finite number"), (b"+Inf", "not a finite number"), (b"-Inf", "not a finite number"),
    (b"-2", "below 0"), (b"1.5", "not a whole number"), (b"lots", "not a number"), (b"1e999", "not a finite"),
])
def test_metrics_with_a_bad_figure_show_it_as_unavailable_with_its_reason(answering, bad: bytes,
                                                                            reason: str) -> None:
    """Before: ``sglang:num_running_reqs NaN`` raised "cannot convert float NaN to integer" out of the
    session's status, which then showed ``unknown (!)``."""
    text = METRICS_OK.replace(b'{model_name="m"} 3.0', b'{model_name="m"} ' + bad)
    base = answering({"/metrics": (200, "text/plain; version=0.0.4", text)})
    serving = SessionServing()
    snap = serving.snapshot(base)  # what a session's status reads, through the real HTTP path
    assert snap is not None and snap.running_reqs is None
    assert snap.queue_reqs == 1 and snap.gen_throughput == 88.5 and snap.token_usage == 0.25
    unavailable = dict(snap.unavailable)
    assert reason in unavailable["running_reqs"] and "sglang:num_running_reqs" in unavailable["running_reqs"]
    assert snap.to_json()["unavailable"] == unavailable and snap.to_json()["running_reqs"] is None


def test_one_bad_rank_makes_the_summed_figure_unavailable_not_wrong() -> None:
    text = ('sglang:num_running_reqs{dp_rank="0"} 4\nsglang:num_running_reqs{dp_rank="1"} NaN\n'
            'sglang:num_queue_reqs{dp_rank="0"} 1\nsglang:num_queue_reqs{dp_rank="1"} 2\n')
    reading = read_metrics(text)
    assert reading.values == {"queue_reqs": 3.0} and "running_reqs" in reading.unavailable


@pytest.mark.parametrize(("body", "why"), [
    (b"[1, 2, 3]", "is an array, not an object"), (b'"ok"', "is a string, not an object"),
    (b"42", "is a number, not an object"), (b"null", "is null, not an object"),
    (b'{"max_total_num_tokens": NaN}', "not a finite number"), (b'{"x": Infinity}', "not a finite number"),
    (b'{"x": 1e999}', "not a finite number"), (b"<html>oops</html>", "is not JSON"),
    (b"[" * 100 + b"]" * 100, "nested deeper"), (b"[" * 100000 + b"]" * 100000, "nested deeper"),
    (b"", "is empty"), (b"\xff\xfe garbage", "is not JSON"),
])
def test_a_typed_json_answer_is_a_failure_with_a_reason(answering, body: bytes, why: str) -> None:
    """Before: a /server_info that is not an object raised AttributeError out of the bench."""
    base = answering({"/server_info": (200, "application/json", body)})
    result = finish(lambda: server_answers.get_json(f"{base}/server_info", deadline_s=5.0, expect=dict))
    assert result.status == 200 and result.json is None
    assert result.error is not None and why in result.error and "/server_info" in result.error


def test_a_good_answer_and_an_error_status_come_back_typed(answering) -> None:
    base = answering({"/model_info": (200, "application/json", b'{"model_path": "/m", "weight_version": "d"}'),
                      "/get_server_info": (500, "application/json", b'{"error": "boom"}')})
    assert server_answers.get_json(f"{base}/model_info") == (200, {"model_path": "/m", "weight_version": "d"}, None)
    assert server_answers.get_json(f"{base}/get_server_info") == (500, {"error": "boom"}, None)
    assert server_answers.get_json(f"{base}/nope").status == 404


@pytest.mark.parametrize("reply", [b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 abc\r\n\r\n", b"\x00\x01\x02\x03" * 100,
                                   b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                                   b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * 200000 + b"\r\n\r\n"])
def test_garbage_and_broken_answers_are_errors_not_tracebacks(raw_server, reply: bytes) -> None:
    def serve(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(reply)
    server = raw_server(serve)
    answer = finish(lambda: server_answers.fetch(f"{server.url}/ready", deadline_s=5.0))
    assert answer.error is not None and answer.body == b""
    assert probes.http_get_json(f"{server.url}/ready", 5.0).error is not None


def test_finite_number_table() -> None:
    ok = [(3, 3.0), ("4.0", 4.0), (0, 0.0), (" 2 ", 2.0)]
    for raw, value in ok:
        assert server_answers.finite_number(raw, "n", minimum=0, integer=True) == (value, None)
    # 10**400: json.loads makes a 400-digit integer an int, which float() refused with OverflowError
    for raw in [float("nan"), float("inf"), "NaN", "+Inf", "-1", "1.5", True, None, [1], {"a": 1}, "x", 10**400]:
        figure = server_answers.finite_number(raw, "n", minimum=0, integer=True)
        assert figure.value is None and figure.reason and figure.reason.startswith("n is ")


# --- one reader for the whole tree ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
_ANSWER_PATHS = ("/metrics", "/server_info", "/get_server_info", "/model_info", "/get_model_info", "/ready")
_HTTP_CLIENTS = {"httpx", "urllib.request", "http.client", "requests", "aiohttp"}
# Modules that still read one of these answers with their own client, each with who moves it over.
_NOT_YET = {
    "sessions/bench/runner.py": "bench: its /server_info read inside the duration (server_answers.get_json)",
}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _names_an_answer(node: ast.AST) -> bool:
    parts = node.values if isinstance(node, ast.JoinedStr) else [node]
    return any(isinstance(v, ast.Constant) and isinstance(v.value, str) and any(
        v.value.rstrip("/").endswith(p) or (p + "?") in v.value for p in _ANSWER_PATHS) for v in parts)


def _client_call_to_an_answer(node: ast.AST) -> bool:
    """``<client>.get(f"{base}/metrics")`` and the like: an HTTP client's own request for an answer."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"get", "post", "stream", "request", "urlopen", "build_request"}
            and any(_names_an_answer(arg) for arg in node.args[:2]))


def test_every_server_answer_is_read_by_the_one_reader() -> None:
    """A module that names one of SGLang's answer endpoints and opens its own HTTP client bypasses the
    deadline, the cap and the type checks of `sessions.server_answers`."""
    offenders = []
    for folder in ("sessions", "app", "widgets", "benches"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "sessions/server_answers.py" or rel.startswith("sessions/emulator/") or rel in _NOT_YET:
                continue  # the emulator serves these answers; it reads none
            tree = ast.parse(path.read_text(), rel)
            if not (_imports(tree) & _HTTP_CLIENTS):
                continue  # no client of its own: whatever it names, it reads through a reader
            named = {f"line {node.lineno}" for node in ast.walk(tree) if _client_call_to_an_answer(node)}
            if named:
                offenders.append(f"{rel}: {sorted(named)}")
    assert not offenders, "read these answers with sessions.server_answers: " + "; ".join(offenders)


def test_the_tree_check_sees_a_planted_client_read() -> None:
    planted = ast.parse('import httpx\ndef f(c, base):\n    return c.get(f"{base}/metrics").text\n')
    assert any(_client_call_to_an_answer(n) for n in ast.walk(planted))


# --- every answer's JSON is parsed by the one parser (adv22) ---------------------------------------------
# ``json.loads`` of an answer recurses into a 100,000-deep array (RecursionError out of a request) and
# takes NaN; ``server_answers.parse_json`` bounds the nesting and wants finite numbers.  The bench's
# streamed chunks are parsed by `sessions.bench.bounded`, which holds no client and catches both.


def _answer_json_parses(tree: ast.AST) -> list[int]:
    """Lines of ``json.loads(...)``/``json.load(...)``/``<response>.json()`` in a module with a client."""
    if not (_imports(tree) & (_HTTP_CLIENTS | {"h11"})):
        return []
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        fn = node.func
        if (isinstance(fn.value, ast.Name) and fn.value.id == "json" and fn.attr in {"load", "loads"}) or (
                fn.attr == "json" and not node.args and not node.keywords):
            lines.append(node.lineno)
    return lines


def test_every_answer_with_a_client_of_its_own_is_parsed_by_the_one_parser() -> None:
    offenders = []
    for folder in ("sessions", "app", "widgets"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "sessions/server_answers.py" or rel.startswith(("sessions/emulator/", "sessions/capture/plugin/")):
                continue
            lines = _answer_json_parses(ast.parse(path.read_text(), rel))
            if lines:
                offenders.append(f"{rel}: lines {lines}")
    assert not offenders, "parse server answers with sessions.server_answers.parse_json: " + "; ".join(offenders)


@pytest.mark.parametrize("source", ["import httpx\ndef f(r):\n    return r.json()\n",
                                    "import httpx, json\ndef f(raw):\n    return json.loads(raw)\n",
                                    "def f(raw):\n    import h11, json\n    return json.loads(raw)\n"])
def test_the_tree_check_sees_a_planted_answer_parse(source: str) -> None:
    assert _answer_json_parses(ast.parse(source))


def test_a_generate_answer_nested_deep_or_not_finite_is_a_failed_request_with_its_reason(answering) -> None:
    """adv22: the extraction client's /generate answer went to ``json.loads``: 100,000 nested arrays raised
    RecursionError out of ``post_generate`` (the sample failed with a traceback in job.log, uncounted)."""
    import asyncio

    from sessions.extraction.client import AttemptFailed, ExtractionClient

    for body, why in ((b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
                      (b'{"meta_info": {"prompt_tokens": 3, "e2e_latency": NaN}}', "not a finite number")):
        url = answering({"/generate": (200, "application/json", body)})

        async def one(url: str = url) -> str:
            client = ExtractionClient(url, concurrency=1)
            try:
                await client.post_generate("r1", [1, 2, 3])
            except AttemptFailed as exc:
                return exc.reason
            finally:
                await client.aclose()
            return "no failure"

        reason = asyncio.run(one())
        assert "/generate answer" in reason and why in reason, reason


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1/metrics", "http://h:99999/x", "http://h:port/x",
                                 "http://[not-an-ip]/x", "ftp://h/x", "http:///x"])
def test_a_url_that_urlsplit_refuses_is_an_error_not_a_raise(url: str) -> None:
    """adv22: ``fetch`` promises never to raise, but ``urlsplit("http://[::1")`` raised ValueError before its
    guard (a ``--server-url`` typo was a traceback out of ``extract verify``)."""
    from sessions.server_answers import fetch, get_json

    answer = fetch(url, deadline_s=1.0)
    assert answer.status is None and answer.error, answer
    assert get_json(url, deadline_s=1.0).error


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b'{"choices": [{"message": {"content": NaN}}]}'])
def test_a_regeneration_answer_nested_deep_or_not_finite_is_the_retried_error(body: bytes) -> None:
    """adv22: the regeneration runner's ``reply.json()`` raised RecursionError for a 100,000-deep answer,
    which its retry (``except (httpx.TransportError, ValueError)``) does not catch."""
    from sessions.regeneration.runner import answer_json

    with pytest.raises(ValueError, match="the answer"):
        answer_json(body)


@pytest.mark.parametrize("serve", ["trickle", "flood"])
def test_a_regeneration_turn_is_a_bounded_read(raw_server, tmp_path, serve: str) -> None:
    """adv22: the regeneration client read /v1/chat/completions with httpx (a timeout per read, no size
    cap), so a server sending a byte every 0.5 s or an endless body held a row for good.  A turn is now a
    read of the one bounded reader: the deadline or the cap fails the attempt, and the retries end it."""
    from sessions.regeneration.runner import RegenRun, RowFailed
    from sessions.regeneration.spec import RegenSpec

    server = raw_server(trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n") if serve == "trickle"
                        else flood(None))
    run = RegenRun.__new__(RegenRun)  # only what a turn reads: the spec and the model name
    run.spec = RegenSpec(name="t", dataset=tmp_path / "in.jsonl", output=tmp_path / "out.jsonl", max_tokens=16,
                         max_retries=1, retry_backoff_s=0.0, request_timeout_s=1.0)
    run.model = "m"

    def turn() -> Any:
        try:
            return run._turn(server.url, [{"role": "user", "content": "hi"}])
        except RowFailed as exc:
            return exc

    failed = finish(turn)
    assert isinstance(failed, RowFailed), failed
    why = str(failed)
    assert "after 2 attempts" in why
    assert ("timed out after 1s" in why) if serve == "trickle" else ("-byte cap" in why), why
