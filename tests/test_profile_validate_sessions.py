"""`profile validate` knows this home's sessions (sessions.server.port_check, shared with the editor)."""
from __future__ import annotations

from test_server import run_cli, wait_for_state


def test_profile_validate_names_this_profiles_running_session(launched, make_emulator_profile, cli_env):
    """`profile validate` on a profile whose own session runs: a warning naming that session (as the editor
    says), exit 0, not "port in use by pid … (python3)" and exit 2; another profile on that port: an error
    naming the session and its profile."""
    profile = make_emulator_profile("mine", tp=1)
    session = launched.launch(profile)
    wait_for_state(session, {"ready"})
    launched.remember(session)
    result = run_cli("profile", "validate", "mine", env=cli_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"this profile's running session {session.session_id}" in result.stdout, result.stdout
    assert "(python" not in result.stdout
    make_emulator_profile("other", tp=1, port=profile.server.port)
    other = run_cli("profile", "validate", "other", env=cli_env)
    assert other.returncode == 2
    assert f"held by session {session.session_id} (profile mine)" in other.stdout, other.stdout
