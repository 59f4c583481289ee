"""The demo home (DESIGN §1b): ready-made emulator profiles, a config-only Kimi-K2.5-shaped model dir, and
the capture + extraction demo (a tiny real model, a capture profile, a dataset and a job spec).

`eagle3-tui --demo` needs no GPU, no SGLang and no network: every profile uses `launcher = "emulator"`,
which runs `python -m sessions.emulator` through the same launch path as a real server.  Creating the
demo home is idempotent and never overwrites a file the user has edited.

The capture demo needs torch, transformers, safetensors and tokenizers (the emulator runs real forwards).
The TUI process must never import torch (TEAM rules), so the tiny model is written by a child process
(``python -m sessions.demo --write-model DIR``); without those packages the capture demo is skipped and
`demo_note` says why in one line the TUI can show.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from sessions import safe_files
from sessions.home import Home, atomic_write_text, ensure_private_dir, resolve_home

HEALTHY_PROFILE = "kimi-k25-tp8"
HANG_PROFILE = "kimi-k25-hang-after-weights"
CAPTURE_PROFILE = "tiny-llama-capture"  # only with torch & co. (see `capture_demo_missing`)
EAGLE3_PROFILE = "tiny-llama-eagle3"  # tiny-llama served with its EAGLE-3 draft (same packages)
PLAIN_PROFILE = "tiny-llama"  # tiny-llama served plainly: the A side of `bench compare` against the drafter
# The profiles every demo home has, in the order the TUI lists them (the capture profile, when there, is
# listed after them: its name sorts after theirs).
DEMO_PROFILES = (HEALTHY_PROFILE, HANG_PROFILE)
DEMO_TITLES = {
    HEALTHY_PROFILE: "Kimi-K2.5-like TP8",
    HANG_PROFILE: "Kimi-K2.5-like TP8, hangs after weights",
    CAPTURE_PROFILE: "Tiny real Llama model (8 layers, hidden 64), TP1, capture on",
    EAGLE3_PROFILE: "Tiny real Llama model served with its EAGLE-3 draft (speculative decoding)",
    PLAIN_PROFILE: "Tiny real Llama model served without a drafter (compare with tiny-llama-eagle3)",
}
MODEL_DIR_NAME = "kimi-k25-like"
TINY_MODEL_DIR_NAME = "tiny-llama"
TINY_DRAFT_DIR_NAME = "tiny-llama-eagle3"
DEMO_JOB_NAME = "demo-extract"
DEMO_DATASET_NAME = "demo-chats.jsonl"
DEMO_MALFORMED_LINE = 13  # 1-based line of the deliberately broken dataset line (shows in errors.jsonl)
_CAPTURE_PACKAGES = ("torch", "transformers", "safetensors", "tokenizers")
_NOTE_FILE = "capture-demo-skipped.txt"  # in the demo root; present while the capture demo is missing
_MODEL_WRITE_TIMEOUT_S = 600.0
# The demo's tiny model (sessions.demo_model.write_demo_model): its answers in sessions/data come from it.
TINY_MODEL_SHAPE: dict[str, Any] = {"arch": "llama", "num_layers": 8, "hidden_size": 64, "seed": 0}
Progress = Callable[[str], None]  # one line about a slow step of building the demo home

# The shape of moonshotai/Kimi-K2.5's config.json: a multimodal wrapper whose text model (DeepSeek-V3
# architecture, 61 layers, hidden 7168) sits under `text_config` (DESIGN §2 asks readers to handle both).
KIMI_K25_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "torch_dtype": "bfloat16",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 163840,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
    },
    "vision_config": {"model_type": "moonvit", "hidden_size": 1152, "num_hidden_layers": 27},
}

_PROFILE_TEMPLATE = """\
# {title}: a demo profile; the emulator stands in for SGLang (no GPU, no SGLang, no network).
[server]
launcher = "emulator"
model_path = "{model_path}"
tp_size = 8
host = "127.0.0.1"
port = {port}
mem_fraction_static = 0.85
extra_args = ["--trust-remote-code"]

[server.env]
NCCL_ALGO = "Ring"

[watch]
stall_after_s = {stall_after_s}

