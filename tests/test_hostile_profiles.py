"""Profile validation never tracebacks (issue 14 item 5): wrong types, NULs, control characters, overlong
paths, deep nesting and a `python` that is no Python are problems named by field (and line)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sessions.profiles import _KINDS, SECTIONS, ProfileError, parse_profile, validate_profile


def problems_of(text: str, tmp_path: Path | None = None) -> list:
    """Every problem of a profile text: the loader's, else validation's (check_port off, no NVML)."""
    try:
        profile = parse_profile(text, name="p")
    except ProfileError as exc:
        return list(exc.problems)
    return validate_profile(profile, check_port=False, nvml_gpu_count=0)


def base(**server) -> dict:
    return {"server": {"launcher": "emulator", "python": sys.executable, "model_path": "/nonexistent",
                       "tp_size": 1, "port": 30000, **server}}


@pytest.mark.parametrize(("doc", "field", "words"), [
    (base(mem_fraction_static="0.85"), "server.mem_fraction_static", "must be a number"),
    (base(chunked_prefill_size="8192"), "server.chunked_prefill_size", "must be an integer"),
    (base(host="127.0.0.1\x00"), "server.host", "NUL"),
    (base(host="loc\x85alhost"), "server.host", "control character"),
    (base(host="höst"), "server.host", "host name"),
    (base(env={"X": "a\x00b"}), "server.env.X", "NUL"),
    (base(extra_args=["--x", "a\x00"]), "server.extra_args[1]", "NUL"),
    (base(model_path="/m" * 2500), "server.model_path", "too long"),
    (base(python="/bin/sh"), "server.python", "not a Python interpreter"),
    ({**base(), "capture": {"enabled": True, "dir": "/tmp/a\x00b"}}, "capture.dir", "NUL"),
    (base(port="30000"), "server.port", "must be an integer"),
    (base(tp_size=[1]), "server.tp_size", "must be an integer"),
])
def test_each_named_hostile_value_is_a_problem_of_its_field(doc: dict, field: str, words: str) -> None:
    found = problems_of(tomli_w.dumps(doc))
    mine = [p for p in found if p.field == field]
    assert mine, found
    assert any(words in p.message for p in mine), mine
    assert all(p.line is not None for p in mine if p.field != "server.python"), mine


def test_deep_nesting_is_a_toml_problem_not_a_recursion_error() -> None:
    text = "[server]\nextra_args = " + "[" * 100_000 + "]" * 100_000 + "\n"
    found = problems_of(text)
    assert found and found[0].field == "toml" and "nested too deeply" in found[0].message


def test_a_python_that_hangs_on_dash_c_is_answered_within_its_timeout(tmp_path: Path, monkeypatch) -> None:
    from sessions.profiles import validation as profiles

    script = tmp_path / "python3"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    monkeypatch.setattr(profiles, "PYTHON_CHECK_TIMEOUT_S", 0.5)
    profiles.python_version_problem.cache_clear()
    found = problems_of(tomli_w.dumps(base(python=str(script))))
    assert any(p.field == "server.python" and "did not answer" in p.message for p in found)


def _value() -> st.SearchStrategy:
    text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12) \
        | st.sampled_from(["0.85", "8192", "\x00", "a\x85b", "x" * 5000, "", " ", "-1", "nan"])
    scalars = (text | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.booleans()
               | st.floats(allow_nan=True, allow_infinity=True))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.sampled_from(["A", "B_TOKEN", "x y", "1"]), inner, max_size=3),
                        max_leaves=6)


_schema = st.fixed_dictionaries({
    section: st.dictionaries(st.sampled_from(sorted(_KINDS[section]) + ["bogus"]), _value(), max_size=8)
    for section in SECTIONS
})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Found by this test: a non-string extra_args entry reached the draft-token count of spec_accept_length.
@example(doc={"server": {"extra_args": [0]}, "capture": {}, "watch": {}, "emulator": {"spec_accept_length": []}})
@example(doc={"server": {"extra_args": [0, "--speculative-num-draft-tokens"]}, "emulator": {"spec_accept_length": 2}})
@given(doc=_schema | st.dictionaries(st.sampled_from([*SECTIONS, "extra"]), _value(), max_size=3))
def test_validation_of_any_typed_profile_returns_problems_and_never_raises(doc: dict) -> None:
    try:
        text = tomli_w.dumps(doc)
    except (TypeError, ValueError):  # tomli_w refuses some shapes (NaN keys, ...): nothing to validate
        return
    found = problems_of(text)
    for problem in found:
        assert problem.field and problem.message
        str(problem)


def test_a_profile_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    from sessions.profiles import load_profile

    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(ProfileError) as info:
            load_profile(path)
        assert "not a regular file" in str(info.value) or "not a file" in str(info.value)


def test_capture_refuses_two_batch_overlap_on_deepseek_and_warns_when_one_forward_does_not_fit(
        make_emulator_profile, tmp_path: Path) -> None:
    """Issue 14 item 7, at launch (validate_profile) and at toggle (capture_problems)."""
    import subprocess

    from sessions.profiles.capture_toggle import capture_problems

    small = tmp_path / "shm"
    small.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(small)], capture_output=True,
        check=False).returncode == 0
    try:
        capture_dir = small / "cap" if mounted else tmp_path / "cap"
        profile = make_emulator_profile("tbo", tp=1, chunked_prefill_size=8192,
                                        extra_args=["--enable-two-batch-overlap"],
                                        capture={"enabled": True, "dir": str(capture_dir)})
        for found in (capture_problems(profile), validate_profile(profile, check_port=False, nvml_gpu_count=0)):
            tbo = [p for p in found if "--enable-two-batch-overlap" in p.message]
            assert tbo and tbo[0].is_error and "model_forward_stages" in tbo[0].message
            assert "DeepseekV3ForCausalLM" in tbo[0].message
            if mounted:  # 8192 x 4 x 7168 x 2 = 469.8 MB against a 1 MB filesystem
                space = [p for p in found if p.field == "capture.dir" and "one forward dumps" in p.message]
                assert space and "469.8 MB" in space[0].message and "--shm-size" in space[0].message
        plain = make_emulator_profile("plain", tp=1, capture={"enabled": True, "dir": str(tmp_path / "c2")})
        assert not [p for p in capture_problems(plain) if "two-batch" in p.message]
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(small)], check=False)
