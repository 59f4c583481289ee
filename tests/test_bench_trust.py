"""The bench never trusts a server's answers (issue 22, item 9): a real HTTP server on a real port streams
hostile answers, and the real bench client must turn each into a failed request with its reason, never a
figure and never a traceback.  Bench sizes are checked before anything is allocated (item 10)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sessions.bench.client import send_request
from sessions.bench.metrics import failure_notes
from sessions.bench.prompts import Prompt, random_id_prompts
from sessions.bench.runner import BenchError, BenchPlan, _clients, run_bench

WANTED = 40  # the warm-up asks for min(40, 32): that request is answered honestly


def _chunk(tokens: Any, **meta: Any) -> bytes:
    return b"data: " + json.dumps({"text": "x" * 3, "output_ids": [1],
                                   "meta_info": {"completion_tokens": tokens, "prompt_tokens": 4, **meta}}).encode()


HONEST = [_chunk(n) for n in range(1, WANTED + 1)]
# name -> (the lines /generate streams, a word the failure must name)
ATTACKS: dict[str, tuple[list[bytes], str]] = {
    "a jump to 3M completion tokens": ([_chunk(1), _chunk(3_000_000)], "completion_tokens 3000000 is outside 0..40"),
    "falling counts": ([_chunk(5), _chunk(2)], "completion_tokens fell from 5 to 2"),
    "a count as a string": ([_chunk("7")], "completion_tokens is a string"),
    "a count of NaN": ([b'data: {"text":"x","meta_info":{"completion_tokens":NaN}}'], "not a count"),
    "a count of 1e300": ([_chunk(1e300)], "outside"),
    "a boolean count": ([_chunk(True)], "not a count"),
    "a negative prompt_tokens": ([_chunk(1, prompt_tokens=-5)], "prompt_tokens -5 is outside"),
    "a chunk that is a list": ([b"data: [1, 2, 3]"], "a streamed chunk is an array, not an object"),
    "meta_info a string": ([b'data: {"text":"x","meta_info":"lots"}'], "meta_info is not an object"),
    "deeply nested JSON": ([b"data: " + b"[" * 100_000 + b"]" * 100_000], "not JSON"),
    "an accept length of inf": ([_chunk(1, spec_accept_length=float("inf"))], "spec_accept_length"),
    "an accept length past max_new_tokens": ([_chunk(1, spec_accept_length=1e9)], "spec_accept_length"),
    # a 400-digit integer is an int to json.loads; float() of it raised OverflowError
    "an accept length of 400 digits": ([_chunk(1, spec_accept_length=10**400)], "spec_accept_length is"),
    "more correct drafts than proposed": ([_chunk(1, spec_num_proposed_drafts=3, spec_num_correct_drafts=9)],
                                          "spec_num_correct_drafts 9 is outside 0..3"),
    "not JSON at all": ([b"data: {\"text\": tru"], "not JSON"),
}
LONG_LINE_BYTES = 40 << 20  # five times the line cap, with no newline


class Hostile(ThreadingHTTPServer):
    daemon_threads = True
    lines: list[bytes] = HONEST
    server_info: bytes = b'{"version": "0.5.23", "internal_states": [{}]}'
    long_line = False
    sent_bytes = 0


class Handler(BaseHTTPRequestHandler):
    server: Hostile

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            self._send(b'{"object":"list","data":[{"id":"m","max_model_len":4096}]}')
        elif self.path.startswith("/server_info"):
            self._send(self.server.server_info)
        else:
            self._send(b"{}", 404)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        if self.path.startswith("/flush_cache"):
            self._send(b"Cache flushed.\n")
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        wanted = body.get("sampling_params", {}).get("max_new_tokens")
        warm_up = wanted != WANTED
        try:
            if self.server.long_line and not warm_up:
                piece = b"x" * (1 << 16)
                self.wfile.write(b"data: {\"text\": \"")
                while self.server.sent_bytes < LONG_LINE_BYTES:
                    self.wfile.write(piece)
                    self.server.sent_bytes += len(piece)
                return
            for line in ([_chunk(n) for n in range(1, wanted + 1)] if warm_up else self.server.lines):
                self.wfile.write(line + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    server = Hostile(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _base(server: Hostile) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _prompt() -> Prompt:
    return random_id_prompts(1, 4, WANTED, vocab_size=64, seed=1)[0]


def test_the_honest_stream_is_a_success(hostile):
    client = _clients(1)[0]
    try:
        out = send_request(client, _base(hostile), _prompt())
    finally:
        client.close()
    assert out.success and out.output_len == WANTED and len(out.itl) == WANTED - 1, out.error


@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_untrusted_answer_is_a_failed_request_with_its_reason(hostile, name):
    hostile.lines, reason = ATTACKS[name]
    client = _clients(1)[0]
    try:
        out = send_request(client, _base(hostile), _prompt())
    finally:
        client.close()
    assert not out.success, name
    assert reason in out.error, (name, out.error)
    assert out.output_len == 0 and out.itl == [] and out.accept_length is None


def test_an_endless_line_is_refused_at_the_cap_without_holding_it(hostile):
    import tracemalloc

    hostile.long_line = True
    client = _clients(1)[0]
    tracemalloc.start()
    try:
        out = send_request(client, _base(hostile), _prompt())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        client.close()
    assert not out.success and "streamed line longer than" in out.error, out.error
    assert peak < 3 * (8 << 20), f"the client held {peak} bytes of one line"


def test_a_run_with_untrusted_answers_gives_no_figure_and_says_why(hostile):
    hostile.lines = ATTACKS["a jump to 3M completion tokens"][0]
    plan = BenchPlan(_base(hostile), tuple(random_id_prompts(4, 4, WANTED, 64, 1)), (2,), num_prompts=4,
                     settle_s=0.0)
    run = run_bench(plan)["runs"][0]
    assert (run["completed"], run["failed"], run["output_throughput"]) == (0, 4, 0.0)
    assert "completion_tokens 3000000" in failure_notes([run])[0]


@pytest.mark.parametrize("info", [b"[1, 2, 3]", b'"a string"', b"null", b"42", b'{"internal_states": 7}',
                                  b'{"internal_states": [{"avg_spec_accept_length": "NaN"}]}', b"{not json",
                                  b'{"internal_states": ["x"]}',
                                  b'{"internal_states": [{"avg_spec_accept_length": 1' + b"0" * 400 + b"}]}"])
def test_a_server_info_that_is_not_an_object_is_a_failed_request_with_a_reason(hostile, info):
    hostile.server_info = info
    plan = BenchPlan(_base(hostile), tuple(random_id_prompts(2, 4, WANTED, 64, 1)), (1,), num_prompts=2,
                     settle_s=0.0)
    run = run_bench(plan)["runs"][0]
    assert run["completed"] == 2  # the requests themselves were fine
    notes = failure_notes([run])
    assert notes and "failed request GET /server_info:" in notes[0], run


# -- sizes within reason (item 10) -------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "words"), [
    ({"input_len": 10**9}, "--input-len"),
    ({"num_prompts": 10**9}, "--num-prompts"),
    ({"concurrency": (10**9,)}, "--concurrency"),
    ({"output_len": 10**9}, "--output-len"),
    ({"input_len": 10**6, "num_prompts": 10**5}, "memory"),
])
def test_sizes_past_the_limits_are_refused_before_anything_is_allocated(changes, words):
    import tracemalloc

    from sessions.bench.session_bench import BenchOptions

    tracemalloc.start()
    try:
        with pytest.raises(BenchError) as caught:
            BenchOptions(**changes).check()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert words in str(caught.value), str(caught.value)
    assert peak < 1 << 20


def test_sizes_are_checked_against_the_servers_context_length(hostile):
    from sessions.bench.session_bench import check_context

    limits = {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]}
    check_context(limits, input_len=4000, output_len=96, what="tiny")  # exactly the context: fine
    with pytest.raises(BenchError) as caught:
        check_context(limits, input_len=4000, output_len=97, what="tiny")
    assert "4097" in str(caught.value) and "context length of 4096" in str(caught.value)
    assert "--input-len" in str(caught.value) and "--output-len" in str(caught.value)