[emulator]
time_scale = {time_scale}
fault = "{fault}"
# single-stream decode rate: the seeds' Kimi-K2.5 TP8 measured 90 tok/s under SGLang
decode_tokens_per_s = 90
"""

# Not SGLang's default 30000: a real server of the user may be there.  Taken ports are replaced by free ones
# when the demo home is created (a port taken later is reported, with its owner, at launch).
class _EmulatorProfileValues(TypedDict):
    """What differs between the two emulator demo profiles (fills _PROFILE_TEMPLATE)."""

    port: int
    stall_after_s: int
    time_scale: float
    fault: str


_PROFILES: dict[str, _EmulatorProfileValues] = {
    HEALTHY_PROFILE: {"port": 31000, "stall_after_s": 120, "time_scale": 0.05, "fault": "none"},
    HANG_PROFILE: {"port": 31010, "stall_after_s": 20, "time_scale": 0.05, "fault": "hang-after-weights"},
}

_CAPTURE_PROFILE_TEMPLATE = """\
# {title}: a demo profile.
# The emulator runs real forwards of the tiny model and writes hidden-state dumps through the same
# writer as the SGLang plugin.  The capture layers are left to SGLang's default ([2, L//2, L-3]) and
# the radix cache to its default (capture turns it off).  The demo job spec points at this port and
# capture dir; change them together: {job_spec}
[server]
launcher = "emulator"
model_path = "{model_path}"
tp_size = 1
host = "127.0.0.1"
port = {port}

[capture]
enabled = true
dir = "{capture_dir}"

[watch]
stall_after_s = 60

[emulator]
time_scale = 0.02
fault = "none"
"""
_CAPTURE_PORT = 31020

_EAGLE3_PROFILE_TEMPLATE = """\
# {title}.
# SGLang's EAGLE3 flags with the demo's draft (one decoder layer, made like a SpecForge checkpoint); the
# draft is untrained, so how many drafted tokens are accepted is the emulator's setting
# `spec_accept_length` (mean tokens per verify step, the bonus token included; 1 to num-draft-tokens).
[server]
launcher = "emulator"
model_path = "{model_path}"
tp_size = 1
host = "127.0.0.1"
port = {port}
# GPU 1 (--base-gpu-id), not tiny-llama's GPU 0: the two fit side by side, so `bench compare` launches
# each once and alternates its rounds between them.
extra_args = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "{draft_path}", \
"--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", \
"--base-gpu-id", "1"]

[watch]
stall_after_s = 60

[emulator]
time_scale = 0.02
fault = "none"
# The same modelled single-stream rate as tiny-llama, so that `bench compare tiny-llama tiny-llama-eagle3`
# compares like with like: slow enough that the tiny model's real forwards on a busy CPU (one per accepted
# token) fit inside each modelled step.
decode_tokens_per_s = 20
spec_accept_length = 3.0
"""
_EAGLE3_PORT = 31030

_PLAIN_PROFILE_TEMPLATE = """\
# {title}.
# The A side of the demo's speculative A/B:  eagle3-tui --demo bench compare tiny-llama tiny-llama-eagle3
[server]
launcher = "emulator"
model_path = "{model_path}"
tp_size = 1
host = "127.0.0.1"
port = {port}

[watch]
stall_after_s = 60

