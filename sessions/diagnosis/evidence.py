"""The evidence a diagnosis gathers, each part on its own: the secrets to hide, the server's environment,
the log's tail (read by the log core), GPU readings, per-rank analysis, hints and what changed since the
last good start.  Nothing here raises for what it probes.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sessions import history, safe_files, stacks, start_facts
from sessions.baseline import BaselineChoice
from sessions.diagnosis.model import GpuProcessReport, GpuReport, HintView
from sessions.diagnosis.predicates import RuntimeEvidence
from sessions.logs import LogFileError, read_tail
from sessions.phases import StartupSummary
from sessions.redaction import Redactor, collect_secrets, redact_env, redact_text


class _Redactor:
    """Every string of a diagnosis passes through here: known secret values first (the session's secrets
    file and profile, the live environment, the argv), in every escaped form, then secret shapes."""

    def __init__(self, known: Iterable[str], session: Any = None) -> None:
        base = Redactor.for_session(session) if session is not None else Redactor()
        self.known = base.with_values(known).known

    def text(self, text: str) -> str:
        return redact_text(text, self.known)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return redact_env(env, self.known)


def _secret_argv_values(argv: Sequence[str]) -> list[str]:
    return collect_secrets(argv)


def _process_environ(pid: int | None) -> dict[str, str]:
    """The server's real environment (ours to read: we launched it); {} when it cannot be read."""
    if not pid:
        return {}
    try:
        import psutil

        return dict(psutil.Process(pid).environ())
    except Exception:  # noqa: BLE001 - gone, or not readable: the profile env is the fallback
        return {}


def _tail_texts(path: Path, max_bytes: int, *, follow_symlinks: bool = True) -> list[str]:
    """The shown text of the log's last lines within ``max_bytes``, read by the log core; a log that is
    not a regular file (a FIFO, a device: never waited on) gives one line saying so."""
    try:
        return [line.text for line in read_tail(path, max_bytes, follow_symlinks=follow_symlinks)]
    except LogFileError as exc:
        return [f"(log not read: {exc})"]
    except OSError:
        return []


def _gpu_snapshot(session: Any, home: Any) -> Any:
    """GPU readings from the source that fits the session: emulated numbers for an emulator session, NVML
    (falling back to emulated) otherwise.  Never raises."""
    try:
        from sessions import gpus as gpu_module

        session_dir = Path(getattr(session, "session_dir", "."))
        source: gpu_module.GpuSource
        if (session_dir / getattr(gpu_module, "EMULATED_GPUS_FILE", "emulated_gpus.json")).is_file():
            source = gpu_module.EmulatedSource(home)
        elif getattr(home, "demo", False):
            source = gpu_module.default_gpu_source(home, demo=True)
        else:
            source = gpu_module.NvmlSource(wait_s=3.0, fallback=gpu_module.EmulatedSource(home))
        try:
            return source.snapshot()
        finally:
            source.close()
    except Exception as exc:  # noqa: BLE001 - GPU readings are optional for a diagnosis
        from sessions.gpus import GpuSnapshot

        return GpuSnapshot((), "none", False, f"GPU readings not available: {exc}", time.time())


def _gpu_reports(snapshot: Any, labels: Mapping[int, str]) -> tuple[GpuReport, ...]:
    reports = []
    for sample in getattr(snapshot, "samples", ()) or ():
        reports.append(
            GpuReport(
                index=sample.index,
                name=sample.name,
                memory_used_bytes=sample.memory_used_bytes,
                memory_total_bytes=sample.memory_total_bytes,
                utilization_percent=sample.utilization_percent,
                processes=tuple(
                    GpuProcessReport(p.pid, p.used_bytes, labels.get(p.pid)) for p in sample.processes
                ),
            )
        )
    return tuple(reports)


def _dump_targets(tree: Sequence[Any]) -> list[int]:
    """The main process and SGLang's children (schedulers, detokenizer, DP controller), not compilers."""
    return [p.pid for p in tree if p.role in ("main", "scheduler", "detokenizer", "dp_controller")]


# Markers every TP rank logs (sglang-facts §1.4); our capture plugin's line comes from some ranks only.
_EVERY_RANK_MARKERS = (
    "init_parallel_begin", "init_parallel_end", "load_weight_begin", "load_weight_end",
    "kv_cache_allocated", "memory_pool_end", "cuda_graph_begin", "cuda_graph_end",
)


