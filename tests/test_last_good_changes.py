"""What changed since the last good start: the facts each start keeps, the diff, the catalogue's
``implicates``, and the seeds' case end to end (real emulator processes, real py-spy, the real CLI).

The seeds' hang was found by swapping ``--attention-backend flashinfer`` for triton by hand; here a good
start with triton is followed by a start of the same profile with flashinfer and an added NCCL variable
that hangs after its weights, and the diagnosis must name both changes and the known causes behind them.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sessions import start_facts
from sessions.diagnosis import diagnose, format_report
from sessions.hints import KnownCausesError, implications, parse_causes
from sessions.history import StartRecord, changes_since, last_good, load_history, record_start
from sessions.start_facts import Change, Implication, diff, mark, parse_flags
from tests._hang_support import wait_for_state
from tests._tui_support import screen_host

HF_TOKEN = "hf_Zq8mWv3LxT9pKd2RbN7cYs4FgH6jJa1E"


def _facts(argv: list[str], env: dict[str, str] | None = None, **extra) -> dict:
    return {"v": 1, "launcher": "emulator", "argv": argv, "env": env or {}, "sglang_version": "0.5.23",
            "model_config_sha256": "a" * 64, "gpus": ["NVIDIA H200"] * 8, "gpu_driver": "570",
            "cuda_visible_devices": None, "emulator": {"time_scale": 0.05, "fault": "none"}, **extra}


HEAD = ["/usr/bin/python3", "-m", "sessions.emulator"]


def test_parse_flags_reads_argparse_shapes():
    flags, head = parse_flags([*HEAD, "--tp-size", "8", "--trust-remote-code", "--port=30001",
                               "--cuda-graph-bs-decode", "1", "2", "4", "--chunked-prefill-size", "-1"])
    assert head == HEAD
    assert flags == {"--tp-size": "8", "--trust-remote-code": "(set)", "--port": "30001",
                     "--cuda-graph-bs-decode": "1 2 4", "--chunked-prefill-size": "-1"}


def test_diff_lists_each_kind_of_change_with_before_and_after():
    before = _facts([*HEAD, "--attention-backend", "triton", "--disable-radix-cache", "--time-scale", "0.05"],
                    {"NCCL_ALGO": "Ring", "OLD": "1"})
    after = _facts([*HEAD, "--attention-backend", "flashinfer", "--enable-metrics", "--time-scale", "0.01"],
                   {"NCCL_ALGO": "Tree", "NCCL_P2P_DISABLE": "1"}, sglang_version="0.5.24",
                   model_config_sha256="b" * 64, gpus=["NVIDIA H200"] * 4, gpu_driver="575",
                   cuda_visible_devices="0,1,2,3", emulator={"time_scale": 0.01, "fault": "hang-after-weights"})
    changes = {c.what: c for c in diff(before, after)}
    assert (changes["--attention-backend"].before, changes["--attention-backend"].after) == ("triton", "flashinfer")
    assert changes["--disable-radix-cache"].change == "removed" and changes["--enable-metrics"].change == "added"
    assert changes["env NCCL_P2P_DISABLE"].to_json() == {
        "what": "env NCCL_P2P_DISABLE", "before": None, "after": "1", "kind": "env", "change": "added",
        "implicated_by": [], "hinted_by": []}
    assert changes["env NCCL_ALGO"].change == "changed" and changes["env OLD"].change == "removed"
    assert changes["SGLang version"].after == "0.5.24"
    assert changes["model config.json (sha256)"].before == "a" * 12
    assert changes["GPUs"].before == "8x NVIDIA H200" and changes["GPUs"].after == "4x NVIDIA H200"
    assert changes["GPU driver"].after == "575" and changes["CUDA_VISIBLE_DEVICES"].after == "0,1,2,3"
    assert changes["emulator.fault"].after == "hang-after-weights"
    assert "--time-scale" not in changes  # the emulator's own flag is listed once, as a setting
    assert diff(before, before) == []
    assert diff(None, after) == [] and diff(before, None) == []


def test_mark_uses_the_catalogue_patterns_and_puts_implicated_changes_first():
    changes = [Change("--port", "1", "2", "flag", "--port"),
               Change("env NCCL_P2P_DISABLE", None, "1", "env", "NCCL_P2P_DISABLE"),
               Change("--attention-backend", "triton", "flashinfer", "flag", "--attention-backend")]
    rules = [Implication("nccl", ("NCCL_*",)), Implication("attn", ("--attention-backend",)),
             Implication("graphs", ("--cuda-graph-*",))]
    marked = mark(changes, rules, hinted=["attn"])
    assert [c.what for c in marked] == ["--attention-backend", "env NCCL_P2P_DISABLE", "--port"]
    assert marked[0].implicated_by == ("attn",) and marked[0].hinted_by == ("attn",)
    assert marked[1].implicated_by == ("nccl",) and marked[1].hinted_by == ()
    assert marked[2].implicated_by == ()


def test_the_shipped_catalogue_implicates_attention_backends_nccl_and_cuda_graph_flags():
    rules = implications()

    def causes_of(kind: str, name: str) -> set[str]:
        change = Change(name, None, "x", kind, name)
        return {r.cause_id for r in rules if r.names(change)}

    assert "attention-backend-hang-after-weights" in causes_of("flag", "--attention-backend")
    assert {"nccl-watchdog-timeout", "all-ranks-in-collective"} <= causes_of("env", "NCCL_P2P_DISABLE")
    assert "cuda-graph-oom" in causes_of("flag", "--cuda-graph-max-bs-decode")
    assert "cuda-graph-capture-failed" in causes_of("flag", "--disable-decode-cuda-graph")
    assert causes_of("flag", "--port") == set()


@pytest.mark.parametrize("bad", ["attention backend", "-x y", "NCCL-P2P"])
def test_a_bad_implicates_entry_is_an_error_naming_file_cause_and_key(bad, tmp_path):
    text = f'[[cause]]\nid = "x"\ntitle = "t"\ndetail = "d"\nlog_any = ["a"]\nimplicates = ["{bad}"]\n'
    with pytest.raises(KnownCausesError, match=r"bad\.toml: cause #1 \(x\): `implicates`"):
        parse_causes(text, tmp_path / "bad.toml")


def test_old_history_records_without_facts_still_load_and_give_no_changes(home):
    from sessions.history import history_path

    path = history_path(home, "old")
    path.parent.mkdir(parents=True, exist_ok=True)
    old = {"v": 1, "session_id": "s1", "profile": "old", "outcome": "ready", "line_count": 10,
           "started_at": 1.0, "recorded_at": 2.0, "phases": [{"phase": "ready", "at_s": 5.0, "line": 10}]}
    path.write_text(json.dumps(old) + "\n")
    baseline = last_good(home, "old")
    assert baseline is not None and baseline.facts is None
    assert changes_since(baseline, _facts(HEAD)) == []
    # A newer record of the same start keeps its facts across updates; the file stays readable.
    record_start(home, "old", "s2", None, {"launching": 1.0}, "ready", started_at=1.0, facts=_facts(HEAD))
    record_start(home, "old", "s2", None, {"launching": 1.0}, "ready", started_at=1.0)
    records = load_history(home, "old")
    assert [r.session_id for r in records] == ["s1", "s2"] and records[1].facts == _facts(HEAD)
    assert StartRecord.from_json(records[1].to_json()).facts == _facts(HEAD)


def test_facts_at_launch_are_redacted_and_hash_the_config(make_emulator_profile, emulator_model_dir):
    import hashlib

    profile = make_emulator_profile("facts", tp=2, env={"HF_TOKEN": HF_TOKEN, "NCCL_DEBUG": "INFO",
                                                        "CUDA_VISIBLE_DEVICES": "1,3"},
                                    extra_args=["--api-key", "sk-abcdefghijklmnopqrstuvwx"])
    from sessions.profiles import build_command

    command = build_command(profile)
    facts = start_facts.collect(profile, command.argv, command.env_changes, base_env={"PATH": "/bin",
                                                                                     "NCCL_IB_HCA": "mlx5"})
    text = json.dumps(facts)
    assert HF_TOKEN not in text and "sk-abcdefghijklmnopqrstuvwx" not in text
    assert facts["env"]["HF_TOKEN"] == "***" and facts["env"]["NCCL_DEBUG"] == "INFO"
    assert facts["env"]["NCCL_IB_HCA"] == "mlx5" and "PATH" not in facts["env"]  # inherited NCCL_* count
    want = hashlib.sha256((emulator_model_dir / "config.json").read_bytes()).hexdigest()
    assert facts["model_config_sha256"] == want and facts["sglang_version"] == "0.5.23"
    assert facts["cuda_visible_devices"] == "1,3" and facts["gpus"] == ["NVIDIA H200"] * 2
    assert facts["gpu_driver"] and facts["emulator"]["fault"] == "none"



def test_start_facts_hide_every_catalogued_secret_but_never_the_launch_dir(make_emulator_profile, home):
    """Issue 22 item 13: PWD is no secret (the launch dir stayed ``***`` in start facts and in "changes
    since the last good start"), and OPENAI_KEY, DB_PASS, PASSWORD2, TOKEN2, HF_TOKEN_1, GH_PAT were raw."""
    secrets = {"OPENAI_KEY": "openai-raw-1", "DB_PASS": "dbpass-raw-1", "PASSWORD2": "password2-raw",
               "TOKEN2": "token2-raw-1", "HF_TOKEN_1": "hftoken1-raw", "GH_PAT": "ghpat-raw-12"}
    from sessions.profiles import build_command

    def facts_for(pwd: str) -> dict:
        profile = make_emulator_profile("pwd", tp=1, env={**secrets, "PWD": pwd, "OLDPWD": "/srv"})
        command = build_command(profile)
        return start_facts.collect(profile, command.argv, command.env_changes, base_env={"PATH": "/bin"})

    good, bad = facts_for("/srv/launch-a"), facts_for("/srv/launch-b")
    assert good["env"]["PWD"] == "/srv/launch-a" and good["env"]["OLDPWD"] == "/srv"
    assert all(good["env"][name] == "***" for name in secrets)
    changes = [(c.what, c.before, c.after) for c in diff(good, bad) if c.what != "--port"]  # a free port each
    assert changes == [("env PWD", "/srv/launch-a", "/srv/launch-b")]
    record_start(home, "pwd", "s-good", None, {"launching": 1.0}, "ready", started_at=1.0, facts=good)
    text = (home.state_root / "history").read_text() if (home.state_root / "history").is_file() else ""
    kept = json.dumps([r.to_json() for r in load_history(home, "pwd")]) + text
    assert "/srv/launch-a" in kept and not any(v in kept for v in secrets.values())


def test_a_stall_after_swapping_the_attention_backend_and_adding_nccl_names_both(
        make_emulator_profile, launched, home, cli_env):
    good = launched.launch(make_emulator_profile("kimi", tp=2, server={"attention_backend": "triton"},
                                                 env={"NCCL_ALGO": "Ring", "HF_TOKEN": HF_TOKEN}))
    assert wait_for_state(good, {"ready"}).state == "ready"
    good.stop(grace_s=5)
    baseline = last_good(home, "kimi")
    assert baseline is not None and baseline.session_id == good.session_id and baseline.facts

    bad_profile = make_emulator_profile(
        "kimi", tp=2, fault="hang-after-weights", watch={"stall_after_s": 3},
        server={"attention_backend": "flashinfer"},
        env={"NCCL_ALGO": "Ring", "NCCL_P2P_DISABLE": "1", "HF_TOKEN": HF_TOKEN})
    bad = launched.launch(bad_profile)
    status = wait_for_state(bad, {"stalled"}, "weights_loaded")
    assert status.state == "stalled", status.to_json()

    d = diagnose(bad, with_stacks=True)
    changes = {c.what: c for c in d.changes_since_last_good or ()}
    attn, nccl = changes["--attention-backend"], changes["env NCCL_P2P_DISABLE"]
    assert (attn.before, attn.after) == ("triton", "flashinfer")
    assert (nccl.before, nccl.after) == (None, "1")
    assert "attention-backend-hang-after-weights" in attn.hinted_by  # it matches this start too
    assert "nccl-watchdog-timeout" in nccl.implicated_by
    assert "all-ranks-in-collective" in nccl.hinted_by  # py-spy shows every rank in all_reduce
    assert changes["emulator.fault"].after == "hang-after-weights"
    assert "env NCCL_ALGO" not in changes and "env HF_TOKEN" not in changes  # unchanged: not listed
    report = format_report(d)
    assert "--attention-backend: triton -> flashinfer" in report and "env NCCL_P2P_DISABLE added: 1" in report
    lines = report.splitlines()
    assert lines.index(next(x for x in lines if x.startswith("changes since the baseline"))) <= 4
    assert HF_TOKEN not in report

    out = subprocess.run([sys.executable, "-m", "app", "diagnose", bad.session_id, "--json", "--no-stacks"],
                         env=cli_env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    by_what = {c["what"]: c for c in doc["changes_since_last_good"]}
    assert by_what["--attention-backend"]["before"] == "triton"
    assert by_what["--attention-backend"]["after"] == "flashinfer"
    assert "attention-backend-hang-after-weights" in by_what["--attention-backend"]["implicated_by"]
    assert by_what["env NCCL_P2P_DISABLE"]["change"] == "added"
    assert HF_TOKEN not in out.stdout
    print(report)  # shown with -s: the output the closing note quotes
    print(json.dumps(doc["changes_since_last_good"], indent=1))

    # The diagnosis screen shows the same changes at its top, the implicated ones first.
    import asyncio

    from textual.widgets import Static

    from app.screens.diagnose import DiagnoseScreen

    async def scenario() -> None:
        app = screen_host(lambda: DiagnoseScreen(bad.session_id, home, with_stacks=False))
        async with app.run_test(size=(160, 50)) as pilot:
            screen = app.screen
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert screen.error is None and screen.diagnosis is not None
            shown = str(screen.query_one("#changes", Static).render())
            first = shown.splitlines()[0]
            assert first.startswith("! --attention-backend: triton -> flashinfer"), shown
            assert "! env NCCL_P2P_DISABLE added: 1" in shown and "attention-backend-hang-after-weights*" in shown
            statics = [w.id for w in screen.query(Static) if w.id]
            assert statics.index("hints") < statics.index("changes") < statics.index("last-lines")

    asyncio.run(scenario())