[emulator]
time_scale = 0.02
fault = "none"
# tiny-llama-eagle3's rate (see there): what changes between the two is the drafter only
decode_tokens_per_s = 20
"""
_PLAIN_PORT = 31040

_JOB_SPEC_TEMPLATE = """\
# The demo extraction job: the demo dataset through profile {profile}'s server
# (launch it first: select it on the dashboard and press l), written as SpecForge training data
# under {output_root}.
# In the TUI: x opens the jobs screen, n starts this spec (Enter).  From a shell:
#   eagle3-tui --demo extract run {spec_path}
# A second run needs an empty output_dir: delete the old one, or change output_dir.
[job]
name = "{name}"
server_url = "http://127.0.0.1:{port}"
capture_dir = "{capture_dir}"
model_path = "{model_path}"
dataset = "{dataset}"
output_dir = "{output_dir}"
max_length = 1024
concurrency = 4
"""


# The demo pipeline (issue 25): the seed chats' answers (another model's) regenerated by the tiny model, then
# extracted; its output is the model's own greedy answers, so `extract verify --lm-head-check` passes on it.
DEMO_PIPELINE_NAME = "demo-regenerate-extract"
DEMO_SEED_DATASET_NAME = "demo-seed-chats.jsonl"
DEMO_PIPELINE_ROWS = 48  # the seed's first rows (its broken line among them): a regeneration of ~a minute

_PIPELINE_SPEC_TEMPLATE = """\
# The demo pipeline: regenerate, then extract.  Stage 1 rewrites every assistant turn of the seed chats
# (answers another model wrote) with the tiny model's own greedy answers, through profile {profile}'s
# /v1/chat/completions (launch it first: select it on the dashboard and press l).  Stage 2 extracts
# hidden states from the regenerated chats; the sample ids are the rows' ids.
# In the TUI: x opens the jobs screen, n starts a spec (this one is listed under Known specs).
# From a shell:
#   eagle3-tui --demo extract run {spec_path}
#   eagle3-tui --demo extract status PIPELINE_ID
#   eagle3-tui --demo extract verify {output_dir} --lm-head-check
# A second run needs fresh outputs: delete {output_root}/{regen_name} and the output_dir, or change them.
[regenerate]
name = "{regen_name}"
servers = ["http://127.0.0.1:{port}"]
dataset = "{seed}"
output = "{regen_output}"
num_samples = {rows}
window = 4
temperature = 0.0
max_tokens = 32

[extract]
name = "{extract_name}"
server_url = "http://127.0.0.1:{port}"
capture_dir = "{capture_dir}"
model_path = "{model_path}"
output_dir = "{output_dir}"
max_length = 1024
concurrency = 4
"""


def demo_pipeline_spec_path(home: Home) -> Path:
    """The demo's ready-to-run pipeline spec, regenerate then extract (with the capture demo only)."""
    return job_specs_dir(home) / f"{DEMO_PIPELINE_NAME}.toml"


def demo_regeneration_output(home: Home) -> Path:
    """The demo pipeline's regenerated chats (SpecForge's ``<out>.jsonl``; ``_error``/``_skipped`` beside)."""
    return demo_root(home) / "output" / "demo-regenerate" / "chats.jsonl"


def demo_pipeline_output_dir(home: Home) -> Path:
    """The demo pipeline's extraction output (hidden states of the regenerated chats)."""
    return demo_root(home) / "output" / "demo-pipeline-extract"


def demo_seed_rows() -> list[dict]:
    """The demo conversations with answers another model wrote: what the demo pipeline regenerates."""
    from sessions.demo_answers import fill_plans

    def another_models_answer(messages: list[dict[str, str]], _max_new_tokens: int) -> str:
        return f"Another model's answer to {messages[-1]['content']!r}, which the tiny model would never write."

    return fill_plans(demo_conversation_plans(), another_models_answer)


def demo_root(home: Home) -> Path:
    """The folder holding the demo's config and state roots (`<home>/demo`)."""
    return home.config_root.parent


def job_specs_dir(home: Home) -> Path:
    """Where job specs the user keeps live (``<config>/jobs``); the jobs screen lists its ``*.toml``."""
    return home.config_root / "jobs"


def demo_job_spec_path(home: Home) -> Path:
    """The demo's ready-to-run job spec (it exists only when the capture demo does)."""
    return job_specs_dir(home) / f"{DEMO_JOB_NAME}.toml"


def demo_capture_dir(home: Home) -> Path:
    return demo_root(home) / "capture"


def demo_output_dir(home: Home) -> Path:
    return demo_root(home) / "output" / DEMO_JOB_NAME


def tiny_model_dir(home: Home) -> Path:
    return demo_root(home) / "models" / TINY_MODEL_DIR_NAME


def tiny_draft_dir(home: Home) -> Path:
    """The EAGLE-3 draft of the tiny model (``<demo home>/models/tiny-llama-eagle3``)."""
    return demo_root(home) / "models" / TINY_DRAFT_DIR_NAME


