"""The SGLang glue: which process registers, and the AFTER hook on ``ModelRunner.forward``.

SGLang 0.5.23 calls every ``sglang.srt.plugins`` entry point in every process (main, schedulers,
detokenizer, DP controller; sglang-facts §5.1), and applying a hook imports its target module (torch and
all of the model runner).  So `register` only registers inside scheduler processes.  Two signs name one:

* the title ``sglang::scheduler...`` (``sglang/srt/managers/scheduler.py:6294``), and
* the multiprocessing target ``run_scheduler_process`` (or ``run_scheduler_process_with_init_pipe``),
  because 0.5.23 runs ``load_plugins()`` as the first statement of ``run_scheduler_process``
  (``scheduler.py:6323``), before ``configure_scheduler_process`` sets the title (``:6294``).  The
  detokenizer and the DP controller set their titles before loading plugins
  (``detokenizer_manager.py:551-552``, ``data_parallel_controller.py:955-960``), and the main process has
  no multiprocessing target.

Symbols used (all checked statically by ``eagle3-tui capture check``):
``HookRegistry.register(target, fn, HookType.AFTER)`` (``srt/plugins/hook_registry.py:84``, AFTER hooks
are called as ``hook(result, *args, **kwargs)``, ``:373-380``); ``ModelRunner.forward(self,
forward_batch, ...) -> ModelRunnerOutput`` (``model_executor/model_runner.py:1813``) whose
``logits_output`` is a ``LogitsProcessorOutput`` with ``hidden_states`` (packed aux rows under
``--enable-return-aux-hidden-states``) and ``last_hidden_states`` (post-norm final rows)
(``layers/logits_processor.py:219-235``); ``ForwardBatch.forward_mode/rids/input_ids/
extend_prefix_lens_cpu/extend_seq_lens_cpu`` (``model_executor/forward_batch_info.py:498-670``);
``get_parallel().attn_tp_rank`` and ``.pp_group.is_last_rank`` (``runtime_context.py:1285``,
``arg_groups/fields/parallel.py:362,409``).

SGLang 0.5.14 and 0.5.18 (read statically from their wheels, docs/sglang-facts.md §9): the same plugin
framework, hook targets, ForwardBatch fields and ``ForwardMode.is_extend_without_speculative``; the rank
names are properties of ``runtime_context.ParallelContext`` there (0.5.14 ``runtime_context.py:120-185``), so
`_writer_rank` reads them unchanged.  Their ``LogitsProcessorOutput`` has no ``last_hidden_states``: with aux
capture on, ``hidden_states`` holds only the concatenated aux rows (0.5.14 ``logits_processor.py:596-600``).
The post-norm final rows are the ``hidden_states`` argument of ``LogitsProcessor.forward`` (the models pass
the output of their final norm, e.g. 0.5.14 ``llama.py:552-558``, ``deepseek_v2.py:2763``), so a third AFTER
hook (`CaptureHook.after_logits`) keeps that argument beside the output object it produced, and the forward
hook takes it when its ``logits_output`` is that very object.  Aux capture there needs an EAGLE-3 draft
(``--speculative-draft-model-path``); the target's prefill runs with ``CaptureHiddenMode.FULL``
(0.5.14 ``speculative/eagle_worker_v2.py:1071-1079``), so ``hidden_states`` covers every token.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import threading
from typing import Any

from .spec import CaptureSpec, CaptureSpecError, capture_active_line

FORWARD_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
# Runs after load_model() and set_eagle3_layers_to_capture(), before CUDA graphs (model_runner.py:1105).
LOADED_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends"
# Only used where LogitsProcessorOutput has no last_hidden_states (SGLang before 0.5.23): see the docstring.
LOGITS_TARGET = "sglang.srt.layers.logits_processor.LogitsProcessor.forward"
SCHEDULER_TITLE_PREFIX = "sglang::scheduler"
SCHEDULER_TARGET_PREFIX = "run_scheduler_process"

logger = logging.getLogger("eagle3_capture")
_registered_state: CaptureHook | None = None
_register_lock = threading.Lock()


# -- which process ------------------------------------------------------------------------------------
def process_title() -> str:
    """This process's title as ``ps`` shows it (setproctitle when importable, else /proc/self/cmdline)."""
    with contextlib.suppress(Exception):  # setproctitle is optional here
        import setproctitle

        return str(setproctitle.getproctitle())
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def is_scheduler_process() -> bool:
    """True inside an SGLang scheduler process (see the module docstring for both signs)."""
    if process_title().startswith(SCHEDULER_TITLE_PREFIX):
        return True
    target = getattr(multiprocessing.current_process(), "_target", None)
    name = getattr(target, "__name__", "") or ""
    module = getattr(target, "__module__", "") or ""
    return name.startswith(SCHEDULER_TARGET_PREFIX) and module.startswith("sglang.")


