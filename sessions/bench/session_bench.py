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
from sessions.bench.prompts import Prompt, dataset_prompts, random_id_prompts
from sessions.bench.runner import BenchError, BenchPlan, Progress, RunHook, prompts_needed, run_bench
from sessions.home import read_json
from sessions.redaction import Redactor, redact_argv

DEFAULT_CONCURRENCY = (1, 8, 32)


# Limits checked before anything is allocated (a prompt, a thread, a client): sizes of 1e9 grew memory
# without bound and ended in a MemoryError traceback.
MAX_TOKENS = 1 << 22  # --input-len / --output-len: past any context length SGLang serves today
MAX_PROMPTS = 1 << 20  # --num-prompts
MAX_CONCURRENCY = 2048  # each request in flight is a thread with its own connection
MEMORY_SHARE = 0.5  # of the memory available now, the most a bench may plan to hold


@dataclass(frozen=True)
class BenchOptions:
    input_len: int = 256
    output_len: int = 128  # with a dataset: the cap of each prompt's output length
    num_prompts: int | None = None
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    seed: int = 1
    flush_cache: bool = True  # empty the prefix cache before each concurrency
    dataset: str | None = None  # a ShareGPT / OpenAI-messages JSONL: real prompts instead of random ids

    def check(self) -> None:
        """Every size within its limit and the planned memory within reach, before anything is made."""
        for name in ("input_len", "output_len"):
            value = getattr(self, name)
            if value < 1 or value > MAX_TOKENS:
                raise BenchError(f"--{name.replace('_', '-')} must be 1..{MAX_TOKENS} tokens, not {value}")
        if self.num_prompts is not None and not 1 <= self.num_prompts <= MAX_PROMPTS:
            raise BenchError(f"--num-prompts must be 1..{MAX_PROMPTS}, not {self.num_prompts}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise BenchError(f"--concurrency must list numbers >= 1, not {list(self.concurrency)}")
        if max(self.concurrency) > MAX_CONCURRENCY:
            raise BenchError(f"--concurrency {max(self.concurrency)} is more than the bench's limit of "
                             f"{MAX_CONCURRENCY} requests in flight (each is a thread with its own connection)")
        need = self.memory_estimate()
        available = _available_memory()
        if available is not None and need > MEMORY_SHARE * available:
            raise BenchError(
                f"--input-len {self.input_len}, --output-len {self.output_len}, --num-prompts "
                f"{prompts_needed(self.concurrency, self.num_prompts)}, --concurrency {max(self.concurrency)} "
                f"need about {need / 2**30:.1f} GiB of memory for the prompts and timings, more than half "
                f"of the {available / 2**30:.1f} GiB available; lower them")

    def memory_estimate(self) -> int:
        """Bytes the bench would hold at its peak: the prompts' ids (a tuple slot and an int object each),
        each request in flight's JSON body, every output token's timing, and a thread and client per slot."""
        prompts = prompts_needed(self.concurrency, self.num_prompts)
        in_flight = min(max(self.concurrency), prompts)
        ids = 0 if self.dataset else prompts * self.input_len * 40
        return ids + in_flight * self.input_len * 24 + prompts * self.output_len * 16 + in_flight * (256 << 10)


def demo_compare_options() -> BenchOptions:
    """The demo's A/B defaults (CLI and bench screen alike): its own real-text prompt set, 32-token outputs
    and concurrency 1 and 4, so that three rounds on the CPU-bound tiny model take about two minutes."""
    from sessions.bench.prompts import DEMO_PROMPTS

    return BenchOptions(output_len=32, concurrency=(1, 4), dataset=str(DEMO_PROMPTS))


def _available_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no reading: the fixed limits still hold
        return None


def check_context(models: dict[str, Any], input_len: int | None, output_len: int, what: str) -> int | None:
    """The server's context length (``/v1/models`` ``data[0].max_model_len``), and a clear error when the
    bench's sizes pass it as SGLang would refuse them (a prompt of the whole context, or prompt + output
    past it: tokenizer_manager.py:1333-1378).  ``input_len`` None: text prompts, only the output is known."""
    data = models.get("data")
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    value = first.get("max_model_len")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None  # not said: each request's refusal will say it
    prompt = input_len or 1
    if prompt >= value or prompt + output_len > value:
        inputs = f"--input-len {input_len} + " if input_len else "a 1-token prompt + "
        raise BenchError(f"{what}: {inputs}--output-len {output_len} = {prompt + output_len} tokens, more than "
                         f"the server's context length of {value} tokens (/v1/models max_model_len); lower "
                         "--input-len or --output-len")
    return value


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
    api_key = _api_key(profile)
    # the server's limits first: nothing is allocated for sizes it would refuse
    context = check_context(server_models(base, api_key), None if options.dataset else options.input_len,
                            options.output_len, f"session {session.session_id}")
    prompts, workload = make_prompts(options, profile.server.model_path)
    plan = BenchPlan(base, tuple(prompts), options.concurrency, options.num_prompts,
                     api_key=api_key, flush_cache=options.flush_cache)
    started = time.time()
    outcome = run_bench(plan, progress, on_run, on_result)
    info = outcome["server_info"]
    command = (read_json(session.session_dir / "command.json", kind=safe_files.SESSION_RECORD) or {}).get("argv") or []
    # the server's own words, kept only as scalars (a dict or list where a flag should be is dropped)
    speculative = {k.removeprefix("speculative_"): info[k] for k in _SPEC_KEYS
                   if isinstance(info.get(k), (str, int, float)) and not isinstance(info.get(k), bool)}
    result: dict[str, Any] = {
        "runs": outcome["runs"],
        "speculative": speculative or None,  # the server's resolved EAGLE flags (/server_info), if any
        "session": session.session_id,
        "profile": profile.name,
        "time": started,
        "sglang_version": info["version"][:64] if isinstance(info.get("version"), str) else None,
        "command": list(command),
        "bench_command": redact_argv(list(bench_argv or [])),
        "profile_toml": profile.to_toml(),
        "base_url": base,
        "request": request_of(options) | workload | {"context_length": context},
    }
    # a redacted copy only: the profile's TOML and the command can carry keys, tokens and passwords
    redacted: dict[str, Any] = Redactor.for_session(session).json(result)
    return redacted


def request_of(options: BenchOptions) -> dict[str, Any]:
    """The workload as asked (the table and the JSON show it)."""
    return {
        "input_len": None if options.dataset else options.input_len,
        "output_len": options.output_len,
        "num_prompts": options.num_prompts,
        "concurrency": list(options.concurrency),
        "seed": options.seed,
        "dataset": options.dataset or "random-ids",
        "flush_cache": options.flush_cache,
    }


def make_prompts(options: BenchOptions, model_path: str | Path) -> tuple[list[Prompt], dict[str, Any]]:
    """The prompts of a bench and what the workload record adds (the dataset's kind and size)."""
    needed = prompts_needed(options.concurrency, options.num_prompts)
    if options.dataset is None:
        return random_id_prompts(needed, options.input_len, options.output_len, vocab_size_of(model_path),
                                 options.seed), {}
    try:
        found = dataset_prompts(options.dataset, needed, options.output_len, options.seed)
    except (OSError, ValueError) as exc:
        raise BenchError(str(exc) if isinstance(exc, ValueError) else f"--dataset {options.dataset}: {exc}") \
            from None
    if options.num_prompts is not None and found.usable < options.num_prompts:
        raise BenchError(f"--dataset {options.dataset} has {found.usable} usable prompts, fewer than "
                         f"--num-prompts {options.num_prompts}")
    return list(found.prompts), {"dataset_kind": found.kind, "dataset_prompts": found.usable,
                                 "dataset_problems": list(found.problems)}


def server_models(base: str, api_key: str | None) -> dict[str, Any]:
    """``/v1/models`` of a ready server (bounded read), for its context length."""
    from sessions.bench.runner import _clients, wait_ready

    client = _clients(1)[0]
    try:
        return wait_ready(client, BenchPlan(base, (), (1,), api_key=api_key, ready_timeout_s=30.0))
    finally:
        client.close()


def _api_key(profile: Any) -> str | None:
    args = list(profile.server.extra_args)
    for i, arg in enumerate(args):
        if arg == "--api-key" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--api-key="):
            return arg.split("=", 1)[1]
    return None
