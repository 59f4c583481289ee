"""`diagnose(session)`: one diagnosis of a live or ended session, gathered in a couple of seconds.

In order: the status (phase, silence, port, ``/ready``), the process tree and GPU readings (together),
py-spy stacks of every rank (in parallel, each with a timeout), the rank analysis, the log's tail, the
comparison with the last good start, then the hints; every string is redacted on the way in.
"""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions import baseline as baselines
from sessions import history, stacks, stall, start_facts
from sessions.diagnosis.evidence import (
    _changes_since_last_good,
    _command_argv,
    _dump_targets,
    _gpu_reports,
    _gpu_snapshot,
    _match_hints,
    _process_environ,
    _rank_analysis,
    _redact_argv_values,
    _redact_dump,
    _Redactor,
    _secret_argv_values,
    _tail_texts,
    split_progress,
)
from sessions.diagnosis.model import (
    CPU_INTERVAL_S,
    DEFAULT_STACK_TIMEOUT_S,
    HINT_LOG_BYTES,
    IDLE_CPU_PERCENT,
    LAST_LINES,
    SPIN_CPU_PERCENT,
    Diagnosis,
    HintView,
    ProcessReport,
)
from sessions.diagnosis.predicates import RuntimeEvidence
from sessions.diagnosis.ranking import rank_hints
from sessions.phases import StartupSummary, error_headline
from sessions.redaction import collect_secrets, secret_values

