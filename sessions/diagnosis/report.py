"""The human report of a diagnosis (the CLI's default output, ``report.txt`` in the bundle)."""
from __future__ import annotations

from sessions import history
from sessions.diagnosis.model import Diagnosis, ProcessReport, _fmt_ranks
from sessions.diagnosis.ranking import ADVICE_RANKS, DEMOTED_RANKS, EVIDENCE_RANKS


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / (1 << 20):,.0f} MiB"


def format_report(d: Diagnosis) -> str:
    """The human report (CLI default output, ``report.txt`` in the bundle).

    What this session produced comes first (the verdict, the baseline and what changed since it, the hints
    its evidence backs, the stacks, the last lines); then the timings and GPUs; then the hints the baseline
    rules out; general advice for the phase last."""
    out = _verdict_lines(d)
    out += _hints_section(d, EVIDENCE_RANKS, "hints from this session's evidence:")
    out.append("")
    out += _process_table(d)
    if d.progress_lines:
        out += ["", "progress bars (last frame of each):", *(f"  {line}" for line in d.progress_lines[-5:])]
    if d.last_lines:
        out += ["", "last log lines:", *(f"  {line}" for line in d.last_lines[-10:])]
    out += _phase_table(d)
    out.append("")
    out += _gpu_lines(d)
    out += _hints_section(d, DEMOTED_RANKS, "hints the baseline speaks against (its good start had the same "
                                          "settings):")
    out += _hints_section(d, ADVICE_RANKS, "general advice for this phase (true of every start here):")
    return "\n".join(out) + "\n"


def _verdict_lines(d: Diagnosis) -> list[str]:
    """The headline, what is wrong, the port, the comparison, the changes, the first error, the ranks."""
    out = [d.headline]
    if d.problem:
        out.append(f"problem: {d.problem}")
    out += [
        f"port {'listening' if d.port_listening else 'closed'}; /ready: "
        + {True: "200", False: "not ready", None: "not asked (port closed)"}[d.ready],
        d.baseline_line,
        d.compare,
    ]
    out.extend(format_changes(d))
    if d.error:
        out.append(f"first error (line {d.error_line}): {d.error}")
    if d.silent_ranks:
        out.append(f"silent ranks: {_fmt_ranks(d.silent_ranks)}")
    if d.missing_load_weight_end:
        out.append(f"missing from Load weight end: {_fmt_ranks(d.missing_load_weight_end)}")
    return out


def _process_table(d: Diagnosis) -> list[str]:
    out = [f"{'proc':<12} {'pid':>7} {'status':<10} {'cpu%':>6} {'rss':>10} {'thr':>4}  blocked in"]
    out += [_process_row(p) for p in d.processes]
    if not d.processes:
        out.append("(no live processes)")
    return out


def _process_row(p: ProcessReport) -> str:
    cpu = "n/a" if p.cpu_percent is None else f"{p.cpu_percent:.0f}"
    if p.stack is None:
        where = "" if p.role == "other" else "(no stack taken)"
    elif p.stack.ok:
        where = str(p.stack.blocked_in or "?")
    else:
        where = f"[{p.stack.error_kind}] {p.stack.error}"
    name = p.label if p.role != "other" else (p.title.split(" ")[0].rsplit("/", 1)[-1] or "?")
    # SGLang's own children are rows of the table already; name only the others (compilers, helpers).
    others = [c for c in p.children if not c.startswith("sglang::")]
    children = f"  children: {', '.join(others)}" if others else ""
    return (
        f"{name[:12]:<12} {p.pid:>7} {p.status[:10]:<10} {cpu:>6} {_mib(p.rss_bytes):>10} "
        f"{p.num_threads if p.num_threads is not None else 'n/a':>4}  {where}{children}"
    )


def _gpu_lines(d: Diagnosis) -> list[str]:
    if not d.gpus:
        return [f"GPUs: {d.gpu_message or 'no readings'}"]
    out = [f"GPUs ({d.gpu_source}{': ' + d.gpu_message if d.gpu_message else ''}):"]
    for g in d.gpus:
        procs = ", ".join(f"{p.label or p.pid} {_mib(p.used_bytes)}" for p in g.processes)
        out.append(f"  GPU{g.index} {_mib(g.memory_used_bytes)} / {_mib(g.memory_total_bytes)}  {procs}")
    return out


def _phase_table(d: Diagnosis) -> list[str]:
    if not (d.has_baseline and d.phase_rows):
        return []
    out = ["", f"{'phase':<22} {'good start':>16} {'this start':>16}"]
    for row in d.phase_rows:
        out.append(f"{row.phase:<22} {_at(row.good_at_s, row.good_line):>16} {_at(row.this_at_s, row.this_line):>16}")
    return out


def _hints_section(d: Diagnosis, ranks: tuple[str, ...], title: str) -> list[str]:
    """The hints of ``ranks`` under ``title``, each with why it ranks there when the baseline decided it."""
    group = [h for h in d.hints if h.rank in ranks]
    if not group:
        return []
    out = ["", title]
    for h in group:
        out.append(f"  [{h.id}] {h.title}")
        if h.why:
            out.append(f"      ({h.why})")
        if h.detail:
            out.append(f"      {h.detail}")
    return out


def _at(at_s: float | None, line: int | None) -> str:
    if at_s is None and line is None:
        return "-"
    when = history.format_duration_s(at_s) if at_s is not None else "?"
    return f"{when} (line {line})" if line is not None else when


def format_changes(d: Diagnosis) -> list[str]:
    """The "what changed since the baseline" lines: implicated changes first, each with the known
    causes that name it (``*`` marks a cause that matches this start now)."""
    if d.changes_since_last_good is None or not d.changes_since_last_good:
        return [f"changes since the baseline: {d.changes_note}"] if d.changes_note else []
    base = d.baseline.session_id if d.baseline else "?"
    out = [f"changes since the baseline ({base}):"]
    for c in d.changes_since_last_good:
        line = f"  {'!' if c.implicated_by else '-'} {c.describe()}"
        if c.implicated_by:
            causes = ", ".join(f"{i}*" if i in c.hinted_by else i for i in c.implicated_by)
            line += f"   [known causes: {causes}]"
        out.append(line)
    if any(c.implicated_by for c in d.changes_since_last_good):
        out.append("  (! = a known cause points at this change; * = that cause matches this start now)")
    return out


