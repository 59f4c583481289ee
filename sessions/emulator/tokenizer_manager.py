"""The main process's serving state (SGLang's TokenizerManager): status, requests in flight, round trips.

* ``status``: ``Starting`` until warmup is done, then ``Up``; ``UnHealthy`` after a failed ``/health``
  (sglang-facts §1.6).  ``gracefully_exit`` is set by SIGTERM; from then on ``/health`` and ``/ready``
  answer 503 while the requests in flight drain.
* ``/generate`` bodies are checked against the API contract (wrong types -> 400 ``{"error": "..."}``),
  batches are split into single requests, each gets a rid (uuid4 hex by default; a duplicate of one in
  flight -> 400), and goes to the schedulers; TP0's backend answers.
* ``loop_started`` is set by the first request: SGLang installs its SIGTERM and running-phase SIGQUIT
  handlers only once its event loop runs (sglang-facts §6, §7).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeGuard

from sessions.emulator.args import SGLANG_VERSION, context_len
from sessions.emulator.backend import RequestError
from sessions.emulator.console import Console
from sessions.emulator.metrics import ServingMetrics
from sessions.emulator.model_config import ModelConfig
from sessions.emulator.scheduler_client import SchedulerClient


class ServerStatus(str, Enum):
    STARTING = "Starting"
    UP = "Up"
    UNHEALTHY = "UnHealthy"


class ContractError(ValueError):
    """The request body does not match SGLang's /generate contract (400 ``{"error": message}``)."""


def split_generate_request(body: Any) -> tuple[list[dict[str, Any]], bool]:
    """One SGLang /generate body -> (single requests, was it a batch)."""
    if not isinstance(body, dict):
        raise ContractError("the request body must be a JSON object")
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is None and input_ids is None:
        raise ContractError("Either text, input_ids or input_embeds should be provided.")
    if text is not None and input_ids is not None:
        raise ContractError("Either text or input_ids should be provided, not both.")
    prompts: list[tuple[str, str | list[int]]]  # ("text", str) or ("input_ids", ids), one per request
    if text is not None:
        if isinstance(text, str):
            prompts, batch = [("text", text)], False
        elif isinstance(text, list) and all(isinstance(t, str) for t in text):
            prompts, batch = [("text", t) for t in text], True
        else:
            raise ContractError("text must be a string or a list of strings")
    else:
        if _is_int_list(input_ids):
            prompts, batch = [("input_ids", list(input_ids))], False
        elif isinstance(input_ids, list) and input_ids and all(_is_int_list(x) for x in input_ids):
            prompts, batch = [("input_ids", list(x)) for x in input_ids], True
        else:
            raise ContractError("input_ids must be a list of integers or a list of lists of integers")
    n = len(prompts)
    rids = _per_item(body.get("rid"), n, batch, "rid", lambda v: isinstance(v, str))
    params = _per_item(
        body.get("sampling_params"), n, batch, "sampling_params", lambda v: isinstance(v, dict)
    )
    hidden = _per_item(
        body.get("return_hidden_states"), n, batch, "return_hidden_states", lambda v: isinstance(v, bool)
    )
    if "stream" in body and not isinstance(body["stream"], bool):
        raise ContractError("stream must be a boolean")
    requests = []
    for i, (key, prompt) in enumerate(prompts):
        request = {
            k: v
            for k, v in body.items()
            if k not in ("text", "input_ids", "rid", "sampling_params", "return_hidden_states")
        }
        request[key] = prompt
        request["rid"] = rids[i]
        request["sampling_params"] = dict(params[i] or {})
        request["return_hidden_states"] = bool(hidden[i])
        requests.append(request)
    return requests, batch


