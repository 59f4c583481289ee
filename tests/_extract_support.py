"""Test support for the extraction tests: tokenizer dirs with chat templates written for these tests,
SpecForge 0.2.0 installed without deps into a cached folder, and emulator helpers.

The three templates imitate the shapes of real ones (they are not copies): Llama-3 (header tokens, trimmed
content, ``<|eot_id|>``, a template-owned date system block), Qwen3 ChatML (``<|im_end|>\\n``, a
``<think>`` block, history reasoning stripped, ``enable_thinking``) and Kimi-K2 (``<|im_middle|>``, a
template-owned default system prompt, ``<|im_end|>`` with no newline).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Self

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set system = '' %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n\\n' + system"
    " + '<|eot_id|>' }}"
    "{%- for message in loop_messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}"
    "{%- set content = m['content'] %}{%- set reasoning = m.get('reasoning_content') or '' %}"
    "{%- if loop.index0 > ns.last_query %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)

KIMI_K2_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}{{- '<|im_system|>system<|im_middle|>' + m['content'] + '<|im_end|>' }}"
    "{%- elif m['role'] == 'user' %}{{- '<|im_user|>user<|im_middle|>' + m['content'] + '<|im_end|>' }}"
    "{%- elif m['role'] == 'tool' %}{{- '<|im_system|>tool<|im_middle|>' + m['content'] + '<|im_end|>' }}"
    "{%- else %}{{- '<|im_assistant|>assistant<|im_middle|>' + m['content'] + '<|im_end|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_assistant|>assistant<|im_middle|>' }}{%- endif %}"
)

TEMPLATES = {
    "llama3": (LLAMA3_TEMPLATE, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|begin_of_text|>", "<|eot_id|>"),
    "qwen3": (QWEN3_TEMPLATE, ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"],
              None, "<|im_end|>"),
    "kimi": (KIMI_K2_TEMPLATE, ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                                "<|im_end|>", "[BOS]"], "[BOS]", "<|im_end|>"),
}

CORPUS = [
    "Hello there, how are you today? I am fine, thank you very much.",
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France.",
    "Write a poem about the sea. The sea is wide and blue and deep.",
    "def add(a, b):\n    return a + b\n",
    "What is 2 + 2? It is 4. Let me think step by step about numbers and words.",
    "You are a helpful assistant. Cutting Knowledge Date: December 2023",
]


def make_tokenizer_dir(path: Path, style: str, hidden_size: int = 16, num_layers: int = 8) -> Path:
    """A model dir holding only a tokenizer (byte-level BPE trained here) and a config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    template, specials, bos, eos = TEMPLATES[style]
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 3, trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, "eos_token": eos,
              "model_max_length": 1 << 20}
    if bos:
        config["bos_token"] = bos
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden_size,
        "num_hidden_layers": num_layers, "vocab_size": tokenizer.get_vocab_size(), "num_attention_heads": 2,
        "num_key_value_heads": 2, "intermediate_size": 32,
    }))
    return path


def supervised_spans(tokenizer, ids, mask) -> list[str]:
    """The decoded text of each run of supervised tokens."""
    spans, current = [], []
    for token, flag in zip(ids, mask):
        if flag:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return [tokenizer.decode(s, skip_special_tokens=False) for s in spans]


# -- SpecForge 0.2.0, installed without its dependencies ----------------------------------------------
SPECFORGE_CACHE = Path(os.environ.get("EAGLE3_TUI_TEST_CACHE", Path.home() / ".cache" / "eagle3-tui-tests"))


def specforge_path() -> Path:
    """``pip install --no-deps --target <cache>/specforge specforge==0.2.0`` once; the folder to import from."""
    target = SPECFORGE_CACHE / "specforge-0.2.0"
    marker = target / "specforge" / "runtime" / "data_plane" / "feature_store.py"
    if marker.is_file():
        return target
    import fcntl

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".specforge.lock", "w") as lock:  # xdist workers may get here together
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                            str(target), "specforge==0.2.0"], check=True)
    return target


def specforge_modules():
    """SpecForge's own offline reader and EAGLE-3 normaliser, imported from the wheel's files.

    ``runtime/data_plane/feature_store.py`` and ``algorithms/eagle3/data.py`` import only torch and
    SpecForge itself, so they import as they are.
    """
    path = str(specforge_path())
    if path not in sys.path:
        sys.path.insert(0, path)
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

    return load_feature_file, normalize_offline_sample, OfflineManifestReader


def specforge_vocab_function():
    """``process_token_dict_to_mappings`` from the wheel's ``data/preprocessing.py``.

    That module imports HF ``datasets`` at its top, which is not installed here, so the one function is
    taken from the file's source with ``ast`` and run on its own (it needs only Counter and torch).
    """
    import ast
    import collections
    import typing

    import torch

    source = (specforge_path() / "specforge" / "data" / "preprocessing.py").read_text()
    tree = ast.parse(source)
    node = next(n for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name == "process_token_dict_to_mappings")
    namespace = {"Counter": collections.Counter, "torch": torch, "Tuple": typing.Tuple}  # noqa: UP006
    code = compile(ast.Module(body=[node], type_ignores=[]), "preprocessing.py", "exec")
    exec(code, namespace)  # noqa: S102 - SpecForge's own function, from the wheel pinned above
    return namespace["process_token_dict_to_mappings"]


