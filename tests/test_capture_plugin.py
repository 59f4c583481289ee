"""The SGLang plugin glue, against the real plugin framework of SGLang 0.5.23.

In-process: the real ``HookRegistry`` loaded by path from the wheel, and the hook itself fed fake
forward batches carrying real torch tensors.  In child processes: the generated PYTHONPATH folder (plugin
+ bare dist-info), found by the real ``load_plugins()`` through ``importlib.metadata``, registering only
in a process titled ``sglang::scheduler...`` or running ``run_scheduler_process``, then wrapping a
stand-in ``ModelRunner.forward`` with the real ``HookRegistry`` and writing the dump.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from sessions.capture.plugin.eagle3_capture import hook as hook_module
from sessions.capture.plugin.eagle3_capture.spec import ENV_NAME, CaptureSpec, capture_active_line
from sessions.capture.writer import list_chunks, read_chunk_metadata, read_chunks
from tests._capture_support import (
    FakeForwardBatch,
    FakeLogitsOutput,
    FakeMode,
    FakeResult,
    FakeRunner,
    fake_sglang_tree,
    load_real_hook_registry,
    sglang_root,
    unload_fake_sglang,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def real_registry():
    unload_fake_sglang()
    module = load_real_hook_registry(sglang_root())
    module.HookRegistry.reset()
    yield module
    module.HookRegistry.reset()
    unload_fake_sglang()


@pytest.fixture
def plugin_site(tmp_path, home):
    """(generated plugin dir, fake sglang site) for child processes."""
    from sessions.capture.inject import plugin_path

    return plugin_path(home), fake_sglang_tree(sglang_root(), tmp_path / "site")


def _batch(rids, prefix_lens, seq_lens, hidden=4, k=3, mode="EXTEND", offset=0.0):
    total = sum(seq_lens)
    aux = (torch.arange(total * k * hidden, dtype=torch.float32).reshape(total, k * hidden) + offset)
    last = -torch.arange(total * hidden, dtype=torch.float32).reshape(total, hidden)
    ids = torch.arange(total, dtype=torch.int64) + 7
    batch = FakeForwardBatch(FakeMode(mode), ids, rids, prefix_lens, seq_lens)
    return batch, FakeResult(FakeLogitsOutput(aux, last)), aux, last, ids


# -- in process ---------------------------------------------------------------------------------------------
def test_register_does_nothing_in_the_main_process(real_registry, monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_NAME, CaptureSpec(dir=str(tmp_path / "cap")).to_json())
    assert not hook_module.is_scheduler_process()
    assert hook_module.register() is None
    assert dict(real_registry.HookRegistry._hooks) == {}


def test_register_does_nothing_without_the_env(real_registry, monkeypatch):
    monkeypatch.delenv(ENV_NAME, raising=False)
    monkeypatch.setattr(hook_module, "is_scheduler_process", lambda: True)
    assert hook_module.register() is None
    assert dict(real_registry.HookRegistry._hooks) == {}


def test_after_hook_through_the_real_registry_writes_only_the_jobs_rids(real_registry, tmp_path):
    """Wrap a target with the real HookRegistry (AFTER), call it, and read the dump back."""
    spec = CaptureSpec(dir=str(tmp_path / "cap"), rid_prefix="eagle3-", fsync=False)
    state = hook_module.CaptureHook(spec, writer_rank=True)
    target_module = types.ModuleType("capture_target_for_test")

    class Runner(FakeRunner):
        def forward(self, forward_batch):
            return self.result

    target_module.Runner = Runner
    sys.modules["capture_target_for_test"] = target_module
    try:
        registry = real_registry.HookRegistry
        registry.register("capture_target_for_test.Runner.forward", state.after_forward,
                          real_registry.HookType.AFTER)
        registry.apply_hooks()
        batch, result, aux, last, ids = _batch(["eagle3-a", "HEALTH_CHECK_1", "other", "eagle3-b"],
                                               [0, 0, 0, 6], [5, 1, 2, 3])
        runner = Runner()
        runner.result = result
        assert runner.forward(batch) is result  # the AFTER hook keeps SGLang's result
        state.flush()
    finally:
        del sys.modules["capture_target_for_test"]
        state.close()
    cap = tmp_path / "cap"
    assert sorted(os.listdir(cap)) == ["eagle3-a", "eagle3-b"]
    a_aux, a_last, a_ids = read_chunks(cap, "eagle3-a")
    assert torch.equal(a_aux, aux[0:5].bfloat16()) and torch.equal(a_last, last[0:5].bfloat16())
    assert torch.equal(a_ids, ids[0:5])
    assert [c.name for c in list_chunks(cap, "eagle3-b")] == ["6-9.safetensors"]
    meta = read_chunk_metadata(cap, "eagle3-b")
    assert meta["start"] == "6" and meta["end"] == "9" and json.loads(meta["layers"]) == [2, 4, 5]
    assert meta["hidden_size"] == "4"


def test_hook_copies_before_returning(tmp_path):
    """CUDA-graph buffers are reused: overwriting the forward's tensors afterwards must not change the dump."""
    state = hook_module.CaptureHook(CaptureSpec(dir=str(tmp_path / "cap"), fsync=False), writer_rank=True)
    batch, result, aux, last, _ids = _batch(["eagle3-x"], [0], [4])
    expected_aux, expected_last = aux.clone(), last.clone()
    state.after_forward(result, FakeRunner(), batch)
    aux.fill_(123.0)  # the next replay writes into the same buffer
    last.fill_(-5.0)
    state.flush()
    state.close()
    got_aux, got_last, _ = read_chunks(tmp_path / "cap", "eagle3-x")
    assert torch.equal(got_aux, expected_aux.bfloat16()) and torch.equal(got_last, expected_last.bfloat16())


