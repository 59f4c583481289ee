"""Known causes of SGLang startup hangs and crashes, matched against what we can see: log lines, stacks,
the command line, the environment, the phase, the session state and child processes.

The causes are data: every ``sessions/data/known_causes*.toml`` (``known_causes.toml`` holds the startup
catalogue built from ``fixtures/hang-catalog.md``; the diagnosis work adds ``known_causes_runtime.toml``).
Each ``[[cause]]`` has ``id``, ``title`` and ``detail`` plus any of these conditions — AND across keys,
OR within one key's list:

* ``log_any``   regexes, one of which some log line must match;
* ``stack_any`` regexes, one of which some rank's stack must match;
* ``argv_any``  flags (``--flag`` or ``--flag=value``), one of which the command line must hold;
* ``argv_none`` flags none of which the command line may hold (an unknown command line passes);
* ``env_any``   environment variables, one of which must be set and non-empty;
* ``phase_in``  startup phases; ``state_in`` session states; ``child_any`` child process names;
* ``check``     the name of a predicate for what data can't say (a name registered here with
  ``register_predicate``, or ``"sessions.module:function"``).  A predicate may return a mapping whose
  entries fill ``{name}`` placeholders in the title and detail.

Not a condition: ``implicates`` lists the flags (``--attention-backend``) and environment variables
(``NCCL_*``; shell-style patterns) the cause is about.  When a start fails, the diagnosis marks each change
since the last good start that one of these names (`sessions.start_facts.mark`), so "you swapped the
attention backend" is shown next to the cause that blames attention backends.

What made a cause match decides how much it says about this start (`KnownCause.triggers`,
`KnownCause.observed`): the settings it needs (``argv_any``, ``argv_none``, ``env_any``, and ``implicates``
when its ``check`` reads settings) are its *triggers*, compared with the baseline's; a log line, a stack, a
child or a check on what the session did is *observed* evidence; ``phase_in``, ``state_in`` and the checks
that only restate the phase (``startup_in_progress``) say nothing of this start.  A cause with neither
triggers nor observed evidence is general advice.

Files are validated when loaded: an unknown key, a wrong type, a bad regex, phase or state, an unknown
predicate or a duplicate id is a `KnownCausesError` naming the file, the cause and the key.
"""
from __future__ import annotations

import importlib
import ipaddress
import re
import threading
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.phases import StartupPhase, StartupSummary, strip_ansi
from sessions.start_facts import Implication

DATA_DIR = Path(__file__).resolve().parent / "data"
CAUSE_FILE_GLOB = "known_causes*.toml"
SESSION_STATES = frozenset({"starting", "ready", "stalled", "crashed", "exited", "stopped"})
_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_LIST_KEYS = ("log_any", "stack_any", "argv_any", "argv_none", "env_any", "phase_in", "state_in", "child_any")
_CONDITION_KEYS = frozenset(_LIST_KEYS) | {"check"}
_ALLOWED_KEYS = frozenset({"id", "title", "detail", "sources", "implicates"}) | _CONDITION_KEYS
# What ``implicates`` may name: a flag pattern (``--cuda-graph-*``) or an env var pattern (``NCCL_*``).
_IMPLICATES_RE = re.compile(r"^(?:--[A-Za-z0-9*?][A-Za-z0-9_*?-]*|[A-Za-z_*?][A-Za-z0-9_*?]*)$")


@dataclass(frozen=True)
class Hint:
    """One matched known cause, as the UI and ``inspect-log`` show it."""

    id: str
    title: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "detail": self.detail}


@dataclass(frozen=True)
class HintEvidence:
    """What is known about a start. Every field may be missing; a condition on a missing field fails
    (except ``argv_none``, which passes when the command line is unknown)."""

    log_lines: Sequence[str] = ()
    summary: StartupSummary | None = None
    stacks: Mapping[int, str] = field(default_factory=dict)  # pid or rank -> py-spy dump text
    argv: Sequence[str] | None = None
    env: Mapping[str, str] | None = None
    children: Sequence[str] = ()  # names (or command lines) of child processes that are not ranks
    state: str | None = None  # a session state ("starting", "stalled", ...)
    pyspy_available: bool | None = None


Predicate = Callable[[HintEvidence], "bool | Mapping[str, str] | None"]


