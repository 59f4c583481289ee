"""Launch profiles: TOML loading with every problem named (field and line), validation on this machine,
argv/env building, shell text with secrets redacted, and the `eagle3-tui profile` CLI.

SGLang checks run against the real SGLang 0.5.23 source (the wheel, unpacked by `_sglang_wheel`), put on
the profile's ``PYTHONPATH`` exactly as a user's server venv would have it.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _sglang_wheel import sglang_0_5_23_site

from sessions.profiles import (
    FAULT_IDS,
    LaunchProfile,
    Problem,
    ProfileError,
    ServerSection,
    build_command,
    list_profiles,
    load_profile,
    nvml_device_count,
    parse_profile,
    read_model_config,
    save_profile,
    toml_key_lines,
    validate_profile,
    visible_gpu_count,
)
from sessions.sglang_source import SglangSource

REPO = Path(__file__).resolve().parent.parent
OLD_STYLE_ROOT = Path(__file__).parent / "data" / "sglang_fake" / "old-style" / "sglang"
HF_SECRET = "hf_QWERTYuiopASDFGHjklZXCVBnm0123456789"


def _problems(text: str) -> list[Problem]:
    with pytest.raises(ProfileError) as info:
        parse_profile(text, name="t")
    return info.value.problems


def _one(problems: list[Problem], field: str) -> Problem:
    found = [p for p in problems if p.field == field]
    assert len(found) == 1, f"expected one problem for {field}, got {problems}"
    return found[0]


def _errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


@pytest.fixture
def model_dir(make_model_dir) -> Path:
    return make_model_dir("m")


@pytest.fixture
def sglang_site() -> Path:
    return sglang_0_5_23_site()


def _profile(model_dir: Path, port: int, **server) -> LaunchProfile:
    base = {"python": sys.executable, "model_path": str(model_dir), "port": port}
    return LaunchProfile(name="t", server=ServerSection(**(base | server)))


def _with_sglang(profile: LaunchProfile, site: Path) -> LaunchProfile:
    env = dict(profile.server.env, PYTHONPATH=str(site))
    return profile.with_changes(server={"env": env})


# --- loading: unknown keys, types, ranges, syntax --------------------------------------------------------


def test_unknown_key_names_the_key_and_its_line() -> None:
    p = _one(_problems('[server]\nport = 30000\n\nportt = 30001\n'), "server.portt")
    assert p.line == 4
    assert "unknown key" in p.message and "'port'" in p.message


def test_unknown_table_names_the_table_and_its_line() -> None:
    p = _one(_problems('[server]\nport = 1\n[servr]\nport = 2\n'), "servr")
    assert p.line == 3 and "unknown table" in p.message and "'server'" in p.message


def test_unknown_key_inside_an_inline_table_is_found() -> None:
    p = _one(_problems('[watch]\nstall_after_s = 5\n\ncapture = { enabled = false, rid_prefx = "x" }\n'),
             "watch.capture")
    assert p.line == 4
    p = _one(_problems('capture = { enabled = false, rid_prefx = "x" }\n'), "capture.rid_prefx")
    assert p.line == 1


def test_wrong_type_names_field_line_and_types() -> None:
    p = _one(_problems('[server]\nmodel_path = "/m"\nport = "30000"\n'), "server.port")
    assert p.line == 3 and "must be an integer, not a string" in p.message


def test_boolean_is_not_an_integer() -> None:
    p = _one(_problems('[server]\ntp_size = true\n'), "server.tp_size")
    assert "integer" in p.message and "boolean" in p.message


def test_wrong_element_type_names_the_element_and_its_own_line() -> None:
    text = '[server]\nextra_args = [\n  "--trust-remote-code",\n  3,\n]\n'
    p = _one(_problems(text), "server.extra_args[1]")
    assert p.line == 4 and "string" in p.message


def test_env_values_must_be_strings() -> None:
    p = _one(_problems('[server.env]\nNCCL_NTHREADS = 4\n'), "server.env.NCCL_NTHREADS")
    assert p.line == 2 and "quote it" in p.message


def test_env_names_must_be_valid() -> None:
    p = _one(_problems('[server.env]\n"BAD-NAME" = "x"\n'), "server.env.BAD-NAME")
    assert "not a valid environment variable name" in p.message


def test_section_must_be_a_table() -> None:
    assert "must be a table" in _one(_problems("watch = 5\n"), "watch").message


@pytest.mark.parametrize(
    ("toml_line", "field"),
    [
        ("[server]\nport = 0", "server.port"),
        ("[server]\nport = 70000", "server.port"),
        ("[server]\ntp_size = 0", "server.tp_size"),
        ("[server]\nlauncher = \"vllm\"", "server.launcher"),
        ("[server]\nmem_fraction_static = 1.0", "server.mem_fraction_static"),
        ("[server]\nmem_fraction_static = 0", "server.mem_fraction_static"),
        ("[server]\nmem_fraction_static = nan", "server.mem_fraction_static"),
        ("[server]\nchunked_prefill_size = 0", "server.chunked_prefill_size"),
        ("[server]\nchunked_prefill_size = -2", "server.chunked_prefill_size"),
        ("[server]\nhost = \"\"", "server.host"),
        ("[server]\nextra_args = [\"\"]", "server.extra_args[0]"),
        ("[capture]\nlayers = [2, -1]", "capture.layers[1]"),
        ("[capture]\nlayers = [2, 30, 2]", "capture.layers[2]"),
        ("[capture]\nrid_prefix = \"\"", "capture.rid_prefix"),
        ("[watch]\nstall_after_s = 0", "watch.stall_after_s"),
        ("[watch]\nstall_after_s = -5", "watch.stall_after_s"),
        ("[emulator]\ntime_scale = 0", "emulator.time_scale"),
        ("[emulator]\nfault = \"explode\"", "emulator.fault"),
        ("[emulator]\ngpu_memory_gb = -1", "emulator.gpu_memory_gb"),
        ("[emulator]\ngpus = 0", "emulator.gpus"),
    ],
)
def test_out_of_range_values_name_field_and_line(toml_line: str, field: str) -> None:
    p = _one(_problems(toml_line + "\n"), field)
    assert p.line == 2, p
    assert p.severity == "error"


@pytest.mark.parametrize(
    "toml_text",
    [
        "[server]\nmem_fraction_static = 0.85\nchunked_prefill_size = -1\nport = 65535\n",
        "[server]\nchunked_prefill_size = 8192\ntp_size = 8\nport = 1\n",
        "[emulator]\ntime_scale = 1\ngpu_memory_gb = 0.5\ngpus = 1\n",
        "[capture]\nlayers = [0, 30, 58]\n",
    ],
)
def test_values_at_the_edges_of_their_ranges_load(toml_text: str) -> None:
    parse_profile(toml_text, name="ok")


def test_every_fault_id_of_the_design_loads() -> None:
    for fault in FAULT_IDS:
        assert parse_profile(f'[emulator]\nfault = "{fault}"\n', name="f").emulator.fault == fault


def test_emulator_tp_beyond_its_gpus() -> None:
    text = '[server]\nlauncher = "emulator"\ntp_size = 16\n[emulator]\ngpus = 8\n'
    p = _one(_problems(text), "server.tp_size")
    assert "emulator has 8" in p.message and p.line == 3


def test_toml_syntax_error_gives_its_line() -> None:
    problems = _problems('[server]\nport = 30000\nmodel_path = \n')
    assert len(problems) == 1
    assert problems[0].field == "toml" and problems[0].line == 3
    assert "TOML syntax" in problems[0].message


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    text = '[server]\nport = 0\ntp_size = "8"\nbogus = 1\n[emulator]\nfault = "nope"\n'
    fields = {p.field for p in _problems(text)}
    assert fields == {"server.port", "server.tp_size", "server.bogus", "emulator.fault"}


def test_defaults_of_the_design() -> None:
    p = parse_profile('[server]\nmodel_path = "/m"\n', name="d")
    s = p.server
    assert (s.launcher, s.python, s.host, s.port, s.tp_size) == ("sglang", sys.executable, "127.0.0.1", 30000, 1)
    assert s.cuda_graph is True and s.radix_cache is True and s.extra_args == () and s.env == {}
    assert p.capture.enabled is False and p.capture.rid_prefix == "eagle3-" and p.capture.layers is None
    assert p.watch.stall_after_s == 300
    assert (p.emulator.time_scale, p.emulator.fault, p.emulator.gpus) == (0.05, "none", 8)


# --- the line scanner ------------------------------------------------------------------------------------


def test_key_lines_follow_tables_arrays_strings_and_comments() -> None:
    text = (
        "# a comment with port = 1 and [fake]\n"  # 1
        "[server]\n"  # 2
        'model_path = """\n'  # 3
        "[not a table]\n"  # 4
        'port = 2"""\n'  # 5
        "port = 30000  # trailing [x]\n"  # 6
        "extra_args = [\n"  # 7
        '  "--a", # one\n'  # 8
        "  '--b',\n"  # 9
        "]\n"  # 10
        "env.NCCL_ALGO = 'Ring'\n"  # 11
        "[capture]\n"  # 12
        'rid_prefix = "a\\"b"\n'  # 13
        "layers = [1, 2]\n"  # 14
    )
    lines = toml_key_lines(text)
    assert lines["server"] == 2
    assert lines["server.model_path"] == 3
    assert lines["server.port"] == 6
    assert lines["server.extra_args[0]"] == 8 and lines["server.extra_args[1]"] == 9
    assert lines["server.env.NCCL_ALGO"] == 11
    assert lines["capture.rid_prefix"] == 13 and lines["capture.layers[1]"] == 14
    assert "not a table" not in lines


