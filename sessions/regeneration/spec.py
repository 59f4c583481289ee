"""The regeneration job spec: a TOML ``[job]`` table with ``mode = "regenerate"``, read and checked.

Like the extraction spec (whose `SpecProblem`/`JobSpecError` it reuses), every problem names the key, its
line and what is wrong, and unknown keys are refused.  The keys mirror SpecForge's
``scripts/regenerate_train_data.py`` flags (scaleout-facts §C1): ``temperature``, ``top_p``, ``top_k``,
``max_tokens``, ``reasoning = none|save|disable``, ``servers`` with a ``window`` of requests each (its
``--concurrency``), plus ``seed`` and what to do with answers cut by ``max_tokens``.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sessions.extraction.spec import JobSpecError, SpecProblem, server_url_problem

MODE = "regenerate"
REASONING = ("none", "save", "disable")
FORMATS = ("auto", "sharegpt", "openai")
ON_LENGTH = ("keep", "skip")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")


@dataclass(frozen=True)
class RegenSpec:
    """A checked regeneration spec.  ``output`` is SpecForge's ``--output-file-path``: ``<out>.jsonl``, next
    to which ``<out>_error.jsonl`` and ``<out>_skipped.jsonl`` are written."""

    name: str
    dataset: Path
    output: Path
    servers: tuple[str, ...] = ()
    sessions: tuple[str, ...] = ()
    model: str | None = None  # the served model name; default: the first of the server's /v1/models
    dataset_format: str = "auto"
    window: int = 8  # requests in flight per server
    temperature: float = 0.7
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int = 2048
    seed: int | None = None
    reasoning: str = "none"
    on_length: str = "keep"
    num_samples: int | None = None
    max_retries: int = 3
    retry_backoff_s: float = 0.5
    request_timeout_s: float = 600.0
    source_path: Path | None = None

    @property
    def error_path(self) -> Path:
        return self.output.with_name(self.output.name[: -len(".jsonl")] + "_error.jsonl")

    @property
    def skipped_path(self) -> Path:
        return self.output.with_name(self.output.name[: -len(".jsonl")] + "_skipped.jsonl")

    def to_toml_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": MODE}
        for key, (attr, kind, _check) in _FIELDS.items():
            if kind in ("str1", "url1"):  # the one-value forms of servers/sessions
                continue
            value = getattr(self, attr)
            if value is None or value == ():
                continue
            out[key] = str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value
        return {"job": out}


def _url(v: str) -> str | None:
    problem = server_url_problem(v)  # a list of servers: the message names the one at fault
    return f"{v!r}: {problem}" if problem else None


def _urls(v: list[str]) -> str | None:
    if not v:
        return "must list at least one server"
    return next((p for p in map(_url, v) if p), None)


def _between(lo: float, hi: float) -> Any:
    return lambda v: None if lo <= v <= hi else f"must be between {lo:g} and {hi:g}"


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _choice(choices: tuple[str, ...]) -> Any:
    return lambda v: None if v in choices else f"{v!r} is not one of {', '.join(choices)}"


def _output(v: Path) -> str | None:
    return None if v.name.endswith(".jsonl") and len(v.name) > len(".jsonl") else "must end in .jsonl"


# key -> (attribute, kind, check)
_FIELDS: dict[str, tuple[str, str, Any]] = {
    "name": ("name", "str", lambda v: None if _NAME_RE.match(v) else "use 1-48 letters, digits, '.', '_', '-'"),
    "dataset": ("dataset", "path", None),
    "dataset_format": ("dataset_format", "str", _choice(FORMATS)),
    "output": ("output", "path", _output),
    "servers": ("servers", "strlist", _urls),
    "server_url": ("servers", "url1", _url),
    "sessions": ("sessions", "strlist", lambda v: None if v else "must list at least one session"),
    "session": ("sessions", "str1", None),
    "model": ("model", "str", None),
    "window": ("window", "int", _between(1, 4096)),
    "temperature": ("temperature", "float", _between(0.0, 2.0)),
    "top_p": ("top_p", "float", _between(0.0, 1.0)),
    "top_k": ("top_k", "int", lambda v: None if v == -1 or v > 0 else "must be -1 (off) or greater than 0"),
    "max_tokens": ("max_tokens", "int", _positive),
    "seed": ("seed", "int", None),
    "reasoning": ("reasoning", "str", _choice(REASONING)),
    "on_length": ("on_length", "str", _choice(ON_LENGTH)),
    "num_samples": ("num_samples", "int", _positive),
    "max_retries": ("max_retries", "int", lambda v: None if v >= 0 else "must be 0 or more"),
    "retry_backoff_s": ("retry_backoff_s", "float", lambda v: None if v >= 0 else "must be 0 or more"),
    "request_timeout_s": ("request_timeout_s", "float", _positive),
}
_WORDS = {"str": "a string", "str1": "a string", "url1": "a string", "path": "a path string", "int": "an integer",
          "float": "a number", "strlist": "a list of strings"}


def _typed(kind: str, value: Any) -> tuple[Any, bool]:
    if kind == "int":
        return value, isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return (float(value) if ok else value), ok
    if kind == "strlist":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return (tuple(value) if ok else value), ok
    return value, isinstance(value, str)


def _lines(text: str) -> dict[str, int]:
    lines: dict[str, int] = {}
    for no, raw in enumerate(text.splitlines(), start=1):
        key = re.match(r'^\s*("?)([A-Za-z0-9_.-]+)\1\s*=', raw)
        if key:
            lines.setdefault(f"job.{key.group(2)}", no)
        elif raw.strip().startswith("[job]"):
            lines.setdefault("job", no)
    return lines


def is_regeneration_spec(text: str) -> bool:
    """Whether a spec's ``[job]`` says ``mode = "regenerate"`` (so `extract run` can hand it over)."""
    try:
        job = tomllib.loads(text).get("job")
    except tomllib.TOMLDecodeError:
        return False
    return isinstance(job, dict) and job.get("mode") == MODE