@dataclass(frozen=True)
class KnownCause:
    id: str
    title: str
    detail: str
    source: Path
    log_any: tuple[re.Pattern[str], ...] = ()
    stack_any: tuple[re.Pattern[str], ...] = ()
    argv_any: tuple[str, ...] = ()
    argv_none: tuple[str, ...] = ()
    env_any: tuple[str, ...] = ()
    phase_in: frozenset[str] = frozenset()
    state_in: frozenset[str] = frozenset()
    child_any: tuple[str, ...] = ()
    check: str | None = None
    sources: tuple[str, ...] = ()
    present: frozenset[str] = frozenset()  # which condition keys the file gave
    implicates: tuple[str, ...] = ()  # flag / env patterns this cause is about (not a condition)

    @property
    def triggers(self) -> tuple[str, ...]:
        """The settings (flag names, env var patterns) this cause needs to match: ``argv_any``/``argv_none``
        flags without their ``=value``, ``env_any`` names, and ``implicates`` when the check reads settings.
        A start whose baseline had the same values did not fail because of them."""
        names = [f.partition("=")[0] for f in (*self.argv_any, *self.argv_none)] + list(self.env_any)
        if self.check is not None and PREDICATE_READS.get(self.check) == "settings":
            names += self.implicates
        return tuple(dict.fromkeys(names))

    @property
    def observed(self) -> bool:
        """Whether the match needs something this session did (a log line, a stack, a child process, a
        check on them), not only its settings, phase or state."""
        if self.log_any or self.stack_any or self.child_any:
            return True
        return self.check is not None and PREDICATE_READS.get(self.check, "observed") == "observed"


class KnownCausesError(ValueError):
    """A known-causes file is malformed; the message names the file, the cause and the key."""


# --- predicates ---------------------------------------------------------------------------------------

PREDICATES: dict[str, Predicate] = {}
# What a predicate reads: "observed" (what the session did: its log, ranks, stacks), "settings" (its
# command line or environment: the cause's ``implicates`` are then its triggers) or "phase" (only where
# the start is, true of every start there).  ``"sessions.module:function"`` predicates read "observed".
PREDICATE_READS: dict[str, str] = {}
PREDICATE_KINDS = ("observed", "settings", "phase")


def register_predicate(name: str, reads: str = "observed") -> Callable[[Predicate], Predicate]:
    """Make ``fn`` usable as ``check = "<name>"`` in a known-causes file; ``reads`` is one of
    `PREDICATE_KINDS` (what the predicate looks at, see `PREDICATE_READS`)."""
    if reads not in PREDICATE_KINDS:
        raise ValueError(f"register_predicate({name!r}): reads must be one of {PREDICATE_KINDS}, got {reads!r}")

    def wrap(fn: Predicate) -> Predicate:
        PREDICATES[name] = fn
        PREDICATE_READS[name] = reads
        return fn

    return wrap


def _fmt_ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    shown = ", ".join(f"TP{r}" for r in ranks[:8])
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _missing_from(evidence: HintEvidence, marker: str) -> Mapping[str, str] | None:
    """Ranks that show up in the log but never logged ``marker``, while others did."""
    s = evidence.summary
    if s is None:
        return None
    arrived = set(s.rank_arrival.get(marker, ()))
    if not arrived:
        return None
    candidates = set(s.ranks_seen) | arrived
    expected = s.ranks_expected
    nnodes = s.server_args.get("nnodes") if s.server_args else None
    single_node = nnodes in (None, 1)
    if expected and single_node and max(candidates, default=0) < expected:
        candidates |= set(range(expected))  # one node holds every rank, silent ones included
    missing = candidates - arrived
    if not missing:
        return None
    total = expected if expected and single_node else len(candidates)
    return {"missing": _fmt_ranks(missing), "arrived": str(len(arrived)), "expected": str(total),
            "missing_count": str(len(missing))}


@register_predicate("ranks_missing_load_weight_end")
def ranks_missing_load_weight_end(evidence: HintEvidence) -> Mapping[str, str] | None:
    return _missing_from(evidence, "load_weight_end")


@register_predicate("ranks_missing_init_parallel_end")
def ranks_missing_init_parallel_end(evidence: HintEvidence) -> Mapping[str, str] | None:
    return _missing_from(evidence, "init_parallel_end")


_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def _argv_value(argv: Sequence[str] | None, flag: str) -> str | None:
    if not argv:
        return None
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token[len(flag) + 1:]
    return None


def no_proxy_covers(no_proxy: str, host: str) -> bool:
    """Whether a ``no_proxy`` value keeps requests to ``host`` off the proxy (as Python requests reads it)."""
    host = host.strip().strip("[]").lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        entry = entry.split(":")[0] if entry.count(":") == 1 else entry  # "host:port" -> host
        if entry == host or (entry.lstrip(".") and host.endswith("." + entry.lstrip("."))):
            return True
        if "/" in entry:
            try:
                if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
    return False