# -- registration -------------------------------------------------------------------------------------
def register() -> CaptureHook | None:
    """The ``sglang.srt.plugins`` entry point.  Does nothing unless ``EAGLE3_CAPTURE`` is set and this is
    a scheduler process; returns the registered hook state (None when nothing was registered)."""
    global _registered_state
    try:
        spec = CaptureSpec.from_environ()
    except CaptureSpecError as exc:
        logger.error("eagle3-capture disabled: %s", exc)
        return None
    if spec is None or not is_scheduler_process():
        return None
    with _register_lock:
        if _registered_state is not None:  # load_plugins() is idempotent, but be safe against re-entry
            return _registered_state
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        state = CaptureHook(spec)
        HookRegistry.register(FORWARD_TARGET, state.after_forward, HookType.AFTER)
        HookRegistry.register(LOADED_TARGET, state.after_model_loaded, HookType.AFTER)
        if "last" in spec.dump and output_lacks_last_hidden_states():
            HookRegistry.register(LOGITS_TARGET, state.after_logits, HookType.AFTER)
        _registered_state = state
        atexit.register(state.close)
        return state


def output_lacks_last_hidden_states() -> bool:
    """True when this SGLang's ``LogitsProcessorOutput`` declares no ``last_hidden_states`` (0.5.14, 0.5.18).

    Read from the source with ``ast`` (``find_spec`` locates the package without importing it): importing
    ``logits_processor`` here, inside ``load_plugins()``, would pull torch and half of SGLang before the
    scheduler has set up its process.  False when the file cannot be read (nothing to hook then)."""
    import ast
    import importlib.util
    import os

    try:
        found = importlib.util.find_spec("sglang")
        origin = found.origin if found is not None else None
        if origin is None:
            return False
        path = os.path.join(os.path.dirname(origin), "srt", "layers", "logits_processor.py")
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError, ImportError):
        return False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "LogitsProcessorOutput":
            return not any(isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                           and item.target.id == "last_hidden_states" for item in node.body)
    return False


# -- the hook -----------------------------------------------------------------------------------------
def find_layers_to_capture(model: Any, depth: int = 3) -> list[int] | None:
    """The model's actual ``layers_to_capture`` (``model.model``; Kimi-K2.5 nests it under
    ``language_model``, ``kimi_k25.py:693``)."""
    if model is None or depth < 0:
        return None
    value = getattr(model, "layers_to_capture", None)
    if isinstance(value, (list, tuple)) and value:
        return [int(v) for v in value]
    for attr in ("model", "language_model"):
        found = find_layers_to_capture(getattr(model, attr, None), depth - 1)
        if found:
            return found
    return None


def _sglang_version() -> str:
    try:
        from sglang.version import __version__

        return str(__version__)
    except Exception:  # noqa: BLE001
        return "unknown"