def _is_int_list(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def _per_item(value: Any, n: int, batch: bool, name: str, ok: Callable[[Any], bool]) -> list[Any]:
    if value is None:
        return [None] * n
    if batch and isinstance(value, list):
        if len(value) != n or not all(v is None or ok(v) for v in value):
            raise ContractError(f"{name} must be a list of {n} values matching the batch")
        return list(value)
    if not ok(value):
        kind = {"rid": "a string", "sampling_params": "an object", "return_hidden_states": "a boolean"}[name]
        raise ContractError(f"{name} must be {kind}, got {value!r}")
    if batch and name == "rid":
        raise ContractError("rid must be a list with one id per prompt for a batch request")
    return [value] * n


class RequestStream:
    """One request's output on the main process: cumulative responses, coalesced as SGLang does.

    ``next_response()`` blocks for the next chunk, then takes every chunk already waiting and returns only
    the latest state (cumulative ``text``/``output_ids``; tokenizer_manager.py:1977-1994).  The first
    response sent gets ``response_sent_to_client_ts``; the final one ``e2e_latency``.  A refusal raises
    `RequestError`.
    """

    def __init__(self, manager: TokenizerManager, call: Any, rid: str, started: float, streaming: bool) -> None:
        self.manager = manager
        self.call = call
        self.rid = rid
        self.started = started
        self.streaming = streaming
        self.finished = False
        self.output_ids: list[int] = []
        self._sent_any = False
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self._closed = False

    def next_response(self) -> dict[str, Any] | None:
        if self.finished:
            return None
        event = self.call.get()
        latest = None
        while event is not None:
            kind, payload = event
            if kind == "reply":
                if "error" in payload:
                    self.close()
                    raise RequestError(payload["error"], payload.get("status", 400))
            else:
                latest = self._take(payload)
                if self.finished:
                    break
            if latest is not None and not self.streaming and not self.finished:
                latest = None  # a non-streaming request waits for its final response
            event = self.call.get_nowait()
            if event is None and latest is None and not self.finished:
                event = self.call.get()
        return latest

    def _take(self, chunk: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        metrics = self.manager.metrics
        new = chunk["ids"]
        if chunk.get("all_ids") is not None:
            self.output_ids = list(chunk["all_ids"])
        else:
            self.output_ids.extend(new)
        if new:
            if self._first_token_at is None:
                self._first_token_at = now
                if metrics is not None:
                    metrics.on_first_token(self.streaming, now - self.started)
            elif metrics is not None and self._last_token_at is not None:
                metrics.on_tokens(now - self._last_token_at, len(new))
            self._last_token_at = now
        meta = dict(chunk["meta"])
        response: dict[str, Any] = {}
        if chunk["text"] is not None:
            response["text"] = chunk["text"]
        response["output_ids"] = list(self.output_ids)
        response["meta_info"] = meta
        if not self._sent_any and not chunk.get("before_output"):
            meta["response_sent_to_client_ts"] = time.time()
            self._sent_any = True
        if chunk["final"]:
            self.finished = True
            e2e = now - self.started
            meta["e2e_latency"] = e2e
            if chunk.get("before_output"):
                meta["completion_tokens"] = 0
            meta.update(chunk.get("spec") or {})  # speculative decoding's keys come after e2e_latency
            if metrics is not None:
                decode_s = now - (self._first_token_at or now)
                metrics.on_finish(self.streaming, int(meta.get("prompt_tokens", 0)), len(self.output_ids),
                                  e2e, decode_s, int(meta.get("spec_verify_ct", 0)))
            self.close()
        return response

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.call.close()
            self.manager._forget(self.rid)


class TokenizerManager:
    """Serving state shared by the HTTP threads, the warmup thread and the main thread."""

    def __init__(
        self,
        args: dict[str, Any],
        model: ModelConfig,
        client: SchedulerClient,
        console: Console,
        launch_command: list[str],
        ready_info: dict[int, dict[str, Any]],
        started_at: float,
    ) -> None:
        self.args = args
        self.model = model
        self.client = client
        self.console = console
        self.launch_command = launch_command
        self.ready_info = ready_info
        self.started_at = started_at
        self.status = ServerStatus.STARTING
        self.gracefully_exit = False
        self.loop_started = threading.Event()
        self._in_flight: dict[str, float] = {}
        self._lock = threading.Lock()
        self.metrics: ServingMetrics | None = None
        if args.get("enable_metrics"):
            self.metrics = ServingMetrics(args["served_model_name"])
            client.on_metrics = self.metrics.on_scheduler
        self.health_timeout_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.health_generates = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1") not in (
            "0",
            "false",
        )

    # -- status ---------------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        return self.status is ServerStatus.UP and not self.gracefully_exit

    def in_flight(self) -> list[str]:
        with self._lock:
            return list(self._in_flight)

    # -- requests -------------------------------------------------------------------------------------

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request, answered whole (non-streaming); RequestError for what SGLang refuses."""
        stream = self.open_stream(request)
        try:
            while True:
                response = stream.next_response()
                if response is None or stream.finished:
                    return response or {}
        finally:
            stream.close()

    def open_stream(self, request: dict[str, Any]) -> RequestStream:
        """Queue one request with the schedulers; its output comes through the returned stream."""
        is_warmup = self.status is ServerStatus.STARTING  # only the warmup request comes before "Up"
        if self.gracefully_exit:
            raise RequestError("The server is shutting down and does not accept new requests.", 503)
        started = time.monotonic()
        rid = request.get("rid") or uuid.uuid4().hex
        request = dict(request, rid=rid)
        with self._lock:
            if rid in self._in_flight:
                raise RequestError(f"Duplicate request ID detected: {rid}")
            self._in_flight[rid] = started
        self.loop_started.set()
        try:
            call = self.client.stream("generate", request, is_warmup)
        except BaseException:
            self._forget(rid)
            raise
        return RequestStream(self, call, rid, started, bool(request.get("stream")))

    def _forget(self, rid: str) -> None:
        with self._lock:
            self._in_flight.pop(rid, None)

    def abort(self, rid: str, abort_all: bool = False) -> None:
        """/abort_request, or a streaming client that went away.  As ``TokenizerManager.abort_request``
        (tokenizer_manager.py:2241-2253): a rid that is not in flight is ignored here, one that is goes to
        the scheduler (which matches by prefix); ``abort_all`` aborts every request."""
        if not abort_all and rid not in self.in_flight():
            return
        self.client.call("abort_request", "" if abort_all else rid, reply_from=(0,), timeout_s=10.0)

    def health(self) -> int:
        """The /health status code (sglang-facts §2): 503 unless Up; by default a 1-token generation."""
        if self.status is not ServerStatus.UP or self.gracefully_exit:
            return 503
        if not self.health_generates:
            return 200
        tic = time.time()
        request = {
            "rid": f"HEALTH_CHECK_{uuid.uuid4().hex}",
            "input_ids": [0],
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        }
        done = threading.Event()

        def run() -> None:
            try:
                self.generate(request)
                done.set()
            except RequestError:
                pass

        threading.Thread(target=run, name="health-check", daemon=True).start()
        if done.wait(self.health_timeout_s):
            return 200
        self.console.log(
            f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{self.health_timeout_s:g} seconds. tic start time: {tic:.2f}. "
            f"last_heartbeat time: {time.time():.2f}"
        )
        self.status = ServerStatus.UNHEALTHY
        return 503

    def flush_cache(self, timeout_s: float = 0.0) -> tuple[int, str]:
        """``/flush_cache[?timeout=T]`` as in 0.5.23 (http_server.py:1025-1040, flush_wrapper.py): with no
        timeout a busy server refuses at once; with one the flush waits up to T s for the server to go idle
        (bench_serving's ``--flush-cache`` sends 60), then refuses with "Timed out waiting for idle state."."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while self.in_flight() and timeout_s > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        pending = self.in_flight()
        if pending:
            if timeout_s > 0:
                self.console.log("Deferred flush_cache timed out while waiting for idle state.", logging.WARNING)
                return 400, "Timed out waiting for idle state."
            self.console.log(
                f"Cache not flushed because there are pending requests. #queue-req: 0, "
                f"#running-req: {len(pending)}",
                logging.WARNING,
            )
            return 400, "Flush cache failed.\n"
        self.client.call("flush_cache")
        return 200, (
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n"
        )

    # -- info -----------------------------------------------------------------------------------------

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args["model_path"],
            "served_model_name": self.args["served_model_name"],
            "tokenizer_path": self.args["tokenizer_path"],
            "is_generation": not self.args["is_embedding"],
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": self.args["load_format"],
            "reasoning_parser": self.args["reasoning_parser"],
            "tool_call_parser": self.args["tool_call_parser"],
            "disaggregation_mode": "null",
            "has_image_understanding": "vision_config" in self.model.raw,
            "has_audio_understanding": "audio_config" in self.model.raw,
            "model_type": self.model.model_type,
            "architectures": self.model.raw.get("architectures") or [self.model.architecture],
        }

    def server_info(self) -> dict[str, Any]:
        """All resolved args + scheduler info; round-trips to every scheduler with no timeout."""
        replies = self.client.call("internal_state") or {}
        tp0 = self.ready_info.get(0, {})
        info: dict[str, Any] = dict(self.args)
        info.update(
            {
                "launch_command": " ".join(self.launch_command),
                "status": "ready" if self.status is ServerStatus.UP else self.status.value.lower(),
                "max_total_num_tokens": tp0.get("max_total_num_tokens"),
                "max_req_input_len": context_len(self.args, self.model) - 1,
                "startup_time": self.started_at,
                "hicache_object_layout": None,
                "kv_events": None,
                "internal_states": [replies[r] for r in sorted(replies) if r in self.client.leader_ranks]
                or list(replies.values()),
                "version": SGLANG_VERSION,
                "frontend": "python",
            }
        )
        return info

    def models_list(self) -> dict[str, Any]:
        name = self.args["served_model_name"]
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(self.started_at),
                    "owned_by": "sglang",
                    "root": name,
                    "max_model_len": context_len(self.args, self.model),
                }
            ],
        }
