"""A profile -> the exact argv and env changes of its launch, in one downward pass (capture adds its flags here)."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any

from sessions.profiles.model import (
    _PER_PHASE_GRAPH_FLAGS,
    EMULATOR_MODULE,
    SGLANG_MODULE,
    EmulatorSection,
    LaunchProfile,
)
from sessions.redaction import REDACTED, is_secret_name, redact_argv, redact_text, secret_values

# --- argv and env ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchCommand:
    """What a launch runs: ``argv`` and the variables added to (or changed in) the inherited environment."""

    argv: list[str]
    env_changes: dict[str, str]

    def shell_text(self, redacted: bool = True) -> str:
        """``KEY=value`` lines for the env changes, then the ``shlex.join``-ed command.  With ``redacted``,
        secret env values (by name or by shape) and secret flag values are replaced by ``***``, also where
        a secret value reappears elsewhere in the command."""
        known = secret_values(self.env_changes) if redacted else []
        lines = []
        for name, value in self.env_changes.items():
            if redacted:
                value = REDACTED if (is_secret_name(name) and value) else redact_text(value, known)
            lines.append(f"{name}={shlex.quote(value)}")
        argv = [redact_text(a, known) for a in redact_argv(self.argv)] if redacted else list(self.argv)
        lines.append(shlex.join(argv))
        return "\n".join(lines)


class _Lookup:
    """Sentinel: find the profile's SGLang when it matters."""


LOOKUP = _Lookup()


def build_command(profile: LaunchProfile, *, sglang: Any = LOOKUP) -> LaunchCommand:
    """The argv and env changes for ``profile``.

    ``sglang``: the `SglangSource` to consult for version-dependent spellings (per-phase CUDA graph
    flags); by default it is looked up in the profile's Python only when needed (``cuda_graph = false``),
    which runs that Python once (cached briefly) - call this off a UI thread.
    """
    s = profile.server
    module = EMULATOR_MODULE if s.launcher == "emulator" else SGLANG_MODULE
    argv = [
        os.path.expanduser(s.python),
        "-m",
        module,
        "--model-path",
        os.path.expanduser(s.model_path),
        "--tp-size",
        str(s.tp_size),
        "--host",
        s.host,
        "--port",
        str(s.port),
    ]
    if s.dp_size > 1:
        argv += ["--dp-size", str(s.dp_size)]
    if s.attention_backend:
        argv += ["--attention-backend", s.attention_backend]
    if not s.cuda_graph:
        argv += _cuda_graph_off_flags(profile, sglang)
    if s.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", _number(s.mem_fraction_static)]
    if not s.radix_cache:
        argv.append("--disable-radix-cache")
    if s.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(s.chunked_prefill_size)]
    argv += list(s.extra_args)
    env = dict(s.env)
    capture_argv, capture_env = _capture_additions(profile)
    argv += [a for a in capture_argv if not (a in _BARE_FLAGS_SET_BY_FIELDS and a in argv)]
    for name, value in capture_env.items():
        if name == "PYTHONPATH" and env.get(name):
            value = os.pathsep.join([value, env[name]])  # the plugin dir first; the user's entries kept
        env[name] = value
    if s.launcher == "emulator":
        e = profile.emulator
        argv += ["--time-scale", _number(e.time_scale), "--emulate-fault", e.fault]
        if e.gpu_memory_gb is not None:
            argv += ["--emulate-gpu-memory-gb", _number(e.gpu_memory_gb)]
        if e.gpus != EmulatorSection().gpus or profile.is_explicit("emulator.gpus"):
            argv += ["--emulate-gpus", str(e.gpus)]
        if e.decode_tokens_per_s != EmulatorSection().decode_tokens_per_s or profile.is_explicit(
            "emulator.decode_tokens_per_s"
        ):
            argv += ["--emulate-decode-tokens-per-s", _number(e.decode_tokens_per_s)]
        for flag, spec_value in (("--emulate-spec-accept-length", e.spec_accept_length),
                                 ("--emulate-spec-draft-cost", e.spec_draft_cost),
                                 ("--emulate-spec-verify-cost", e.spec_verify_cost)):
            if spec_value is not None:
                argv += [flag, _number(spec_value)]
    return LaunchCommand(argv=argv, env_changes=env)


# Valueless flags that both a profile field and capture may emit: emitted once.
_BARE_FLAGS_SET_BY_FIELDS = frozenset({"--disable-radix-cache"})


def _number(value: float) -> str:
    """``0.85`` → ``"0.85"``, ``2.0`` → ``"2"`` (what a person would type)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _cuda_graph_off_flags(profile: LaunchProfile, sglang: Any) -> list[str]:
    # 0.5.23 split CUDA graphs per phase; `--disable-cuda-graph` still works there but is deprecated
    # (sglang/srt/server_args.py:409-416, arg_groups/fields/exec_.py:662-669).  Older SGLang has only it.
    if isinstance(sglang, _Lookup):
        from sessions.sglang_source import find_sglang

        sglang = find_sglang(profile.server.python, env=_server_env(profile))
    if sglang is not None and all(sglang.has_flag(f) for f in _PER_PHASE_GRAPH_FLAGS):
        return list(_PER_PHASE_GRAPH_FLAGS)
    return ["--disable-cuda-graph"]


def _capture_additions(profile: LaunchProfile) -> tuple[list[str], dict[str, str]]:
    """Flags and env from the capture toggle (DESIGN §5), when capture is on."""
    if not profile.capture.enabled:
        return [], {}
    # Imported here, when a profile asks for it: `sessions.profiles.capture_launch` reads the profile model
    # and the capture leaves, and a module-level import would run while this package is half-initialised.
    from sessions.profiles.capture_launch import capture_additions

    argv_extra, env_extra = capture_additions(profile)
    return list(argv_extra), dict(env_extra)


def _server_env(profile: LaunchProfile) -> dict[str, str]:
    """The environment the server will see: ours plus the profile's changes."""
    return {**os.environ, **profile.server.env}