def is_regeneration_spec_file(path: Path | str) -> bool:
    """Whether the spec file at ``path`` is a regeneration spec (False when it cannot be read: the job's
    own loader then names the problem)."""
    from sessions.safe_files import JOB_SPEC, read_text

    try:
        return is_regeneration_spec(read_text(Path(path).expanduser(), JOB_SPEC))
    except (OSError, UnicodeDecodeError):
        return False


def parse_regen_spec(text: str, source: str = "<job spec>", base_dir: Path | None = None) -> RegenSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobSpecError(source, [SpecProblem("toml", str(exc))]) from None
    lines = _lines(text)
    problems: list[SpecProblem] = [SpecProblem(top, "unknown table or key; a job spec has only [job]")
                                   for top in data if top != "job"]
    job = data.get("job")
    if not isinstance(job, dict):
        raise JobSpecError(source, [*problems, SpecProblem("job", "missing [job] table")])
    if job.get("mode") != MODE:
        problems.append(SpecProblem("job.mode", f'must be "{MODE}" for a regeneration job', lines.get("job.mode")))
    values: dict[str, Any] = {}
    for key, value in job.items():
        if key == "mode":
            continue
        dotted = f"job.{key}"
        if key not in _FIELDS:
            problems.append(SpecProblem(dotted, "unknown key", lines.get(dotted)))
            continue
        attr, kind, check = _FIELDS[key]
        value, ok = _typed(kind, value)
        if not ok:
            problems.append(SpecProblem(dotted, f"must be {_WORDS[kind]}, not {type(value).__name__} {value!r}",
                                        lines.get(dotted)))
            continue
        if kind == "path":
            if not value.strip():
                problems.append(SpecProblem(dotted, "must not be empty", lines.get(dotted)))
                continue
            value = Path(value).expanduser()
            if base_dir is not None and not value.is_absolute():
                value = (base_dir / value).resolve()
        problem = check(value) if check else None
        if problem:
            problems.append(SpecProblem(dotted, problem, lines.get(dotted)))
            continue
        if kind in ("str1", "url1"):
            value = (value,)
        if attr == "servers":
            value = tuple(url.rstrip("/") for url in value)  # requests go to <url>/v1/...
        if attr in values:
            problems.append(SpecProblem(dotted, f"give only one of {attr} and its one-value form", lines.get(dotted)))
        values[attr] = value
    for key in ("name", "dataset", "output"):
        if key not in job:
            problems.append(SpecProblem(f"job.{key}", "is required", lines.get("job")))
    if bool(values.get("servers")) == bool(values.get("sessions")):
        problems.append(SpecProblem("job.servers", "give the servers (URLs) or the sessions to send to, not both",
                                    lines.get("job.servers") or lines.get("job")))
    if problems:
        raise JobSpecError(source, problems)
    return RegenSpec(**values)


def load_regen_spec(path: Path | str) -> RegenSpec:
    from sessions.safe_files import JOB_SPEC, read_text

    path = Path(path).expanduser()
    text = read_text(path, JOB_SPEC)
    spec = parse_regen_spec(text, source=str(path), base_dir=path.parent.resolve())
    return replace(spec, source_path=path.resolve())
