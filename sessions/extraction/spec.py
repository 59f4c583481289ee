"""The extraction job spec: a TOML file with one ``[job]`` table (DESIGN §6, contract), read and checked.

Every problem names the key, its line in the file and what is wrong; unknown keys and tables are refused
(a typo such as ``concurency`` must not silently fall back to a default).  Paths are checked for shape
here; whether they exist is checked by ``check_paths`` so that a spec can be parsed anywhere.
"""
from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DATASET_FORMATS = ("auto", "sharegpt", "openai", "tokenized")
TOO_LONG_POLICIES = ("truncate", "skip")
SAMPLE_ID_SOURCES = ("index", "row")  # "<job id>-<line index>", or the row's own `id` (regeneration output)
JOB_DATASET_PREFIX = "job:"  # dataset = "job:<regeneration job id>": that job's <out>.jsonl
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")
_RID_PREFIX_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a job spec: ``field`` is the dotted key (``job.concurrency``)."""

    field: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.field}{where}: {self.message}"


class JobSpecError(ValueError):
    """The spec cannot be used; ``problems`` lists every reason, each naming its key and line."""

    def __init__(self, source: str, problems: list[SpecProblem]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: invalid job spec\n{lines}")


@dataclass(frozen=True)
class JobSpec:
    """A checked job spec.  ``server_url``/``capture_dir``/``rid_prefix``/``model_path`` may be None when
    ``session`` names a server session: they are then taken from the session's profile (``resolve``)."""

    name: str
    dataset: Path
    output_dir: Path
    server_url: str | None = None
    session: str | None = None
    # Several servers for one job (`sessions.extraction.servers`): session ids, replicas group ids or URLs.
    # One entry is a single server, the same as ``session``/``server_url``.
    servers: tuple[str, ...] = ()
    # The interpreter that runs the job (it needs torch): by default the session profile's `python`, which
    # on a GPU host is SGLang's own, so one torch serves the server, the capture plugin and the job.
    python: Path | None = None
    model_path: Path | None = None
    capture_dir: Path | None = None
    rid_prefix: str | None = None
    dataset_format: str = "auto"
    max_length: int = 2048
    on_too_long: str = "truncate"
    concurrency: int = 8
    # Rendering: nothing is injected unless asked (SpecForge injects a default system prompt; serving doesn't).
    system_prompt: str | None = None
    thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False
    # Client.
    max_retries: int = 5
    retry_backoff_s: float = 0.5
    retry_backoff_max_s: float = 30.0
    max_consecutive_failures: int = 20
    request_timeout_s: float = 600.0
    server_down_timeout_s: float = 0.0  # 0 = stay paused until the server is back
    dump_wait_s: float = 30.0
    # Back-pressure on the capture filesystem (/dev/shm is small).
    capture_fill_threshold: float = 0.9
    capture_budget_bytes: int = 0  # >0: treat the capture dir as a filesystem of this many bytes
    # Output.
    file_group_size: int = 2000
    draft_vocab_size: int | None = None
    num_samples: int | None = None
    disk_preflight: bool = True
    sample_ids: str = "index"
    source_path: Path | None = None
    # Filled by job.resolve_spec from a session's profile (not TOML keys): physical capture points.
    capture_layers: tuple[int, ...] | None = None

    def to_toml_dict(self) -> dict[str, Any]:
        """The spec as a ``{"job": {...}}`` dict (Nones dropped), for writing a resolved copy."""
        out: dict[str, Any] = {}
        for key, spec_field in _FIELDS.items():
            value = getattr(self, spec_field.attr)
            if value is None or (key in ("chat_template_kwargs", "servers") and not value):
                continue
            out[key] = str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value
        return {"job": out}


@dataclass(frozen=True)
class _Field:
    attr: str
    kind: str  # "str", "path", "int", "float", "bool", "table", "choice"
    check: Callable[[Any], str | None] | None = None
    choices: tuple[str, ...] = ()


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be 0 or more"


def _fraction(v: Any) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1], e.g. 0.9"


def _name(v: str) -> str | None:
    if _NAME_RE.match(v):
        return None
    return "use 1-48 letters, digits, '.', '_' or '-' (it becomes part of the job id and of request ids)"


def _rid_prefix(v: str) -> str | None:
    return None if _RID_PREFIX_RE.match(v) else "use 1-64 letters, digits, '.', '_', ':' or '-'"


def server_url_problem(v: str) -> str | None:
    """What is wrong with ``v`` as a server root URL (``http://HOST:PORT``), or None; extraction's
    ``server_url`` and regeneration's ``servers`` are checked by this one rule."""
    try:
        parts = urlsplit(v)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must look like http://HOST:PORT"
    if parts.path not in ("", "/") or parts.query:
        return "give the server root (http://HOST:PORT), without a path"
    if port is None:
        return "name the port, e.g. http://127.0.0.1:30000"
    return None


def _session_id(v: str) -> str | None:
    return None if re.match(r"^[A-Za-z0-9._-]{1,128}$", v) else "not a session id"


