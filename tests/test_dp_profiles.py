"""``[server] dp_size`` (or ``--dp-size`` in extra_args): the launch flag, SGLang's refusals named at the
field, and the tp x pp x dp GPUs that the count check, the GPU-busy check and a group's members use."""

from __future__ import annotations

import pytest
from _extract_support import wait_for

from sessions.gpus import busy_gpus_for_launch, launch_gpu_ids
from sessions.profiles import ProfileError, validate_profile
from sessions.profiles.command import build_command
from sessions.server import GpuBusy, ServerSession
from sessions.server.group import member_profiles


def problems_of(make, name: str, **overrides) -> dict[str, str]:
    """The error problems of a profile: refused at load (field rules) or by validation."""
    try:
        found = validate_profile(make(name, **overrides), check_port=False)
    except ProfileError as refused:
        found = refused.problems
    return {p.field: p.message for p in found if p.is_error}


def test_dp_size_becomes_the_flag_and_puts_each_replica_on_its_own_gpus(make_emulator_profile):
    profile = make_emulator_profile("dp", tp=2, dp_size=2)
    argv = build_command(profile).argv
    assert argv[argv.index("--dp-size") + 1] == "2"
    assert launch_gpu_ids(profile) == [0, 1, 2, 3]
    # The same from extra_args, and attention DP (which splits the TP group's GPUs) adds none.
    assert launch_gpu_ids(make_emulator_profile("dpx", tp=2, extra_args=["--dp-size=3"])) == [0, 1, 2, 3, 4, 5]
    assert launch_gpu_ids(make_emulator_profile("adp", tp=2, extra_args=["--dp-size", "2",
                                                                         "--enable-dp-attention"])) == [0, 1]
    # A group of DP servers: member i starts past member i-1's tp x dp GPUs.
    group = make_emulator_profile("gdp", tp=1, dp_size=2, replicas=2)
    members = member_profiles(group)
    assert [launch_gpu_ids(m) for m in members] == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    ("overrides", "field", "named"),
    [
        ({"dp_size": 0}, "server.dp_size", "must be at least 1, not 0"),
        ({"dp_size": 2, "extra_args": ["--dp-size", "2"]}, "server.extra_args", "--dp-size conflicts with server.dp_size"),
        ({"dp_size": 2, "extra_args": ["--attn-dp-size", "2"]}, "server.dp_size",
         "--dp-size 2 with --attn-dp-size 2: data-parallel replicas combined with attention data parallelism"),
        ({"extra_args": ["--dp-size", "2", "--attn-dp-size", "2"]}, "server.extra_args", "--dp-size 2 with --attn-dp-size 2"),
        ({"dp_size": 2, "extra_args": ["--nnodes", "2"]}, "server.dp_size", "multi-node data-parallel replicas"),
        ({"dp_size": 3, "emulator": {"gpus": 8}, "tp": 4}, "server.dp_size",
         "TP 4 x PP 1 x DP 3 need 12 GPUs but the emulator has 8 (emulator.gpus)"),
        ({"dp_size": 2, "replicas": 3, "emulator": {"gpus": 8}, "tp": 2}, "server.replicas",
         "3 replicas x TP 2 x PP 1 x DP 2 need 12 GPUs but the emulator has 8"),
    ],
)
def test_dp_layouts_that_cannot_run_are_refused_at_their_field(make_emulator_profile, overrides, field, named):
    overrides = dict(overrides)
    tp = overrides.pop("tp", 1)
    problems = problems_of(make_emulator_profile, "bad", tp=tp, **overrides)
    assert field in problems and named in problems[field], problems


def test_a_dp_size_of_the_wrong_type_is_named(make_emulator_profile):
    with pytest.raises(ProfileError) as refused:
        make_emulator_profile("typed", tp=1, dp_size="2")
    assert "server.dp_size: must be an integer, not a string" in str(refused.value)


def test_the_gpu_busy_check_covers_every_replica_of_a_dp_server(make_emulator_profile, launched, home):
    """GPUs 2,3 are held by another session: a TP2 server alone (GPUs 0,1) would fit, but with dp_size = 2
    its second replica needs GPUs 2,3, so the launch is refused naming them, before anything starts."""
    holder = launched.launch(make_emulator_profile("holder", tp=2, extra_args=["--base-gpu-id", "2"],
                                                   watch={"stall_after_s": 600}))

    def held() -> bool:
        return [b.index for b in busy_gpus_for_launch(make_emulator_profile("probe", tp=2, dp_size=2), home)] == [2, 3]

    wait_for(held, "emulated memory on GPUs 2,3", 90, interval_s=0.2)
    assert busy_gpus_for_launch(make_emulator_profile("alone", tp=2), home) == []
    dp = make_emulator_profile("dp", tp=2, dp_size=2)
    with pytest.raises(GpuBusy) as refused:
        ServerSession.launch(dp, home)
    assert [b.index for b in refused.value.busy] == [2, 3]
    assert f"session {holder.session_id}" in str(refused.value)
    assert not [p for p in home.sessions_dir.iterdir() if p.name.startswith("dp-")]