def test_chunked_prefill_reassembles_in_order(tmp_path):
    state = hook_module.CaptureHook(CaptureSpec(dir=str(tmp_path / "cap"), fsync=False), writer_rank=True)
    parts = []
    for start, n in ((0, 4), (4, 4), (8, 3)):
        batch, result, aux, last, ids = _batch(["eagle3-long"], [start], [n], offset=1000.0 * start)
        state.after_forward(result, FakeRunner(), batch)
        parts.append((aux, last, ids))
    state.flush()
    state.close()
    got_aux, got_last, got_ids = read_chunks(tmp_path / "cap", "eagle3-long", expected_tokens=11)
    assert torch.equal(got_aux, torch.cat([p[0] for p in parts]).bfloat16())
    assert torch.equal(got_last, torch.cat([p[1] for p in parts]).bfloat16())
    assert torch.equal(got_ids, torch.cat([p[2] for p in parts]))


@pytest.mark.parametrize("mode", ["DECODE", "TARGET_VERIFY", "IDLE"])
def test_no_dump_outside_extend_without_speculation(tmp_path, mode):
    state = hook_module.CaptureHook(CaptureSpec(dir=str(tmp_path / "cap"), fsync=False), writer_rank=True)
    batch, result, *_ = _batch(["eagle3-a"], [0], [3], mode=mode)
    state.after_forward(result, FakeRunner(), batch)
    state.flush()
    assert not (tmp_path / "cap").exists()


def test_no_dump_for_draft_runner_or_missing_lens(tmp_path):
    state = hook_module.CaptureHook(CaptureSpec(dir=str(tmp_path / "cap"), fsync=False), writer_rank=True)
    batch, result, *_ = _batch(["eagle3-a"], [0], [3])
    state.after_forward(result, FakeRunner(is_draft_worker=True), batch)
    batch.extend_seq_lens_cpu = None  # the "gpu_only" path (sglang-facts §4.6)
    state.after_forward(result, FakeRunner(), batch)
    state.flush()
    assert not (tmp_path / "cap").exists()


def test_only_attn_tp_rank_0_of_the_last_pp_rank_writes(tmp_path, monkeypatch):
    """The rank decision asks get_parallel() (sglang.srt.runtime_context), as the plugin does in SGLang."""
    ranks = {"attn_tp_rank": 1, "pp_last": True}

    class Group:
        @property
        def is_last_rank(self):
            return ranks["pp_last"]

    parallel = types.SimpleNamespace(pp_group=Group(), pp_rank=0, pp_size=1)
    runtime_context = types.ModuleType("sglang.srt.runtime_context")
    runtime_context.get_parallel = lambda: types.SimpleNamespace(
        attn_tp_rank=ranks["attn_tp_rank"], pp_group=parallel.pp_group, pp_rank=0, pp_size=1)
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", runtime_context)

    def run(directory: Path) -> bool:
        state = hook_module.CaptureHook(CaptureSpec(dir=str(directory), fsync=False))
        batch, result, *_ = _batch(["eagle3-a"], [0], [2])
        state.after_forward(result, FakeRunner(), batch)
        state.flush()
        state.close()
        return directory.exists()

    assert run(tmp_path / "rank1") is False
    ranks.update(attn_tp_rank=0, pp_last=False)
    assert run(tmp_path / "not-last-pp") is False
    ranks.update(attn_tp_rank=0, pp_last=True)
    assert run(tmp_path / "rank0") is True


