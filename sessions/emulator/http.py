"""The HTTP front of the emulated server: SGLang's endpoints and response shapes (sglang-facts §2).

Stdlib ``ThreadingHTTPServer`` standing in for uvicorn: bound only once every rank is loaded, access log
lines in uvicorn's format on stdout, ``--api-key`` checked like SGLang's middleware (``Authorization:
Bearer <key>``; ``/health*`` and ``/metrics`` are exempt).

Endpoints: ``GET /health`` ``/health_generate`` (503 until warmup is done; otherwise a 1-token
generation), ``GET /ready``, ``GET /model_info`` (``/get_model_info``: deprecated alias),
``GET /server_info`` (``/get_server_info``), ``GET /v1/models``, ``POST|PUT /generate``,
``POST /v1/chat/completions`` (openai_chat.py), ``GET|POST /flush_cache``, ``POST /abort_request``, ``POST /freeze_gc``, ``GET /metrics`` (with
``--enable-metrics``).  ``/generate`` with ``"stream": true`` answers in SGLang's SSE framing, one chunk per
scheduler forward.
Request bodies over `MAX_BODY_BYTES` (64 MiB; chunked ones too) are answered 413 and never read (uvicorn has no
such cap: this one keeps a stand-in that any local process can reach from being made to hold any size).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sessions.emulator.backend import RequestError
from sessions.emulator.console import Console
from sessions.emulator.openai_chat import (
    ChatError,
    ChatTemplate,
    chat_response,
    generate_request,
    parse_chat_request,
    refusal,
    stream_chunks,
)
from sessions.emulator.tokenizer_manager import ContractError, TokenizerManager, split_generate_request

# Request bodies past this are refused with 413 (Content-Length at once, a chunked body as soon as it passes
# it), never read into memory.  uvicorn sets no such limit; a stand-in that any local process can reach
# must not be made to hold an unbounded body.  A /generate of one 128k-token prompt is about 1 MB of JSON.
MAX_BODY_BYTES = 64 << 20
_MAX_CHUNK_LINE = 1024


class BodyTooLarge(Exception):
    """A request body over the server's cap (answered 413)."""


class BadBody(Exception):
    """A request body whose framing is broken (a chunk size that is not hex; answered 400)."""
# path -> the methods SGLang's FastAPI app accepts there
_ROUTES = {
    "/health": ("GET", "HEAD"),
    "/health_generate": ("GET", "HEAD"),
    "/ready": ("GET", "HEAD"),
    "/model_info": ("GET",),
    "/get_model_info": ("GET",),
    "/server_info": ("GET",),
    "/get_server_info": ("GET",),
    "/v1/models": ("GET",),
    "/v1/chat/completions": ("POST",),
    "/generate": ("POST", "PUT"),
    "/flush_cache": ("GET", "POST"),
    "/abort_request": ("POST",),
    "/freeze_gc": ("POST",),
    "/metrics": ("GET",),
}


class EmulatorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # uvicorn sets SO_REUSEADDR too
    request_queue_size = 128
    max_body_bytes = MAX_BODY_BYTES

    def __init__(self, host: str, port: int, manager: TokenizerManager, console: Console) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.manager = manager
        self.console = console
        self.chat_template = ChatTemplate(manager.args, manager.model)
        super().__init__((host, port), _Handler, bind_and_activate=False)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would resolve socket.getfqdn(host): a DNS round trip we do not need.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def bind(self) -> None:
        """Bind and listen; OSError worded as asyncio does (``[Errno 98] error while attempting to bind``)."""
        try:
            self.server_bind()
            self.server_activate()
        except OSError as exc:
            self.server_close()
            host, port = self.server_address[:2]
            raise OSError(
                exc.errno,
                f"error while attempting to bind on address ({host!r}, {port}): "
                f"{(exc.strerror or str(exc)).lower()}",
            ) from None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    server: EmulatorHTTPServer

    # -- plumbing -------------------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        # uvicorn sets TCP_NODELAY on every connection: without it the first SSE chunk waits for the
        # client's delayed ACK of the headers (Nagle), adding tens of ms to TTFT.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the access log is written in uvicorn's format by _finish

    def _finish(self, status: int) -> None:
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        self.server.console.access(client, self.requestline, status)

    def _send(self, status: int, body: bytes, content_type: str, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        if close:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._finish(status)

    def _json(self, status: int, obj: Any, compact: bool = False) -> None:
        body = _compact(obj) if compact else json.dumps(obj).encode()
        self._send(status, body, "application/json")

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    def _empty(self, status: int) -> None:
        self._send(status, b"", "text/plain; charset=utf-8")

    def _read_body(self) -> bytes:
        """The request body, at most ``server.max_body_bytes`` (`BodyTooLarge` past it, chunked or not)."""
        cap = self.server.max_body_bytes
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            parts, size = [], 0
            while True:
                line = self.rfile.readline(_MAX_CHUNK_LINE)
                try:
                    length = int(line.split(b";")[0].strip() or b"0", 16)
                except ValueError:
                    raise BadBody(f"bad chunk size line {line[:40]!r}") from None
                if length < 0:
                    raise BadBody(f"bad chunk size line {line[:40]!r}")
                if length == 0:
                    self.rfile.readline(_MAX_CHUNK_LINE)
                    break
                size += length
                if size > cap:
                    raise BodyTooLarge(f"request body over {cap} bytes (chunked)")
                parts.append(self.rfile.read(length))
                self.rfile.readline(_MAX_CHUNK_LINE)
            return b"".join(parts)
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            raise BadBody(f"bad content-length {self.headers.get('content-length')!r}") from None
        if length > cap:
            raise BodyTooLarge(f"request body of {length} bytes is over {cap} bytes")
        return self.rfile.read(length) if length > 0 else b""

    def _authorized(self, path: str) -> bool:
        key = self.server.manager.args.get("api_key")
        if not key or path.startswith(("/health", "/metrics")):
            return True
        return self.headers.get("authorization", "") == f"Bearer {key}"

    # -- routing --------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def _route(self, method: str) -> None:
        path = urlsplit(self.path).path
        try:
            allowed = _ROUTES.get(path)
            if allowed is None:
                self._json(404, {"detail": "Not Found"})
                return
            if method not in allowed:
                self._json(405, {"detail": "Method Not Allowed"})
                return
            if not self._authorized(path):
                self._json(401, {"error": "Unauthorized"})
                return
            getattr(self, "_" + path.strip("/").replace("/", "_"))()
        except BodyTooLarge as exc:
            # The rest of the body is never read: answer and close (uvicorn closes after an error it raised).
            self._send(413, json.dumps({"detail": f"Request Entity Too Large: {exc}"}).encode(), "application/json",
                       close=True)
        except BadBody as exc:
            self._send(400, json.dumps({"detail": f"Bad Request: {exc}"}).encode(), "application/json", close=True)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - one bad request must not print a traceback into the log
            self.server.console.log(
                f"Error handling {self.command} {path}: {type(exc).__name__}: {exc}", logging.ERROR
            )
            with contextlib.suppress(OSError):
                self._json(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})

    # -- endpoints ------------------------------------------------------------------------------------

    def _health(self) -> None:
        self._empty(self.server.manager.health())

    _health_generate = _health

    def _ready(self) -> None:
        self._empty(200 if self.server.manager.is_ready() else 503)

    def _model_info(self) -> None:
        self._json(200, self.server.manager.model_info())

    def _get_model_info(self) -> None:
        self.server.console.log(
            "The endpoint /get_model_info is deprecated and will be removed in a future "
            "version. Please use /model_info instead.",
            logging.WARNING,
        )
        self._model_info()

    def _server_info(self) -> None:
        self._json(200, self.server.manager.server_info())

    def _get_server_info(self) -> None:
        self.server.console.log(
            "The endpoint /get_server_info is deprecated and will be removed in a future "
            "version. Please use /server_info instead.",
            logging.WARNING,
        )
        self._server_info()

    def _v1_models(self) -> None:
        self._json(200, self.server.manager.models_list())

    def _flush_cache(self) -> None:
        self._read_body()
        raw = parse_qs(urlsplit(self.path).query).get("timeout", ["0"])[-1]
        try:
            timeout = float(raw)
            problem = None if timeout >= 0 else "greater_than_equal"
        except ValueError:
            timeout, problem = 0.0, "float_parsing"
        if problem:  # FastAPI's Query(0.0, ge=0.0) answers 422
            self._json(422, {"detail": [{"type": problem, "loc": ["query", "timeout"], "input": raw}]})
            return
        status, text = self.server.manager.flush_cache(timeout)
        self._text(status, text)

    def _abort_request(self) -> None:
        raw = self._read_body()
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        rid = body.get("rid") if isinstance(body, dict) else None
        if isinstance(body, dict) and body.get("abort_all") is True:
            self.server.manager.abort("", abort_all=True)
        elif isinstance(rid, str) and rid:
            self.server.manager.abort(rid)
        self._empty(200)

    def _freeze_gc(self) -> None:
        self._read_body()
        self._empty(200)

    def _metrics(self) -> None:
        metrics = self.server.manager.metrics
        if metrics is None:  # SGLang mounts /metrics only with --enable-metrics
            self._json(404, {"detail": "Not Found"})
            return
        self._send(200, metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")

    def _generate(self) -> None:
        manager = self.server.manager
        try:
            raw = self._read_body()
            try:
                body = json.loads(raw or b"null")
            except json.JSONDecodeError as exc:
                raise ContractError(
                    f"the request body is not valid JSON: {exc.msg} (line {exc.lineno})"
                ) from None
            requests, batch = split_generate_request(body)
            if body.get("stream"):
                self._stream(requests, batch)
                return
            responses = [manager.generate(request) for request in requests]
        except ContractError as exc:
            self._json(400, {"error": str(exc)})
            return
        except RequestError as exc:
            self._json(exc.status, {"error": {"message": str(exc)}})
            return
        self._json(200, responses if batch else responses[0], compact=True)

    def _v1_chat_completions(self) -> None:
        """OpenAI chat (openai_chat.py): the request is checked and the prompt rendered before any byte is
        sent, so every refusal is an HTTP status with SGLang's top-level ``ErrorResponse``."""
        manager = self.server.manager
        parser = manager.args.get("reasoning_parser")
        stream = None
        try:
            raw = self._read_body()
            media = self.headers.get("content-type", "").lower().split(";", 1)[0].strip()
            if media != "application/json":  # http_server.py:695-708
                raise ChatError("Unsupported Media Type: Only 'application/json' is allowed", "Bad Request")
            try:
                body = json.loads(raw or b"null")
            except json.JSONDecodeError as exc:
                raise ChatError(f"JSON decode error: {exc.msg} (line {exc.lineno})", "Bad Request") from None
            request = parse_chat_request(body)
            generate = generate_request(request, self.server.chat_template, manager.args, manager.model)
            stream = manager.open_stream(generate)
            if not request.stream:
                response: dict[str, Any] = {}
                while not stream.finished:
                    response = stream.next_response() or response
                self._json(200, chat_response(request, response, parser), compact=True)
                return
            # serving_chat.py:2422-2427 kick-starts the generator so that a refusal is still an HTTP error:
            first = stream.next_response()
        except ChatError as exc:
            if stream is not None:
                stream.close()
            self._json(exc.status, exc.body(), compact=True)
            return
        except RequestError as exc:
            self._json(refusal(exc).status, refusal(exc).body(), compact=True)
            return
        self._stream_chat(request, stream, first, parser)

    def _stream_chat(self, request: Any, stream: Any, first: dict[str, Any] | None, parser: str | None) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def responses() -> Any:
            if first is not None:
                yield first
            while not stream.finished:
                response = stream.next_response()
                if response is None:
                    break
                yield response

        try:
            try:
                for chunk in stream_chunks(request, responses(), parser):
                    self._sse(chunk)
            except RequestError as exc:
                self._sse({"error": ChatError(str(exc)).body()})
            self._write_chunk(b"data: [DONE]\n\n")
            self._write_chunk(b"")
            self._finish(200)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            if not stream.finished:
                self.server.manager.abort(stream.rid)
                stream.close()
            self.server.console.log(
                f"[http_server] Client disconnected: {self.client_address[0]}:{self.client_address[1]}"
            )

    def _stream(self, requests: list[dict[str, Any]], batch: bool) -> None:
        """SSE as SGLang sends it (http_server.py:956-981): ``data: <compact json>\n\n`` per chunk, then
        ``data: [DONE]\n\n``; a refusal after the headers is one error chunk.  Chunked transfer encoding
        keeps the connection reusable, as uvicorn's does."""
        manager = self.server.manager
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        streams = []
        try:
            try:
                streams = [manager.open_stream(request) for request in requests]
                for index, stream in enumerate(streams):
                    # A batch's sub-requests are sent one after the other (SGLang interleaves them); each
                    # chunk carries its "index".
                    while not stream.finished:
                        response = stream.next_response()
                        if response is None:
                            break
                        if batch:
                            response = {**response, "index": index}
                        self._sse(response)
            except RequestError as exc:
                code = exc.status or 400
                self._sse({"error": {"message": str(exc), "type": "invalid_request_error", "code": code,
                                     "retryable": False}})
            self._write_chunk(b"data: [DONE]\n\n")
            self._write_chunk(b"")
            self._finish(200)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            for stream in streams:
                if not stream.finished:
                    manager.abort(stream.rid)
                    stream.close()
            self.server.console.log(
                f"[http_server] Client disconnected: {self.client_address[0]}:{self.client_address[1]}"
            )

    def _sse(self, obj: Any) -> None:
        self._write_chunk(b"data: " + _compact(obj) + b"\n\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _compact(obj: Any) -> bytes:
    """orjson's output as SGLang sends it: compact, insertion order kept."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
