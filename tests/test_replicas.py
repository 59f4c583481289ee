"""Replicas on one host (issue 24, item 1): a group of N emulator servers of one profile on disjoint GPUs
(`--base-gpu-id i*tp*pp`) and ports (port + i), launched, watched, crashed, stopped and refused as a group.

The servers are real emulator processes; the GPUs are the emulated ones they publish (the GPU panel's and
the launch check's source without a driver).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from _extract_support import wait_for

from sessions import probes
from sessions.gpus import EmulatedSource, launch_gpu_ids
from sessions.profiles import ProfileError, validate_profile
from sessions.server import GpuBusy, LaunchError, ServerSession, find_group, group_members, stop_group
from sessions.server.group import GroupInfo, member_profiles


def free_port_run(count: int) -> int:
    """A base port whose next ``count`` ports are all free now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65535 and all(probes.port_free("127.0.0.1", base + i) for i in range(count)):
            return base
    raise AssertionError("no run of free ports")


def gpu_holders(home) -> dict[int, set[int]]:
    """Emulated GPU index -> pids holding memory there."""
    return {s.index: {p.pid for p in s.processes} for s in EmulatedSource(home).snapshot().samples if s.processes}


def tree_pids(session) -> set[int]:
    rec = session.state_record
    return {info.pid for info in probes.process_tree(rec["pid"], rec["create_time"])}


