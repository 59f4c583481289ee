"""Replicas on one host: N servers of one profile side by side, as one group (issue 24, item 1).

``[server] replicas = N`` (or ``launch --replicas N``) makes member i of the group a copy of the profile on
GPUs ``i*tp*pp .. (i+1)*tp*pp - 1`` (SGLang's ``--base-gpu-id``, the router's own layout:
``base_gpu_id = i * tp_size``, scaleout-facts §B), on port ``port + i``, with its own capture dir when
capture is on.  Each member is an ordinary session; its state.json carries the group (`GROUP_KEY`), so a
status, the dashboard and stop/restart/diagnose can gather the members back.  This module holds the pure
parts (member profiles, the group record, the members' port checks); `sessions.server.session` launches.
"""
from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

from sessions import probes
from sessions.profiles import LaunchProfile, Problem
from sessions.profiles.fields import gpus_per_server

GROUP_KEY = "group"  # in state.json: {"id", "index", "size", "gpus"}
GROUP_ID_PREFIX = "g-"


@dataclass(frozen=True)
class GroupInfo:
    """A member's place in its group, read back from its state.json."""

    group_id: str
    index: int
    size: int
    gpus: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.group_id, "index": self.index, "size": self.size, "gpus": list(self.gpus)}

    @classmethod
    def from_record(cls, rec: dict) -> GroupInfo | None:
        """None for a session of no group, or a group entry that is not well formed (it is then shown on
        its own rather than in a wrong group)."""
        raw = rec.get(GROUP_KEY)
        if not isinstance(raw, dict):
            return None
        gid, index, size, gpus = raw.get("id"), raw.get("index"), raw.get("size"), raw.get("gpus") or []
        if not (isinstance(gid, str) and gid and isinstance(index, int) and isinstance(size, int)):
            return None
        if not (0 <= index < size) or not all(isinstance(g, int) for g in gpus):
            return None
        return cls(gid, index, size, tuple(gpus))


def gpus_per_replica(profile: LaunchProfile) -> int:
    return gpus_per_server(profile.server)  # tp x pp x dp: a DP server's replicas move together


def member_profile(profile: LaunchProfile, index: int) -> LaunchProfile:
    """Member ``index`` of ``profile``'s group: ``--base-gpu-id index*tp*pp``, port + index, capture dir
    ``<dir>/replica-<index>``, and ``replicas = 1`` (a member is one server)."""
    from sessions.profiles.capture_launch import capture_dir

    server = profile.server
    changes: dict[str, Any] = {
        "server": {
            "port": server.port + index,
            "replicas": 1,
            "extra_args": tuple(server.extra_args) + ("--base-gpu-id", str(index * gpus_per_replica(profile))),
        }
    }
    if profile.capture.enabled:
        # Each server dumps into its own folder: two servers' dumps never meet, and each job reads its own.
        changes["capture"] = {"dir": os.path.join(capture_dir(profile), f"replica-{index}")}
    return profile.with_changes(**changes)


def member_profiles(profile: LaunchProfile, replicas: int | None = None) -> list[LaunchProfile]:
    count = profile.server.replicas if replicas is None else replicas
    return [member_profile(profile, i) for i in range(count)]


def with_replicas(profile: LaunchProfile, replicas: int) -> LaunchProfile:
    """``profile`` with ``server.replicas`` set (the CLI's ``--replicas N``)."""
    return profile.with_changes(server={"replicas": replicas})


def new_group_id(profile_name: str) -> str:
    return f"{GROUP_ID_PREFIX}{profile_name[:60]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def member_port_problems(members: list[LaunchProfile]) -> list[Problem]:
    """Members 1.. each need their own free port (member 0's port is `validate_profile`'s to check)."""
    problems = []
    for i, member in enumerate(members[1:], start=1):
        host, port = member.server.host, member.server.port
        if port > 65535:
            problems.append(Problem("server.port", f"replica {i} would listen on port {port}, above 65535; "
                                    f"lower server.port or server.replicas"))
        elif not probes.port_free(host, port):
            problems.append(Problem("server.port", f"replica {i}: {probes.describe_port_user(host, port)}; "
                                    "the replicas use server.port + i: pick another base port or stop that server"))
    return problems