# Environment that explains hangs (NCCL, CUDA, proxies, SGLang switches); the rest stays out of bundles.
_RELEVANT_ENV = re.compile(
    r"^(NCCL_|CUDA_|SGLANG_|SGL_|TORCH_|TORCHINDUCTOR_|GLOO_|FLASHINFER_|TRITON_|HF_|NVIDIA_|OMP_|MASTER_"
    r"|PYTORCH_|DG_|DEEPGEMM_|TP_|WORLD_SIZE|RANK|LOCAL_RANK|PYTHONPATH$|LD_LIBRARY_PATH$|PATH$|VIRTUAL_ENV$"
    r"|EAGLE3_)|^(http_proxy|https_proxy|all_proxy|no_proxy)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _Context:
    """What a diagnosis knows of the session before it probes: its profile, argv, env and secrets."""

    problems: list[str]
    server: Any  # the profile's [server] table, None when the snapshot cannot be read
    argv: list[str]
    profile_env: dict[str, str]
    environ: dict[str, str]
    redactor: _Redactor


@dataclass(frozen=True)
class _RankFindings:
    """What the ranks show together: who lags, who is silent, idle, or waiting in a collective."""

    expected: int | None
    lagging: dict[str, tuple[int, ...]]
    missing_lwe: tuple[int, ...]
    silent: tuple[int, ...]
    idle: tuple[int, ...]
    collective: dict[int, str]


def diagnose(
    session: Any,
    with_stacks: bool = True,
    stack_timeout_s: float = DEFAULT_STACK_TIMEOUT_S,
    *,
    cpu_interval_s: float = CPU_INTERVAL_S,
    pyspy: str | None = None,
    baseline: str | None = None,
) -> Diagnosis:
    """Collect everything about ``session`` (a `ServerSession`) now; never raises for what it probes.

    ``baseline`` is the session id (or unique prefix) of a good start to compare with instead of the one
    `sessions.baseline.choose_baseline` picks; a bad one raises `sessions.baseline.BaselineError` first.
    """
    # a bad start_facts.json (a device, a FIFO, deep JSON) leaves this start's settings unknown, and fails
    # only the "changes since the baseline" section
    facts, facts_problem = start_facts.read_checked(Path(getattr(session, "session_dir", "") or "."))
    chosen = baselines.chosen_baseline(session.home, baseline, facts) if baseline else None
    start = time.monotonic()
    taken_at = time.time()
    status = session.status(probe_http=True)
    ctx = _context(session, status)
    redactor = ctx.redactor
    tree, gpu_snapshot = _tree_and_gpus(session, status, cpu_interval_s)
    pyspy_state = stacks.pyspy_status(pyspy)
    dumps: dict[int, stacks.StackDump] = {}
    if with_stacks and tree:
        dumps = stacks.dump_stacks(_dump_targets(tree), timeout_s=stack_timeout_s, pyspy=pyspy_state.path)
    processes = _process_reports(tree, dumps, redactor)
    summary: StartupSummary = status.summary
    ranks = _rank_findings(summary, summary.ranks_expected or getattr(ctx.server, "tp_size", None), processes,
                           status.state)

    last_lines_all = _tail_texts(status.log_path, HINT_LOG_BYTES, follow_symlinks=False)  # ours: never a link
    log_only, progress = split_progress(last_lines_all)
    choice = chosen or baselines.choose_baseline(session.home, status.profile, status.session_id, facts)
    good = choice.record if choice is not None else None
    hint_list = _match_hints(
        RuntimeEvidence(
            log_lines=list(last_lines_all),
            summary=summary,
            stacks={pid: d.text for pid, d in dumps.items() if d.ok},
            argv=ctx.argv,
            env={**ctx.environ, **ctx.profile_env},
            children=[p.name for p in tree if p.role == "other"],
            state=status.state,
            pyspy_available=pyspy_state.available,
            processes=processes,
            dumps=dumps,
            with_stacks=with_stacks and bool(tree),
        )
    )
    unranked = _unique_hints(hint_list, redactor)
    changes, changes_note = _changes_since_last_good(facts, choice, unranked, redactor, facts_problem)
    hints = rank_hints(unranked, changes, choice)
    return Diagnosis(
        session_id=status.session_id,
        profile=status.profile,
        state=status.state,
        phase=status.phase,
        silent_for_s=status.silent_for_s,
        stall_limit_s=status.stall_limit_s,
        last_lines=tuple(redactor.text(line) for line in log_only[-LAST_LINES:]),
        port_listening=status.port_listening,
        ready=status.ready,
        processes=processes,
        gpus=_gpu_reports(gpu_snapshot, {p.pid: p.label for p in processes}),
        gpu_source=getattr(gpu_snapshot, "source", "none"),
        gpu_message=getattr(gpu_snapshot, "message", None),
        baseline=good,
        baseline_choice=choice,
        hints=tuple(hints),
        compare=history.compare(
            good, summary, status.phase_entered_at, status.silent_for_s, started_at=status.started_at
        ),
        phase_rows=_phase_rows(good, summary, status),
        ranks_expected=ranks.expected,
        silent_ranks=ranks.silent,
        lagging_ranks=ranks.lagging,
        missing_load_weight_end=ranks.missing_lwe,
        compile_children=tuple(f"{p.name} (pid {p.pid})" for p in tree if stall.is_compiler_name(p.name)),
        idle_ranks=ranks.idle,
        collective_ranks=ranks.collective,
        pyspy=pyspy_state,
        with_stacks=with_stacks,
        log_path=str(status.log_path),
        line_count=summary.line_count,
        error=redactor.text(error_headline(summary) or "") if summary.error else None,
        error_line=summary.error_line,
        argv=tuple(redactor.text(a) for a in _redact_argv_values(ctx.argv)),
        env=_env_shown(ctx),
        taken_at=taken_at,
        collect_s=time.monotonic() - start,
        progress_lines=tuple(redactor.text(line) for line in progress),
        problem="; ".join(ctx.problems) if ctx.problems else None,
        host=status.host,
        port=status.port,
        changes_since_last_good=changes,
        changes_note=changes_note,
    )


def _context(session: Any, status: Any) -> _Context:
    """The profile (a damaged snapshot is reported, the rest is still diagnosed), argv, env, secrets."""
    problems = [status.problem] if status.problem else []
    try:
        profile = session.profile
    except Exception as exc:  # noqa: BLE001 - a damaged snapshot is reported, the rest is still diagnosed
        profile = None
        problems.append(f"the profile snapshot {Path(session.session_dir) / 'profile.toml'} cannot be read: {exc}")
    server = getattr(profile, "server", None)
    rec = session.state_record
    argv = list(rec.get("argv") or _command_argv(session))
    profile_env = dict(getattr(server, "env", {}) or {})
    environ = _process_environ(status.pid if status.alive else None)
    redactor = _Redactor(
        secret_values(profile_env) + collect_secrets((), environ) + _secret_argv_values(argv), session
    )
    return _Context(problems, server, argv, profile_env, environ, redactor)


def _tree_and_gpus(session: Any, status: Any, cpu_interval_s: float) -> tuple[list, Any]:
    """The live process tree (CPU measured over ``cpu_interval_s``) and GPU readings, taken together."""
    from sessions import probes

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="diagnose") as pool:
        gpu_future = pool.submit(_gpu_snapshot, session, session.home)
        tree = (
            probes.process_tree(status.pid, status.create_time, cpu_interval_s=cpu_interval_s)
            if status.alive and status.pid
            else []
        )
        return tree, gpu_future.result()