def assert_specforge_reads(out_dir: Path, hidden_size: int, aux_width: int, max_len: int = 4096) -> int:
    """Load every sample with SpecForge's reader and normaliser and check the shapes its trainer expects."""
    import torch

    load_feature_file, normalize, Reader = specforge_modules()
    refs = list(Reader(str(out_dir), validate_files=True, max_len=max_len))
    assert refs, f"SpecForge found no feature files under {out_dir}"
    for ref in refs:
        path = ref.feature_store_uri.removeprefix("file://")
        raw = load_feature_file(path)
        t = raw["input_ids"].shape[0]
        assert raw["input_ids"].shape == (t,) and raw["loss_mask"].shape == (t,)
        sample = normalize(raw, max_len=max_len)
        assert sample["input_ids"].shape == (1, t)
        assert sample["loss_mask"].shape == (1, t) and int(sample["loss_mask"][0, -1]) == 0
        assert sample["attention_mask"].shape == (1, t)
        assert sample["hidden_state"].shape == (1, t, aux_width)  # SpecForge's name for the aux rows
        assert sample["target"].shape == (1, t, hidden_size)  # and for the final states
        assert sample["hidden_state"].dtype == torch.bfloat16 and sample["target"].dtype == torch.bfloat16
        assert ref.num_tokens == t
    return len(refs)


# -- jobs ---------------------------------------------------------------------------------------------
def chat_rows(count: int, words: int = 6) -> list[dict]:
    """ShareGPT rows with different lengths (so T differs from sample to sample)."""
    rows = []
    for i in range(count):
        answer = " ".join(["the capital of France is Paris"] * (1 + i % words))
        rows.append({"conversations": [{"from": "human", "value": f"Question {i}: where is Paris?"},
                                       {"from": "gpt", "value": f"Answer {i}: {answer}."}]})
    return rows


def write_dataset(path: Path, rows: list, bad: dict[int, bytes] | None = None) -> Path:
    """JSONL with ``rows``; ``bad`` inserts raw bad lines before the given row positions."""
    bad = bad or {}
    with open(path, "wb") as fh:
        for i, row in enumerate(rows):
            if i in bad:
                fh.write(bad[i] + b"\n")
            fh.write(json.dumps(row).encode() + b"\n")
    return path


def write_spec(path: Path, **keys) -> Path:
    """A job spec with a [job] table of ``keys`` (Paths written as strings, None left out)."""
    import tomli_w

    doc = {"job": {k: (str(v) if isinstance(v, Path) else v) for k, v in keys.items() if v is not None}}
    path.write_text(tomli_w.dumps(doc))
    return path


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def wait_for(condition, what: str, limit_s: float = 120.0, interval_s: float = 0.1):
    """Poll ``condition()`` until truthy (the limit only stops a hung test; the failure says what)."""
    import time

    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s:.0f} s waiting for: {what}")
        time.sleep(interval_s)


JOB_ENDS = ("done", "failed", "cancelled")


def start_job(spec: Path, env: dict[str, str], command: str = "extract") -> str:
    """`eagle3-tui <command> run SPEC` (extract or regenerate): the new job's id, the only thing on stdout."""
    result = run_cli([command, "run", str(spec)], env)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert job_id and "\n" not in job_id  # only the job id on stdout
    return job_id


def wait_state(job_id: str, home, states: tuple[str, ...] = JOB_ENDS, limit_s: float = 240):
    """The job's progress once its state is one of ``states`` (default: it ended)."""
    from sessions.extraction.job import job_status

    return wait_for(lambda: (p := job_status(job_id, home)).state in states and p, f"job {job_id} in {states}",
                    limit_s)


def run_job_to_end(spec: Path, env: dict[str, str], home, command: str = "extract", limit_s: float = 240):
    """`<command> run SPEC` until the job ends: its last progress (the job is stopped either way)."""
    job_id = start_job(spec, env, command)
    try:
        return wait_state(job_id, home, limit_s=limit_s)
    finally:
        stop_job(job_id, home)


def stop_job(job_id: str, home) -> None:
    """Teardown: cancel the job (SIGTERM, then SIGKILL of its pid after the grace)."""
    from sessions.extraction.job import JobError, cancel_job

    try:
        cancel_job(job_id, home, grace_s=10.0)
    except JobError:
        pass


# -- processes and ports --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DownServerStandIn:
    """Holds a dead server's port and answers every request 503 (SGLang while it cannot serve), recording
    each request line: what a client sends while it believes the server is down, as events to wait for.

    Used as a context manager; it binds 127.0.0.1 only and stops its thread on exit.
    """

    def __init__(self, port: int) -> None:
        import http.server
        import threading

        self.requests: list[str] = []
        seen = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):  # HTTP/1.0: one request per connection
            def _answer(self) -> None:
                seen.append(f"{self.command} {self.path}")
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: object) -> None:  # quiet: the test reads .requests
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="down-server", daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

