"""sessions.sglang_source against the real SGLang sources (the 0.5.14, 0.5.18 and 0.5.23 wheels) and an
older-style stand-in.

The oracle for each flag table is ``tests/data/sglang_fake/argparse-<version>.json``: the option strings of
the parser SGLang itself builds (``ServerArgs.add_cli_args``), recorded once per version by running that
SGLang's code (how, in each file's ``generated_by``).  0.5.14 and 0.5.18 are the versions SpecForge 0.2.0 and
SpecForge's main branch pin; they keep every flag as an ``A[T, Arg(...)]`` field on ``ServerArgs`` itself,
where 0.5.23 spreads them over ``srt/arg_groups/fields/*.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from _sglang_wheel import SGLANG_VERSIONS, sglang_0_5_23_root, sglang_0_5_23_site
from _sglang_wheel import sglang_root as sglang_root_of

from sessions.sglang_source import (
    SglangSource,
    find_sglang,
    locate_sglang,
    read_version,
    resolve_option,
)

DATA = Path(__file__).parent / "data" / "sglang_fake"
OLD_STYLE_ROOT = DATA / "old-style" / "sglang"


@pytest.fixture(scope="module")
def sglang_root() -> Path:
    return sglang_0_5_23_root()


@pytest.fixture(scope="module")
def src(sglang_root: Path) -> SglangSource:
    return SglangSource(sglang_root)


@pytest.fixture(scope="module", params=SGLANG_VERSIONS)
def any_src(request: pytest.FixtureRequest) -> SglangSource:
    return SglangSource(sglang_root_of(request.param))


def _argparse_oracle(version: str = "0.5.23") -> dict[str, list]:
    return json.loads((DATA / f"argparse-{version}.json").read_text())["options"]


def test_version_is_read_from_version_file(any_src: SglangSource) -> None:
    assert any_src.version == any_src.root.parent.parent.name.removeprefix("sglang-")


def test_flag_table_matches_sglangs_own_argparse_parser(any_src: SglangSource) -> None:
    oracle = _argparse_oracle(any_src.version or "")
    flags = any_src.flags()
    print(f"SGLang {any_src.version}: {len(flags)} option strings read statically, {len(oracle)} in its parser")
    assert set(flags) == set(oracle)
    for name, (nargs, choices) in oracle.items():
        info = flags[name]
        assert info.takes_value == (nargs != 0), name
        assert info.nargs == (nargs if isinstance(nargs, str) else None), name
        if info.choices is not None:  # dynamic choices (parsers, sampling backends) are unknown statically
            # 0.5.14/0.5.18 keep some choices in a set literal, whose order is the process's string hashing
            assert sorted(info.choices) == sorted(str(c) for c in choices), name
            if any_src.version == "0.5.23":
                assert list(info.choices) == [str(c) for c in choices], name


def test_flags_users_carry_between_versions(any_src: SglangSource) -> None:
    """A flag list written for SpecForge's SGLang must validate the same way SGLang itself parses it."""
    flags = any_src.flags()
    for flag in ("--tp-size", "--attention-backend", "--mem-fraction-static", "--chunked-prefill-size",
                 "--disable-radix-cache", "--dp-size", "--nnodes", "--node-rank", "--dist-init-addr",
                 "--base-gpu-id", "--speculative-algorithm", "--speculative-draft-model-path"):
        assert flag in flags, (any_src.version, flag)
    exact, candidates = resolve_option("--cuda-graph-max-bs", flags)
    if any_src.version == "0.5.23":  # split into -decode/-prefill: the old spelling is an ambiguous prefix
        assert exact is None and candidates == ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]
    else:
        assert exact == "--cuda-graph-max-bs"
    assert "fa3" in (any_src.attention_backends() or ())


def test_cuda_graph_max_bs_is_ambiguous_in_0_5_23(src: SglangSource) -> None:
    flag, candidates = resolve_option("--cuda-graph-max-bs", src.flags())
    assert flag is None
    assert candidates == ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]


def test_tp_is_an_accepted_prefix_of_tp_size(src: SglangSource) -> None:
    assert resolve_option("--tp", src.flags()) == ("--tp-size", [])
    assert resolve_option("--tp=8", src.flags()) == ("--tp-size", [])


def test_aliases_and_exact_spellings_resolve_to_themselves(src: SglangSource) -> None:
    assert resolve_option("--ep", src.flags()) == ("--ep", [])  # a real alias of --ep-size, also a prefix of others
    assert src.flags()["--ep"].canonical == "--ep-size"
    assert src.flags()["--tensor-parallel-size"].canonical == "--tp-size"
    assert resolve_option("--model", src.flags()) == ("--model", [])


def test_made_up_flag_is_rejected(src: SglangSource) -> None:
    assert resolve_option("--enable-eagle3-tui-magic", src.flags()) == (None, [])


def test_attention_backends_accept_fa3_and_reject_bogus(src: SglangSource) -> None:
    backends = src.attention_backends()
    assert "fa3" in backends
    assert "bogus" not in backends
    assert backends == src.flags()["--attention-backend"].choices