def test_a_forward_with_too_few_rows_is_logged_and_not_written(tmp_path, caplog):
    state = hook_module.CaptureHook(CaptureSpec(dir=str(tmp_path / "cap"), fsync=False), writer_rank=True)
    batch, result, _aux, last, _ids = _batch(["eagle3-a"], [0], [3])
    result.logits_output.last_hidden_states = last[:2]  # fewer rows than the batch's tokens
    with caplog.at_level("ERROR", logger="eagle3_capture"):
        state.after_forward(result, FakeRunner(), batch)
        state.flush()
    state.close()
    assert any("eagle3-a" in r.getMessage() for r in caplog.records)
    assert not list_chunks(tmp_path / "cap", "eagle3-a")


def test_writer_failure_leaves_an_error_marker(tmp_path, caplog):
    from sessions.capture.writer import BackgroundWriter, read_error_marker

    writer = BackgroundWriter(str(tmp_path / "cap"), queue_depth=1, fsync=False)
    aux = torch.zeros(3, 6)
    with caplog.at_level("ERROR", logger="eagle3_capture"):
        writer.submit(["eagle3-a"], [0], [3], aux, torch.zeros(2, 2), torch.arange(3), {"layers": [1]})
        writer.flush()
    writer.close()
    assert writer.failures == 1
    assert "last has shape" in (read_error_marker(tmp_path / "cap", "eagle3-a") or "")


def test_background_writer_never_drops_when_the_queue_is_full(tmp_path):
    import threading

    from sessions.capture.writer import BackgroundWriter

    gate = threading.Event()

    class Ready:  # stands for the CUDA event the plugin records after its async copies
        def synchronize(self):
            gate.wait()

    writer = BackgroundWriter(str(tmp_path / "cap"), queue_depth=1, fsync=False)
    submitted = []

    def producer():
        for i in range(5):
            writer.submit([f"eagle3-{i}"], [0], [2], torch.ones(2, 6) * i, torch.ones(2, 2), torch.arange(2),
                          {"layers": [1, 2, 3]}, ready=Ready())
            submitted.append(i)

    thread = threading.Thread(target=producer)
    thread.start()
    gate.set()
    thread.join()
    writer.flush()
    writer.close()
    assert submitted == [0, 1, 2, 3, 4]
    for i in range(5):
        aux, _, _ = read_chunks(tmp_path / "cap", f"eagle3-{i}")
        assert torch.equal(aux, (torch.ones(2, 6) * i).bfloat16())


def test_active_line_text_is_exactly_what_the_log_reader_parses(tmp_path):
    spec = CaptureSpec(dir="/dev/shm/eagle3-capture-me", rid_prefix="eagle3-")
    assert capture_active_line([2, 30, 58], spec) == (
        "eagle3-capture active: layers_to_capture=[2, 30, 58], dir=/dev/shm/eagle3-capture-me, rid_prefix=eagle3-")


def test_layers_are_found_under_kimi_k25_language_model():
    kimi = types.SimpleNamespace(language_model=types.SimpleNamespace(
        model=types.SimpleNamespace(layers_to_capture=[2, 30, 58])))
    assert hook_module.find_layers_to_capture(kimi) == [2, 30, 58]
    assert hook_module.find_layers_to_capture(types.SimpleNamespace(model=types.SimpleNamespace())) is None


# -- child processes ----------------------------------------------------------------------------------------
_TITLE_SCRIPT = r"""
import json, sys
import setproctitle
if sys.argv[1]:
    setproctitle.setproctitle(sys.argv[1])
import eagle3_capture
state = eagle3_capture.register()
from sglang.srt.plugins.hook_registry import HookRegistry
print(json.dumps({"title": setproctitle.getproctitle(), "targets": sorted(HookRegistry._hooks),
                  "registered": state is not None}))
"""

