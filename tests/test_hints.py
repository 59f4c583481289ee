"""The known-causes catalogue: its schema, its validation, the matcher and the predicates (sessions/hints.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from sessions import hints
from sessions.hints import (
    HintEvidence,
    KnownCausesError,
    cause_files,
    hints_for_log,
    load_causes,
    match_hints,
    no_proxy_covers,
)
from sessions.phases import StartupPhase, summarize_file, summarize_text
from tests._logs_support import SGLANG_LOGS, LogBuilder

FIXTURES = SGLANG_LOGS


def _causes(tmp_path: Path, text: str, name: str = "known_causes.toml"):
    path = tmp_path / name
    path.write_text(text)
    return load_causes([path])


# --- the shipped catalogue ------------------------------------------------------------------------------


def test_the_shipped_catalogue_loads_with_unique_ids_and_a_condition_each():
    files = cause_files()
    assert files and files[0].name == "known_causes.toml"
    causes = load_causes()
    ids = [c.id for c in causes]
    assert len(ids) == len(set(ids))
    assert all(c.present for c in causes)
    for required in ("http-proxy-intercepts-warmup", "port-closed-until-graphs-done", "ranks-missing-load-weight-end",
                     "flashinfer-jit-compile", "deepgemm-jit", "custom-allreduce-pcie", "negative-kv-budget",
                     "cuda-graph-oom", "torch-compile-with-graphs", "nccl-watchdog-timeout", "gloo-connect-failed",
                     "address-in-use"):
        assert required in ids


# fixture -> the hang-catalog row that cites it (fixtures/hang-catalog.md "Links (log file)" column)
_CATALOG_ROWS = {
    "02-r1-4x8a100-tp32-stops-after-load-weight-end.log": "ranks-missing-load-weight-end",  # row 1
    "05-capturing-batches-stuck-flashinfer-jit.log": "flashinfer-jit-compile",  # row 4
    "08-mistral7b-warmup-502-killed.log": "http-proxy-intercepts-warmup",  # row 9
    "12-multinode-gloo-connectfullmesh-failed.log": "gloo-connect-failed",  # row 8
    "14-r1-mi300-rocm-negative-kv-token-budget.log": "negative-kv-budget",  # row 13
    "18-deepep-2x8h20-capture-cuda-oom.log": "cuda-graph-oom",  # row 10
}


@pytest.mark.parametrize("name, hint_id", sorted(_CATALOG_ROWS.items()))
def test_each_catalogued_fixture_gets_the_hint_of_its_catalog_row(name, hint_id):
    path = FIXTURES / name
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    found = [h.id for h in hints_for_log(summarize_file(path), lines)]
    assert hint_id in found


def test_a_clean_ready_log_gets_no_hints():
    built = LogBuilder(tp=4).startup().build()
    assert hints_for_log(summarize_text(built.text), built.text.split("\n")) == []


def test_missing_ranks_are_named_in_the_hint():
    built = LogBuilder(tp=8).startup(missing_load_end=[3, 6]).build()
    found = {h.id: h for h in hints_for_log(summarize_text(built.text), built.text.split("\n"))}
    hint = found["ranks-missing-load-weight-end"]
    assert "TP3, TP6" in hint.title and "6/8" in hint.title
    everyone = LogBuilder(tp=8).startup(stop_after=StartupPhase.WEIGHTS_LOADED).build()
    assert "ranks-missing-load-weight-end" not in {
        h.id for h in hints_for_log(summarize_text(everyone.text), everyone.text.split("\n"))}


def test_a_multi_node_excerpt_names_only_the_missing_ranks_of_its_node():
    path = FIXTURES / "02-r1-4x8a100-tp32-stops-after-load-weight-end.log"
    summary = summarize_file(path)
    hint = next(h for h in hints_for_log(summary, []) if h.id == "ranks-missing-load-weight-end")
    assert "TP25, TP27, TP28, TP30" in hint.title


# --- validation -------------------------------------------------------------------------------------------

_GOOD = '''
[[cause]]
id = "a-cause"
title = "A"
detail = "d"
log_any = ['boom']
'''


@pytest.mark.parametrize(
    "text, fragment",
    [
        (_GOOD + "colour = 'red'\n", "unknown key(s) colour"),
        (_GOOD + _GOOD, "duplicate id 'a-cause'"),
        (_GOOD.replace("['boom']", "['(unclosed']"), "bad regex"),
        (_GOOD + "phase_in = ['booting']\n", "unknown phase 'booting'"),
        (_GOOD + "state_in = ['sleepy']\n", "unknown state 'sleepy'"),
        (_GOOD + "check = 'no_such_predicate'\n", "unknown predicate 'no_such_predicate'"),
        (_GOOD + "check = 'os:system'\n", "unknown predicate 'os:system'"),
        (_GOOD.replace('title = "A"\n', ""), "`title` is required"),
        (_GOOD.replace("log_any = ['boom']\n", ""), "has no condition"),
        (_GOOD.replace('"a-cause"', '"A Cause"'), "`id` must be lower-case"),
        (_GOOD + "argv_any = ['enable-x']\n", "flags must start with '-'"),
        (_GOOD + "env_any = 'HTTP_PROXY'\n", "`env_any` must be a list"),
        (_GOOD + "log_any_extra = 1\n", "unknown key(s) log_any_extra"),
        ("[meta]\nversion = 1\n" + _GOOD, "unknown top-level key(s) meta"),
        ("[[cause]\nid=", "not valid TOML"),
    ],
)
def test_a_malformed_file_is_refused_with_the_file_cause_and_key(tmp_path, text, fragment):
    with pytest.raises(KnownCausesError) as err:
        _causes(tmp_path, text)
    message = str(err.value)
    assert fragment in message
    assert "known_causes.toml" in message


def test_ids_must_be_unique_across_every_file(tmp_path):
    (tmp_path / "known_causes.toml").write_text(_GOOD)
    (tmp_path / "known_causes_runtime.toml").write_text(_GOOD.replace("boom", "bang"))
    files = cause_files(tmp_path)
    assert [p.name for p in files] == ["known_causes.toml", "known_causes_runtime.toml"]
    with pytest.raises(KnownCausesError, match="already defined in .*known_causes.toml"):
        load_causes(files)


def test_every_file_matching_the_glob_is_loaded(tmp_path):
    (tmp_path / "known_causes.toml").write_text(_GOOD)
    (tmp_path / "known_causes_runtime.toml").write_text(_GOOD.replace("a-cause", "b-cause"))
    (tmp_path / "other.toml").write_text("not = 'a catalogue'")
    assert [c.id for c in load_causes(cause_files(tmp_path))] == ["a-cause", "b-cause"]


def test_a_predicate_may_be_named_by_module_path(tmp_path):
    causes = _causes(tmp_path, _GOOD.replace("log_any = ['boom']", "check = 'sessions.hints:outcome_crashed'"))
    crashed = summarize_text("Killed\n")
    assert [h.id for h in match_hints(HintEvidence(summary=crashed), causes)] == ["a-cause"]
    assert match_hints(HintEvidence(summary=summarize_text("")), causes) == []


# --- the matcher: AND across keys, OR within a list -----------------------------------------------------

_MATRIX = '''
[[cause]]
id = "all-keys"
title = "T {missing}"
detail = "D {missing} {arrived}"
log_any = ['never-there', 'Load weight end']
stack_any = ['in init_memory_pool']
argv_any = ["--enable-torch-compile", "--deepep-mode=normal"]
argv_none = ["--disable-custom-all-reduce"]
env_any = ["NCCL_DEBUG", "NCCL_SOCKET_IFNAME"]
phase_in = ["weights_loaded", "kv_cache"]
state_in = ["stalled"]
child_any = ["nvcc"]
check = "ranks_missing_load_weight_end"
'''


def _full_evidence(**changes):
    built = LogBuilder(tp=4).startup(missing_load_end=[2]).build()
    base = {
        "log_lines": built.text.split("\n"),
        "summary": summarize_text(built.text),
        "stacks": {1234: "Thread 1 (idle)\n    all_reduce (x.py:1)\n    in init_memory_pool (model_runner.py:9)"},
        "argv": ["python", "-m", "sglang.launch_server", "--deepep-mode", "normal"],
        "env": {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": ""},
        "children": ["/usr/local/cuda/bin/nvcc -c x.cu"],
        "state": "stalled",
        "pyspy_available": True,
    }
    base.update(changes)
    return HintEvidence(**base)


def test_a_cause_matches_when_every_key_holds_and_fills_its_placeholders(tmp_path):
    causes = _causes(tmp_path, _MATRIX)
    found = match_hints(_full_evidence(), causes)
    assert [(h.id, h.title, h.detail) for h in found] == [("all-keys", "T TP2", "D TP2 3")]


@pytest.mark.parametrize(
    "change",
    [
        {"log_lines": ["nothing relevant"]},
        {"stacks": {}},
        {"argv": ["python", "--deepep-mode", "low_latency"]},
        {"argv": None},
        {"argv": ["python", "--enable-torch-compile", "--disable-custom-all-reduce"]},
        {"env": {"NCCL_DEBUG": ""}},
        {"env": None},
        {"state": "starting"},
        {"children": ["ninja"]},
        {"summary": summarize_text(LogBuilder(tp=4).startup().build().text)},
    ],
    ids=["log", "stack", "argv-value", "argv-unknown", "argv-none", "env-empty", "env-unknown", "state", "child",
         "phase-and-check"],
)
def test_one_failing_key_is_enough_to_not_match(tmp_path, change):
    causes = _causes(tmp_path, _MATRIX)
    assert match_hints(_full_evidence(**change), causes) == []


def test_argv_none_passes_when_the_command_line_is_unknown(tmp_path):
    causes = _causes(tmp_path, _GOOD + "argv_none = ['--disable-custom-all-reduce']\n")
    assert [h.id for h in match_hints(HintEvidence(log_lines=["boom"], argv=None), causes)] == ["a-cause"]
    with_flag = HintEvidence(log_lines=["boom"], argv=["--disable-custom-all-reduce=true"])
    assert match_hints(with_flag, causes) == []


def test_argv_any_accepts_both_flag_spellings(tmp_path):
    causes = _causes(tmp_path, _GOOD + "argv_any = ['--deepep-mode=normal']\n")
    for argv in (["--deepep-mode", "normal"], ["--deepep-mode=normal"]):
        assert match_hints(HintEvidence(log_lines=["boom"], argv=argv), causes)
    assert not match_hints(HintEvidence(log_lines=["boom"], argv=["--deepep-mode", "auto"]), causes)


def test_log_patterns_see_lines_without_their_colours(tmp_path):
    causes = _causes(tmp_path, _GOOD.replace("['boom']", "['^Killed$']"))
    assert match_hints(HintEvidence(log_lines=["\x1b[31mKilled\x1b[0m"]), causes)


# --- predicates ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, argv, fires",
    [
        ({"http_proxy": "http://10.0.0.1:3128"}, None, True),
        ({"HTTPS_PROXY": "http://p:1"}, None, True),
        ({"http_proxy": "http://p:1", "no_proxy": "localhost,127.0.0.1"}, None, False),
        ({"http_proxy": "http://p:1", "NO_PROXY": "localhost,127.0.0.0/8"}, None, False),
        ({"http_proxy": "http://p:1", "no_proxy": "localhost,127.0.0.1"}, ["--host", "0.0.0.0"], True),
        ({"http_proxy": "http://p:1", "no_proxy": "*"}, ["--host", "0.0.0.0"], False),
        ({"http_proxy": ""}, None, False),
        ({}, None, False),
    ],
)
def test_a_proxy_without_no_proxy_for_the_warmup_address_is_flagged(env, argv, fires):
    found = hints.http_proxy_without_no_proxy(HintEvidence(env=env, argv=argv))
    assert bool(found) is fires


def test_no_proxy_matching_follows_requests_rules():
    assert no_proxy_covers("example.com,.internal", "api.internal")
    assert no_proxy_covers("localhost:30000", "localhost")
    assert not no_proxy_covers("127.0.0.2", "127.0.0.1")
    assert no_proxy_covers(" 10.0.0.0/8 ", "10.1.2.3")


def test_the_proxy_hint_from_the_environment(tmp_path):
    found = match_hints(HintEvidence(env={"http_proxy": "http://proxy:3128"}, argv=["--host", "0.0.0.0"]))
    hint = next(h for h in found if h.id == "http-proxy-without-no-proxy")
    assert "http_proxy" in hint.title and "0.0.0.0" in hint.title


def test_weights_at_100_without_an_end_is_recognised():
    text = ("[2026-11-01 10:00:00 TP0] Load weight begin. avail mem=80.00 GB\n"
            "\rMulti-thread loading shards:  99% Completed | 163/164 [09:00<00:03,  0.30it/s]"
            "\rMulti-thread loading shards: 100% Completed | 164/164 [09:03<00:00,  0.30it/s]\n")
    found = {h.id: h for h in hints_for_log(summarize_text(text), text.split("\n"))}
    assert "164/164" in found["weights-at-100-no-end"].title