def server_ref_problem(v: str) -> str | None:
    """What is wrong with one ``servers`` entry: a URL (``http://HOST:PORT``), a session id or a group id."""
    if "://" in v:
        return server_url_problem(v)
    return None if _session_id(v) is None else "neither a URL (http://HOST:PORT) nor a session or group id"


def _servers(v: tuple[str, ...]) -> str | None:
    if not v:
        return "name at least one server"
    for i, entry in enumerate(v):
        problem = server_ref_problem(entry)
        if problem:
            return f"entry {i + 1} ({entry!r}): {problem}"
    duplicates = sorted({e for e in v if v.count(e) > 1})
    if duplicates:
        return f"{', '.join(duplicates)} named twice (each server is one lane of the job)"
    return None


_FIELDS: dict[str, _Field] = {
    "name": _Field("name", "str", _name),
    "server_url": _Field("server_url", "str", server_url_problem),
    "session": _Field("session", "str", _session_id),
    "servers": _Field("servers", "list", _servers),
    "python": _Field("python", "path"),
    "dataset": _Field("dataset", "path"),
    "dataset_format": _Field("dataset_format", "choice", choices=DATASET_FORMATS),
    "output_dir": _Field("output_dir", "path"),
    "model_path": _Field("model_path", "path"),
    "capture_dir": _Field("capture_dir", "path"),
    "rid_prefix": _Field("rid_prefix", "str", _rid_prefix),
    "max_length": _Field("max_length", "int", _positive),
    "on_too_long": _Field("on_too_long", "choice", choices=TOO_LONG_POLICIES),
    "concurrency": _Field("concurrency", "int", lambda v: None if 1 <= v <= 4096 else "must be 1..4096"),
    "system_prompt": _Field("system_prompt", "str"),
    "thinking": _Field("thinking", "bool"),
    "chat_template_kwargs": _Field("chat_template_kwargs", "table"),
    "trust_remote_code": _Field("trust_remote_code", "bool"),
    "max_retries": _Field("max_retries", "int", _non_negative),
    "retry_backoff_s": _Field("retry_backoff_s", "float", _non_negative),
    "retry_backoff_max_s": _Field("retry_backoff_max_s", "float", _non_negative),
    "max_consecutive_failures": _Field("max_consecutive_failures", "int", _positive),
    "request_timeout_s": _Field("request_timeout_s", "float", _positive),
    "server_down_timeout_s": _Field("server_down_timeout_s", "float", _non_negative),
    "dump_wait_s": _Field("dump_wait_s", "float", _non_negative),
    "capture_fill_threshold": _Field("capture_fill_threshold", "float", _fraction),
    "capture_budget_bytes": _Field("capture_budget_bytes", "int", _non_negative),
    "file_group_size": _Field("file_group_size", "int", _positive),
    "draft_vocab_size": _Field("draft_vocab_size", "int", _positive),
    "num_samples": _Field("num_samples", "int", _positive),
    "disk_preflight": _Field("disk_preflight", "bool"),
    "sample_ids": _Field("sample_ids", "choice", choices=SAMPLE_ID_SOURCES),
}
_REQUIRED = ("name", "dataset", "output_dir")
_KIND_WORDS = {"str": "a string", "path": "a path string", "int": "an integer", "float": "a number",
               "bool": "true or false", "table": "a table", "choice": "a string",
               "list": "a list of strings"}


def _key_lines(text: str) -> dict[str, int]:
    """Map ``table.key`` (and ``table`` itself) to its 1-based line: tomllib keeps no positions."""
    lines: dict[str, int] = {}
    table = ""
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        header = re.match(r"^\[\s*([^\[\]]+?)\s*\]", line)
        if header:
            table = header.group(1).replace('"', "").replace(" ", "")
            lines.setdefault(table, no)
            continue
        key = re.match(r'^("?)([A-Za-z0-9_.-]+)\1\s*=', line)
        if key:
            dotted = f"{table}.{key.group(2)}" if table else key.group(2)
            lines.setdefault(dotted, no)
    return lines


def _check_value(key: str, spec_field: _Field, value: Any) -> tuple[Any, str | None]:
    kind = spec_field.kind
    if kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind == "table":
        ok = isinstance(value, dict)
    elif kind == "list":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        return value, f"must be {_KIND_WORDS[kind]}, not {type(value).__name__} {value!r}"
    if kind == "choice" and value not in spec_field.choices:
        return value, f"{value!r} is not one of {', '.join(spec_field.choices)}"
    if kind == "path":
        if not value.strip():
            return value, "must not be empty"
        value = Path(value).expanduser()
    if spec_field.check is not None:
        problem = spec_field.check(value)
        if problem:
            return value, problem
    return value, None