def ensure_demo_home(home: Home | None = None, progress: Progress | None = None) -> Home:
    """Create (once) the demo home with its profiles, model dirs, dataset and job spec; returns the demo
    `Home`.  Files that exist are kept as they are (the user may have edited them).  ``progress`` gets one
    line per slow step (the first start writes the tiny model: seconds, which a terminal must not spend
    blank)."""
    started = time.monotonic()
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        (progress or _quiet)(line)

    home = (home or resolve_home(demo=True)).ensure()
    model_dir = ensure_private_dir(demo_root(home) / "models" / MODEL_DIR_NAME)
    config_path = model_dir / "config.json"
    if not config_path.exists():
        atomic_write_text(config_path, json.dumps(KIMI_K25_CONFIG, indent=2) + "\n", mode=0o644)
    for name, values in _PROFILES.items():
        path = home.profiles_dir / f"{name}.toml"
        if path.exists():  # the user may have edited it in the demo; keep their version
            continue
        filled = dict(values, port=_usable_port(values["port"]))
        text = _PROFILE_TEMPLATE.format(title=DEMO_TITLES[name], model_path=_toml_string(model_dir), **filled)
        atomic_write_text(path, text)
    _ensure_capture_demo(home, say)
    if said and progress is not None:
        progress(f"demo home ready in {time.monotonic() - started:.1f} s: {demo_root(home)}")
    return home


def _quiet(_line: str) -> None:
    """The default `Progress`: say nothing."""


def say_on_stderr(line: str) -> None:
    """The `Progress` of the CLI and the TUI: a line on the terminal before anything else is drawn (stderr:
    stdout stays for a command's own output)."""
    try:
        print(f"eagle3-tui: {line}", file=sys.stderr, flush=True)
    except OSError:  # no terminal any more (a hangup): the work goes on without the line
        pass


def demo_note(home: Home) -> str | None:
    """One line for the TUI when the capture + extraction demo was skipped (why), else None."""
    try:
        text = safe_files.read_text(demo_root(home) / _NOTE_FILE, safe_files.NOTE, errors="replace").strip()
    except OSError:
        return None
    return text.splitlines()[0] if text else None


def capture_demo_missing() -> list[str]:
    """The packages the capture demo needs that cannot be found (found without importing them)."""
    missing = []
    for name in _CAPTURE_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


# -- the capture + extraction demo ---------------------------------------------------------------------
def _ensure_capture_demo(home: Home, progress: Progress) -> None:
    note_path = demo_root(home) / _NOTE_FILE
    model_dir = tiny_model_dir(home)
    draft_dir = tiny_draft_dir(home)
    if not (model_dir / "model.safetensors").is_file():
        missing = capture_demo_missing()
        if missing:
            _write_note(note_path, f"Capture demo skipped: {', '.join(missing)} not installed (the tiny real "
                        f"model needs torch, transformers, safetensors and tokenizers); the Kimi demos work.")
            return
        progress(f"first start: writing the demo's tiny model and its EAGLE-3 draft under {model_dir.parent} "
                 "(once, a few seconds)")
        problem = _write_tiny_model(model_dir, draft_dir)
        if problem:
            _write_note(note_path, f"Capture demo skipped: making the tiny model failed: {problem}")
            return
    note_path.unlink(missing_ok=True)
    _ensure_eagle3_demo(home, model_dir)
    capture_dir = ensure_private_dir(demo_capture_dir(home))
    profile_path = home.profiles_dir / f"{CAPTURE_PROFILE}.toml"
    spec_path = demo_job_spec_path(home)
    if not profile_path.exists():
        port = _usable_port(_CAPTURE_PORT)
        atomic_write_text(profile_path, _CAPTURE_PROFILE_TEMPLATE.format(
            title=DEMO_TITLES[CAPTURE_PROFILE], model_path=_toml_string(model_dir), port=port,
            capture_dir=_toml_string(capture_dir), job_spec=_toml_string(spec_path)))
    dataset = ensure_private_dir(demo_root(home) / "datasets") / DEMO_DATASET_NAME
    if not dataset.exists():
        answers = _demo_answers(model_dir, progress)
        if isinstance(answers, str):
            _write_note(note_path, f"Extraction demo skipped: {answers}")
            return
        atomic_write_text(dataset, demo_dataset_text(answers), mode=0o644)
    _ensure_pipeline_demo(home, capture_dir, model_dir)
    if not spec_path.exists():
        ensure_private_dir(spec_path.parent)
        port, capture = _capture_profile_endpoint(home, capture_dir)
        output = demo_output_dir(home)
        atomic_write_text(spec_path, _JOB_SPEC_TEMPLATE.format(
            profile=CAPTURE_PROFILE, output_root=_toml_string(output.parent), spec_path=_toml_string(spec_path),
            name=DEMO_JOB_NAME, port=port, capture_dir=_toml_string(capture), model_path=_toml_string(model_dir),
            dataset=_toml_string(dataset), output_dir=_toml_string(output)))