# --- names, paths, listing, saving ------------------------------------------------------------------------


def test_a_name_resolves_in_the_profiles_dir_and_a_path_is_used_as_is(home, tmp_path: Path) -> None:
    (home.profiles_dir / "alpha.toml").write_text('[server]\nport = 30001\n')
    elsewhere = tmp_path / "beta.toml"
    elsewhere.write_text('[server]\nport = 30002\n')
    assert load_profile("alpha").server.port == 30001
    assert load_profile("alpha").path == home.profiles_dir / "alpha.toml"
    assert load_profile(str(elsewhere)).server.port == 30002
    assert load_profile(elsewhere).name == "beta"
    assert list_profiles(home) == ["alpha"]


def test_an_unknown_name_lists_the_known_profiles(home) -> None:
    (home.profiles_dir / "alpha.toml").write_text("")
    with pytest.raises(ProfileError) as info:
        load_profile("alpah")
    assert "alpha" in info.value.problems[0].message


def test_round_trip_through_toml_and_disk(home, model_dir: Path) -> None:
    text = (
        '[server]\nlauncher = "emulator"\nmodel_path = "' + str(model_dir) + '"\ntp_size = 4\nport = 31000\n'
        'attention_backend = "fa3"\ncuda_graph = false\nmem_fraction_static = 0.8\nradix_cache = false\n'
        'chunked_prefill_size = -1\nextra_args = ["--trust-remote-code", "--context-length", "4096"]\n'
        '[server.env]\nNCCL_ALGO = "Ring"\nHF_TOKEN = "' + HF_SECRET + '"\n'
        '[capture]\nenabled = true\nlayers = [2, 30, 58]\ndir = "/dev/shm/x"\nrid_prefix = "job-"\n'
        '[watch]\nstall_after_s = 120.5\n[emulator]\ntime_scale = 0.01\nfault = "slow-weights"\n'
        'gpu_memory_gb = 1.5\ngpus = 4\n'
    )
    original = parse_profile(text, name="rt")
    assert parse_profile(original.to_toml(), name="rt") == original
    path = save_profile(original, home=home)
    assert path == home.profiles_dir / "rt.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_profile("rt") == original


