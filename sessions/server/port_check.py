"""The port check of a profile, knowing this home's sessions (one owner for the editor and `profile validate`).

`sessions.profiles.validate_profile` sees only "port in use by pid N (python3)".  Here the holder is named:
the profile's own running session holding its port is expected (a restart stops it first; a second launch
would fail), so it is a warning naming that session; another session holding it is an error naming that
session and its profile; anything else is an error naming the process.
"""
from __future__ import annotations

import os
from typing import Any

from sessions import probes
from sessions.home import Home
from sessions.profiles import Problem


def port_problems(profile: Any, home: Home | None, restart_hint: str = "restart") -> list[Problem]:
    """The ``server.port`` problems of ``profile`` now (none when the port is free or unset)."""
    server = profile.server
    if not isinstance(server.port, int) or not server.port or probes.port_free(server.host, server.port):
        return []
    holder = None
    if home is not None:
        from sessions.server.session import list_sessions

        holder = next(
            (s for s in list_sessions(home, include_ended=False) if s.state_record.get("port") == server.port),
            None,
        )
    if holder is not None and holder.state_record.get("profile") == profile.name:
        return [
            Problem(
                "server.port",
                f"port {server.port} is held by this profile's running session "
                f"{holder.session_id}; {restart_hint} stops it first, a second launch would fail",
                severity="warning",
            )
        ]
    if holder is not None:
        return [
            Problem(
                "server.port",
                f"port {server.port} is held by session {holder.session_id} (profile "
                f"{holder.state_record.get('profile')}); pick another port or stop that session",
            )
        ]
    if server.port < 1024 and os.geteuid() != 0 and not probes.port_listening(server.host, server.port):
        return [Problem("server.port", f"port {server.port} is below 1024 and needs root")]
    return [
        Problem(
            "server.port",
            f"{probes.describe_port_user(server.host, server.port)}; pick another port or stop that server",
        )
    ]