def _ensure_pipeline_demo(home: Home, capture_dir: Path, model_dir: Path) -> None:
    """The seed chats and the pipeline spec that regenerates them, then extracts (each written once)."""
    seed = demo_root(home) / "datasets" / DEMO_SEED_DATASET_NAME
    if not seed.exists():
        atomic_write_text(seed, demo_dataset_text(rows=demo_seed_rows()), mode=0o644)
    spec_path = demo_pipeline_spec_path(home)
    if spec_path.exists():
        return
    ensure_private_dir(spec_path.parent)
    port, capture = _capture_profile_endpoint(home, capture_dir)
    output = demo_pipeline_output_dir(home)
    regen_output = demo_regeneration_output(home)
    atomic_write_text(spec_path, _PIPELINE_SPEC_TEMPLATE.format(
        profile=CAPTURE_PROFILE, spec_path=_toml_string(spec_path), output_dir=_toml_string(output),
        output_root=_toml_string(output.parent), regen_name="demo-regenerate", port=port, seed=_toml_string(seed),
        regen_output=_toml_string(regen_output), rows=DEMO_PIPELINE_ROWS, extract_name="demo-pipeline-extract",
        capture_dir=_toml_string(capture), model_path=_toml_string(model_dir)))


def _capture_profile_endpoint(home: Home, default_dir: Path) -> tuple[int, Path]:
    """The port and capture dir of the (possibly edited) capture profile, for the job spec."""
    try:
        from sessions.profiles import load_profile
        from sessions.profiles.capture_launch import capture_dir

        profile = load_profile(CAPTURE_PROFILE, home)
        return profile.server.port, Path(capture_dir(profile))
    except Exception:  # noqa: BLE001 - a profile the user broke: the spec still gets the demo's values
        return _CAPTURE_PORT, default_dir


def _write_note(path: Path, text: str) -> None:
    atomic_write_text(path, text.replace("\n", " ") + "\n", mode=0o644)


def _ensure_eagle3_demo(home: Home, model_dir: Path) -> None:
    """The tiny model's EAGLE-3 draft and the profile that serves the model with it."""
    draft_dir = tiny_draft_dir(home)
    if not (draft_dir / "model.safetensors").is_file():
        problem = _write_tiny_model(draft_dir, target_dir=model_dir)
        if problem:
            _write_note(demo_root(home) / _NOTE_FILE, f"EAGLE-3 demo skipped: making the draft failed: {problem}")
            return
    profile_path = home.profiles_dir / f"{EAGLE3_PROFILE}.toml"
    if not profile_path.exists():
        atomic_write_text(profile_path, _EAGLE3_PROFILE_TEMPLATE.format(
            title=DEMO_TITLES[EAGLE3_PROFILE], model_path=_toml_string(model_dir),
            draft_path=_toml_string(draft_dir), port=_usable_port(_EAGLE3_PORT)))
    plain_path = home.profiles_dir / f"{PLAIN_PROFILE}.toml"
    if not plain_path.exists():
        atomic_write_text(plain_path, _PLAIN_PROFILE_TEMPLATE.format(
            title=DEMO_TITLES[PLAIN_PROFILE], model_path=_toml_string(model_dir),
            port=_usable_port(_PLAIN_PORT)))