def test_saving_keeps_an_explicit_radix_cache_but_does_not_invent_one(home) -> None:
    implicit = parse_profile('[server]\nmodel_path = "/m"\n', name="a")
    explicit = parse_profile('[server]\nmodel_path = "/m"\nradix_cache = true\n', name="b")
    assert implicit.server == explicit.server  # same meaning...
    reloaded_implicit = load_profile(save_profile(implicit, home=home))
    reloaded_explicit = load_profile(save_profile(explicit, home=home))
    assert not reloaded_implicit.is_explicit("server.radix_cache")  # ...but capture rules need to tell them apart
    assert reloaded_explicit.is_explicit("server.radix_cache")


def test_with_changes_updates_sections_and_marks_changed_keys_explicit() -> None:
    p = parse_profile('[server]\nmodel_path = "/m"\n', name="w")
    q = p.with_changes(server={"port": 31234, "extra_args": ["--x"]}, emulator={"fault": "rank-missing"})
    assert q.server.port == 31234 and q.server.extra_args == ("--x",) and q.emulator.fault == "rank-missing"
    assert p.server.port == 30000  # immutable
    assert q.is_explicit("server.port") and not q.is_explicit("server.host")
    same = p.with_changes(server={"radix_cache": True})  # not a change: stays implicit
    assert not same.is_explicit("server.radix_cache")