def parse_job_spec(text: str, source: str = "<job spec>", base_dir: Path | None = None,
                   servers_given: bool = False) -> JobSpec:
    """Parse and check a spec; relative paths resolve against ``base_dir`` (the spec file's folder).

    ``servers_given``: the command line names the servers (``extract run --servers``), so the spec need
    not name any."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"at line (\d+)", str(exc))  # 3.11's TOMLDecodeError has no lineno attribute
        line = getattr(exc, "lineno", None) or (int(found.group(1)) if found else None)
        raise JobSpecError(source, [SpecProblem("toml", str(exc), line)]) from None
    lines = _key_lines(text)
    problems: list[SpecProblem] = []
    for top in data:
        if top != "job":
            problems.append(SpecProblem(top, "unknown table or key; a job spec has only [job]", lines.get(top)))
    job = data.get("job")
    if not isinstance(job, dict):
        problems.append(SpecProblem("job", "missing [job] table", None))
        raise JobSpecError(source, problems)
    values: dict[str, Any] = {}
    for key, value in job.items():
        dotted = f"job.{key}"
        spec_field = _FIELDS.get(key)
        if spec_field is None:
            close = [k for k in _FIELDS if _similar(k, key)]
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(SpecProblem(dotted, f"unknown key{hint}", lines.get(dotted)))
            continue
        checked, problem = _check_value(key, spec_field, value)
        if problem:
            problems.append(SpecProblem(dotted, problem, lines.get(dotted)))
            continue
        if key == "dataset" and isinstance(value, str) and value.startswith(JOB_DATASET_PREFIX):
            checked = Path(value)  # another job's output: job.create_job resolves it
        elif spec_field.kind == "path" and base_dir is not None and not checked.is_absolute():
            checked = (base_dir / checked).resolve()
        values[spec_field.attr] = checked
    for key in _REQUIRED:
        if key not in job:
            problems.append(SpecProblem(f"job.{key}", "is required", lines.get("job")))
    has_url, has_session, has_servers = "server_url" in job, "session" in job, "servers" in job
    named = has_url + has_session + has_servers
    if named > 1:
        problems.append(SpecProblem("job.server_url", "give exactly one of server_url, session and servers",
                                    lines.get("job.server_url") or lines.get("job.servers") or lines.get("job")))
    elif named == 0 and not servers_given:
        problems.append(SpecProblem("job.server_url", "give server_url, session or servers (or extract run "
                                    "--servers)", lines.get("job")))
    if has_servers and any("://" in e for e in job.get("servers") or [] if isinstance(e, str)) \
            and "model_path" not in job:
        problems.append(SpecProblem("job.model_path", "is required when servers names a URL (a session would "
                                    "supply it)", lines.get("job")))
    if has_url and not has_session:
        for key in ("capture_dir", "model_path"):
            if key not in job:
                problems.append(SpecProblem(f"job.{key}", "is required with server_url (a session would supply it)",
                                            lines.get("job")))
    backoff = values.get("retry_backoff_s", 0.5)
    if values.get("retry_backoff_max_s", 30.0) < backoff:
        problems.append(SpecProblem("job.retry_backoff_max_s", "must be at least retry_backoff_s",
                                    lines.get("job.retry_backoff_max_s")))
    if problems:
        raise JobSpecError(source, problems)
    return JobSpec(**values)


def _similar(a: str, b: str) -> bool:
    import difflib

    return difflib.SequenceMatcher(None, a, b).ratio() >= 0.8


def load_job_spec(path: Path | str, servers_given: bool = False) -> JobSpec:
    """Read a spec file; raises ``JobSpecError`` (problems name key and line) or ``OSError``."""
    from sessions import safe_files

    path = Path(path).expanduser()
    text = safe_files.read_text(path, safe_files.JOB_SPEC)  # a FIFO, a device, over 1 MiB: refused at once
    spec = parse_job_spec(text, source=str(path), base_dir=path.parent.resolve(), servers_given=servers_given)
    return replace(spec, source_path=path.resolve())


def check_paths(spec: JobSpec) -> list[SpecProblem]:
    """What exists on disk: the dataset file, the model dir (tokenizer), and an output dir we may use."""
    from sessions.safe_files import DATASET, SpecialFileError, check_file

    problems: list[SpecProblem] = []
    try:
        check_file(spec.dataset, DATASET)
    except SpecialFileError as exc:
        problems.append(SpecProblem("job.dataset", exc.strerror or str(exc)))
    except OSError as exc:
        problems.append(SpecProblem("job.dataset", f"{spec.dataset} cannot be read: {exc.strerror or exc}"))
    if spec.model_path is not None and not (spec.model_path / "config.json").is_file():
        problems.append(SpecProblem("job.model_path", f"{spec.model_path} has no config.json"))
    out = spec.output_dir
    if out.is_symlink():
        problems.append(SpecProblem("job.output_dir", f"{out} is a symlink; give the real folder"))
    elif out.exists() and not out.is_dir():
        problems.append(SpecProblem("job.output_dir", f"{out} exists and is not a folder"))
    if spec.capture_dir is not None and spec.capture_dir.resolve() == out.resolve():
        problems.append(SpecProblem("job.capture_dir", "must differ from output_dir"))
    return problems