_SPAWN_SCRIPT = r"""
import json, multiprocessing as mp, sys
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.managers.scheduler import run_scheduler_process

if __name__ == "__main__":
    load_plugins()  # the main process loads plugins too (launch_server.py:79, engine.py:1159)
    main_targets = sorted(HookRegistry._hooks)
    ctx = mp.get_context("spawn")  # SGLang forces spawn (engine.py:1995)
    queue = ctx.Queue()
    proc = ctx.Process(target=run_scheduler_process, args=(queue, sys.argv[1]))
    proc.start()
    report = queue.get(timeout=240)
    proc.join(240)
    print(json.dumps({"main": main_targets, "child": report, "exitcode": proc.exitcode}))
"""


def _child_env(plugin_dir: Path, site: Path, capture_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir), str(site)])
    env[ENV_NAME] = CaptureSpec(dir=str(capture_dir), rid_prefix="eagle3-", fsync=False).to_json()
    env.update(extra)
    return env


@pytest.mark.parametrize("title,registers", [
    ("sglang::scheduler_TP0", True),
    ("sglang::scheduler_DP1_TP3_EP3", True),
    ("sglang::detokenizer", False),
    ("", False),  # the plain `python ...` title of SGLang's main process
])
def test_registers_only_in_a_process_titled_sglang_scheduler(plugin_site, tmp_path, title, registers):
    plugin_dir, site = plugin_site
    proc = subprocess.run([sys.executable, "-c", _TITLE_SCRIPT, title], capture_output=True, text=True, check=False,
                          env=_child_env(plugin_dir, site, tmp_path / "cap"), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    if title:
        assert report["title"].startswith(title)
    assert report["registered"] is registers
    expected = sorted([hook_module.FORWARD_TARGET, hook_module.LOADED_TARGET]) if registers else []
    assert report["targets"] == expected


def test_real_load_plugins_finds_the_plugin_and_dumps_in_the_scheduler_only(plugin_site, tmp_path):
    """SGLang 0.5.23 runs load_plugins() before titling the scheduler: the spawn target identifies it."""
    plugin_dir, site = plugin_site
    capture_dir = tmp_path / "cap"
    proc = subprocess.run([sys.executable, str(_write(tmp_path / "drive.py", _SPAWN_SCRIPT)), "forward"],
                          capture_output=True, text=True, check=False, env=_child_env(plugin_dir, site, capture_dir),
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["main"] == []  # no hook (and no torch import) in the main process
    assert report["child"]["targets"] == sorted([hook_module.FORWARD_TARGET, hook_module.LOADED_TARGET])
    assert report["child"]["patched"] is True and report["exitcode"] == 0
    active = [line for line in proc.stderr.splitlines() if "eagle3-capture active:" in line]
    assert active == [f"eagle3-capture active: layers_to_capture=[2, 4, 5], dir={capture_dir}, rid_prefix=eagle3-"]
    assert sorted(os.listdir(capture_dir)) == ["eagle3-a", "eagle3-b"]  # not HEALTH_CHECK_*, not the decode
    a_aux, a_last, a_ids = read_chunks(capture_dir, "eagle3-a")
    full_aux = torch.arange(6 * 12, dtype=torch.float32).reshape(6, 12).bfloat16()
    full_last = -torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4).bfloat16()
    assert torch.equal(a_aux, full_aux[0:3]) and torch.equal(a_last, full_last[0:3])
    assert a_ids.tolist() == [100, 101, 102]
    assert [c.name for c in list_chunks(capture_dir, "eagle3-b")] == ["4-6.safetensors"]
    from safetensors.torch import load_file  # the contract files are plain safetensors

    b = load_file(str(capture_dir / "eagle3-b" / "4-6.safetensors"))
    assert torch.equal(b["aux"], full_aux[4:6]) and b["input_ids"].tolist() == [104, 105]
    meta = read_chunk_metadata(capture_dir, "eagle3-b")
    assert meta["sglang_version"] == "0.5.23"


def test_plugin_is_inert_in_the_scheduler_without_the_env(plugin_site, tmp_path):
    plugin_dir, site = plugin_site
    env = _child_env(plugin_dir, site, tmp_path / "cap")
    del env[ENV_NAME]
    proc = subprocess.run([sys.executable, str(_write(tmp_path / "drive.py", _SPAWN_SCRIPT)), "targets"],
                          capture_output=True, text=True, check=False, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["child"]["targets"] == [] and report["main"] == []


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
