"""The emulator's model-backed ``/generate``: real forwards of a small model with SGLang's capture rules.

``ModelBackend(model_dir, server_flags).generate(request) -> response`` takes an SGLang ``/generate``
request dict and answers in SGLang's response shape (sglang-facts §2.1-2.2).  It runs the model with
transformers (CPU, or CUDA when available) and honours what matters for capture:

* ``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 [--return-aux-hidden-state-layer-ids]``
  with SGLang's layer convention for the model's family (``sessions.capture.layers``): the aux rows are
  HF ``hidden_states[p]`` for each physical point p, concatenated; ``last`` is the post-norm final state;
* chunked prefill: a prompt longer than ``--chunked-prefill-size`` runs as several extend forwards over
  a KV cache, each with its prefix length (sglang-facts §4.8);
* with ``EAGLE3_CAPTURE`` set, every extend chunk of a rid with the job's prefix goes to the SAME bounded
  background writer the plugin uses (``BackgroundWriter``, queue depth and fsync from the spec), with the
  same (rids, prefix lens, seq lens, aux, last, input_ids) arguments.  Like the plugin, a request returns
  once its tensors are handed over, not once they are on disk: the collector waits for the chunks
  (``sessions.extraction.collector.wait_for_dumps``).  A full queue blocks the forward (never drops), and
  a failed write leaves ``error.json`` for the collector;
* ``return_hidden_states: true`` answers in SGLang's layout: one 2-D list for the prefill (the LAST
  chunk's rows only, as SGLang's HTTP path drops middle chunks, §4.8), then one 1-D list per decode step;
  K·H wide with aux capture, else H (post-norm).  Without a server mode that allows it, the request is
  refused with SGLang's message (``tokenizer_manager.py:1394-1410``).

torch and transformers are imported lazily, so `capture_config` and `capture_active_line_for` work for a
config-only model dir too (the emulator can log the capture line without weights).
"""
from __future__ import annotations

import argparse
import atexit
import dataclasses
import inspect
import logging
import multiprocessing.util
import os
import threading
import time
import uuid
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sessions.capture.layers import LayerConvention, LayerRule, rule_for
from sessions.capture.plugin.eagle3_capture.spec import CaptureSpec, capture_active_line
from sessions.emulator.backend import RequestError, check_context_length
from sessions.emulator.model_config import load_model_config

DEFAULT_CHUNKED_PREFILL_SIZE = 8192  # SGLang picks a size per GPU when the flag is absent
EMULATOR_VERSION = "emulator"
_AUX_METHODS = ("EAGLE3", "DFLASH", "DSPARK")
_HIDDEN_NOT_CONFIGURED = (
    "The server is not configured to return hidden states. Please set `--return-hidden-states-mode last`, "
    "`--return-hidden-states-mode full`, or the legacy `--enable-return-hidden-states` flag."
)
_HIDDEN_EXCEEDS = (
    "The requested return_hidden_states mode exceeds the server maximum `{mode}`. Please launch with "
    "`--return-hidden-states-mode full` to allow return_hidden_states=True."
)


