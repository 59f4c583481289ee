"""DP ranks in the panel: ``status --json``, the GPU panel, the phase timeline and the error headline name
the ranks of a ``--dp-size`` server ``DPk TPm`` (SGLang's own prefix), not by a global ``TP`` number.

The live test runs a real DP2 x TP2 emulator session with the ``rank-missing`` fault: the last TP rank of
each replica never finishes its weights, so the timeline waits for ``DP0 TP1`` and ``DP1 TP1``."""

from __future__ import annotations

import json
import subprocess
import sys

from _extract_support import wait_for

from sessions.gpus import EmulatedSource
from sessions.phases.model import StartupSummary, error_headline
from sessions.phases.topology import rank_name


def test_rank_names_follow_the_layout_of_the_server_args_line() -> None:
    dp = {"tp_size": 2, "pp_size": 1, "dp_size": 2, "enable_dp_attention": False, "attn_dp_size": 1}
    assert [rank_name(r, dp) for r in range(4)] == ["DP0 TP0", "DP0 TP1", "DP1 TP0", "DP1 TP1"]
    assert rank_name(5, {**dp, "pp_size": 2}) == "DP1 PP0 TP1"
    assert rank_name(3, {**dp, "enable_dp_attention": True}) == "TP3"  # attention DP: one TP group
    assert rank_name(3, {"tp_size": 4}) == "TP3"
    summary = StartupSummary(error="RuntimeError: boom", error_rank=3, server_args=dp)
    assert error_headline(summary) == "DP1 TP1: RuntimeError: boom"


def test_status_gpu_panel_and_timeline_name_dp_ranks(make_emulator_profile, launched, home, cli_env) -> None:
    from app.tui import Eagle3App
    from tests._tui_support import first_poll, run, screen_text, wait_until
    from widgets.gpu_panel import GpuPanel
    from widgets.phase_timeline import PhaseTimeline

    profile = make_emulator_profile("dpview", tp=2, dp_size=2, fault="rank-missing", watch={"stall_after_s": 600})
    session = launched.launch(profile)

    def waiting() -> bool:
        status = session.status(probe_http=False)
        arrival = status.summary.rank_arrival.get("load_weight_end", ())
        return sorted(arrival) == [0, 2] and len([r for r in status.ranks if r.role == "scheduler"]) == 4

    wait_for(waiting, "replica TP0s loaded, their TP1s stuck", 120, interval_s=0.2)

    result = subprocess.run([sys.executable, "-m", "app", "status", session.session_id, "--json"], check=False,
                            capture_output=True, text=True, env=cli_env, timeout=120)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    row = doc[0] if isinstance(doc, list) else doc
    schedulers = [r for r in row["ranks"] if r["role"] == "scheduler"]
    assert [(r["dp_rank"], r["rank"]) for r in schedulers] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["title"].strip() for r in schedulers][2] == "sglang::scheduler_DP1_TP0"
    assert [r["role"] for r in row["ranks"]].count("dp_controller") == 1

    pid_of = {(r["dp_rank"], r["rank"]): r["pid"] for r in schedulers}

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(200, 50)) as pilot:
            await first_poll(pilot, app)
            owners = await wait_until(pilot, lambda: len(app.dashboard.last_snapshot.owners) >= 5
                                      and app.dashboard.last_snapshot.owners, "owners of the DP ranks")
            assert owners[pid_of[(1, 0)]] == "DP1 TP0" and owners[pid_of[(0, 1)]] == "DP0 TP1"
            panel = app.dashboard.query_one(GpuPanel)
            gpu2 = next(s for s in panel.snapshot.samples if s.index == 2)
            assert pid_of[(1, 0)] in {p.pid for p in gpu2.processes}  # replica 1 starts at GPU 2
            await wait_until(pilot, lambda: "DP1 TP0" in "\n".join(t.plain for t in panel._lines(120)),
                             "the GPU panel naming DP1 TP0")
            # At 80 columns the GPUs are cells three to a row: the owner still fits, the utilisation gives way.
            compact = "\n".join(t.plain for t in panel._lines(78))
            assert "DP1 TP0" in compact and "DP0 TP1" in compact, compact
            timeline = app.dashboard.query_one(PhaseTimeline)
            text = await wait_until(pilot, lambda: (t := "\n".join(x.plain for x in timeline._lines(190)))
                                    and "waiting for DP0 TP1, DP1 TP1" in t and t, "the timeline's missing ranks")
            assert "TP3" not in text
            assert "DP1 TP0" in screen_text(app)

    run(scenario)

    # The diagnosis names the replicas' schedulers the same way (its report and its JSON).
    from sessions.diagnosis.collect import diagnose

    report = diagnose(session, with_stacks=False)
    labels = [p.label for p in report.processes if p.role == "scheduler"]
    assert sorted(labels) == ["DP0 TP0", "DP0 TP1", "DP1 TP0", "DP1 TP1"]
    assert {p.to_json()["dp_rank"] for p in report.processes if p.role == "scheduler"} == {0, 1}