def test_with_changes_refuses_unknown_keys() -> None:
    p = parse_profile("", name="w")
    with pytest.raises(ProfileError) as info:
        p.with_changes(server={"prot": 1})
    assert info.value.problems[0].field == "server.prot" and "'port'" in info.value.problems[0].message


def test_save_refuses_a_profile_that_would_not_load(home) -> None:
    bad = parse_profile("", name="bad").with_changes(server={"port": 0})
    with pytest.raises(ProfileError) as info:
        save_profile(bad, home=home)
    assert info.value.problems[0].field == "server.port"
    assert not (home.profiles_dir / "bad.toml").exists()


# --- model config ----------------------------------------------------------------------------------------


def test_read_model_config_flat_and_nested_text_config(make_model_dir) -> None:
    flat = read_model_config(make_model_dir("flat"))
    assert (flat.architecture, flat.num_hidden_layers, flat.hidden_size) == ("DeepseekV3ForCausalLM", 61, 7168)
    assert not flat.text_config_nested
    nested_dir = make_model_dir("kimi")
    (nested_dir / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {"model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168},
    }))
    nested = read_model_config(nested_dir)
    assert nested.architecture == "KimiK25ForConditionalGeneration" and nested.model_type == "kimi_k25"
    assert (nested.num_hidden_layers, nested.hidden_size, nested.text_model_type) == (61, 7168, "kimi_k2")
    assert nested.text_config_nested


# --- validation on this machine --------------------------------------------------------------------------


def test_a_good_profile_without_sglang_has_one_warning_and_no_error(model_dir: Path, free_port: int) -> None:
    problems = validate_profile(_profile(model_dir, free_port), nvml_gpu_count=8)
    assert _errors(problems) == []
    assert len(problems) == 1
    warning = problems[0]
    assert warning.severity == "warning" and warning.field == "server.python"
    assert "SGLang checks skipped" in warning.message and "not installed" in warning.message


def test_missing_model_dir(tmp_path: Path, free_port: int) -> None:
    p = _one(validate_profile(_profile(tmp_path / "nope", free_port)), "server.model_path")
    assert "does not exist" in p.message and str(tmp_path / "nope") in p.message


def test_model_path_not_set(free_port: int) -> None:
    p = _one(validate_profile(_profile(Path(""), free_port).with_changes(server={"model_path": ""})),
             "server.model_path")
    assert "not set" in p.message


def test_model_dir_without_config_json(tmp_path: Path, free_port: int) -> None:
    (tmp_path / "empty-model").mkdir()
    p = _one(validate_profile(_profile(tmp_path / "empty-model", free_port)), "server.model_path")
    assert "no config.json" in p.message