def run_cli(cli_env, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], env=cli_env, capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def test_members_get_disjoint_gpus_ports_and_capture_dirs(make_emulator_profile, tmp_path):
    profile = make_emulator_profile("grp", tp=2, replicas=3, capture={"enabled": True, "dir": str(tmp_path / "cap")})
    members = member_profiles(profile)
    assert [launch_gpu_ids(m) for m in members] == [[0, 1], [2, 3], [4, 5]]
    assert [m.server.port for m in members] == [profile.server.port + i for i in range(3)]
    assert [m.capture.dir for m in members] == [str(tmp_path / "cap" / f"replica-{i}") for i in range(3)]
    assert all(m.server.replicas == 1 for m in members)
    pp2 = make_emulator_profile("grp-pp", tp=2, replicas=2, extra_args=["--pp-size", "2"])
    assert [launch_gpu_ids(m) for m in member_profiles(pp2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def errors_loading(make_emulator_profile, name: str, **overrides) -> list:
    with pytest.raises(ProfileError) as refused:
        make_emulator_profile(name, **overrides)
    return [p for p in refused.value.problems if p.is_error]


def test_replicas_that_do_not_fit_or_a_fixed_base_gpu_id_are_refused_by_name(make_emulator_profile):
    problems = errors_loading(make_emulator_profile, "many", tp=4, replicas=3)  # 12 GPUs of the emulator's 8
    assert [p.field for p in problems] == ["server.replicas"]
    assert "3 replicas x TP 4 x PP 1 need 12 GPUs but the emulator has 8" in problems[0].message
    problems = errors_loading(make_emulator_profile, "fixed", tp=1, replicas=2, extra_args=["--base-gpu-id", "3"])
    assert [p.field for p in problems] == ["server.extra_args"]
    assert "--base-gpu-id conflicts with server.replicas = 2" in problems[0].message
    assert problems[0].line is not None  # the TOML line of extra_args
    problems = errors_loading(make_emulator_profile, "zero", tp=1, replicas=0)
    assert [p.field for p in problems] == ["server.replicas"] and "between 1 and" in problems[0].message


def test_visible_gpus_bound_a_real_sglang_group(make_emulator_profile):
    """On a GPU host (NVML's count), replicas x tp x pp must fit the GPUs CUDA shows."""
    profile = make_emulator_profile("sg", tp=2, replicas=3, launcher="sglang")
    problems = [p for p in validate_profile(profile, check_port=False, nvml_gpu_count=4)
                if p.field == "server.replicas"]
    assert problems and "3 replicas x TP 2 x PP 1 needs 6 GPUs but only 4 are visible" in problems[0].message
    fits = make_emulator_profile("sg2", tp=2, replicas=2, launcher="sglang")
    assert not [p for p in validate_profile(fits, check_port=False, nvml_gpu_count=4) if p.field == "server.replicas"]


def test_the_emulator_refuses_gpus_beyond_its_count(emulator_model_dir, free_port):
    result = subprocess.run(
        [sys.executable, "-m", "sessions.emulator", "--model-path", str(emulator_model_dir), "--tp-size", "2",
         "--port", str(free_port), "--base-gpu-id", "7", "--time-scale", "0.003"],
        capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert "--base-gpu-id 7 with --tp-size 2 would use GPU 8, but there are 8 GPUs" in result.stderr


@pytest.fixture
def group_of_three(make_emulator_profile, launched, home, cli_env):
    """`launch grp --replicas 3` of a TP2 emulator profile, every member ready."""
    make_emulator_profile("grp", tp=2, port=free_port_run(3), watch={"stall_after_s": 600})
    result = run_cli(cli_env, "launch", "grp", "--replicas", "3", "--wait-ready", "--timeout", "150")
    ids = result.stdout.split()
    for session_id in ids:
        launched.track(session_id)
    assert result.returncode == 0, result.stderr
    assert len(ids) == 3
    return [ServerSession.load(i, home) for i in ids]


def test_a_group_launches_on_disjoint_gpus_and_ports_and_stops_as_one(group_of_three, home, cli_env):
    members = group_of_three
    infos = [m.group for m in members]
    assert all(isinstance(i, GroupInfo) for i in infos)
    assert len({i.group_id for i in infos}) == 1 and [i.index for i in infos] == [0, 1, 2]
    assert [i.gpus for i in infos] == [(0, 1), (2, 3), (4, 5)]
    ports = [m.state_record["port"] for m in members]
    assert ports == [ports[0], ports[0] + 1, ports[0] + 2]
    assert all(probes.port_listening("127.0.0.1", p) for p in ports)
    # Each member's ranks hold its own emulated GPUs and no other's.
    wait_for(lambda: len(gpu_holders(home)) == 6, "emulated memory on GPUs 0-5", 60, interval_s=0.1)
    held = gpu_holders(home)
    for member, info in zip(members, infos):
        pids = tree_pids(member)
        assert {g for g, holders in held.items() if holders & pids} == set(info.gpus)
    assert sorted(held) == [0, 1, 2, 3, 4, 5]

    group_id = infos[0].group_id
    status = run_cli(cli_env, "status", "--no-http")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(group_id))
    assert "group of 3: 3 ready" in lines[head]
    for k, (member, info) in enumerate(zip(members, infos)):
        assert lines[head + 1 + k].startswith(f"  [{k}] {member.session_id} GPU {info.gpus[0]},{info.gpus[1]}")
    as_json = json.loads(run_cli(cli_env, "status", group_id[:-2], "--json", "--no-http").stdout)
    assert [row["group"]["index"] for row in as_json] == [0, 1, 2]

    stopped = run_cli(cli_env, "stop", group_id, "--grace", "20", "--json")
    assert stopped.returncode == 0, stopped.stderr
    reports = json.loads(stopped.stdout)
    assert [r["session_id"] for r in reports] == [m.session_id for m in members]
    assert all(r["stopped"] and r["port_free"] for r in reports)
    assert gpu_holders(home) == {}  # every GPU of the group is free
    assert all(probes.port_free("127.0.0.1", p) for p in ports)
    assert [m.status(probe_http=False).state for m in members] == ["stopped"] * 3


def test_a_killed_member_shows_crashed_while_the_others_stay_ready(group_of_three, home):
    members = group_of_three
    victim = members[1]
    # One scheduler of member 1 dies (an OOM kill): its server logs the crash and takes itself down.
    scheduler = next(r for r in victim.status(probe_http=False).ranks if r.role == "scheduler")
    os.kill(scheduler.pid, signal.SIGKILL)
    wait_for(lambda: victim.status(probe_http=False).state == "crashed", "member 1 crashed", 60, interval_s=0.1)
    others = [members[0], members[2]]
    assert [m.status().state for m in others] == ["ready", "ready"]
    assert all(m.status().ready for m in others)
    assert [m.session_id for m in group_members(victim.group.group_id, home)] == [m.session_id for m in members]
    # The group is still found whole (the crashed member included) and stops as one.
    found = find_group(victim.group.group_id, home)
    assert found is not None
    reports = stop_group(found, grace_s=20)
    assert all(r.stopped for r in reports)
    assert gpu_holders(home) == {}


def test_restarting_one_member_keeps_its_place_and_the_others_run(group_of_three, home, launched):
    members = group_of_three
    old = members[2]
    others_before = [(m.pid, m.state_record["create_time"]) for m in members[:2]]
    new = launched.track(old.restart(grace_s=20))
    assert new.group == GroupInfo(old.group.group_id, 2, 3, (4, 5))
    assert new.state_record["port"] == old.state_record["port"]
    assert [(m.pid, m.state_record["create_time"]) for m in members[:2]] == others_before
    assert all(m.is_alive() for m in members[:2])
    assert [m.session_id for m in group_members(old.group.group_id, home)] == \
        [members[0].session_id, members[1].session_id, new.session_id]


def test_restarting_the_group_by_its_id_starts_every_member_again_in_place(group_of_three, home, launched, cli_env):
    members = group_of_three
    group_id = members[0].group.group_id
    result = run_cli(cli_env, "restart", group_id, "--yes", "--grace", "20")
    new_ids = result.stdout.split()
    for session_id in new_ids:
        launched.track(session_id)
    assert result.returncode == 0, result.stderr
    new = [ServerSession.load(i, home) for i in new_ids]
    assert [m.status(probe_http=False).state for m in members] == ["stopped"] * 3
    assert [n.group.gpus for n in new] == [(0, 1), (2, 3), (4, 5)]
    assert [n.state_record["port"] for n in new] == [m.state_record["port"] for m in members]
    assert [n.state_record["restarted_from"] for n in new] == [m.session_id for m in members]
    assert len({n.group.group_id for n in new}) == 1 and new[0].group.group_id != group_id


def test_one_busy_gpu_refuses_the_whole_group(make_emulator_profile, launched, home, cli_env):
    holder = launched.launch(make_emulator_profile("holder", tp=1, extra_args=["--base-gpu-id", "3"],
                                                   watch={"stall_after_s": 600}))
    wait_for(lambda: 3 in gpu_holders(home), "emulated memory on GPU3", 90, interval_s=0.1)
    group = make_emulator_profile("grp", tp=2, replicas=2, port=free_port_run(2))
    with pytest.raises(GpuBusy) as refused:
        ServerSession.launch_group(group, home)
    assert [b.index for b in refused.value.busy] == [3]
    assert f"session {holder.session_id}" in str(refused.value)
    result = run_cli(cli_env, "launch", "grp")
    assert result.returncode == 2 and result.stdout == ""
    assert "GPU3" in result.stderr
    assert [p.name for p in home.sessions_dir.iterdir() if p.name.startswith("grp-")] == []  # none started


def test_a_taken_member_port_refuses_the_group_before_anything_starts(make_emulator_profile, home):
    base = free_port_run(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 2))
        taken.listen()
        group = make_emulator_profile("grp", tp=1, replicas=3, port=base)
        with pytest.raises(LaunchError) as refused:
            ServerSession.launch_group(group, home)
    assert "replica 2:" in str(refused.value) and str(base + 2) in str(refused.value)
    assert [p.name for p in home.sessions_dir.iterdir() if p.name.startswith("grp-")] == []


def test_plain_launch_of_a_replicas_profile_says_it_is_a_group(make_emulator_profile, home):
    with pytest.raises(LaunchError, match="server.replicas = 2"):
        ServerSession.launch(make_emulator_profile("grp", tp=1, replicas=2), home)


def test_the_group_card_draws_a_line_per_member_and_the_crashed_one_stands_out():
    from sessions.snapshots import SessionEntry
    from widgets.group_card import group_text

    members = tuple(
        SessionEntry(f"grp-{i}", "grp", state, "ready", 31000 + i, 0.0, state == "ready", "g-grp-1", i,
                     (2 * i, 2 * i + 1))
        for i, state in enumerate(("ready", "crashed", "ready"))
    )
    text = group_text(members)
    lines = text.plain.splitlines()
    assert lines[0] == "group g-grp-1 · 3 replicas: 2 ready, 1 crashed"
    assert lines[2].startswith(" [1] ✖ crashed  :31001  GPU 2,3  grp-1")
    assert any("red" in str(span.style) for span in text.spans if text.plain[span.start:span.end].startswith("✖"))
    assert group_text(()).plain == ""


def test_the_dashboard_shows_the_group_in_one_card_and_names_each_members_gpus(group_of_three, home):
    """A real group in the TUI: the card has a line per member, the GPU panel labels each member's ranks,
    and a member whose scheduler is killed shows crashed there while the others stay ready."""
    from app.tui import Eagle3App
    from tests._tui_support import first_poll, run, wait_until
    from widgets.group_card import GroupCard

    members = group_of_three

    async def scenario() -> None:
        app = Eagle3App(home, gpu_source=EmulatedSource(home), refresh_s=0.2)
        async with app.run_test(size=(200, 50)) as pilot:
            await first_poll(pilot, app)
            card = app.dashboard.query_one(GroupCard)
            await wait_until(pilot, lambda: card.display and "3 replicas: 3 ready" in card.shown.plain,
                             "the group card with three ready members")
            text = card.shown.plain
            for i, member in enumerate(members):
                assert f"[{i}] ● ready" in text and member.session_id in text
            owners = await wait_until(pilot, lambda: len(set(app.dashboard.last_snapshot.owners.values())) >= 6
                                      and app.dashboard.last_snapshot.owners, "owners of every member's ranks")
            assert {"r0 TP0", "r1 TP0", "r2 TP0"} <= set(owners.values())
            scheduler = next(r for r in members[0].status(probe_http=False).ranks if r.role == "scheduler")
            os.kill(scheduler.pid, signal.SIGKILL)
            await wait_until(pilot, lambda: [e.state for e in app.dashboard.last_snapshot.group] == [
                "crashed", "ready", "ready"], "member 0 crashed in the snapshot", limit_s=60)
            await wait_until(pilot, lambda: "3 replicas: 1 crashed, 2 ready" in card.shown.plain,
                             "member 0 crashed on the card", limit_s=30)
            assert "[0] ✖ crashed" in card.shown.plain and "[1] ● ready" in card.shown.plain

    run(scenario)
    assert members[1].is_alive() and members[2].is_alive()