def _writer_rank() -> bool:
    """attn_tp_rank 0 of the last PP rank: every TP rank holds the same rows (sglang-facts §4.7)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if int(parallel.attn_tp_rank) != 0:
        return False
    try:
        return bool(parallel.pp_group.is_last_rank)
    except Exception:  # noqa: BLE001 - groups not built (single process tools): fall back to the ranks
        return int(parallel.pp_rank) == int(parallel.pp_size) - 1


def _to_host(tensor: Any) -> Any:
    """A CPU copy that survives the next forward (CUDA-graph buffers are reused).

    GPU tensors are copied asynchronously into pinned memory on the forward's own stream, so a later
    replay that overwrites the buffer is ordered after the copy; the writer waits on an event.
    """
    import torch

    if tensor.is_cuda:
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        out.copy_(tensor, non_blocking=True)
        return out
    return tensor.detach().clone()


class CaptureHook:
    """State of the capture inside one scheduler process."""

    def __init__(self, spec: CaptureSpec, writer_rank: bool | None = None) -> None:
        self.spec = spec
        self._writer_rank = writer_rank  # None: ask get_parallel() on first use
        self._writer: Any = None
        self._layers: list[int] | None = None
        self._active_logged = False
        self._warned: set[str] = set()
        self._version: str | None = None
        # (LogitsProcessorOutput, the post-norm rows it was computed from), for SGLang without last_hidden_states
        self._final_rows: tuple[Any, Any] | None = None

    # -- helpers --
    def _is_writer_rank(self) -> bool:
        if self._writer_rank is None:
            self._writer_rank = _writer_rank()
        return self._writer_rank

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _log_active(self, runner: Any) -> None:
        if self._active_logged:
            return
        self._layers = find_layers_to_capture(getattr(runner, "model", None))
        self._active_logged = True
        line = capture_active_line(self._layers, self.spec)
        # SGLang's log format has no level name; use WARNING only if INFO would be filtered out.
        logger.log(logging.INFO if logger.isEnabledFor(logging.INFO) else logging.WARNING, "%s", line)
        if self._layers is None:
            self._warn_once("no-layers", "eagle3-capture: the model has no layers_to_capture; is "
                            "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 set?")

    def _get_writer(self) -> Any:
        if self._writer is None:
            from .writer import BackgroundWriter, check_capture_dir

            check_capture_dir(self.spec.dir, create=True)
            self._writer = BackgroundWriter(self.spec.dir, queue_depth=self.spec.queue_depth,
                                            fsync=self.spec.fsync)
        return self._writer

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    # -- hooks --
    def after_model_loaded(self, result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
        """AFTER ``ModelRunner.init_attention_backends``: the layers are set; log the active line."""
        try:
            if getattr(runner, "is_draft_worker", False) or not self._is_writer_rank():
                return
            self._log_active(runner)
        except Exception as exc:  # noqa: BLE001 - never break the server's start
            self._warn_once("loaded", "eagle3-capture: could not report the capture layers: %s", exc)
        return

    def after_logits(self, result: Any, processor: Any, *args: Any, **kwargs: Any) -> None:
        """AFTER ``LogitsProcessor.forward(input_ids, hidden_states, lm_head, metadata, aux_hidden_states)``:
        where the output keeps no ``last_hidden_states``, remember the post-norm rows it came from."""
        try:
            if result is None or hasattr(result, "last_hidden_states"):
                return  # 0.5.23 keeps them itself (or a dummy run returned nothing)
            hidden = args[1] if len(args) > 1 else kwargs.get("hidden_states")
            metadata = args[3] if len(args) > 3 else kwargs.get("logits_metadata")
            aux = args[4] if len(args) > 4 else kwargs.get("aux_hidden_states")
            mode = getattr(metadata, "forward_mode", None)
            if hidden is None or aux is None or mode is None or not mode.is_extend_without_speculative():
                return  # not a capturing target prefill (a draft's call, a decode, a verify)
            self._final_rows = (result, hidden)
        except Exception as exc:  # noqa: BLE001 - never break a forward
            self._warn_once("logits", "eagle3-capture: could not keep the final hidden states: %s", exc)

    def _take_final_rows(self, logits_output: Any) -> Any:
        """The rows `after_logits` kept for exactly this output object (None otherwise); clears the slot."""
        kept, self._final_rows = self._final_rows, None
        if kept is not None and logits_output is not None and kept[0] is logits_output:
            return kept[1]
        return None

    def after_forward(self, result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
        """AFTER ``ModelRunner.forward``: copy the job's rows and queue them for the writer.

        Returns None so SGLang keeps its own result.
        """
        forward_batch = args[0] if args else kwargs.get("forward_batch")
        final_rows = self._take_final_rows(getattr(result, "logits_output", None))
        try:
            self._capture(result, runner, forward_batch, final_rows)
        except Exception as exc:  # noqa: BLE001 - a capture failure must not kill serving; say it loudly
            rids = getattr(forward_batch, "rids", None)
            logger.error("eagle3-capture: capturing a forward of %s failed: %s: %s", rids,
                         type(exc).__name__, exc)

    def _capture(self, result: Any, runner: Any, forward_batch: Any, final_rows: Any = None) -> None:
        if forward_batch is None or getattr(runner, "is_draft_worker", False):
            return
        mode = getattr(forward_batch, "forward_mode", None)
        if mode is None or not mode.is_extend_without_speculative():
            return
        rids = forward_batch.rids
        prefix_lens = forward_batch.extend_prefix_lens_cpu
        seq_lens = forward_batch.extend_seq_lens_cpu
        if rids is None or prefix_lens is None or seq_lens is None:
            return
        prefix = self.spec.rid_prefix
        wanted = [i for i, rid in enumerate(rids) if isinstance(rid, str) and rid.startswith(prefix)]
        if not wanted or not self._is_writer_rank():
            return
        self._log_active(runner)
        logits_output = getattr(result, "logits_output", None)
        aux = getattr(logits_output, "hidden_states", None)
        last = getattr(logits_output, "last_hidden_states", None) if "last" in self.spec.dump else None
        if last is None and "last" in self.spec.dump:
            last = final_rows  # SGLang before 0.5.23: the hidden_states argument of LogitsProcessor.forward
        if aux is None:
            self._warn_once("no-aux", "eagle3-capture: the forward returned no hidden states; start the "
                            "server with --enable-return-aux-hidden-states --speculative-algorithm EAGLE3 "
                            "(SGLang 0.5.23), or, where SGLang has no capture-only mode (0.5.14, 0.5.18), with "
                            "--speculative-algorithm EAGLE3 --speculative-draft-model-path DIR")
            return
        if "last" in self.spec.dump and last is None:
            self._warn_once("no-last", "eagle3-capture: the forward kept no last_hidden_states (nor did "
                            "LogitsProcessor.forward see its final rows, e.g. a prefill CUDA graph replay); "
                            "the chunks are written without 'last'")
        total = sum(int(n) for n in seq_lens)
        input_ids = forward_batch.input_ids
        for label, tensor in (("aux", aux), ("last", last), ("input_ids", input_ids)):
            if tensor is not None and tensor.shape[0] < total:
                logger.error("eagle3-capture: %s has %d rows for %d tokens of %s; not written", label,
                             tensor.shape[0], total, [rids[i] for i in wanted])
                return

        starts = [0]
        for n in seq_lens:
            starts.append(starts[-1] + int(n))
        if len(wanted) == len(rids):
            rows = [slice(0, total)]
        else:  # requests are row-contiguous in rids order: copy only ours
            rows = [slice(starts[i], starts[i + 1]) for i in wanted]

        import torch

        def gather(tensor: Any) -> Any:
            if tensor is None:
                return None
            pieces = [tensor[r] for r in rows]
            return _to_host(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0))

        aux_host, last_host, ids_host = gather(aux), gather(last), gather(input_ids)
        ready = None
        if aux.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        if self._version is None:
            self._version = _sglang_version()
        if last is not None:
            hidden_size: int | None = int(last.shape[-1])
        else:
            layers = self._layers or list(self.spec.layers or [])
            hidden_size = int(aux.shape[-1]) // len(layers) if layers else None
        meta = {
            "layers": self._layers or list(self.spec.layers or []),
            "hidden_size": hidden_size,
            "sglang_version": self._version,
            "draft_layer_ids": list(self.spec.draft_layer_ids) if self.spec.draft_layer_ids else None,
        }
        self._get_writer().submit(
            [rids[i] for i in wanted],
            [int(prefix_lens[i]) for i in wanted],
            [int(seq_lens[i]) for i in wanted],
            aux_host, last_host, ids_host, meta, ready=ready,
        )