def _write_tiny_model(model_dir: Path, draft_dir: Path | None = None, target_dir: Path | None = None) -> str | None:
    """Write the tiny model (and, with ``draft_dir``, its EAGLE-3 draft there too; with ``target_dir``,
    only a draft of that model into ``model_dir``) in one child process, so torch is imported once and
    stays out of this one; None, or what went wrong.  Each folder appears complete or not at all."""
    parent = ensure_private_dir(model_dir.parent)
    staging = parent / f".{model_dir.name}.tmp-{os.getpid()}"
    draft_staging = parent / f".{draft_dir.name}.tmp-{os.getpid()}" if draft_dir is not None else None
    if target_dir is not None:
        args = ["--write-eagle3-draft", str(staging), "--target", str(target_dir)]
    else:
        args = ["--write-model", str(staging)]
        if draft_staging is not None:
            args += ["--with-eagle3-draft", str(draft_staging)]
    stagings = [p for p in (staging, draft_staging) if p is not None]
    for path in stagings:
        shutil.rmtree(path, ignore_errors=True)
    problem = _run_child(parent, args)
    if problem is None and not all((p / "model.safetensors").is_file() for p in stagings):
        problem = "the child process wrote no model.safetensors"
    if problem:
        for path in stagings:
            shutil.rmtree(path, ignore_errors=True)
        return problem
    moves = [(staging, model_dir)] + ([(draft_staging, draft_dir)] if draft_staging and draft_dir else [])
    for made, final in moves:
        shutil.rmtree(final, ignore_errors=True)  # a partial folder from an interrupted earlier run
        os.replace(made, final)  # complete or absent: `model.safetensors` marks a finished model
    return None


def _run_child(cwd: Path, args: list[str]) -> str | None:
    """``python -m sessions.demo ARGS`` (the torch side of the demo); None, or its last error line."""
    project_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (project_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    try:
        proc = subprocess.run([sys.executable, "-m", "sessions.demo", *args],
                              cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                              timeout=_MODEL_WRITE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr or proc.stdout or "").splitlines() if line.strip()]
        return lines[-1].strip() if lines else f"exit status {proc.returncode}"
    return None


# Subjects of the demo conversations; combined in code so there is no data file to ship.  The answers are
# the demo model's own (sessions.demo_answers): what a regeneration job would write.
_TOPICS = (
    "the capital of France", "speculative decoding", "EAGLE-3 hidden states", "a chunked prefill",
    "tensor parallel ranks", "the detokenizer", "a tiny language model", "the capture directory", "counting",
)
_OPENERS = ("Hello! Tell me about {t}.", "What is {t}?", "Explain {t} in one sentence.",
            "How are you today? I would like to know about {t}.")
_FIRST_ANSWER_TOKENS = 20  # a second answer gets 16, 32, 48 or 64: samples of different lengths


DEMO_DATASET_ROWS = 720  # enough for the demo job to run ~10-30 s: time to watch it, kill it, resume it


def demo_conversation_plans() -> list[tuple[str, list[dict]]]:
    """(row id, ShareGPT turns) with each assistant turn a ``{"from": "gpt", "max_new_tokens": n}`` slot:
    one- and two-turn chats, some with a system prompt, of different lengths."""
    plans = []
    for i in range(DEMO_DATASET_ROWS):
        topic = _TOPICS[i % len(_TOPICS)]
        turns: list[dict] = []
        if i % 5 == 0:
            turns.append({"from": "system", "value": "You are a helpful assistant. Answer briefly."})
        turns += [{"from": "human", "value": _OPENERS[i % len(_OPENERS)].format(t=topic)},
                  {"from": "gpt", "max_new_tokens": _FIRST_ANSWER_TOKENS}]
        if i % 3 == 1:  # a second turn makes a longer sample with two supervised spans
            turns += [{"from": "human", "value": f"Thank you. And {_TOPICS[(i + 4) % len(_TOPICS)]}?"},
                      {"from": "gpt", "max_new_tokens": 16 * (1 + i % 4)}]
        plans.append((f"demo-{i:03d}", turns))
    return plans