@register_predicate("http_proxy_without_no_proxy", reads="settings")
def http_proxy_without_no_proxy(evidence: HintEvidence) -> Mapping[str, str] | None:
    """A proxy is set and ``no_proxy`` does not cover the address SGLang's warm-up request goes to.

    The warm-up thread requests ``http://<--host>:<port>`` (``_wait_and_warmup``); with a proxy in the
    environment that request goes to the proxy unless ``no_proxy`` names the host (hang-catalog #9).
    """
    env = evidence.env
    if not env:
        return None
    proxy_var = next((v for v in _PROXY_VARS if env.get(v)), None)
    if proxy_var is None:
        return None
    host = _argv_value(evidence.argv, "--host")
    if host is None and evidence.summary is not None:
        host = evidence.summary.server_args.get("host")  # type: ignore[assignment]
    hosts = {str(host or "127.0.0.1"), "127.0.0.1", "localhost"}
    no_proxy = ",".join(env.get(v, "") for v in ("no_proxy", "NO_PROXY"))
    uncovered = sorted(h for h in hosts if not no_proxy_covers(no_proxy, h))
    if not uncovered:
        return None
    return {"proxy_var": proxy_var, "hosts": ", ".join(uncovered)}


@register_predicate("startup_in_progress", reads="phase")
def startup_in_progress(evidence: HintEvidence) -> bool:
    s = evidence.summary
    return s is not None and s.outcome == "incomplete" and evidence.state not in ("crashed", "exited", "stopped")


@register_predicate("outcome_crashed", reads="phase")
def outcome_crashed(evidence: HintEvidence) -> bool:
    return (evidence.summary is not None and evidence.summary.outcome == "crashed") or evidence.state == "crashed"


@register_predicate("weights_done_no_end")
def weights_done_no_end(evidence: HintEvidence) -> Mapping[str, str] | None:
    """The weight bar reached n/n but no rank logged Load weight end, and the log stops there."""
    s = evidence.summary
    if s is None or s.outcome != "incomplete" or s.rank_arrival.get("load_weight_end"):
        return None
    p = s.progress
    if p is None or p.label != "shards" or p.total is None or p.done < p.total:
        return None
    return {"shards": f"{p.done}/{p.total}"}


@register_predicate("killed_without_prior_error")
def killed_without_prior_error(evidence: HintEvidence) -> bool:
    s = evidence.summary
    if s is None or s.outcome != "crashed":
        return False
    first = next((e for e in s.errors if e.fatal), None)
    return first is not None and first.kind in ("killed", "exit")


@register_predicate("pyspy_unavailable")
def pyspy_unavailable(evidence: HintEvidence) -> bool:
    return evidence.pyspy_available is False


# --- loading ------------------------------------------------------------------------------------------

_cache_lock = threading.Lock()
_cache: dict[tuple[tuple[str, float, int], ...], tuple[KnownCause, ...]] = {}


def cause_files(data_dir: Path | None = None) -> list[Path]:
    """Every known-causes file, ``known_causes.toml`` first, the rest by name."""
    files = sorted((data_dir or DATA_DIR).glob(CAUSE_FILE_GLOB))
    return sorted(files, key=lambda p: (p.name != "known_causes.toml", p.name))


