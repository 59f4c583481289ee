"""The demo home (DESIGN §1b): ready-made emulator profiles and a config-only Kimi-K2.5-shaped model dir.

`eagle3-tui --demo` needs no GPU, no SGLang and no network: both profiles use `launcher = "emulator"`,
which runs `python -m sessions.emulator` through the same launch path as a real server.  Creating the
demo home is idempotent and never overwrites a profile the user has edited.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from sessions.home import Home, atomic_write_text, ensure_private_dir, resolve_home

HEALTHY_PROFILE = "kimi-k25-tp8"
HANG_PROFILE = "kimi-k25-hang-after-weights"
DEMO_PROFILES = (HEALTHY_PROFILE, HANG_PROFILE)  # in the order the TUI lists them
DEMO_TITLES = {
    HEALTHY_PROFILE: "Kimi-K2.5-like TP8",
    HANG_PROFILE: "Kimi-K2.5-like TP8, hangs after weights",
}
MODEL_DIR_NAME = "kimi-k25-like"

# The shape of moonshotai/Kimi-K2.5's config.json: a multimodal wrapper whose text model (DeepSeek-V3
# architecture, 61 layers, hidden 7168) sits under `text_config` (DESIGN §2 asks readers to handle both).
_KIMI_K25_CONFIG = {
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
"""

# Not SGLang's default 30000: a real server of the user may be there.  Taken ports are replaced by free ones
# when the demo home is created (a port taken later is reported, with its owner, at launch).
_PROFILES = {
    HEALTHY_PROFILE: {"port": 31000, "stall_after_s": 120, "time_scale": 0.05, "fault": "none"},
    HANG_PROFILE: {"port": 31010, "stall_after_s": 20, "time_scale": 0.05, "fault": "hang-after-weights"},
}


def demo_root(home: Home) -> Path:
    """The folder holding the demo's config and state roots (`<home>/demo`)."""
    return home.config_root.parent


def ensure_demo_home(home: Home | None = None) -> Home:
    """Create (once) the demo home with its profiles and model dir; returns the demo `Home`."""
    home = (home or resolve_home(demo=True)).ensure()
    model_dir = ensure_private_dir(demo_root(home) / "models" / MODEL_DIR_NAME)
    config_path = model_dir / "config.json"
    if not config_path.exists():
        atomic_write_text(config_path, json.dumps(_KIMI_K25_CONFIG, indent=2) + "\n", mode=0o644)
    for name, values in _PROFILES.items():
        path = home.profiles_dir / f"{name}.toml"
        if path.exists():  # the user may have edited it in the demo; keep their version
            continue
        values = dict(values, port=_usable_port(values["port"]))
        text = _PROFILE_TEMPLATE.format(title=DEMO_TITLES[name], model_path=_toml_string(model_dir), **values)
        atomic_write_text(path, text)
    return home


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