def test_value_kinds_of_some_flags(src: SglangSource) -> None:
    flags = src.flags()
    assert flags["--disable-cuda-graph"].takes_value is False  # deprecated manual flag, store-true action
    assert flags["--monokernel-backend"].takes_value is True  # DeprecatedStoreConstAction with nargs=None
    assert flags["--no-enable-tf32-matmul"].takes_value is False  # BooleanOptionalAction's negative form
    assert flags["--lora-paths"].nargs == "*"  # custom action with action_kwargs nargs
    assert flags["--cuda-graph-bs-decode"].nargs == "+"
    assert flags["--disable-decode-cuda-graph"].takes_value is False
    assert flags["--disable-prefill-cuda-graph"].takes_value is False


def test_second_read_is_cached_and_timed(src: SglangSource) -> None:
    from sessions import sglang_source

    sglang_source._FLAG_CACHE.clear()
    sglang_source._PARSE_CACHE.clear()
    sglang_source._CONSTANTS_CACHE.clear()
    t0 = time.perf_counter()
    first = src.flags()
    t1 = time.perf_counter()
    second = src.flags()
    t2 = time.perf_counter()
    print(f"static read of SGLang 0.5.23 flags: cold {1000 * (t1 - t0):.0f} ms, cached {1000 * (t2 - t1):.2f} ms")
    assert second is first


def test_resolve_option_follows_argparse_prefix_rules() -> None:
    from sessions.sglang_source import FlagInfo

    flags = {n: FlagInfo(n, n, True) for n in ("--alpha", "--alpha-beta", "--gamma", "-h")}
    assert resolve_option("--alpha", flags) == ("--alpha", [])  # exact beats prefix
    assert resolve_option("--alp", flags) == (None, ["--alpha", "--alpha-beta"])
    assert resolve_option("--g=1", flags) == ("--gamma", [])
    assert resolve_option("--delta", flags) == (None, [])
    assert resolve_option("-x", flags) == (None, [])


# --- locating without importing ------------------------------------------------------------------------


def test_find_sglang_in_a_python_via_its_environment(sglang_root: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(sglang_0_5_23_site()))
    location = locate_sglang(sys.executable, env=env, use_cache=False)
    assert location.source is not None, location.reason
    assert location.source.root.resolve() == sglang_root.resolve()
    assert location.source.version == "0.5.23"


def test_find_sglang_never_imports_the_package(tmp_path: Path) -> None:
    # old-style/sglang/__init__.py raises when imported; find_spec must only locate it
    site = tmp_path / "site"
    shutil.copytree(OLD_STYLE_ROOT, site / "sglang")
    env = dict(os.environ, PYTHONPATH=str(site))
    location = locate_sglang(sys.executable, env=env, use_cache=False)
    assert location.source is not None, location.reason
    assert location.source.version == "0.4.6.post1"


def test_python_without_sglang_gives_a_reason(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    location = locate_sglang(sys.executable, env=env, use_cache=False)
    # this test venv has no SGLang installed: the reason says so and names the interpreter
    assert location.source is None
    assert "not installed" in location.reason and sys.executable in location.reason
    assert find_sglang(sys.executable, env=env) is None


def test_missing_python_gives_a_reason(tmp_path: Path) -> None:
    location = locate_sglang(str(tmp_path / "nope" / "python"), use_cache=False)
    assert location.source is None
    assert "not found" in location.reason


def test_explicit_root_must_hold_srt(tmp_path: Path) -> None:
    (tmp_path / "sglang").mkdir()
    location = locate_sglang(sglang_root=tmp_path / "sglang")
    assert location.source is None and "no srt/" in location.reason
    assert find_sglang(sglang_root=OLD_STYLE_ROOT) is not None


# --- older SGLang: one ServerArgs with add_argument -----------------------------------------------------


def test_old_style_flags_come_from_add_argument_calls() -> None:
    src = SglangSource(OLD_STYLE_ROOT)
    assert src.version == "0.4.6.post1"
    assert resolve_option("--cuda-graph-max-bs", src.flags()) == ("--cuda-graph-max-bs", [])  # exact there
    assert src.flags()["--tp-size"].canonical == "--tensor-parallel-size"
    assert src.flags()["--cuda-graph-bs"].nargs == "+"
    assert src.flags()["--disable-cuda-graph"].takes_value is False
    assert src.flags()["--load-format"].choices == ("auto", "pt", "safetensors")  # resolved module constant
    assert src.attention_backends() == ("flashinfer", "triton", "torch_native")
    assert not src.has_flag("--disable-decode-cuda-graph")


def test_flag_cache_is_refreshed_when_a_source_file_changes(tmp_path: Path) -> None:
    root = tmp_path / "sglang"
    shutil.copytree(OLD_STYLE_ROOT, root)
    src = SglangSource(root)
    assert not src.has_flag("--brand-new-flag")
    server_args = root / "srt" / "server_args.py"
    text = server_args.read_text().replace(
        '        parser.add_argument("--trust-remote-code", action="store_true")',
        '        parser.add_argument("--trust-remote-code", action="store_true")\n'
        '        parser.add_argument("--brand-new-flag", type=int)',
    )
    server_args.write_text(text)
    stat = server_args.stat()
    os.utime(server_args, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert src.has_flag("--brand-new-flag")


def test_version_falls_back_to_dist_info(tmp_path: Path) -> None:
    root = tmp_path / "sglang"
    (root / "srt").mkdir(parents=True)
    (tmp_path / "sglang-9.9.9.dist-info").mkdir()
    (tmp_path / "sglang-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
    assert read_version(root) == "9.9.9"