def _rank_analysis(
    summary: StartupSummary, expected: int | None, local_ranks: Iterable[int], state: str
) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...], tuple[int, ...]]:
    """(lagging ranks per marker, ranks missing from Load weight end, silent ranks).

    The ranks to expect are those this node's log or process tree shows (a multi-node log only has its
    own ranks), or all ``expected`` when neither shows any.
    """
    universe = set(summary.ranks_seen or ()) | set(local_ranks)
    if not universe and expected:
        universe = set(range(expected))
    lagging: dict[str, tuple[int, ...]] = {}
    for marker in _EVERY_RANK_MARKERS:
        arrived = (summary.rank_arrival or {}).get(marker, ())
        missing = tuple(sorted(universe - set(arrived)))
        if arrived and missing:
            lagging[marker] = missing
    missing_lwe = lagging.get("load_weight_end", ())
    lagging_all = sorted({r for ranks in lagging.values() for r in ranks})
    if lagging_all:
        silent = tuple(lagging_all)
    elif state == "stalled":
        silent = tuple(sorted(universe))  # the whole log is silent: so is every rank
    else:
        silent = ()
    return lagging, missing_lwe, silent


def _match_hints(evidence: RuntimeEvidence) -> list[HintView]:
    """Hints from every ``known_causes*.toml``; a broken catalogue becomes a hint, not a failed diagnosis."""
    from sessions.hints import KnownCausesError, match_hints

    try:
        found = match_hints(evidence)
    except KnownCausesError as exc:
        return [HintView("known-causes-unreadable", "The known-causes catalogue could not be read", str(exc))]
    return [HintView(h.id, h.title, h.detail) for h in found]


_TQDM_FRAME = re.compile(r"\d{1,3}%\|[^|]*\|\s*\d+/\d+\s*\[")


def split_progress(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    """(log lines, progress bars): a tqdm frame is not a log line; of each bar only its last frame is
    kept (a bar is named by its description, the text before the percentage)."""
    log_lines: list[str] = []
    bars: dict[str, str] = {}
    for line in lines:
        match = _TQDM_FRAME.search(line)
        if match is None:
            log_lines.append(line)
            continue
        bars.pop(line[: match.start()].strip(), None)
        bars[line[: match.start()].strip()] = line
    return log_lines, list(bars.values())


def _changes_since_last_good(
    facts: Mapping[str, Any] | None, choice: BaselineChoice | None, hints: Sequence[HintView],
    redactor: _Redactor, facts_problem: str | None = None,
) -> tuple[tuple[start_facts.Change, ...] | None, str | None]:
    """The changes from the baseline to this start (``facts``), each marked with the known causes naming it."""
    if choice is None:
        return None, ("no earlier good start of this profile, nor of another profile with the same model, "
                      "TP/PP/DP and SGLang version: nothing to compare with (diagnose --baseline SESSION, or p "
                      "on the diagnosis screen, picks one)")
    baseline = choice.record
    if facts_problem is not None:  # only this section fails: the rest of the diagnosis stands
        return None, f"this start's settings cannot be read: {facts_problem}"
    if facts is None:
        return None, "this start's settings were not recorded (launched by an older eagle3-tui)"
    if not baseline.facts:
        return None, (f"the good start {baseline.session_id} was recorded before settings were kept: "
                      "its flags and environment are not known")
    from sessions.hints import KnownCausesError, implications

    try:
        rules = implications()
    except KnownCausesError:
        rules = []  # the broken catalogue is a hint already; the changes are still worth showing
    changes = history.changes_since(baseline, facts, rules, [h.id for h in hints])
    cleaned = tuple(
        start_facts.Change(c.what, redactor.text(c.before) if c.before is not None else None,
                           redactor.text(c.after) if c.after is not None else None, c.kind, c.name,
                           c.implicated_by, c.hinted_by)
        for c in changes
    )
    return cleaned, None if cleaned else f"nothing changed since the baseline ({baseline.session_id})"


def _redact_argv_values(argv: Sequence[str]) -> list[str]:
    from sessions.redaction import redact_argv

    return redact_argv(argv)


def _command_argv(session: Any) -> list[str]:
    try:
        data = safe_files.read_json(Path(session.session_dir) / "command.json", safe_files.SESSION_RECORD)
        return [str(a) for a in data.get("argv", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def _redact_dump(dump: stacks.StackDump | None, redactor: _Redactor) -> stacks.StackDump | None:
    if dump is None:
        return None
    from dataclasses import replace

    return replace(
        dump,
        text=redactor.text(dump.text),
        error=redactor.text(dump.error) if dump.error else None,
    )


