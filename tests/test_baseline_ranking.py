"""Hints ranked by this start's evidence (issue 21): the baseline, the rule over the catalogue's triggers,
the report's and the screen's order, the stall report saved once per stall, silence only before ready.

The seeded hang is the demo's: a profile that never reached ready (``kimi-hang``: TP2, flashinfer,
``emulator.fault = hang-after-weights``) next to one that did (``kimi-good``: the same model dir, TP2 and
flashinfer).  Only ``emulator.fault`` (and the port) differ, so the attention-backend hint, which fires on
``--attention-backend`` alone, must stand below "every rank waits in all_reduce" and say why.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sessions import start_facts
from sessions.baseline import BaselineError, choose_baseline, chosen_baseline, find_start
from sessions.diagnosis import RANKS, HintView, diagnose, format_report, rank_hints, save_stall_report
from sessions.hints import load_causes
from sessions.history import record_start
from sessions.phases import StartupTracker
from sessions.server.status import last_output_offset
from tests._hang_support import wait_for_state
from tests._tui_support import screen_host, screen_text, wait_until

ALL_REDUCE_HINT = "all-ranks-in-collective"
BACKEND_HINT = "attention-backend-hang-after-weights"
PORT_ADVICE = "port-closed-until-graphs-done"


@dataclass(frozen=True)
class Seeded:
    home: Any
    good_id: str
    ready_diagnosis: Any  # the good start diagnosed while it was ready and idle
    hang: Any
    cli_env: dict[str, str]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Iterator[Seeded]:
    """A good start of ``kimi-good`` (diagnosed while ready, then stopped), then ``kimi-hang`` stalled after
    its weights; everything started is stopped by pid at the end."""
    import tomli_w
    from conftest import KIMI_LIKE_CONFIG, REPO_ROOT, LaunchedSessions, get_free_port

    from sessions.home import HOME_ENV, resolve_home
    from sessions.profiles import load_profile

    root = tmp_path_factory.mktemp("seeded")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HOME_ENV, str(root / "eagle3-home"))
        mp.delenv("EAGLE3_TUI_DEMO", raising=False)
        home = resolve_home().ensure()
        model_dir = root / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(KIMI_LIKE_CONFIG))

        def profile(name: str, fault: str, stall_after_s: int):
            doc = {
                "server": {"launcher": "emulator", "python": sys.executable, "model_path": str(model_dir),
                           "tp_size": 2, "host": "127.0.0.1", "port": get_free_port(),
                           "attention_backend": "flashinfer", "env": {"NCCL_ALGO": "Ring"}},
                "watch": {"stall_after_s": stall_after_s},
                "emulator": {"time_scale": 0.003, "fault": fault},
            }
            path = home.profiles_dir / f"{name}.toml"
            path.write_text(tomli_w.dumps(doc))
            return load_profile(path)

        registry = LaunchedSessions(home)
        try:
            good = registry.launch(profile("kimi-good", "none", 300))
            assert wait_for_state(good, {"ready"}).state == "ready"
            ready_diagnosis = diagnose(good, with_stacks=False)
            good.stop(grace_s=5)
            hang = registry.launch(profile("kimi-hang", "hang-after-weights", 3))
            status = wait_for_state(hang, {"stalled"}, "weights_loaded")
            registry.remember(hang)
            assert status.state == "stalled", status.to_json()
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
            yield Seeded(home, good.session_id, ready_diagnosis, hang, env)
        finally:
            registry.cleanup()


def _ids(d) -> list[str]:
    return [h.id for h in d.hints]


def test_the_seeded_hang_is_compared_with_the_good_start_of_the_same_model_and_the_unchanged_flag_is_demoted(
        seeded):
    d = diagnose(seeded.hang, stack_timeout_s=20)

    # The baseline: no good start of kimi-hang, so the one of kimi-good, named as such.
    assert d.baseline is not None and d.baseline.session_id == seeded.good_id
    assert d.baseline_choice is not None and d.baseline_choice.how == "same-shape"
    assert d.baseline_line.startswith("baseline: good start of kimi-good at ")
    assert "same model, TP/PP/DP and SGLang version" in d.baseline_line
    changes = {c.what: c for c in d.changes_since_last_good or ()}
    assert (changes["emulator.fault"].before, changes["emulator.fault"].after) == ("none", "hang-after-weights")
    assert "--attention-backend" not in changes and "env NCCL_ALGO" not in changes

    # The stacks' hint first; the flag both starts used demoted, saying why; the phase's advice last.
    ids = _ids(d)
    assert ids[0] == ALL_REDUCE_HINT, [(h.id, h.rank) for h in d.hints]
    by_id = {h.id: h for h in d.hints}
    backend = by_id[BACKEND_HINT]
    assert backend.rank == "unchanged"
    assert backend.why is not None and "good start of kimi-good" in backend.why
    assert "also used --attention-backend flashinfer" in backend.why
    assert ids.index(ALL_REDUCE_HINT) < ids.index(BACKEND_HINT) < ids.index(PORT_ADVICE)
    assert by_id[PORT_ADVICE].rank == "generic" and ids[-1] == PORT_ADVICE
    assert [RANKS.index(h.rank) for h in d.hints] == sorted(RANKS.index(h.rank) for h in d.hints)
    doc = d.to_json()
    assert doc["baseline"]["how"] == "same-shape" and doc["baseline"]["profile"] == "kimi-good"
    assert {h["id"]: h["rank"] for h in doc["hints"]}[BACKEND_HINT] == "unchanged"

    # The report: this session's evidence (baseline, changes, the stacks' hint, the stacks, the last lines)
    # before the demoted hint and the general advice.
    report = format_report(d)
    at = report.index
    assert at("baseline: good start of kimi-good") < at("changes since the baseline") < at(f"[{ALL_REDUCE_HINT}]")
    assert at(f"[{ALL_REDUCE_HINT}]") < at("all_reduce (") < at("last log lines:") < at(f"[{BACKEND_HINT}]")
    assert at(f"[{BACKEND_HINT}]") < at(f"[{PORT_ADVICE}]")
    assert "the good start of kimi-good at" in report


def test_diagnose_baseline_flag_picks_a_start_by_hand_and_refuses_a_bad_one(seeded):
    hang, env = seeded.hang, seeded.cli_env
    done = subprocess.run(
        [sys.executable, "-m", "app", "diagnose", hang.session_id, "--json", "--no-stacks",
         "--baseline", seeded.good_id[:-2]],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["baseline"]["session_id"] == seeded.good_id and doc["baseline"]["how"] == "chosen"
    assert "picked by hand" in doc["baseline"]["description"]
    assert any(c["what"] == "emulator.fault" for c in doc["changes_since_last_good"])

    unknown = subprocess.run(
        [sys.executable, "-m", "app", "diagnose", hang.session_id, "--no-stacks", "--baseline", "no-such-start"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert unknown.returncode == 2, unknown.stdout
    assert "--baseline no-such-start" in unknown.stderr and "Traceback" not in unknown.stderr


def test_a_baseline_by_hand_must_be_a_good_start(home):
    record_start(home, "p", "p-crashed-1", None, {"launching": 100.0}, "crashed", started_at=100.0)
    with pytest.raises(BaselineError, match="p-crashed-1 of p never reached ready"):
        find_start(home, "p-crashed")
    record_start(home, "p", "p-good-2", None, {"launching": 100.0, "ready": 120.0}, "ready", started_at=100.0)
    record_start(home, "p", "p-good-3", None, {"launching": 100.0, "ready": 120.0}, "ready", started_at=100.0)
    with pytest.raises(BaselineError, match="fits 2 starts"):
        find_start(home, "p-good")
    assert chosen_baseline(home, "p-good-3", None).record.session_id == "p-good-3"


def _facts(model_sha: str | None, tp: int = 8, version: str | None = "0.5.23", extra: tuple[str, ...] = ()) -> dict:
    return {"argv": ["python3", "-m", "sglang.launch_server", "--tp-size", str(tp), *extra],
            "env": {"NCCL_ALGO": "Ring"}, "sglang_version": version, "model_config_sha256": model_sha}


def _good(home, profile: str, session_id: str, started_at: float, facts: dict | None) -> None:
    tracker = StartupTracker()
    record_start(home, profile, session_id, tracker.summary(), {"launching": started_at, "ready": started_at + 5},
                 "ready", started_at=started_at, facts=facts)


def test_the_fallback_baseline_needs_the_same_model_sizes_and_version_and_the_newest_wins(home):
    this = _facts("a" * 64)
    _good(home, "other-model", "om-1", 500.0, _facts("b" * 64))
    _good(home, "other-tp", "ot-1", 500.0, _facts("a" * 64, tp=4))
    _good(home, "other-version", "ov-1", 500.0, _facts("a" * 64, version="0.5.22"))
    _good(home, "no-facts", "nf-1", 500.0, None)
    assert choose_baseline(home, "new", "new-1", this) is None

    _good(home, "same-old", "so-1", 100.0, _facts("a" * 64))
    _good(home, "same-new", "sn-1", 200.0, _facts("a" * 64, extra=("--port", "31000")))
    choice = choose_baseline(home, "new", "new-1", this)
    assert choice is not None and choice.record.session_id == "sn-1" and choice.how == "same-shape"
    assert "good start of same-new at " in choice.describe() and "same model, TP/PP/DP" in choice.describe()
    # A start without a model hash matches nothing (an unreadable config is not "the same model").
    assert choose_baseline(home, "new", "new-1", _facts(None)) is None

    # The profile's own good start comes first, whatever the others are.
    _good(home, "new", "new-0", 50.0, _facts("c" * 64, tp=2))
    own = choose_baseline(home, "new", "new-1", this)
    assert own is not None and own.record.session_id == "new-0" and own.how == "profile"


def _baseline_facts_for(cause) -> dict:
    """The facts of a good start that had every trigger of ``cause`` set as this start has them."""
    argv = ["python3", "-m", "sglang.launch_server"]
    env: dict[str, str] = {}
    for flag in cause.argv_any:
        name, _, value = flag.partition("=")
        argv += [name, value] if value else [name, "x"]
    for name in cause.env_any:
        env[name] = "1"
    for pattern in cause.triggers:
        if not pattern.startswith("-") and not any(ch in pattern for ch in "*?") and pattern not in env:
            env[pattern] = "http://proxy:3128"
    return {"argv": argv, "env": env, "sglang_version": "0.5.23", "model_config_sha256": "a" * 64}


def test_every_setting_only_cause_is_demoted_when_unchanged_and_first_when_changed(home):
    """The rule is the catalogue's, not one hint's: each cause that matches on settings alone is demoted
    below the observed evidence when the baseline had the same values, and comes first when they changed;
    each cause matching on the phase or state only is general advice, last."""
    causes = load_causes()
    setting_only = [c for c in causes if c.triggers and not c.observed]
    generic = [c for c in causes if not c.triggers and not c.observed]
    observed = next(c for c in causes if c.id == ALL_REDUCE_HINT)
    assert {BACKEND_HINT, "http-proxy-without-no-proxy"} <= {c.id for c in setting_only}
    assert PORT_ADVICE in {c.id for c in generic}

    for cause in setting_only:
        facts = _baseline_facts_for(cause)
        _good(home, "p", f"good-{cause.id}", 100.0, facts)
        choice = chosen_baseline(home, f"good-{cause.id}", facts)
        hints = [HintView(c.id, c.title, c.detail) for c in (*generic, cause, observed)]

        unchanged = rank_hints(hints, [], choice)
        ranks = {h.id: h for h in unchanged}
        assert ranks[cause.id].rank == "unchanged", cause.id
        assert ranks[cause.id].why and "the good start of p at" in ranks[cause.id].why, cause.id
        assert unchanged[0].id == observed.id, cause.id
        assert all(ranks[g.id].rank == "generic" for g in generic)
        assert [h.id for h in unchanged][-len(generic):] == [g.id for g in generic]

        trigger = cause.triggers[0]
        kind = "flag" if trigger.startswith("-") else "env"
        change = start_facts.Change(trigger if kind == "flag" else f"env {trigger}", "before", "after", kind,
                                    trigger)
        changed = rank_hints(hints, [change], choice)
        assert changed[0].id == cause.id and changed[0].rank == "changed", cause.id
        assert changed[0].why is not None and change.describe() in changed[0].why

    # Without a baseline nothing is judged: a setting-only hint ranks after the observed ones, before advice.
    plain = rank_hints([HintView(c.id, c.title, c.detail) for c in (*generic, *setting_only, observed)], None, None)
    assert plain[0].id == observed.id and {h.rank for h in plain[1:len(setting_only) + 1]} == {"setting"}


def test_the_stall_report_is_written_once_whoever_notices_the_stall(seeded):
    hang, env = seeded.hang, seeded.cli_env
    # Two watchers at once (two `status` commands) and this process: one report for this stall.
    procs = [subprocess.Popen([sys.executable, "-m", "app", "status", hang.session_id], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    mine = save_stall_report(hang)
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    reports = sorted(hang.session_dir.glob("stall-diagnosis-*.txt"))
    assert len(reports) == 1, reports
    said = [err for _, err in outs if "diagnosis saved to" in err]
    assert len(said) + (mine is not None) == 1, (mine, outs)
    text = reports[0].read_text()
    assert "is stalled in phase weights_loaded" in text and f"[{ALL_REDUCE_HINT}]" in text
    assert oct(reports[0].stat().st_mode & 0o777) == "0o600"
    assert json.loads(reports[0].with_suffix(".json").read_text())["state"] == "stalled"
    # Asked again (the next poll, a third watcher): nothing new.
    assert save_stall_report(hang) is None
    assert len(list(hang.session_dir.glob("stall-diagnosis-*.txt"))) == 1


def test_a_stall_is_named_by_where_the_output_stopped_not_by_our_probe_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"[2026-12-01 22:19:31 TP0] Load weight end. elapsed=16.34 s\n")
    quiet_at = last_output_offset(log)
    assert quiet_at == log.stat().st_size - 1
    with log.open("ab") as fh:  # watchers' /ready probes land in the access log: the same stall
        fh.write(b'INFO:     127.0.0.1:5433 - "GET /ready HTTP/1.1" 503 Service Unavailable\n' * 3)
    assert last_output_offset(log) == quiet_at
    with log.open("ab") as fh:  # the server said something: a later silence is another stall
        fh.write(b"[2026-12-01 22:29:31 TP0] KV Cache is allocated.\n")
    assert last_output_offset(log) > quiet_at
    assert last_output_offset(tmp_path / "missing.log") is None


def test_an_idle_ready_server_is_not_called_silent(seeded):
    d = seeded.ready_diagnosis
    assert d.state == "ready" and d.silent_for_s > 0
    assert d.silence is None
    assert "silent" not in d.headline and "log silent" not in format_report(d).splitlines()[0]


@pytest.mark.timeout(240)
def test_the_diagnosis_screen_at_80x24_shows_the_top_hint_first_and_picks_a_baseline(seeded):
    from app.screens.diagnose import BaselinePicker, DiagnoseScreen

    hang, home = seeded.hang, seeded.home

    async def scenario() -> None:
        app = screen_host(lambda: DiagnoseScreen(hang.session_id, home))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            assert isinstance(screen, DiagnoseScreen)
            await wait_until(pilot, lambda: screen.diagnosis is not None or screen.error, "the diagnosis")
            await pilot.pause()
            d = screen.diagnosis
            assert screen.error is None and d.hints[0].id == ALL_REDUCE_HINT
            first = screen_text(app)
            assert "baseline: good start of kimi-good" in first, first
            assert "Every rank waits in the same collective" in first, first
            assert "SGLang binds its port" not in first, first  # the general advice is folded
            assert "log silent for" in first  # still starting: its silence counts

            await pilot.press("p")
            picker = await wait_until(pilot, lambda: isinstance(app.screen, BaselinePicker) and app.screen,
                                      "the list of good starts")
            assert [c.record.session_id for c in picker.choices] == [seeded.good_id]
            assert "same model, TP/PP/DP" in screen_text(app)
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.screen is screen and screen.diagnosis is not d
                             and screen.diagnosis is not None, "the diagnosis against the picked start")
            assert screen.baseline == seeded.good_id
            assert screen.diagnosis.baseline_choice.how == "chosen"

            await pilot.press("a")
            await wait_until(pilot, lambda: "SGLang binds its port" in str(
                screen.query_one("#advice-text").render()) and not screen.query_one("#advice").collapsed,
                "the general advice unfolded")

    asyncio.run(scenario())


@pytest.mark.timeout(300)
def test_the_dashboard_saves_the_report_of_a_stall_it_sees_once(make_emulator_profile, launched, home):
    from app.tui import Eagle3App
    from sessions.gpus import EmulatedSource
    from tests._tui_support import first_poll

    session = launched.launch(make_emulator_profile("hang", tp=2, fault="hang-after-weights",
                                                    watch={"stall_after_s": 3}))
    assert wait_for_state(session, {"stalled"}, "weights_loaded").state == "stalled"
    launched.remember(session)

    def reports() -> list[Path]:
        return sorted(session.session_dir.glob("stall-diagnosis-*.txt"))

    async def main() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await first_poll(pilot, app)
            await wait_until(pilot, reports, "the stall report saved by the dashboard", limit_s=240)
            polls = app.dashboard.poll_count
            await wait_until(pilot, lambda: app.dashboard.poll_count >= polls + 5, "five more polls")
            await app.workers.wait_for_complete()
            assert len(reports()) == 1, reports()
            # (Textual keeps its toasts in App._notifications and has no public reader)
            assert "Diagnosis of the stall saved" in "".join(str(n.message) for n in app._notifications)

    asyncio.run(main())
    assert "is stalled in phase weights_loaded" in reports()[0].read_text()
