"""TP0's continuous batching: admit requests, run prefill and decode forwards, stream, and log the stats lines.

This stands in for SGLang's scheduler loop (``event_loop_normal`` with ``get_next_batch_to_run``):

* Requests wait in a FCFS queue.  Between forwards the scheduler admits as many as fit (at most
  ``max_running_requests`` running, at most ``--chunked-prefill-size`` new tokens per prefill forward, at
  least one request) and runs one **prefill** forward, which samples each admitted request's first token.
  A prompt longer than the chunk size takes several prefill forwards (one ``Prefill batch`` line each).
* Otherwise the running batch takes one **decode** step: one token per request.  With EAGLE/EAGLE3
  speculative decoding the step is one draft + verify cycle instead (`spec_decode.SpecDecoding`): each
  request gets its drawn accept length of the target's own tokens, the cycle costs what that model says,
  ``Decode batch`` carries ``accept len: X.XX, accept rate: Y.YY, `` after the token usage
  (metrics_reporter.py:1005-1009), the final response carries the ``spec_*`` meta_info keys, and the gauges
  ``spec_accept_length``/``spec_accept_rate`` take each Decode line's interval figures.
* Each forward lasts what `DecodeCostModel` says; the backend's real work (the tiny model's forward) runs
  inside it and the step lasts the longer of the two.
* After each forward, streaming requests get a chunk under SGLang's rule (output_streamer.py:444-478): a
  finished request, interval 1, ``unsent >= stream_interval``, or the first output.  Non-streaming
  requests get only their final response.
* ``Prefill batch`` is logged for every prefill forward; ``Decode batch`` every ``--decode-log-interval``
  decode steps, counted across the whole server, never reset between requests (metrics_reporter.py).

Messages to the main process: ``("chunks", rank, [(msg_id, chunk), ...])`` once per forward, where a chunk is
``{"ids": new ids, "text": full text or None, "meta": meta_info, "final": bool}``; a request refused at
admission gets ``("reply", msg_id, rank, {"error", "status"})``; gauges go out as ``("metrics", rank, {...})``
at every stats line.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessions.emulator.backend import RequestError
from sessions.emulator.console import Console
from sessions.emulator.cost_model import DecodeCostModel
from sessions.emulator.spec_decode import SpecDecoding

# The meta_info keys every chunk carries, in SGLang's insertion order (tokenizer_manager.py:2507-2617).
_META_ORDER = (
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "cached_tokens_details",
)

# A forward that starts within this long of the previous one's modelled end continues its clock.
_CHAIN_SLACK_S = 0.005


@dataclass
class Req:
    """One request in the scheduler (SGLang's ``Req``)."""

    msg_id: int
    rid: str
    steps: Generator[int, None, dict[str, Any]]
    prompt_len: int
    cached: int
    stream: bool
    stream_interval: int
    prefill_left: int  # uncached prompt tokens not yet run through a prefill forward
    max_new: int
    output_ids: list[int] = field(default_factory=list)
    sent_offset: int = 0
    final: dict[str, Any] | None = None
    aborted: bool = False
    # speculative decoding: verify steps, accepted drafts, and how many steps accepted 0, 1, 2... drafts
    spec_verify_ct: int = 0
    spec_correct_drafts: int = 0
    spec_histogram: list[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + len(self.output_ids)


@dataclass
class _Stats:
    """What the stats lines and the gauges report (metrics_reporter.py)."""

    forward_ct_decode: int = 0
    decode_tokens_since_log: int = 0
    last_decode_tic: float = field(default_factory=time.monotonic)
    last_prefill_tic: float = field(default_factory=time.monotonic)
    last_gen_throughput: float = 0.0
    realtime_decode_tokens: int = 0
    realtime_prefill_tokens: int = 0
    realtime_cached_tokens: int = 0
    # speculative decoding, over the current Decode-log interval and (added at each tick) since start/flush
    spec_accept_tokens: int = 0  # sum of accept lengths (accepted drafts + bonus) per request-step
    spec_reqs: int = 0  # sum of batch sizes
    last_accept_length: float = 0.0
    last_accept_rate: float = 0.0
    total_accept_tokens: int = 0
    total_reqs: int = 0


class Batcher:
    """Continuous batching on TP0 (see the module docstring)."""

    def __init__(
        self,
        backend: Any,
        args: dict[str, Any],
        cost: DecodeCostModel,
        console: Console,
        kv_capacity: int,
        max_running: int,
        send: Callable[..., None],
        rank: int = 0,
        spec: SpecDecoding | None = None,
    ) -> None:
        self.backend = backend
        self.args = args
        self.dp_rank: int | None = None  # get_parallel().dp_rank: set by a scheduler under a DP controller
        self.cost = cost
        self.console = console
        self.kv_capacity = max(1, kv_capacity)
        self.max_running = max(1, max_running)
        self.send = send
        self.rank = rank
        self.spec = spec
        self.waiting: collections.deque[Req] = collections.deque()
        self.prefilling: Req | None = None  # a chunked prompt part-way through its prefill forwards
        self.running: list[Req] = []
        self.stats = _Stats()
        self.chunk_size = args.get("chunked_prefill_size") or -1
        self.decode_log_interval = max(1, int(args.get("decode_log_interval") or 40))
        self.stream_interval_default = max(1, int(args.get("stream_interval") or 1))
        self.decode_graph = args.get("cuda_graph_backend_decode", "full") != "disabled"
        self.decode_graph_max_bs = int(args.get("cuda_graph_max_bs_decode") or 0)
        self.prefill_graph = args.get("cuda_graph_backend_prefill", "breakable") != "disabled"
        self.prefill_graph_max = max(args.get("cuda_graph_bs_prefill") or [0])
        self.graph_label = "cuda graph"
        self._last_deadline: float | None = None

    # -- requests -------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling)

    def add(self, msg_id: int, request: dict[str, Any]) -> None:
        """Queue one request; a request the backend refuses is answered at once."""
        try:
            steps = self.backend.generate_steps(request)
        except RequestError as exc:
            self.send("reply", msg_id, self.rank, {"error": str(exc), "status": exc.status})
            return
        params = request.get("sampling_params") or {}
        interval = params.get("stream_interval") or self.stream_interval_default
        prompt_len = int(getattr(self.backend, "last_prompt_len", 0))
        cached = int(getattr(self.backend, "last_cached", 0))
        self.waiting.append(
            Req(
                msg_id=msg_id,
                rid=str(request.get("rid")),
                steps=steps,
                prompt_len=prompt_len,
                cached=cached,
                stream=bool(request.get("stream")),
                stream_interval=max(1, int(interval)),
                prefill_left=max(1, prompt_len - cached),
                max_new=int(params.get("max_new_tokens", 128)),
            )
        )

    def abort(self, rid: str) -> None:
        """/abort_request, or a streaming client that went away (scheduler.py:5675-5812, rids match by
        prefix).  A queued request, or a prompt part-way through its chunked prefill, is answered at once
        with finish_reason abort "Abort in waiting queue"; a running one finishes after one more decode
        forward with the tokens it has ("Aborted"), so a client that still waits always gets its answer."""
        queued = [r for r in self.waiting if r.rid.startswith(rid)]
        if self.prefilling is not None and self.prefilling.rid.startswith(rid):
            queued.append(self.prefilling)
            self.prefilling = None
        self.waiting = collections.deque(r for r in self.waiting if not r.rid.startswith(rid))
        for req in queued:
            self._finish_aborted(req, {"type": "abort", "message": "Abort in waiting queue"})
            assert req.final is not None
            req.final["before_output"] = True  # its final object is built apart (tokenizer_manager.py:3596)
        self._emit(queued)
        for req in self.running:
            if req.rid.startswith(rid):
                req.aborted = True

    def _finish_aborted(self, req: Req, reason: dict[str, Any]) -> None:
        req.steps.close()
        text = self.backend.detokenize(req.output_ids) if req.output_ids else ""
        req.final = {"text": text or "", "output_ids": list(req.output_ids), "meta_info": {"finish_reason": reason}}

    def flush_stats(self) -> None:
        """/flush_cache resets the decode-log counter (scheduler.py:5528), not the tic."""
        self.stats.forward_ct_decode = 0
        self.stats.decode_tokens_since_log = 0
        self.stats.spec_accept_tokens = self.stats.spec_reqs = 0
        self.stats.total_accept_tokens = self.stats.total_reqs = 0

    @property
    def avg_spec_accept_length(self) -> float | None:
        """Lifetime accept length as ``/server_info`` reports it: totals added at Decode-log ticks only,
        absent (None) before the first tick and after a flush (internal_state.py:119-125)."""
        stats = self.stats
        if self.spec is None or stats.total_reqs == 0:
            return None
        return stats.total_accept_tokens / stats.total_reqs

    # -- one forward ----------------------------------------------------------------------------------

    def step(self) -> None:
        """Run the next forward: a prefill when requests wait and there is room, else a decode step."""
        if self.prefilling is not None or (self.waiting and len(self.running) < self.max_running):
            self._prefill()
        elif self.running:
            self._decode()

    def _admit(self) -> tuple[list[Req], int]:
        """The prefill batch: (requests, new tokens in this forward)."""
        if self.prefilling is not None:
            req = self.prefilling
            take = req.prefill_left if self.chunk_size <= 0 else min(self.chunk_size, req.prefill_left)
            return [req], take
        batch: list[Req] = []
        tokens = 0
        budget = self.chunk_size if self.chunk_size > 0 else None
        while self.waiting and len(self.running) + len(batch) < self.max_running:
            req = self.waiting[0]
            if batch and budget is not None and tokens + req.prefill_left > budget:
                break
            self.waiting.popleft()
            batch.append(req)
            take = req.prefill_left if budget is None else min(req.prefill_left, budget - tokens)
            tokens += take
            if budget is not None and take < req.prefill_left:
                break  # this prompt continues in the next prefill forward (chunked prefill)
        return batch, tokens

    def _step_start(self) -> float:
        """When this forward began.  Back-to-back forwards chain on the modelled clock, so that the
        emulator's own bookkeeping between two steps (streaming, pipes) is not added to every step."""
        now = time.monotonic()
        last = self._last_deadline
        if last is not None and 0.0 <= now - last < _CHAIN_SLACK_S:
            return last
        return now

    def _prefill(self) -> None:
        began = self._step_start()
        batch, new_tokens = self._admit()
        chunked = self.prefilling
        done: list[Req] = []
        for req in batch:
            take = min(req.prefill_left, new_tokens) if req is batch[-1] else req.prefill_left
            req.prefill_left -= take
            if req.prefill_left > 0:
                self.prefilling = req
            else:
                if req is chunked:
                    self.prefilling = None
                done.append(req)
        for req in done:
            self._advance(req)  # the prefill samples each finished prompt's first token (real forward)
        self._sleep_until(began + self.cost.prefill_s(new_tokens))
        self.stats.realtime_prefill_tokens += new_tokens
        self._log_prefill(batch if chunked is None else [], new_tokens, batch)
        self.running.extend(r for r in done if r.final is None)
        self._emit(done)

    def _decode(self) -> None:
        began = self._step_start()
        batch = list(self.running)
        seconds, accept_lens = self._plan_step(len(batch))
        emitted = 0
        for req, accepted in zip(batch, accept_lens, strict=True):
            before = len(req.output_ids)
            for _ in range(accepted):  # the target's own tokens; spec overshoot stops at max_new / a stop
                if req.final is not None:
                    break
                self._advance(req)
            emitted += len(req.output_ids) - before
            if req.aborted and req.final is None:  # FINISH_ABORT() set as to_finish, taken after this forward
                self._finish_aborted(req, {"type": "abort", "message": "Aborted", "status_code": None,
                                           "err_type": None})
            if self.spec is not None:
                req.spec_verify_ct += 1
                req.spec_correct_drafts += accepted - 1
                while len(req.spec_histogram) < accepted:
                    req.spec_histogram.append(0)
                req.spec_histogram[accepted - 1] += 1
        self._sleep_until(began + seconds)
        stats = self.stats
        stats.forward_ct_decode += 1
        # SGLang counts accepted drafts + one bonus token per request (batch_result_processor.py:982-993)
        stats.decode_tokens_since_log += sum(accept_lens)
        stats.realtime_decode_tokens += emitted
        if self.spec is not None:
            stats.spec_accept_tokens += sum(accept_lens)
            stats.spec_reqs += len(batch)
        if stats.forward_ct_decode % self.decode_log_interval == 0:
            self._log_decode(batch)
        self.running = [r for r in self.running if r.final is None]
        self._emit(batch)

    def _plan_step(self, batch_size: int) -> tuple[float, list[int]]:
        """(seconds, accept length per request) of the next decode step: a plain step yields one token per
        request; with speculative decoding it is one draft + verify cycle (`SpecDecoding`)."""
        plain = self.cost.decode_step_s(batch_size)
        if self.spec is None:
            return plain, [1] * batch_size
        return plain * self.spec.cycle_cost, [self.spec.draw() for _ in range(batch_size)]

    def _advance(self, req: Req) -> None:
        try:
            req.output_ids.append(next(req.steps))
        except StopIteration as stop:
            req.final = stop.value
            return
        try:  # a request whose last token just came: collect its final response now
            if len(req.output_ids) >= req.max_new:
                next(req.steps)
        except StopIteration as stop:
            req.final = stop.value

    def _sleep_until(self, deadline: float) -> None:
        self._last_deadline = deadline
        left = deadline - time.monotonic()
        if left > 0:
            time.sleep(left)

    # -- output ---------------------------------------------------------------------------------------

    def _emit(self, reqs: list[Req]) -> None:
        out = []
        for req in reqs:
            finished = req.final is not None
            unsent = len(req.output_ids) - req.sent_offset
            if not finished:
                if not req.stream or unsent <= 0:
                    continue
                if not (req.stream_interval == 1 or unsent >= req.stream_interval or req.sent_offset == 0):
                    continue
            out.append((req.msg_id, self._chunk(req, finished)))
            req.sent_offset = len(req.output_ids)
        if out:
            self.send("chunks", self.rank, out)

    def _chunk(self, req: Req, finished: bool) -> dict[str, Any]:
        final = req.final or {}
        final_meta = final.get("meta_info") or {}
        ids = final.get("output_ids", req.output_ids) if finished else req.output_ids
        values = {
            "id": req.rid,
            "finish_reason": final_meta.get("finish_reason") if finished else None,
            "prompt_tokens": req.prompt_len,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(ids),
            "cached_tokens": req.cached,
            "cached_tokens_details": None,
        }
        if finished and final.get("before_output"):
            # aborted before any output: only id, finish_reason, weight_version (then the main process's
            # e2e_latency and completion_tokens), no prompt_tokens (tokenizer_manager.py:3596-3634)
            meta = {key: values[key] for key in ("id", "finish_reason", "weight_version")}
            return {"ids": [], "all_ids": [], "text": final.get("text", ""), "meta": meta, "final": True,
                    "before_output": True}
        meta = {key: values[key] for key in _META_ORDER}
        if finished and "hidden_states" in final_meta:
            meta["hidden_states"] = final_meta["hidden_states"]
        meta["dp_rank"] = self.dp_rank
        if finished:
            text = final.get("text")
        else:
            text = self.backend.detokenize(ids)
            if text is not None:
                text = text.rstrip("\ufffd")  # an incomplete UTF-8 tail is held back (detokenizer_manager)
        new_ids = ids[req.sent_offset :]
        chunk = {"ids": new_ids, "all_ids": ids if finished else None, "text": text, "meta": meta,
                 "final": finished}
        if finished and self.spec is not None and req.spec_verify_ct > 0:
            chunk["spec"] = self._spec_meta(req, len(ids))
        return chunk

    def _spec_meta(self, req: Req, completion_tokens: int) -> dict[str, Any]:
        """The final response's ``spec_*`` keys, in SGLang's order (tokenizer_manager.py:3138-3208): the
        accept length divides by verify steps the completion tokens, the prefill's first token included."""
        assert self.spec is not None
        proposed = req.spec_verify_ct * max(1, self.spec.num_draft_tokens - 1)
        return {
            "spec_accept_rate": req.spec_correct_drafts / proposed,
            "spec_accept_length": completion_tokens / req.spec_verify_ct,
            "spec_num_correct_drafts": req.spec_correct_drafts,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": req.spec_verify_ct,
            "spec_correct_drafts_histogram": list(req.spec_histogram),
        }

    # -- stats lines ----------------------------------------------------------------------------------

    def _used_tokens(self, extra: Sequence[Req] = ()) -> int:
        reqs = {id(r): r for r in [*self.running, *extra]}
        return sum(r.seq_len for r in reqs.values())

    def _log_prefill(self, new_reqs: list[Req], new_tokens: int, batch: list[Req]) -> None:
        now = time.monotonic()
        stats = self.stats
        gap = max(now - stats.last_prefill_tic, 1e-9)
        stats.last_prefill_tic = now
        throughput = new_tokens / gap
        used = self._used_tokens(batch)
        cached = sum(r.cached for r in new_reqs)
        stats.realtime_cached_tokens += cached
        pending = sum(r.prompt_len for r in self.waiting) + (
            self.prefilling.prefill_left if self.prefilling is not None else 0
        )
        graph = self.prefill_graph and new_tokens <= self.prefill_graph_max
        self.console.log(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {new_tokens}, "
            f"#cached-token: {cached}, token usage: {min(used, self.kv_capacity) / self.kv_capacity:.2f}, "
            f"#running-req: {len(self.running)}, #queue-req: {len(self.waiting)}, "
            f"#pending-token: {pending}, {self.graph_label}: {graph}, "
            f"input throughput (token/s): {throughput:.2f}"
        )
        self._send_metrics(len(self.running), used)

    def _log_decode(self, batch: list[Req]) -> None:
        now = time.monotonic()
        stats = self.stats
        gap = max(now - stats.last_decode_tic, 1e-9)
        stats.last_gen_throughput = stats.decode_tokens_since_log / gap
        stats.last_decode_tic = now
        stats.decode_tokens_since_log = 0
        used = self._used_tokens()
        graph = self.decode_graph and len(batch) <= self.decode_graph_max_bs
        spec_part = ""
        if self.spec is not None:
            # metrics_reporter.py:973-982: accept len = sum(accepted drafts + 1) / sum(bs); accept rate =
            # sum(accepted drafts) / (sum(bs) * (num_draft_tokens - 1))
            reqs = max(1, stats.spec_reqs)
            stats.last_accept_length = stats.spec_accept_tokens / reqs
            correct = stats.spec_accept_tokens - stats.spec_reqs
            stats.last_accept_rate = correct / (reqs * max(1, self.spec.num_draft_tokens - 1))
            stats.total_accept_tokens += stats.spec_accept_tokens
            stats.total_reqs += stats.spec_reqs
            stats.spec_accept_tokens = stats.spec_reqs = 0
            spec_part = (f"accept len: {stats.last_accept_length:.2f}, "
                         f"accept rate: {stats.last_accept_rate:.2f}, ")
        self.console.log(
            f"Decode batch, #running-req: {len(batch)}, #token: {used}, "
            f"token usage: {min(used, self.kv_capacity) / self.kv_capacity:.2f}, {spec_part}"
            f"{self.graph_label}: {graph}, gen throughput (token/s): {stats.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting)}"
        )
        self._send_metrics(len(batch), used)

    def idle_metrics(self) -> None:
        """The idle refresh (metrics_reporter.py:1476-1531): no requests, no throughput."""
        self.stats.last_gen_throughput = 0.0
        self._send_metrics(0, 0)

    def _send_metrics(self, running: int, used: int) -> None:
        stats = self.stats
        self.send(
            "metrics",
            self.rank,
            {
                "num_running_reqs": running,
                "num_queue_reqs": len(self.waiting),
                "gen_throughput": stats.last_gen_throughput,
                "token_usage": round(min(used, self.kv_capacity) / self.kv_capacity, 2),
                "num_used_tokens": used,
                "kv_used_tokens": used,
                "kv_available_tokens": self.kv_capacity - min(used, self.kv_capacity),
                "kv_evictable_tokens": 0,
                "realtime_decode_tokens": stats.realtime_decode_tokens,
                "realtime_prefill_tokens": stats.realtime_prefill_tokens,
                "realtime_cached_tokens": stats.realtime_cached_tokens,
                "spec_accept_length": stats.last_accept_length,
                "spec_accept_rate": stats.last_accept_rate,
                "spec_num_steps": self.spec.num_steps if self.spec is not None else 0,
                "spec_num_draft_tokens": self.spec.num_draft_tokens if self.spec is not None else 0,
            },
        )