def demo_dataset_rows(answers: dict[str, str] | None = None) -> list[dict]:
    """The demo's ShareGPT rows, their answers from ``answers`` (an answer book; default: the committed one)."""
    from sessions.demo_answers import book_answer, fill_plans, load_book

    return fill_plans(demo_conversation_plans(), book_answer(answers if answers is not None else load_book()[1]))


def demo_dataset_text(answers: dict[str, str] | None = None, rows: list[dict] | None = None) -> str:
    """The demo dataset as JSONL (``rows``, else the rows of ``answers``), with line `DEMO_MALFORMED_LINE`
    deliberately broken (not JSON)."""
    lines = [json.dumps(row) for row in (rows if rows is not None else demo_dataset_rows(answers))]
    lines.insert(DEMO_MALFORMED_LINE - 1,
                 '{"id": "demo-broken", "conversations": [{"from": "human", "value": "this line is cut off')
    return "\n".join(lines) + "\n"


def _demo_answers(model_dir: Path, progress: Progress) -> dict[str, str] | str:
    """The answer book for the model in ``model_dir``: the committed one when it was made from these very
    model files, else generated now by a child process (torch stays out of this one); or what went wrong."""
    from sessions.demo_answers import load_book, model_fingerprint

    fingerprint, book = load_book()
    try:
        if fingerprint is not None and fingerprint == model_fingerprint(model_dir):
            return book
    except OSError as exc:
        return f"cannot read the tiny model: {exc}"
    progress("the tiny model differs from the one the committed answers came from (another torch?): "
             "generating its own answers for the demo dataset (once, about half a minute)")
    out = model_dir.parent / f".demo-answers.tmp-{os.getpid()}.json"
    try:
        problem = _run_child(model_dir.parent, ["--write-answers", str(model_dir), "--out", str(out)])
        if problem:
            return f"generating the demo answers failed: {problem}"
        return load_book(out)[1] or "generating the demo answers failed: no answers written"
    finally:
        out.unlink(missing_ok=True)


def _usable_port(preferred: int) -> int:
    """``preferred`` when it can be bound on 127.0.0.1 now, else a free port."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            pass
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _toml_string(path: Path) -> str:
    return str(path).replace("\\", "\\\\").replace('"', '\\"')


def main(argv: list[str] | None = None) -> int:
    """``python -m sessions.demo --write-model DIR [--with-eagle3-draft DIR2]`` (or ``--write-eagle3-draft
    DIR --target DIR``, or ``--write-answers MODEL_DIR --out FILE``): the child process that writes the
    tiny model (and its EAGLE-3 draft), or the demo dataset's answers (sessions.demo_answers)."""
    parser = argparse.ArgumentParser(prog="python -m sessions.demo")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--write-model", metavar="DIR", help="write the demo's tiny model here")
    which.add_argument("--write-eagle3-draft", metavar="DIR", help="write an EAGLE-3 draft of --target here")
    which.add_argument("--write-answers", metavar="MODEL_DIR",
                       help="generate the demo dataset's answers with this model into --out")
    parser.add_argument("--with-eagle3-draft", metavar="DIR", help="with --write-model: also write its draft")
    parser.add_argument("--target", metavar="DIR", help="the target model dir of --write-eagle3-draft")
    parser.add_argument("--out", metavar="FILE", help="the answers file of --write-answers")
    args = parser.parse_args(argv)
    from sessions.demo_model import write_demo_model, write_eagle3_draft

    if args.write_answers:
        if not args.out:
            parser.error("--write-answers needs --out FILE")
        from sessions.demo_answers import write_book

        write_book(args.write_answers, demo_conversation_plans(), Path(args.out),
                   log=lambda line: print(line, file=sys.stderr))
        return 0
    if args.write_eagle3_draft:
        if not args.target:
            parser.error("--write-eagle3-draft needs --target DIR")
        write_eagle3_draft(args.write_eagle3_draft, args.target, seed=1)
        return 0
    write_demo_model(args.write_model, **TINY_MODEL_SHAPE)
    if args.with_eagle3_draft:
        write_eagle3_draft(args.with_eagle3_draft, args.write_model, seed=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