def test_model_config_that_is_not_json(tmp_path: Path, free_port: int) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{not json")
    p = _one(validate_profile(_profile(tmp_path / "m", free_port)), "server.model_path")
    assert "not valid JSON" in p.message


def test_port_in_use_names_the_holder(model_dir: Path) -> None:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        profile = _profile(model_dir, port)
        p = _one(validate_profile(profile), "server.port")
        assert p.severity == "error"
        assert f"port {port}" in p.message and "in use" in p.message
        assert f"pid {os.getpid()}" in p.message  # psutil can tell: it is this test process
        assert not [x for x in validate_profile(profile, check_port=False) if x.field == "server.port"]
    finally:
        holder.close()


def test_port_error_carries_the_toml_line(home, model_dir: Path) -> None:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        path = home.profiles_dir / "busy.toml"
        path.write_text(f'[server]\npython = "{sys.executable}"\nmodel_path = "{model_dir}"\n\nport = {port}\n')
        assert _one(validate_profile(load_profile("busy")), "server.port").line == 5
    finally:
        holder.close()


def test_host_that_is_not_on_this_machine(model_dir: Path, free_port: int) -> None:
    p = _one(validate_profile(_profile(model_dir, free_port, host="192.0.2.1")), "server.host")
    assert "not an address of this machine" in p.message and p.severity == "error"


def test_wildcard_host_is_a_warning(model_dir: Path, free_port: int) -> None:
    p = _one(validate_profile(_profile(model_dir, free_port, host="0.0.0.0"), check_port=False), "server.host")
    assert p.severity == "warning" and "every interface" in p.message


def test_tp_beyond_the_visible_gpus(model_dir: Path, free_port: int) -> None:
    p = _one(validate_profile(_profile(model_dir, free_port, tp_size=4), nvml_gpu_count=2), "server.tp_size")
    assert "TP 4" in p.message and "only 2 are visible" in p.message


def test_tp_check_honours_cuda_visible_devices_of_the_profile(model_dir: Path, free_port: int) -> None:
    profile = _profile(model_dir, free_port, tp_size=2, env={"CUDA_VISIBLE_DEVICES": "3"})
    p = _one(validate_profile(profile, nvml_gpu_count=8), "server.tp_size")
    assert "only 1 is visible" in p.message and "CUDA_VISIBLE_DEVICES='3' from server.env" in p.message
    ok = _profile(model_dir, free_port, tp_size=2, env={"CUDA_VISIBLE_DEVICES": "3,5"})
    assert not [x for x in validate_profile(ok, nvml_gpu_count=8) if x.field == "server.tp_size"]


def test_tp_check_is_for_the_real_launcher_only(model_dir: Path, free_port: int) -> None:
    profile = _profile(model_dir, free_port, tp_size=8, launcher="emulator")
    assert not [x for x in validate_profile(profile, nvml_gpu_count=1) if x.field == "server.tp_size"]


def test_tp_check_with_this_machines_nvml(model_dir: Path, free_port: int) -> None:
    count = nvml_device_count()
    profile = _profile(model_dir, free_port, tp_size=(count or 0) + 1)
    tp_problems = [x for x in validate_profile(profile) if x.field == "server.tp_size"]
    if count is None:  # no NVML here: the rule is skipped silently
        assert tp_problems == []
    else:
        assert len(tp_problems) == 1 and f"NVML sees {count}" in tp_problems[0].message


def test_visible_gpu_count_reads_cuda_visible_devices_like_cuda() -> None:
    assert visible_gpu_count(None, 8) == 8
    assert visible_gpu_count("", 8) == 0
    assert visible_gpu_count("0,1,7", 4) == 2  # CUDA stops at the first invalid index
    assert visible_gpu_count("1,1", 4) == 1
    assert visible_gpu_count("GPU-3f2a,MIG-1", 1) == 2
    assert visible_gpu_count("-1,0", 4) == 0


def test_python_that_does_not_exist(model_dir: Path, free_port: int, tmp_path: Path) -> None:
    profile = _profile(model_dir, free_port, python=str(tmp_path / "venv" / "bin" / "python"))
    problems = validate_profile(profile)
    p = _one(problems, "server.python")
    assert p.severity == "error" and "not an executable Python" in p.message


def test_programmatic_out_of_range_values_are_caught_by_validate(model_dir: Path, free_port: int) -> None:
    profile = _profile(model_dir, free_port).with_changes(server={"mem_fraction_static": 1.5})
    assert "between 0 and 1" in _one(validate_profile(profile), "server.mem_fraction_static").message


# --- validation against the installed SGLang (real 0.5.23 source) ---------------------------------------


def test_attention_backend_not_accepted_by_installed_sglang(model_dir, free_port, sglang_site) -> None:
    profile = _with_sglang(_profile(model_dir, free_port, attention_backend="bogus"), sglang_site)
    p = _one(validate_profile(profile), "server.attention_backend")
    assert "'bogus' is not an attention backend of SGLang 0.5.23" in p.message and "fa3" in p.message
    good = _with_sglang(_profile(model_dir, free_port, attention_backend="fa3"), sglang_site)
    assert validate_profile(good) == []  # SGLang found: no skip warning either


def test_cuda_graph_max_bs_is_reported_ambiguous_with_its_candidates(model_dir, free_port, sglang_site) -> None:
    profile = _with_sglang(_profile(model_dir, free_port, extra_args=("--cuda-graph-max-bs", "16")), sglang_site)
    problems = validate_profile(profile)
    p = _one(problems, "server.extra_args[0]")
    assert "ambiguous" in p.message
    assert "--cuda-graph-max-bs-decode" in p.message and "--cuda-graph-max-bs-prefill" in p.message
    assert not [x for x in problems if x.field == "server.extra_args[1]"]  # its value is not reported again


def test_unique_prefix_is_accepted_like_argparse(model_dir, free_port, sglang_site) -> None:
    args = ("--trust-remote", "--context-len", "4096", "--tp", "1")
    profile = _with_sglang(_profile(model_dir, free_port, extra_args=args), sglang_site)
    problems = validate_profile(profile)
    assert _errors(problems) == []
    # --tp resolves to --tp-size, which server.tp_size already sets to 1: only a "repeats" warning
    p = _one(problems, "server.extra_args[3]")
    assert p.severity == "warning" and "server.tp_size" in p.message


def test_extra_flag_conflicting_with_a_field_is_an_error(model_dir, free_port, sglang_site) -> None:
    profile = _with_sglang(_profile(model_dir, free_port, tp_size=2, extra_args=("--tp", "8")), sglang_site)
    p = _one(validate_profile(profile), "server.extra_args[0]")
    assert p.severity == "error" and "conflicts with server.tp_size = 2" in p.message


def test_unknown_flag_is_reported(model_dir, free_port, sglang_site) -> None:
    profile = _with_sglang(_profile(model_dir, free_port, extra_args=("--enable-warp-drive",)), sglang_site)
    p = _one(validate_profile(profile), "server.extra_args[0]")
    assert "SGLang 0.5.23 has no flag --enable-warp-drive" in p.message


def test_invalid_choice_and_missing_value_and_stray_value(model_dir, free_port, sglang_site) -> None:
    args = ("--moe-runner-backend", "nope", "--trust-remote-code", "stray", "--context-length")
    problems = validate_profile(_with_sglang(_profile(model_dir, free_port, extra_args=args), sglang_site))
    assert "not a valid choice for --moe-runner-backend" in _one(problems, "server.extra_args[0]").message
    assert "follows no flag that takes a value" in _one(problems, "server.extra_args[3]").message
    assert "--context-length expects a value" in _one(problems, "server.extra_args[4]").message


def test_without_sglang_only_field_flags_are_checked(model_dir, free_port) -> None:
    profile = _profile(model_dir, free_port, extra_args=("--whatever", "--port", "1"))
    problems = validate_profile(profile)
    assert "conflicts with server.port" in _one(problems, "server.extra_args[1]").message
    assert not [x for x in problems if x.field == "server.extra_args[0]"]  # unknowable without SGLang


def test_sglang_not_found_gives_exactly_one_warning_even_with_sglang_fields(model_dir, free_port) -> None:
    profile = _profile(model_dir, free_port, attention_backend="bogus", extra_args=("--cuda-graph-max-bs", "8"))
    problems = validate_profile(profile)
    assert _errors(problems) == []
    assert [p.severity for p in problems] == ["warning"]


# --- argv and env ----------------------------------------------------------------------------------------


def test_build_command_for_sglang(model_dir: Path) -> None:
    profile = _profile(model_dir, 30123, tp_size=8, attention_backend="fa3", mem_fraction_static=0.85,
                       radix_cache=False, chunked_prefill_size=-1, extra_args=("--trust-remote-code",),
                       env={"NCCL_ALGO": "Ring"})
    cmd = build_command(profile, sglang=None)
    assert cmd.argv == [
        sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--tp-size", "8",
        "--host", "127.0.0.1", "--port", "30123", "--attention-backend", "fa3", "--mem-fraction-static",
        "0.85", "--disable-radix-cache", "--chunked-prefill-size", "-1", "--trust-remote-code",
    ]
    assert cmd.env_changes == {"NCCL_ALGO": "Ring"}


def test_cuda_graph_off_uses_per_phase_flags_where_sglang_has_them(model_dir: Path, sglang_site: Path) -> None:
    profile = _profile(model_dir, 30000, cuda_graph=False)
    new = build_command(profile, sglang=SglangSource(sglang_site / "sglang")).argv
    assert new[-2:] == ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]
    old = build_command(profile, sglang=SglangSource(OLD_STYLE_ROOT)).argv
    assert old[-1] == "--disable-cuda-graph" and "--disable-decode-cuda-graph" not in old
    assert build_command(profile, sglang=None).argv[-1] == "--disable-cuda-graph"
    looked_up = build_command(_with_sglang(profile, sglang_site)).argv  # found through the profile's python
    assert looked_up[-2:] == ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]