def _process_reports(
    tree: list, dumps: dict[int, stacks.StackDump], redactor: _Redactor
) -> tuple[ProcessReport, ...]:
    return tuple(
        ProcessReport(
            pid=p.pid,
            title=redactor.text(p.title),
            role=p.role,
            rank=p.rank if p.role == "scheduler" else None,
            status=p.status,
            cpu_percent=p.cpu_percent,
            rss_bytes=p.rss_bytes,
            num_threads=p.num_threads,
            children=tuple(p.children),
            stack=_redact_dump(dumps.get(p.pid), redactor),
            dp_rank=p.dp_rank if p.role == "scheduler" else None,
        )
        for p in tree
    )


def _rank_findings(
    summary: StartupSummary, expected: int | None, processes: tuple[ProcessReport, ...], state: str
) -> _RankFindings:
    schedulers = [(p.rank, p) for p in processes if p.role == "scheduler" and p.rank is not None]
    lagging, missing_lwe, silent = _rank_analysis(summary, expected, [rank for rank, _ in schedulers], state)
    busy = [p for _, p in schedulers if (p.cpu_percent or 0.0) >= SPIN_CPU_PERCENT]
    idle = tuple(
        sorted(rank for rank, p in schedulers if p.cpu_percent is not None and p.cpu_percent < IDLE_CPU_PERCENT)
    ) if busy else ()
    collective = {
        rank: str(p.stack.collective_frame)
        for rank, p in schedulers
        if p.stack is not None and p.stack.ok and p.stack.collective_frame is not None
    }
    return _RankFindings(expected, lagging, missing_lwe, silent, idle, collective)


def _phase_rows(baseline: history.Baseline | None, summary: StartupSummary, status: Any) -> tuple:
    """The table compares with a good start; without one it would be a column of blanks."""
    if baseline is None or not baseline.reached_ready:
        return ()
    rows = history.compare_rows(baseline, summary, status.phase_entered_at, started_at=status.started_at)
    return tuple(rows)


def _unique_hints(hints: list[HintView], redactor: _Redactor) -> list[HintView]:
    """Each id once, redacted, in catalogue order (`rank_hints` orders them)."""
    seen: set[str] = set()
    unique = []
    for hint in hints:
        if hint.id not in seen:
            seen.add(hint.id)
            title, detail = redactor.text(hint.title), redactor.text(hint.detail)
            unique.append(HintView(hint.id, title, detail, hint.evidence))
    return unique


def _env_shown(ctx: _Context) -> dict[str, str]:
    """The profile's env and the hang-relevant part of the server's environment, redacted and sorted."""
    merged = {**ctx.environ, **ctx.profile_env}
    relevant = {k: v for k, v in merged.items() if k in ctx.profile_env or _RELEVANT_ENV.search(k)}
    shown = ctx.redactor.env(relevant)
    return dict(sorted(shown.items()))