def _resolve_predicate(name: str) -> Predicate | None:
    if name in PREDICATES:
        return PREDICATES[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if not module_name.startswith("sessions."):
            return None  # predicates come from our own engine only
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return None
        fn = getattr(module, attr, None)
        return fn if callable(fn) else None
    return None


def _string_list(where: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise KnownCausesError(f"{where}: `{key}` must be a list of non-empty strings, got {value!r}")
    if not value:
        raise KnownCausesError(f"{where}: `{key}` is empty (leave the key out instead)")
    return tuple(value)


def _regex(where: str, key: str, patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except re.error as exc:
            raise KnownCausesError(f"{where}: `{key}` has a bad regex {p!r}: {exc}") from None
    return tuple(compiled)


def _any_search(patterns: tuple[re.Pattern[str], ...], texts: Iterable[str]) -> bool:
    return any(p.search(t) for t in texts for p in patterns)


class _LogText:
    """The evidence's log lines, searched per line; one search over all of them first rules most
    patterns out at C speed (a line's match is also a match in the joined text)."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = lines
        self._joined: str | None = None
        self._maybe: dict[re.Pattern[str], bool] = {}

    def any_line(self, patterns: tuple[re.Pattern[str], ...]) -> bool:
        for pattern in patterns:
            maybe = self._maybe.get(pattern)
            if maybe is None:
                if self._joined is None:
                    self._joined = "\n".join(self.lines)
                joined_hit = re.search(pattern.pattern, self._joined, pattern.flags | re.MULTILINE)
                maybe = self._maybe[pattern] = joined_hit is not None
            if maybe and any(pattern.search(line) for line in self.lines):
                return True
        return False


def parse_causes(text: str, source: Path) -> list[KnownCause]:
    """The causes of one file's text; raises `KnownCausesError` for anything malformed."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KnownCausesError(f"{source}: not valid TOML: {exc}") from None
    unknown_top = sorted(set(data) - {"cause"})
    if unknown_top:
        raise KnownCausesError(f"{source}: unknown top-level key(s) {', '.join(unknown_top)} (only [[cause]])")
    raw_causes = data.get("cause", [])
    if not isinstance(raw_causes, list):
        raise KnownCausesError(f"{source}: `cause` must be an array of tables ([[cause]])")
    causes: list[KnownCause] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_causes, start=1):
        where = f"{source}: cause #{index}"
        if not isinstance(raw, dict):
            raise KnownCausesError(f"{where}: must be a table")
        cid = raw.get("id")
        if isinstance(cid, str):
            where = f"{source}: cause #{index} ({cid})"
        unknown = sorted(set(raw) - _ALLOWED_KEYS)
        if unknown:
            raise KnownCausesError(
                f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_ALLOWED_KEYS))}"
            )
        for key in ("id", "title", "detail"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise KnownCausesError(f"{where}: `{key}` is required and must be a non-empty string")
        if not isinstance(cid, str) or not _ID_RE.match(cid):  # (a str: checked with title and detail)
            raise KnownCausesError(f"{where}: `id` must be lower-case words joined by '-', got {cid!r}")
        if cid in seen:
            raise KnownCausesError(f"{where}: duplicate id {cid!r}")
        seen.add(cid)
        present = frozenset(set(raw) & _CONDITION_KEYS)
        if not present:
            raise KnownCausesError(f"{where}: has no condition (it would match everything)")
        lists = {key: _string_list(where, key, raw[key]) for key in _LIST_KEYS if key in raw}
        for phase in lists.get("phase_in", ()):
            if phase not in StartupPhase._value2member_map_:
                raise KnownCausesError(f"{where}: `phase_in` has unknown phase {phase!r}")
        for state in lists.get("state_in", ()):
            if state not in SESSION_STATES:
                raise KnownCausesError(f"{where}: `state_in` has unknown state {state!r}")
        for flag in lists.get("argv_any", ()) + lists.get("argv_none", ()):
            if not flag.startswith("-"):
                raise KnownCausesError(f"{where}: flags must start with '-', got {flag!r}")
        check = raw.get("check")
        if check is not None and (not isinstance(check, str) or _resolve_predicate(check) is None):
            raise KnownCausesError(
                f"{where}: `check` names an unknown predicate {check!r}; known: {', '.join(sorted(PREDICATES))}"
            )
        sources = _string_list(where, "sources", raw["sources"]) if "sources" in raw else ()
        implicates = _string_list(where, "implicates", raw["implicates"]) if "implicates" in raw else ()
        for name in implicates:
            if not _IMPLICATES_RE.match(name):
                raise KnownCausesError(
                    f"{where}: `implicates` entries must be a flag ('--attention-backend') or an environment "
                    f"variable ('NCCL_*'), shell-style patterns allowed; got {name!r}"
                )
        causes.append(
            KnownCause(
                id=cid,
                title=raw["title"].strip(),
                detail=raw["detail"].strip(),
                source=source,
                log_any=_regex(where, "log_any", lists["log_any"]) if "log_any" in lists else (),
                stack_any=_regex(where, "stack_any", lists["stack_any"]) if "stack_any" in lists else (),
                argv_any=lists.get("argv_any", ()),
                argv_none=lists.get("argv_none", ()),
                env_any=lists.get("env_any", ()),
                phase_in=frozenset(lists.get("phase_in", ())),
                state_in=frozenset(lists.get("state_in", ())),
                child_any=lists.get("child_any", ()),
                check=check,
                sources=sources,
                present=present,
                implicates=implicates,
            )
        )
    return causes


def load_causes(paths: Sequence[Path] | None = None) -> tuple[KnownCause, ...]:
    """Every cause of ``paths`` (default: all ``known_causes*.toml``), validated; cached until a file changes."""
    files = list(paths) if paths is not None else cause_files()
    key_parts = []
    for p in files:
        try:
            st = p.stat()
        except OSError as exc:
            raise KnownCausesError(f"{p}: cannot read: {exc.strerror or exc}") from None
        key_parts.append((str(p), st.st_mtime, st.st_size))
    key = tuple(key_parts)
    with _cache_lock:
        cached = _cache.get(key)
    if cached is not None:
        return cached
    causes: list[KnownCause] = []
    where_id: dict[str, Path] = {}
    for p in files:
        try:
            text = safe_files.read_text(p, safe_files.CATALOGUE)
        except OSError as exc:
            raise KnownCausesError(f"{p}: cannot read: {exc}") from None
        for cause in parse_causes(text, p):
            if cause.id in where_id:
                raise KnownCausesError(
                    f"{p}: cause {cause.id!r} is already defined in {where_id[cause.id]} (ids must be unique)"
                )
            where_id[cause.id] = p
            causes.append(cause)
    result = tuple(causes)
    with _cache_lock:
        _cache[key] = result
    return result


# --- matching -----------------------------------------------------------------------------------------


def _argv_has(argv: Sequence[str], flag: str) -> bool:
    name, eq, value = flag.partition("=")
    for i, token in enumerate(argv):
        if not eq:
            if token == name or token.startswith(name + "="):
                return True
        elif token == flag or (token == name and i + 1 < len(argv) and argv[i + 1] == value):
            return True
    return False


def _child_matches(children: Sequence[str], names: tuple[str, ...]) -> bool:
    for child in children:
        words = child.strip().split()
        base = words[0].rsplit("/", 1)[-1] if words else ""
        if base in names:
            return True
    return False


def _fill(text: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def _cause_matches(cause: KnownCause, ev: HintEvidence, lines: _LogText) -> Mapping[str, str] | None:
    """The fill-ins when every condition of ``cause`` holds, else None."""
    if cause.phase_in and (ev.summary is None or str(ev.summary.phase) not in cause.phase_in):
        return None
    if cause.state_in and ev.state not in cause.state_in:
        return None
    if cause.argv_any and (ev.argv is None or not any(_argv_has(ev.argv, f) for f in cause.argv_any)):
        return None
    if cause.argv_none and ev.argv is not None and any(_argv_has(ev.argv, f) for f in cause.argv_none):
        return None
    if cause.env_any and (not ev.env or not any(ev.env.get(name) for name in cause.env_any)):
        return None
    if cause.child_any and not _child_matches(ev.children, cause.child_any):
        return None
    if cause.stack_any and not _any_search(cause.stack_any, ev.stacks.values()):
        return None
    if cause.log_any and not lines.any_line(cause.log_any):
        return None
    values: Mapping[str, str] = {}
    if cause.check is not None:
        predicate = _resolve_predicate(cause.check)
        result = predicate(ev) if predicate is not None else None
        if not result:
            return None
        if isinstance(result, Mapping):
            values = result
    return values


def match_hints(evidence: HintEvidence, causes: Sequence[KnownCause] | None = None) -> list[Hint]:
    """The known causes that ``evidence`` fits, in catalogue order."""
    if causes is None:
        causes = load_causes()
    lines = _LogText([strip_ansi(line) for line in evidence.log_lines])
    hints: list[Hint] = []
    for cause in causes:
        values = _cause_matches(cause, evidence, lines)
        if values is not None:
            hints.append(Hint(cause.id, _fill(cause.title, values), _fill(cause.detail, values)))
    return hints


def implications(causes: Sequence[KnownCause] | None = None) -> list[Implication]:
    """What each cause of the catalogue ``implicates`` (the causes without the key are left out)."""
    if causes is None:
        causes = load_causes()
    return [Implication(c.id, c.implicates) for c in causes if c.implicates]


def argv_from_server_args(server_args: Mapping[str, object]) -> list[str]:
    """Flags equivalent to a log's ``server_args`` values (True -> ``--flag``, a value -> ``--flag=value``).

    Lets flag conditions (``argv_any``) work on a log alone; False and None values are left out.
    """
    argv: list[str] = []
    for key, value in server_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        else:
            argv.append(f"{flag}={value}")
    return argv


def hints_for_log(summary: StartupSummary, log_lines: Sequence[str]) -> list[Hint]:
    """Hints from a log alone (``inspect-log``): its lines, its summary and the flags of its server_args."""
    argv = argv_from_server_args(summary.server_args) if summary.server_args else None
    state = {"crashed": "crashed", "ready": "ready"}.get(summary.outcome)
    return match_hints(HintEvidence(log_lines=log_lines, summary=summary, argv=argv, state=state))