def test_build_command_for_the_emulator(model_dir: Path) -> None:
    profile = _profile(model_dir, 30001, launcher="emulator", tp_size=4).with_changes(
        emulator={"time_scale": 0.003, "fault": "hang-after-weights", "gpu_memory_gb": 2.0, "gpus": 4}
    )
    argv = build_command(profile, sglang=None).argv
    assert argv[:3] == [sys.executable, "-m", "sessions.emulator"]
    assert argv[3:11] == ["--model-path", str(model_dir), "--tp-size", "4", "--host", "127.0.0.1", "--port", "30001"]
    assert argv[11:] == ["--time-scale", "0.003", "--emulate-fault", "hang-after-weights",
                         "--emulate-gpu-memory-gb", "2", "--emulate-gpus", "4"]


def test_shell_text_is_the_exact_quoted_command(tmp_path: Path) -> None:
    odd = tmp_path / "my models" / "it's \"here\""
    profile = _profile(odd, 30000, extra_args=("--json-model-override-args", '{"rope": 2}'),
                       env={"NCCL_DEBUG_SUBSYS": "INIT,ENV", "GREETING": "hello world's"})
    cmd = build_command(profile, sglang=None)
    lines = cmd.shell_text(redacted=True).splitlines()
    assert shlex.split(lines[-1]) == cmd.argv
    assert lines[0] == "NCCL_DEBUG_SUBSYS=INIT,ENV"
    assert shlex.split(lines[1]) == ["GREETING=hello world's"]


