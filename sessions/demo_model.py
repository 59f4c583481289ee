"""``eagle3-tui demo-model DIR``: a small, real, seeded causal LM made offline (DESIGN §7).

The folder holds what SGLang and transformers read from a model dir: ``config.json`` (a Llama or Qwen2
architecture that transformers implements, >= 8 layers so that ``[2, L//2, L-3]`` are three distinct
capture points), ``model.safetensors`` with seeded weights, ``generation_config.json``, and a real
``tokenizers`` byte-level BPE trained in-process on the built-in text below, saved as ``tokenizer.json``
+ ``tokenizer_config.json`` with a ChatML chat template, so that ``AutoTokenizer.from_pretrained(dir,
local_files_only=True).apply_chat_template(...)`` works.  The weights are drawn with plain torch under
the HF parameter names (transformers is not needed to write the folder, only to run it); torch,
safetensors and tokenizers are imported only inside `write_demo_model`.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from sessions import safe_files

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
# ChatML; the {% generation %} markers let transformers return an assistant-token mask.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Training text for the tokenizer: plain English about the product's own domain, so that demo prompts
# tokenize into sensible pieces.  Any text encodes anyway (byte-level alphabet).
_CORPUS = """\
The server is fired up and ready to roll. Loading safetensors checkpoint shards took a while.
Speculative decoding drafts several tokens with a small model and verifies them with the target model.
EAGLE-3 feeds the draft model with hidden states taken from three layers of the target: a low layer,
a middle layer and a high layer. The capture point of layer i is the input of decoder layer i.
Hidden states are written to a private directory, one file per request chunk, and collected later.
A chunked prefill splits a long prompt into several forward passes; each chunk has a prefix length.
The user asks a question and the assistant answers it. Hello! How are you today? I am fine, thank you.
What is the capital city of France? The capital city of France is Paris. Tell me a short story.
Once upon a time there was a tiny language model with eight layers and a hidden size of sixty four.
It could not say much, but it was very fast, and every forward pass was exactly the same each time.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2048 4096 8192. Punctuation: , . ; : ! ? ( ) [ ] { } " ' - _
Tensor parallel ranks share one batch. The scheduler runs the model; the detokenizer turns ids into text.
"""


class DemoModelError(ValueError):
    """The target folder cannot be used (not empty, not a folder, bad option)."""


def write_demo_model(
    directory: str | os.PathLike,
    *,
    arch: str = "llama",
    num_layers: int = 8,
    hidden_size: int = 64,
    vocab_size: int = 512,
    seed: int = 0,
    overwrite: bool = False,
    attention_heads: int | None = None,
    intermediate_size: int | None = None,
) -> Path:
    """Write the model folder; returns its path.  Refuses a non-empty folder unless ``overwrite``.

    ``attention_heads`` (of 16 dims each) and ``intermediate_size`` default to a full-width model
    (``hidden_size // 16`` heads, ``2 * hidden_size``).  Smaller values keep the real hidden size, so the
    dumps have a real model's width, with a forward that a CPU runs in a fraction of a second (the
    extraction bench's Llama-8B and Kimi shapes on a machine without a GPU)."""
    if arch not in ARCHITECTURES:
        raise DemoModelError(f"arch {arch!r} is not one of {', '.join(ARCHITECTURES)}")
    if num_layers < 8:
        raise DemoModelError(f"num_layers must be >= 8 (three distinct capture points), not {num_layers}")
    if hidden_size < 16 or hidden_size % 8:
        raise DemoModelError(f"hidden_size must be a multiple of 8 and >= 16, not {hidden_size}")
    if (attention_heads is not None and attention_heads < 1) or (intermediate_size is not None
                                                                  and intermediate_size < 1):
        raise DemoModelError(f"attention_heads ({attention_heads}) and intermediate_size ({intermediate_size}) "
                             "must be >= 1")
    if vocab_size < 300:
        raise DemoModelError(f"vocab_size must be >= 300 (256 bytes + merges + specials), not {vocab_size}")
    path = Path(directory).expanduser()
    if path.exists() and not path.is_dir():
        raise DemoModelError(f"{path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise DemoModelError(f"{path} is not empty (eagle3-tui demo-model {path} --force writes into it)")
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = _train_tokenizer(vocab_size)
    tokenizer.save(str(path / "tokenizer.json"))
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    real_vocab = tokenizer.get_vocab_size()
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|pad|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    (path / "special_tokens_map.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|pad|>",
    }, indent=2) + "\n")

    config = _config(arch, num_layers, hidden_size, real_vocab, ids)
    if attention_heads is not None:
        config.update({"num_attention_heads": attention_heads, "num_key_value_heads": max(1, attention_heads // 2),
                       "head_dim": 16})
    if intermediate_size is not None:
        config["intermediate_size"] = intermediate_size
    state = _weights(config, seed, spoken_token_ids(tokenizer))
    from safetensors.torch import save_file

    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (path / "generation_config.json").write_text(json.dumps({
        "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|pad|>"], "do_sample": False,
    }, indent=2) + "\n")
    return path


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    return tokenizer


