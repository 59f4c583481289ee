"""Bench a running session: build the plan from its state, run it, and keep the result.

The result is ``{"runs": [...], "session", "profile", "time", "sglang_version", "command", "profile_toml",
"request": {input_len, output_len, num_prompts, concurrency, seed}, "base_url"}``; ``command`` is the
session's launch argv as kept in ``command.json`` (secrets already redacted) and ``bench_command`` the bench's
own command line, redacted too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.bench.prompts import random_id_prompts
from sessions.bench.runner import BenchError, BenchPlan, Progress, RunHook, prompts_needed, run_bench
from sessions.home import read_json
from sessions.redaction import redact_argv

DEFAULT_CONCURRENCY = (1, 8, 32)


@dataclass(frozen=True)
class BenchOptions:
    input_len: int = 256
    output_len: int = 128
    num_prompts: int | None = None
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    seed: int = 1
    flush_cache: bool = True  # empty the prefix cache before each concurrency

    def check(self) -> None:
        for name in ("input_len", "output_len"):
            if getattr(self, name) < 1:
                raise BenchError(f"--{name.replace('_', '-')} must be >= 1, not {getattr(self, name)}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise BenchError(f"--num-prompts must be >= 1, not {self.num_prompts}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise BenchError(f"--concurrency must list numbers >= 1, not {list(self.concurrency)}")


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``"1,8,32"`` -> (1, 8, 32); a clear error naming the bad part."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise BenchError(f"--concurrency {text!r}: {part!r} is not a number >= 1 (expected e.g. 1,8,32)")
        out.append(int(part))
    return tuple(dict.fromkeys(out))


def vocab_size_of(model_path: str | Path) -> int:
    path = Path(model_path).expanduser() / "config.json"
    try:
        raw = safe_files.read_json(path, safe_files.MODEL_CONFIG)
    except OSError as exc:
        raise BenchError(f"cannot read the model's vocab size: {safe_files.describe_os_error(exc, path)}") from None
    if not isinstance(raw, dict):
        raise BenchError(f"{path} holds no JSON object: no vocab size")
    for source in (raw, raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}):
        value = source.get("vocab_size") if isinstance(source, dict) else None
        if isinstance(value, int) and value > 1:
            return value
    raise BenchError(f"{path} has no vocab_size")


_SPEC_KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
              "speculative_num_draft_tokens", "speculative_draft_model_path")


def bench_session(session: Any, options: BenchOptions, progress: Progress | None = None,
                  bench_argv: list[str] | None = None, on_run: RunHook | None = None,
                  on_result: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Bench a ready session (a `ServerSession`); BenchError when it cannot."""
    options.check()
    status = session.status()
    if status.state != "ready":
        raise BenchError(f"session {session.session_id} is {status.state}, not ready: nothing to bench")
    profile = session.profile
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(status.host, status.host)
    base = f"http://{'[' + host + ']' if ':' in host else host}:{status.port}"
    prompts = random_id_prompts(prompts_needed(options.concurrency, options.num_prompts), options.input_len,
                                options.output_len, vocab_size_of(profile.server.model_path), options.seed)
    plan = BenchPlan(base, tuple(prompts), options.concurrency, options.num_prompts,
                     api_key=_api_key(profile), flush_cache=options.flush_cache)
    started = time.time()
    outcome = run_bench(plan, progress, on_run, on_result)
    info = outcome["server_info"]
    command = (read_json(session.session_dir / "command.json", kind=safe_files.SESSION_RECORD) or {}).get("argv") or []
    speculative = {k.removeprefix("speculative_"): info.get(k) for k in _SPEC_KEYS if info.get(k) is not None}
    return {
        "runs": outcome["runs"],
        "speculative": speculative or None,  # the server's resolved EAGLE flags (/server_info), if any
        "session": session.session_id,
        "profile": profile.name,
        "time": started,
        "sglang_version": info.get("version"),
        "command": list(command),
        "bench_command": redact_argv(list(bench_argv or [])),
        "profile_toml": profile.to_toml(),
        "base_url": base,
        "request": {
            "input_len": options.input_len,
            "output_len": options.output_len,
            "num_prompts": options.num_prompts,
            "concurrency": list(options.concurrency),
            "seed": options.seed,
            "dataset": "random-ids",
            "flush_cache": options.flush_cache,
        },
    }


def _api_key(profile: Any) -> str | None:
    args = list(profile.server.extra_args)
    for i, arg in enumerate(args):
        if arg == "--api-key" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--api-key="):
            return arg.split("=", 1)[1]
    return None