def test_shell_text_redacts_secrets_everywhere(model_dir: Path) -> None:
    profile = _profile(model_dir, 30000, extra_args=("--api-key", "sk-abcdefghijklmnopqrstuvwxyz", "--served-model-name",
                                                     HF_SECRET),
                       env={"HF_TOKEN": HF_SECRET, "NCCL_ALGO": "Ring"})
    text = build_command(profile, sglang=None).shell_text(redacted=True)
    assert HF_SECRET not in text and "sk-abcdefghijklmnopqrstuvwxyz" not in text
    assert "HF_TOKEN='***'" in text and "NCCL_ALGO=Ring" in text
    assert HF_SECRET in build_command(profile, sglang=None).shell_text(redacted=False)


# --- the CLI ---------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=120, check=False)


def test_cli_profile_command_prints_the_redacted_command(home, model_dir: Path) -> None:
    (home.profiles_dir / "p.toml").write_text(
        f'[server]\npython = "{sys.executable}"\nmodel_path = "{model_dir}"\nport = 30555\n'
        f'[server.env]\nHF_TOKEN = "{HF_SECRET}"\n'
    )
    result = _cli("profile", "command", "p")
    assert result.returncode == 0, result.stderr
    assert HF_SECRET not in result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "HF_TOKEN='***'"
    assert shlex.split(lines[-1])[2:4] == ["sglang.launch_server", "--model-path"]