_WORD_RE = re.compile(r" [A-Za-z]+")


def spoken_token_ids(tokenizer: Any) -> list[int]:
    """The ids the model's output head may pick: whole words with their leading space (" model").

    A seeded random head picks byte pieces and special tokens as readily as words, and its greedy text then
    does not survive the trip through text (a lone UTF-8 byte decodes to U+FFFD; a special token is dropped
    by the detokenizer), so a dataset of its own answers would re-tokenize into other ids.  Each of these
    is its own pre-token and encodes back to itself, so any sequence of them round-trips: the answers
    stored as text are the ids the model chose, and ``extract verify --lm-head-check`` can hold there.
    """
    kept = []
    for token_id in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([token_id])
        if _WORD_RE.fullmatch(text) and tokenizer.encode(text).ids == [token_id]:
            kept.append(token_id)
    return kept


def _config(arch: str, num_layers: int, hidden_size: int, vocab: int, ids: dict[str, int]) -> dict:
    heads = max(2, hidden_size // 16)
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "head_dim": hidden_size // heads,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|pad|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.1,  # larger than HF's 0.02 so the layers visibly change the residual
    }
    if arch == "llama":
        config.update({"attention_bias": False, "mlp_bias": False})
    return config


def _weights(config: dict, seed: int, spoken_ids: list[int] | None = None) -> dict:
    """Seeded bf16 weights under the HF Llama/Qwen2 parameter names (plain torch: no transformers import).

    Linear and embedding weights ~ N(0, initializer_range), norms = 1, Qwen2's q/k/v biases small.  The
    lm_head rows of every id outside ``spoken_ids`` are zero (see `spoken_token_ids`): their logit is 0,
    and the largest of the ~75 random word logits is above 0 for every practical input, so greedy decoding
    speaks words only.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    std = float(config["initializer_range"])
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config["head_dim"]
    q_out, kv_out = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    state = {"model.embed_tokens.weight": normal(vocab, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state[p + "self_attn.q_proj.weight"] = normal(q_out, h)
        state[p + "self_attn.k_proj.weight"] = normal(kv_out, h)
        state[p + "self_attn.v_proj.weight"] = normal(kv_out, h)
        state[p + "self_attn.o_proj.weight"] = normal(h, q_out)
        if config["model_type"] == "qwen2":  # Qwen2 attention has q/k/v biases
            state[p + "self_attn.q_proj.bias"] = normal(q_out)
            state[p + "self_attn.k_proj.bias"] = normal(kv_out)
            state[p + "self_attn.v_proj.bias"] = normal(kv_out)
        state[p + "mlp.gate_proj.weight"] = normal(inter, h)
        state[p + "mlp.up_proj.weight"] = normal(inter, h)
        state[p + "mlp.down_proj.weight"] = normal(h, inter)
        state[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        state[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    # The final norm's gains are seeded and far from 1 (log-normal), as a trained model's are: with gains
    # of 1 the pre-norm state is the post-norm one times a positive scalar and has the same top-1, so
    # `--lm-head-check` could not tell a pre-norm capture from the right one.
    state["model.norm.weight"] = torch.exp(torch.randn(h, generator=gen)).to(torch.bfloat16)
    if not config.get("tie_word_embeddings"):
        head = normal(vocab, h)
        if spoken_ids:
            keep = torch.zeros(vocab, dtype=torch.bool)
            keep[torch.tensor(spoken_ids, dtype=torch.int64)] = True
            head[~keep] = 0
        state["lm_head.weight"] = head
    return state


def write_eagle3_draft(
    directory: str | os.PathLike,
    target_dir: str | os.PathLike,
    *,
    draft_vocab_size: int | None = None,
    seed: int = 1,
    overwrite: bool = False,
) -> Path:
    """Write an EAGLE-3 draft for the model in ``target_dir``, shaped as SpecForge saves one.

    ``config.json``: one decoder layer, ``architectures = ["LlamaForCausalLMEagle3"]``, the target's
    hidden size, heads and vocab, and ``draft_vocab_size``; ``model.safetensors``: ``fc`` (3 x hidden ->
    hidden: the three captured layers), ``midlayer.*`` (attention reads [embedding, hidden] = 2 x hidden),
    ``norm``, ``lm_head`` over the draft vocab, and the vocab maps ``d2t`` (draft id -> target id offset)
    and ``t2d`` (which target ids the draft can propose).  The weights are seeded noise: the draft is not
    trained, so its acceptance is whatever ``[emulator] spec_accept_length`` says.
    """
    target = safe_files.read_json(Path(target_dir).expanduser() / "config.json", safe_files.MODEL_CONFIG)
    vocab = int(target["vocab_size"])
    draft_vocab = int(draft_vocab_size or max(1, vocab // 2))
    if not 0 < draft_vocab <= vocab:
        raise DemoModelError(f"draft_vocab_size must be in 1..{vocab} (the target's vocab), not {draft_vocab}")
    path = Path(directory).expanduser()
    if path.exists() and not path.is_dir():
        raise DemoModelError(f"{path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise DemoModelError(f"{path} is not empty (eagle3-tui demo-model {path} --force writes into it)")
    path.mkdir(parents=True, exist_ok=True)
    h = int(target["hidden_size"])
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": target.get("bos_token_id"),
        "eos_token_id": target.get("eos_token_id"),
        "head_dim": int(target.get("head_dim") or h // int(target["num_attention_heads"])),
        "hidden_act": "silu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": int(target.get("intermediate_size") or 4 * h),
        "max_position_embeddings": int(target.get("max_position_embeddings") or 4096),
        "model_type": "llama",
        "num_attention_heads": int(target["num_attention_heads"]),
        "num_hidden_layers": 1,
        "num_key_value_heads": int(target.get("num_key_value_heads") or target["num_attention_heads"]),
        "pad_token_id": target.get("pad_token_id"),
        "rms_norm_eps": float(target.get("rms_norm_eps") or 1e-6),
        "rope_scaling": None,
        "rope_theta": float(target.get("rope_theta") or 10000.0),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
    }
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    std = config["initializer_range"]
    head_dim = config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    inter = config["intermediate_size"]

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    ones = torch.ones(h, dtype=torch.bfloat16)
    state = {
        "fc.weight": normal(h, 3 * h),
        "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.input_layernorm.weight": ones.clone(),
        "midlayer.self_attn.q_proj.weight": normal(q_out, 2 * h),
        "midlayer.self_attn.k_proj.weight": normal(kv_out, 2 * h),
        "midlayer.self_attn.v_proj.weight": normal(kv_out, 2 * h),
        "midlayer.self_attn.o_proj.weight": normal(h, q_out),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "midlayer.mlp.gate_proj.weight": normal(inter, h),
        "midlayer.mlp.up_proj.weight": normal(inter, h),
        "midlayer.mlp.down_proj.weight": normal(h, inter),
        "norm.weight": ones.clone(),
        "lm_head.weight": normal(draft_vocab, h),
        # The draft vocab is the first draft_vocab target ids: offset 0 for each, and those ids marked.
        "d2t": torch.zeros(draft_vocab, dtype=torch.int64),
        "t2d": torch.arange(vocab) < draft_vocab,
    }
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path