class ModelBackendError(RequestError):  # the emulator's HTTP layer answers RequestError with its status
    """A request SGLang would refuse: ``status`` (400) and SGLang's message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message, status)
        self.message = message


# -- server flags -----------------------------------------------------------------------------------------
_FLAG_NAMES = {
    "enable_return_aux_hidden_states": False,
    "speculative_algorithm": None,
    "speculative_draft_model_path": None,
    "return_aux_hidden_state_layer_ids": None,
    "chunked_prefill_size": None,
    "enable_return_hidden_states": False,
    "return_hidden_states_mode": None,
    "skip_tokenizer_init": False,
    "pp_size": 1,
    "aux_hidden_state_capture": None,  # set by a resolved args dict (speculative_algorithm is then None)
    "context_length": None,
}


def _flags_from_argv(argv: Sequence[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--enable-return-aux-hidden-states", action="store_true")
    parser.add_argument("--speculative-algorithm")
    parser.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    parser.add_argument("--return-aux-hidden-state-layer-ids", type=int, nargs="+")
    parser.add_argument("--chunked-prefill-size", type=int)
    parser.add_argument("--enable-return-hidden-states", action="store_true")
    parser.add_argument("--return-hidden-states-mode", choices=["last", "full"])
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    parser.add_argument("--pp-size", "--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--context-length", type=int)
    known, _ = parser.parse_known_args(list(argv))
    return vars(known)


def _normalize_flags(server_flags: Any) -> dict[str, Any]:
    """Server flags as a dict of SGLang field names; accepts argv, a mapping or an argparse Namespace."""
    if server_flags is None:
        raw: Mapping[str, Any] = {}
    elif isinstance(server_flags, (list, tuple)):
        raw = _flags_from_argv([str(a) for a in server_flags])
    elif isinstance(server_flags, Mapping):
        raw = {str(k).lstrip("-").replace("-", "_"): v for k, v in server_flags.items()}
    else:
        raw = vars(server_flags)
    out = {}
    for name, default in _FLAG_NAMES.items():
        value = raw.get(name, default)
        out[name] = default if value is None and default is not None else value
    return out


@dataclass(frozen=True)
class CaptureConfig:
    """What the server flags and the model say about hidden states."""

    aux_enabled: bool
    layer_ids: tuple[int, ...] | None  # --return-aux-hidden-state-layer-ids as given
    points: tuple[int, ...] | None  # layers_to_capture (physical) when aux_enabled
    num_layers: int
    hidden_states_mode: str | None  # None, "last" or "full"
    chunked_prefill_size: int  # -1: no chunking
    skip_tokenizer_init: bool


def capture_config(model_dir: str | os.PathLike, server_flags: Any) -> CaptureConfig:
    """Resolve the flags as SGLang 0.5.23 does; ValueError with SGLang's message when it would refuse
    (``arg_groups/validation_hook.py:697-754``, ``spec_aux_hidden_state.py:113-129``)."""
    from sessions.profiles import read_model_config

    flags = _normalize_flags(server_flags)
    shape = read_model_config(Path(model_dir))
    num_layers = int(shape.num_hidden_layers or 0)
    ids = flags["return_aux_hidden_state_layer_ids"]
    aux = bool(flags["enable_return_aux_hidden_states"])
    points = None
    if not aux:
        if ids is not None:
            raise ValueError("--return-aux-hidden-state-layer-ids requires --enable-return-aux-hidden-states.")
    else:
        method = (flags["speculative_algorithm"] or flags["aux_hidden_state_capture"] or "").upper()
        if method not in _AUX_METHODS:
            raise ValueError(
                "--enable-return-aux-hidden-states needs --speculative-algorithm EAGLE3, DFLASH or DSPARK to "
                f"name the capture convention, got {flags['speculative_algorithm']!r}.")
        if method != "EAGLE3":
            raise ValueError(f"the emulator implements the EAGLE3 capture convention only, not {method}")
        if flags["speculative_draft_model_path"] is not None:
            raise ValueError("--enable-return-aux-hidden-states captures without a draft; drop "
                             "--speculative-draft-model-path.")
        if int(flags["pp_size"] or 1) != 1:
            raise ValueError("--enable-return-aux-hidden-states only supports pp_size == 1: the capture hooks "
                             "only see the layers on the last pipeline rank.")
        if ids is not None:
            ids = [int(i) for i in ids]
            if not ids:
                raise ValueError("--return-aux-hidden-state-layer-ids must not be empty.")
            if any(i < 0 for i in ids):
                raise ValueError(f"--return-aux-hidden-state-layer-ids must be non-negative, got {ids}.")
            if len(set(ids)) != len(ids):
                raise ValueError(f"--return-aux-hidden-state-layer-ids must not repeat a layer, got {ids}.")
            out_of_range = [i for i in ids if i >= num_layers]
            if out_of_range:
                raise ValueError(f"--return-aux-hidden-state-layer-ids {out_of_range} out of range for a "
                                 f"target with {num_layers} layers.")
        rule = rule_for(shape.architecture) or LayerRule.PLUS_ONE
        points = tuple(LayerConvention(rule, num_layers).points_from_ids(ids))
        if any(p >= num_layers for p in points):
            # SGLang's first forward fails the same way (layers/logits_processor.py:920-951).
            raise ValueError(f"The model captured fewer aux hidden states than --return-aux-hidden-state-layer-ids "
                             f"names: capture points {list(points)} include a layer this model cannot capture.")
    mode = flags["return_hidden_states_mode"]
    if mode is None and (flags["enable_return_hidden_states"] or aux):
        mode = "full"  # arg_groups/serving_hook.py:712-724
    chunk = flags["chunked_prefill_size"]
    chunk = DEFAULT_CHUNKED_PREFILL_SIZE if chunk is None else int(chunk)
    return CaptureConfig(
        aux_enabled=aux,
        layer_ids=tuple(ids) if ids is not None else None,
        points=points,
        num_layers=num_layers,
        hidden_states_mode=mode,
        chunked_prefill_size=chunk if chunk > 0 else -1,
        skip_tokenizer_init=bool(flags["skip_tokenizer_init"]),
    )


def capture_active_line_for(model_dir: str | os.PathLike, server_flags: Any,
                            environ: Mapping[str, str] | None = None) -> str | None:
    """The plugin's ``eagle3-capture active: ...`` line for this launch, or None when capture is off.

    Needs only config.json, so the emulator can log it for a config-only model dir as well.
    """
    spec = CaptureSpec.from_environ(environ)
    if spec is None:
        return None
    config = capture_config(model_dir, server_flags)
    if not config.aux_enabled:
        return None
    return capture_active_line(config.points, spec)


# -- the backend ------------------------------------------------------------------------------------------
class ModelBackend:
    """A small real model behind the emulator's ``/generate`` (same method as ``FixedBackend``)."""

    def __init__(self, model_dir: str | os.PathLike, server_flags: Any = None,
                 environ: Mapping[str, str] | None = None, device: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model_dir = Path(model_dir)
        self.config = capture_config(self.model_dir, server_flags)
        context = _normalize_flags(server_flags)["context_length"]  # --context-length, else the model's
        self.context_len = int(context or load_model_config(str(self.model_dir)).context_len)
        self.spec = CaptureSpec.from_environ(environ)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # A forward of a model this small gains nothing from intra-op threads, and on a shared CPU
            # torch's one-thread-per-core pool oversubscribes it: one token then takes 100 ms instead of 5.
            torch.set_num_threads(1)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar in the emulated server log
        # transformers types PreTrainedModel.to through functools.wraps(nn.Module.to), which loses the bound
        # self: mypy then reads the device as the model argument.
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, local_files_only=True, dtype=dtype).to(self.device).eval()  # type: ignore[arg-type]
        self.hidden_size = int(self.model.config.hidden_size)
        self.tokenizer = None
        if not self.config.skip_tokenizer_init:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        eos = self.model.config.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.capture_log_line = (
            capture_active_line(self.config.points, self.spec)
            if self.spec is not None and self.config.aux_enabled else None
        )
        self._lock = threading.Lock()
        self._writer: Any = None  # the plugin's BackgroundWriter, made on the first dump
        if self.capture_log_line:
            # The plugin's line, logged once the model is loaded (the emulator routes logging into its
            # SGLang-format console, so it reads "[ts TP0] eagle3-capture active: ...").
            logging.getLogger("eagle3_capture").info("%s", self.capture_log_line)
        # transformers 5.x renames past_key_values to cache (deprecated name warns until 5.40).
        params = inspect.signature(self.model.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @property
    def layers_to_capture(self) -> list[int] | None:
        return list(self.config.points) if self.config.points is not None else None

    def set_eagle3_layers_to_capture(self, layers: Sequence[int] | None) -> None:
        """Called by the emulated ModelRunner with the layers it resolved (the same family rules)."""
        if layers is None or not self.config.aux_enabled or list(layers) == self.layers_to_capture:
            return
        if any(p < 0 or p >= self.config.num_layers for p in layers):
            raise ValueError(f"capture points {list(layers)} out of range for {self.config.num_layers} layers")
        self.config = dataclasses.replace(self.config, points=tuple(int(p) for p in layers))
        if self.spec is not None:
            self.capture_log_line = capture_active_line(self.config.points, self.spec)
            logging.getLogger("eagle3_capture").info("%s", self.capture_log_line)

    def flush(self) -> None:
        """Wait until every chunk handed to the background writer is on disk (or has failed)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Write what is queued, then stop the writer thread (idempotent)."""
        if self._writer is not None:
            self._writer.close()

    @property
    def writer(self) -> Any:
        """The plugin's ``BackgroundWriter`` for the spec's dir (made, and the dir checked, on first use)."""
        if self._writer is None:
            from sessions.capture.plugin.eagle3_capture.writer import BackgroundWriter, check_capture_dir

            spec = self.spec
            assert spec is not None, "no capture spec: nothing to write"
            check_capture_dir(spec.dir, create=True)  # refuse an unsafe dir in the request, as the plugin does
            self._writer = BackgroundWriter(spec.dir, queue_depth=spec.queue_depth, fsync=spec.fsync)
            # Queued chunks must reach the disk on a clean shutdown.  The emulator's ranks are
            # multiprocessing children, which exit through os._exit and skip atexit; multiprocessing runs
            # its own finalizers there (and atexit covers an in-process backend).
            multiprocessing.util.Finalize(None, self._writer.close, exitpriority=10)
            atexit.register(self._writer.close)
        return self._writer

    def flush_cache(self) -> bool:
        """No prefix cache here: every prompt is computed in full (what capture needs anyway)."""
        return True

    # -- requests --
    def generate(self, request: Mapping[str, Any]) -> dict | list[dict]:
        """One SGLang ``/generate`` request (single or batch) → its response (dict or list of dicts)."""
        prompts, batched = self._prompts(request)
        rids = _per_item(request.get("rid"), len(prompts), "rid")
        params = _per_item(request.get("sampling_params"), len(prompts), "sampling_params")
        want_hidden = _per_item(request.get("return_hidden_states"), len(prompts), "return_hidden_states")
        responses = []
        for i, ids in enumerate(prompts):
            rid = rids[i] if rids[i] is not None else uuid.uuid4().hex
            if not isinstance(rid, str):
                raise ModelBackendError(f"rid must be a string, not {type(rid).__name__}")
            hidden = want_hidden[i]
            if hidden not in (None, False, True):
                raise ModelBackendError(f"return_hidden_states must be a boolean, not {hidden!r}")
            if hidden and self.config.hidden_states_mode != "full":
                if self.config.hidden_states_mode is None:
                    raise ModelBackendError(_HIDDEN_NOT_CONFIGURED)
                raise ModelBackendError(_HIDDEN_EXCEEDS.format(mode=self.config.hidden_states_mode))
            with self._lock:
                responses.append(self._run_one(rid, ids, params[i] or {}, bool(hidden)))
        return responses if batched else responses[0]

    def _prompts(self, request: Mapping[str, Any]) -> tuple[list[list[int]], bool]:
        text, input_ids = request.get("text"), request.get("input_ids")
        if (text is None) == (input_ids is None):
            raise ModelBackendError("Either text or input_ids should be provided.")
        if input_ids is not None:
            if input_ids and all(isinstance(x, list) for x in input_ids):
                prompts, batched = [list(x) for x in input_ids], True
            else:
                prompts, batched = [list(input_ids)], False
            vocab = int(self.model.config.vocab_size)
            for prompt in prompts:
                if not prompt or any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab
                                     for t in prompt):
                    raise ModelBackendError(f"input_ids must be non-empty lists of token ids in [0, {vocab})")
            return prompts, batched
        if self.tokenizer is None:
            raise ModelBackendError("text input is not supported with --skip-tokenizer-init; send input_ids")
        assert text is not None  # exactly one of text and input_ids, checked above
        texts, batched = ([text], False) if isinstance(text, str) else (list(text), True)
        prompts = [self.tokenizer.encode(t, add_special_tokens=True) for t in texts]
        if any(not p for p in prompts):
            raise ModelBackendError("text encodes to no tokens")
        return prompts, batched

    def generate_steps(self, request: Mapping[str, Any]) -> Generator[int, None, dict]:
        """One (non-batch) request, checked now; then one output token per ``next()`` (the first from the
        prefill, each later one from a decode forward).  The generator returns the final response.  The
        emulator's scheduler drives several of these, one step each per decode batch."""
        prompts, batched = self._prompts(request)
        if batched:
            raise ModelBackendError("generate_steps takes one prompt; split the batch first")
        rid = request.get("rid")
        rid = rid if rid is not None else uuid.uuid4().hex
        if not isinstance(rid, str):
            raise ModelBackendError(f"rid must be a string, not {type(rid).__name__}")
        hidden = request.get("return_hidden_states")
        if hidden not in (None, False, True):
            raise ModelBackendError(f"return_hidden_states must be a boolean, not {hidden!r}")
        if hidden and self.config.hidden_states_mode != "full":
            if self.config.hidden_states_mode is None:
                raise ModelBackendError(_HIDDEN_NOT_CONFIGURED)
            raise ModelBackendError(_HIDDEN_EXCEEDS.format(mode=self.config.hidden_states_mode))
        params = request.get("sampling_params") or {}
        _check_max_new(params)
        check_context_length(len(prompts[0]), params.get("max_new_tokens"), self.context_len)
        self.last_prompt_len, self.last_cached = len(prompts[0]), 0
        return self._steps_one(rid, prompts[0], params, bool(hidden))

    def detokenize(self, ids: list[int]) -> str | None:
        """The text so far (None without a tokenizer), as SGLang's detokenizer sends it."""
        if self.tokenizer is None:
            return None
        # decode's annotation also covers a batch (list[str]); one list of ids decodes to one str.
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))

    def _run_one(self, rid: str, prompt: list[int], params: Mapping[str, Any], want_hidden: bool) -> dict:
        _check_max_new(params)
        steps = self._steps_one(rid, prompt, params, want_hidden)
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value

    def _steps_one(self, rid: str, prompt: list[int], params: Mapping[str, Any],
                   want_hidden: bool) -> Generator[int, None, dict]:
        import torch

        started = time.monotonic()
        max_new = params.get("max_new_tokens", 128)
        ignore_eos = bool(params.get("ignore_eos", False))
        stop_ids = set(params.get("stop_token_ids") or [])
        output: list[int] = []
        finish: dict = {"type": "length", "length": max_new}
        hidden_out: list = []
        if max_new > 0:
            with torch.inference_mode():
                cache, last_row, chunk_rows = self._prefill(rid, prompt)
                if want_hidden:
                    hidden_out.append(chunk_rows.tolist())
                token = self._next_token(last_row)
            position = len(prompt)
            while True:
                output.append(token)
                yield token
                if (token in self.eos_token_ids and not ignore_eos) or token in stop_ids:
                    finish = {"type": "stop", "matched": token}
                    break
                if len(output) >= max_new:
                    break
                with torch.inference_mode():
                    out = self._forward(torch.tensor([[token]], device=self.device), cache, position)
                    position += 1
                    rows = self._hidden_rows(out)
                    if want_hidden:
                        hidden_out.append(rows[0].tolist())
                    token = self._next_token(out.last_hidden_state[0, -1])
        else:
            with torch.inference_mode():
                _cache, _last_row, chunk_rows = self._prefill(rid, prompt)
            if want_hidden:
                hidden_out.append(chunk_rows.tolist())
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "weight_version": "default",
            "completion_tokens": len(output),
            "cached_tokens": 0,
            "e2e_latency": time.monotonic() - started,
        }
        if want_hidden:
            meta["hidden_states"] = hidden_out
        response: dict[str, Any] = {"output_ids": output, "meta_info": meta}
        if self.tokenizer is not None:
            response = {"text": self.tokenizer.decode(output, skip_special_tokens=True), **response}
        return response

    # -- forwards --
    def _forward(self, ids: Any, cache: Any, position: int) -> Any:
        import torch

        positions = torch.arange(position, position + ids.shape[1], device=self.device)
        return self.model.model(input_ids=ids, use_cache=True, cache_position=positions,
                                position_ids=positions[None], output_hidden_states=True,
                                **{self._cache_kwarg: cache})

    def _hidden_rows(self, out: Any) -> Any:
        """The rows SGLang would put in ``LogitsProcessorOutput.hidden_states`` under FULL capture."""
        import torch

        if self.config.aux_enabled:
            points = self.config.points
            assert points is not None  # capture_config sets the points whenever aux capture is on
            # HF hidden_states[p] is the input of decoder layer p (index 0: the embeddings).
            return torch.cat([out.hidden_states[p][0] for p in points], dim=-1)
        return out.last_hidden_state[0]

    def _next_token(self, last_row: Any) -> int:
        logits = self.model.lm_head(last_row[None].to(self.model.lm_head.weight.dtype))
        return int(logits[0].argmax())

    def _prefill(self, rid: str, prompt: list[int]) -> tuple[Any, Any, Any]:
        """Run the prompt as SGLang's extend forwards; returns (cache, last post-norm row, last chunk rows)."""
        import torch
        from transformers import DynamicCache

        cache = DynamicCache()
        size = self.config.chunked_prefill_size
        step = len(prompt) if size <= 0 else size
        ids_all = torch.tensor(prompt, dtype=torch.int64)
        rows = last_row = None
        for start in range(0, len(prompt), step):
            chunk = ids_all[start : start + step]
            out = self._forward(chunk[None].to(self.device), cache, start)
            rows = self._hidden_rows(out)
            last = out.last_hidden_state[0]
            last_row = last[-1]
            self._maybe_dump(rid, start, chunk, rows, last)
        return cache, last_row, rows

    def _maybe_dump(self, rid: str, prefix_len: int, chunk: Any, aux: Any, last: Any) -> None:
        """Hand one extend chunk to the background writer, as the plugin's AFTER hook does."""
        spec = self.spec
        if spec is None or not self.config.aux_enabled or not rid.startswith(spec.rid_prefix):
            return
        meta = {
            "layers": list(self.config.points or ()),
            "hidden_size": self.hidden_size,
            "sglang_version": EMULATOR_VERSION,
            "draft_layer_ids": list(spec.draft_layer_ids) if spec.draft_layer_ids else None,
        }
        keep_last = "last" in spec.dump
        ready = None
        if aux.is_cuda:
            # Like the plugin (hook.py `_to_host`): async copies into pinned memory on the forward's stream,
            # and the writer waits on an event before it reads them.
            import torch

            aux, last = _pinned_copy(aux), _pinned_copy(last) if keep_last else None
            ready = torch.cuda.Event()
            ready.record()
        else:
            # CPU: `aux` (torch.cat) and `last` (this forward's output) are fresh tensors that nothing
            # writes again, so handing them over is the copy; the bf16 cast happens in the writer thread.
            last = last if keep_last else None
        self.writer.submit([rid], [prefix_len], [int(chunk.shape[0])], aux, last, chunk.cpu(), meta,
                           ready=ready)


def _check_max_new(params: Mapping[str, Any]) -> None:
    max_new = params.get("max_new_tokens", 128)
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
        raise ModelBackendError(f"max_new_tokens must be an integer >= 0, not {max_new!r}")


def _pinned_copy(tensor: Any) -> Any:
    import torch

    out = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
    out.copy_(tensor, non_blocking=True)
    return out


def _per_item(value: Any, count: int, name: str) -> list:
    """A request field that may be one value for all prompts or a list with one per prompt."""
    if isinstance(value, list):
        if len(value) != count:
            raise ModelBackendError(f"{name} has {len(value)} entries for {count} prompts")
        return list(value)
    return [value] * count