def test_cli_profile_command_with_bad_toml_exits_2_with_the_line(home) -> None:
    (home.profiles_dir / "broken.toml").write_text('[server]\nport = \n')
    result = _cli("profile", "command", "broken")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "toml" in result.stderr and "line 2" in result.stderr


def test_cli_profile_validate_exit_codes(home, model_dir: Path, free_port: int) -> None:
    good = f'[server]\npython = "{sys.executable}"\nmodel_path = "{model_dir}"\nport = {free_port}\n'
    (home.profiles_dir / "good.toml").write_text(good)
    (home.profiles_dir / "bad.toml").write_text(good.replace(str(model_dir), "/no/such/model") + "tp_size = 0\n")
    ok = _cli("profile", "validate", "good")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "warning: server.python: SGLang checks skipped" in ok.stdout  # printed, yet exit 0
    bad = _cli("profile", "validate", "bad")
    assert bad.returncode == 2
    assert "error: server.model_path: model folder /no/such/model does not exist (line 3)" in bad.stdout
    assert "error: server.tp_size: must be at least 1, not 0 (line 5)" in bad.stdout
    as_json = json.loads(_cli("profile", "validate", "bad", "--json").stdout)
    assert {p["field"] for p in as_json} == {"server.tp_size", "server.model_path", "server.python"}


def test_cli_profile_list_and_new(home, model_dir: Path) -> None:
    made = _cli("profile", "new", "fresh", "--emulator", "--model", str(model_dir))
    assert made.returncode == 0, made.stderr
    path = Path(made.stdout.strip())
    assert path == home.profiles_dir / "fresh.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    profile = load_profile("fresh")  # the template loads as it is
    assert profile.server.launcher == "emulator" and profile.server.model_path == str(model_dir)
    assert "#" in path.read_text()  # commented
    assert _cli("profile", "new", "fresh").returncode == 1  # never overwritten silently
    assert _cli("profile", "new", "../escape").returncode == 2
    plain = _cli("profile", "new", "real")
    assert plain.returncode == 0 and load_profile("real").server.launcher == "sglang"
    listed = _cli("profile", "list")
    assert listed.returncode == 0 and listed.stdout.split() == ["fresh", "real"]


def test_loading_a_profile_opens_its_file_once(tmp_path, monkeypatch):
    """load_profile opened the file twice (a check_regular, then the read that refuses the same special
    files); a status of a starting server loads its snapshot each time it is read."""
    from sessions.profiles import load_profile

    path = tmp_path / "p.toml"
    path.write_text('[server]\nlauncher = "emulator"\nmodel_path = "/m"\n')
    opened = []
    real_open = os.open

    def counted(file, *args, **kwargs):
        if os.fspath(file) == str(path):
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", counted)
    assert load_profile(path).server.model_path == "/m"
    assert len(opened) == 1
