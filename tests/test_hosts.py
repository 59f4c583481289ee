"""Hosts over SSH (issue 26 items 1 and 5) with real OpenSSH servers the tests start (tests/_ssh_support.py).

Each "host" is an sshd on 127.0.0.2 / 127.0.0.3 with its own EAGLE3_TUI_HOME; the CLI there is this
checkout's.  Nothing leaves the machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.remote.client import HostUnreachable, RemoteClient, VersionMismatch, local_version
from sessions.remote.hosts import HostsError, load_hosts
from sessions.remote.link import SshLink
from tests._extract_support import wait_for

PY = sys.executable
ANSWERING = ("connected", "slow")  # a loaded machine may answer a call late: "slow" is connected too


def cli(args: list[str], env: dict[str, str], input: str | None = None, timeout: float = 180):
    return subprocess.run([PY, "-m", "app", *args], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False, input=input, stdin=None if input is not None else subprocess.DEVNULL)


def emulator_profile(name: str, model_dir: Path, port: int, fault: str = "none", host: str | None = None) -> str:
    head = f'host = "{host}"\n' if host else ""
    return head + (
        f'[server]\nlauncher = "emulator"\npython = "{PY}"\nmodel_path = "{model_dir}"\ntp_size = 2\n'
        f'host = "127.0.0.1"\nport = {port}\n[watch]\nstall_after_s = 600\n'
        f'[emulator]\ntime_scale = 0.003\nfault = "{fault}"\n'
    )


def wait_state(monitor, name: str, states: tuple[str, ...], limit_s: float) -> None:
    try:
        wait_for(lambda: monitor.view(name).state in states, f"{name} {' or '.join(states)}", limit_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {name} is {monitor.view(name)}") from None


# --- hosts.toml -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ('[hosts.local]\nssh = "x"\n', "hosts.local: the name 'local' is reserved for this machine (line 1)"),
    ('[hosts.gpu2]\neagle3_tui = "/x"\n', "hosts.gpu2.ssh: missing"),
    ('[hosts.gpu2]\nssh = "-oProxyCommand=x"\n', "hosts.gpu2.ssh: must be a ~/.ssh/config alias or user@host:port"),
    ('[hosts.gpu2]\nssh = "a"\nport = 22\n', "hosts.gpu2.port: unknown key (keys: ssh, eagle3_tui, env, ssh_config) (line 3)"),
    ('[hosts.gpu2]\nssh = "a"\nenv = { A = 1 }\n', "hosts.gpu2.env.A: must be a string"),
    ('[hosts.gpu2]\nssh = "a"\nssh = "b"\n', "TOML syntax"),
    ('servers = 3\n', "servers: unknown key (hosts go in [hosts.NAME] tables) (line 1)"),
])
def test_bad_hosts_file_names_file_line_and_problem(home, text: str, expected: str) -> None:
    path = home.config_root / "hosts.toml"
    path.write_text(text)
    with pytest.raises(HostsError) as info:
        load_hosts(home)
    message = str(info.value)
    assert str(path) in message
    assert expected in message


def test_hosts_file_parses_targets_and_env(home) -> None:
    (home.config_root / "hosts.toml").write_text(
        '[hosts.gpu2]\nssh = "me@10.0.0.2:2222"\neagle3_tui = "/opt/e/bin/eagle3-tui"\n'
        'env = { EAGLE3_TUI_HOME = "/scratch/e3" }\n[hosts.lab]\nssh = "lab-alias"\n')
    hosts = load_hosts(home)
    assert hosts["gpu2"].destination() == ("me@10.0.0.2", 2222)
    assert hosts["lab"].destination() == ("lab-alias", None)
    # The env's values never go on a command line: the CLI there reads them from stdin (--env-stdin).
    assert hosts["gpu2"].remote_argv(["status", "--json"]) == ["/opt/e/bin/eagle3-tui", "--env-stdin", "status", "--json"]
    assert hosts["gpu2"].stdin_text("TOML") == '{"env":{"EAGLE3_TUI_HOME":"/scratch/e3"}}\nTOML'
    assert hosts["lab"].remote_argv(["status"]) == ["eagle3-tui", "status"] and hosts["lab"].stdin_text(None) is None
    argv = SshLink(hosts["gpu2"], home).ssh_argv(["logs", "a b; rm -rf /"])
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "-T" in argv and "ControlMaster=auto" in argv
    # the remote words are quoted for the remote shell: the ';' is a character of the argument
    assert argv[-1].endswith("logs 'a b; rm -rf /'")
    control = next(a for a in argv if a.startswith("ControlPath="))[len("ControlPath="):]
    assert len(os.fsencode(control.replace("%C", "x" * 40))) + 17 < 108
    assert (os.stat(Path(control).parent).st_mode & 0o777) == 0o700


# --- over SSH ---------------------------------------------------------------------------------------------


def test_connect_and_status_of_an_emulator_session_on_the_remote_host(ssh_hosts, home, cli_env, emulator_model_dir,
                                                                     free_port) -> None:
    from tests.conftest import LaunchedSessions

    remote_home = ssh_hosts.homes["h2"]
    (remote_home.profiles_dir / "emu.toml").write_text(emulator_profile("emu", emulator_model_dir, free_port))
    remote = LaunchedSessions(remote_home)
    try:
        launched = cli(["launch", "emu", "--host", "h2", "--wait-ready", "--timeout", "120"], cli_env)
        assert launched.returncode == 0, launched.stderr
        session_id = launched.stdout.split()[0]
        remote.track(session_id)
        assert (remote_home.sessions_dir / session_id).is_dir()  # in h2's home, not ours
        assert not (home.sessions_dir / session_id).exists()

        client = RemoteClient(ssh_hosts.host("h2"), SshLink(ssh_hosts.host("h2"), home))
        assert client.connect() == local_version()
        rows = client.status()
        assert [(r["session_id"], r["state"]) for r in rows] == [(session_id, "ready")]
        assert RemoteClient(ssh_hosts.host("h3"), SshLink(ssh_hosts.host("h3"), home)).status() == []

        shown = cli(["status", "--json", "--host", "h2"], cli_env)
        assert shown.returncode == 0, shown.stderr
        assert [r["session_id"] for r in json.loads(shown.stdout)] == [session_id]
        assert json.loads(cli(["status", "--json"], cli_env).stdout) == []  # nothing of it here

        logs = cli(["logs", session_id, "--host", "h2", "--grep", "fired up"], cli_env)
        assert logs.returncode == 0 and "fired up and ready to roll" in logs.stdout, logs.stderr
        diagnosis = cli(["diagnose", session_id, "--json", "--no-stacks", "--host", "h2"], cli_env)
        assert diagnosis.returncode == 0, diagnosis.stderr
        assert json.loads(diagnosis.stdout)["session_id"] == session_id

        listed = cli(["hosts", "--json"], cli_env)
        assert listed.returncode == 0, listed.stderr
        rows = {h["name"]: h for h in json.loads(listed.stdout)}
        assert sorted(rows) == ["h2", "h3"]
        for row in rows.values():  # "slow" when a loaded machine answers late: both are usable
            assert row["state"] in ("reachable", "slow") and row["version"] == local_version(), row
    finally:
        remote.cleanup()


def test_profile_with_host_launches_there_and_stops_over_ssh(ssh_hosts, home, cli_env, emulator_model_dir,
                                                            free_port) -> None:
    from sessions.server import ServerSession
    from tests.conftest import LaunchedSessions

    (home.profiles_dir / "far.toml").write_text(emulator_profile("far", emulator_model_dir, free_port, host="h3"))
    remote_home = ssh_hosts.homes["h3"]
    remote = LaunchedSessions(remote_home)
    try:
        validated = cli(["profile", "validate", "far"], cli_env)
        assert validated.returncode == 0, validated.stdout + validated.stderr
        launched = cli(["launch", "far", "--wait-ready", "--timeout", "120"], cli_env)
        assert launched.returncode == 0, launched.stderr
        assert "on host h3" in launched.stderr
        session_id = launched.stdout.split()[0]
        session = remote.track(session_id)
        assert session.state_record.get("pid")
        # the copy h3 launched from is the profile sent from here, without its host key
        received = (remote_home.state_root / "received-profiles" / "far.toml").read_text()
        assert "host = " not in received.split("[server]")[0] and f"port = {free_port}" in received

        stopped = cli(["stop", session_id, "--json", "--host", "h3"], cli_env)
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["stopped"] is True
        assert ServerSession.load(session_id, remote_home).status(probe_http=False).state == "stopped"
    finally:
        remote.cleanup()


def test_profile_naming_an_unknown_host_is_refused(ssh_hosts, home, cli_env, emulator_model_dir, free_port) -> None:
    (home.profiles_dir / "lost.toml").write_text(emulator_profile("lost", emulator_model_dir, free_port, host="h9"))
    validated = cli(["profile", "validate", "lost"], cli_env)
    assert validated.returncode != 0
    assert "host: no host 'h9' in" in validated.stdout + validated.stderr
    launched = cli(["launch", "lost"], cli_env)
    assert launched.returncode == 2 and "no host 'h9'" in launched.stderr and "h2, h3" in launched.stderr


def test_other_version_on_the_host_is_refused_naming_both(ssh_hosts, home, cli_env, tmp_path) -> None:
    fake = tmp_path / "old-eagle3-tui"
    fake.write_text("#!/bin/sh\necho 'eagle3-tui 0.0.9'\n")
    fake.chmod(0o755)
    ssh_hosts.write_hosts(cli={"h3": fake})
    with pytest.raises(VersionMismatch) as info:
        RemoteClient(ssh_hosts.host("h3"), SshLink(ssh_hosts.host("h3"), home)).connect()
    assert "0.0.9" in str(info.value) and local_version() in str(info.value)
    shown = cli(["status", "--host", "h3"], cli_env)
    assert shown.returncode == 1
    assert "runs eagle3-tui 0.0.9, this machine " + local_version() in shown.stderr
    listed = cli(["hosts"], cli_env)
    assert listed.returncode == 1
    assert "refused" in listed.stdout and "reachable" in listed.stdout


def test_ssh_never_waits_on_a_prompt(ssh_hosts, home, tmp_path) -> None:
    """BatchMode, no tty and stdin from /dev/null: an unknown host key (ask) and a server that would take a
    password both fail at once with ssh's reason instead of asking."""
    from sessions.remote.hosts import Host
    from tests._ssh_support import SshServer

    other_key = tmp_path / "not_authorized"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    server = SshServer(tmp_path / "sshd-pw", "127.0.0.2", Path(f"{other_key}.pub"), password_auth=True).start()
    try:
        config = tmp_path / "ask_config"
        config.write_text(f"Host ask\n  HostName 127.0.0.2\n  Port {server.port}\n  User root\n"
                          f"  UserKnownHostsFile {tmp_path / 'empty_known_hosts'}\n  StrictHostKeyChecking ask\n"
                          f"  IdentityFile {ssh_hosts.user_key}\n  IdentitiesOnly yes\n")
        host = Host("ask", "ask", "/bin/true", ssh_config=str(config))
        with pytest.raises(HostUnreachable, match="Host key verification failed"):
            RemoteClient(host, SshLink(host, home), timeout_s=60).connect()
        (tmp_path / "empty_known_hosts").write_text("")
        config.write_text(config.read_text().replace("StrictHostKeyChecking ask", "StrictHostKeyChecking accept-new"))
        # the key is not authorized and the server offers passwords: BatchMode refuses to ask for one
        with pytest.raises(HostUnreachable, match="Permission denied"):
            RemoteClient(host, SshLink(host, home), timeout_s=60).connect()
    finally:
        server.stop()


def test_lost_host_is_unreachable_then_reconnects_and_its_server_never_noticed(
        ssh_hosts, home, cli_env, emulator_model_dir, free_port) -> None:
    from sessions.remote.monitor import HostMonitor
    from sessions.server import ServerSession
    from tests.conftest import LaunchedSessions

    remote_home = ssh_hosts.homes["h2"]
    (remote_home.profiles_dir / "emu.toml").write_text(emulator_profile("emu", emulator_model_dir, free_port))
    remote = LaunchedSessions(remote_home)
    monitor = HostMonitor(load_hosts(home), home, interval_s=0.5)
    try:
        launched = cli(["launch", "emu", "--host", "h2", "--wait-ready", "--timeout", "120"], cli_env)
        assert launched.returncode == 0, launched.stderr
        session_id = launched.stdout.split()[0]
        session = remote.track(session_id)
        pid, create_time = session.state_record["pid"], session.state_record["create_time"]
        monitor.start()
        wait_for(lambda: monitor.view("h2").state in ANSWERING and monitor.view("h2").sessions,
                 "h2 connected with its session", 60)
        assert [(s.session_id, s.state) for s in monitor.view("h2").sessions] == [(session_id, "ready")]
        assert monitor.view("h2").gpus is not None

        ssh_hosts.servers["h2"].stop()  # the host is gone (its sshd and every connection)
        wait_for(lambda: monitor.view("h2").state in ("reconnecting", "unreachable"), "h2 lost", 60)
        wait_for(lambda: monitor.view("h2").state == "unreachable", "h2 unreachable", 120)
        lost = monitor.view("h2")
        assert "Connection refused" in (lost.reason or ""), lost.reason
        assert lost.state_text().startswith("unreachable: ") and lost.stale
        assert [s.session_id for s in lost.sessions] == [session_id]  # the last answer, kept
        assert monitor.view("h3").state in ANSWERING  # the other host is not held up

        ssh_hosts.servers["h2"].start()  # same address and port
        monitor.poll_now()
        wait_for(lambda: monitor.view("h2").state in ANSWERING, "h2 reconnected", 120)
        back = monitor.view("h2")
        assert [(s.session_id, s.state) for s in back.sessions] == [(session_id, "ready")]
        import psutil

        assert psutil.Process(pid).create_time() == create_time  # the same server process, never restarted
        status = ServerSession.load(session_id, remote_home).status(probe_http=True)
        assert status.state == "ready" and status.pid == pid
    finally:
        monitor.close()
        remote.cleanup()


def test_logs_follow_over_ssh_streams_and_ends_there_when_we_stop(ssh_hosts, home, cli_env, emulator_model_dir,
                                                                  free_port) -> None:
    """`logs -f --host`: lines come as written, and ending it here ends the follower there (an idle log's
    follower would otherwise wait on the host for ever: it learns of the closed pipe only when it writes)."""
    import psutil

    from tests.conftest import LaunchedSessions

    remote_home = ssh_hosts.homes["h2"]
    (remote_home.profiles_dir / "emu.toml").write_text(emulator_profile("emu", emulator_model_dir, free_port))
    remote = LaunchedSessions(remote_home)
    follower = None
    try:
        launched = cli(["launch", "emu", "--host", "h2", "--wait-ready", "--timeout", "120"], cli_env)
        assert launched.returncode == 0, launched.stderr
        session_id = launched.stdout.split()[0]
        remote.track(session_id)
        follower = subprocess.Popen([PY, "-m", "app", "logs", session_id, "-f", "--host", "h2"], env=cli_env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert follower.stdout is not None
        seen = []
        for line in follower.stdout:
            seen.append(line)
            if "fired up and ready to roll" in line:
                break
        assert any("fired up" in line for line in seen)

        def followers_there() -> list[psutil.Process]:
            found = []
            for proc in psutil.process_iter(["cmdline", "pid"]):
                cmd = proc.info["cmdline"] or []
                if "logs" in cmd and session_id in cmd and "-f" in cmd and "--host" not in cmd:
                    found.append(proc)
            return found

        assert followers_there(), "the follower runs on the host (through sshd)"
        follower.terminate()  # Ctrl-C / the TUI closing: our ssh ends
        follower.wait(timeout=30)
        wait_for(lambda: not followers_there(), "the follower on h2 ended", 60)
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
        remote.cleanup()


def test_slow_host_and_hung_host(ssh_hosts, home, cli_env, tmp_path) -> None:
    """A host that answers late is "slow"; one whose sshd hangs (SIGSTOP: connections open, no answer) turns
    unreachable with the timeout as its reason while the other host's answers go on, and it is connected
    again once it runs."""
    from sessions.remote.monitor import SLOW_S, HostMonitor

    slow = tmp_path / "slow-eagle3-tui"
    slow.write_text(f"#!/bin/sh\nsleep {SLOW_S + 0.5}\nexec {ssh_hosts.cli} \"$@\"\n")
    slow.chmod(0o755)
    ssh_hosts.write_hosts(cli={"h3": slow})
    listed = cli(["hosts", "--json"], cli_env)
    states = {h["name"]: h["state"] for h in json.loads(listed.stdout)}
    # h3 always answers late; h2 is reachable (a loaded machine may make it slow too: not asserted)
    assert states["h3"] == "slow" and states["h2"] in ("reachable", "slow"), states
    assert listed.returncode == 0  # slow is usable

    monitor = HostMonitor(load_hosts(home), home, interval_s=0.5, call_timeout_s=8.0)
    try:
        monitor.start()
        wait_state(monitor, "h2", ("connected", "slow"), 60)
        wait_state(monitor, "h3", ("slow",), 90)
        assert monitor.view("h3").state_text().startswith("slow (")

        ssh_hosts.servers["h2"].pause()
        try:
            wait_state(monitor, "h2", ("unreachable",), 120)
            # our call's timeout, or ssh's own once its connection was given up and a new one tried
            reason = monitor.view("h2").reason or ""
            assert "no answer from h2 within 8 s" in reason or "Connection timed out" in reason, reason
            answered = monitor.view("h3").answered_at
            wait_for(lambda: (monitor.view("h3").answered_at or 0) > (answered or 0), "h3 answers again", 60)
        finally:
            ssh_hosts.servers["h2"].resume()
        monitor.poll_now()
        wait_state(monitor, "h2", ("connected", "slow"), 120)
    finally:
        monitor.close()


def test_profile_host_key_round_trips_and_is_checked(home) -> None:
    """``host`` is a top-level key: read, type-checked, kept by a save that edits the file in place."""
    from sessions.profiles import ProfileError, load_profile, save_profile

    path = home.profiles_dir / "far.toml"
    path.write_text('# my far profile\nhost = "gpu2"  # the lab box\n[server]\nlauncher = "emulator"\n'
                    'model_path = "/m"\n')
    profile = load_profile(path)
    assert profile.host == "gpu2"
    save_profile(profile.with_changes(server={"port": 31000}))
    text = path.read_text()
    assert "# my far profile" in text and 'host = "gpu2"  # the lab box' in text and "port = 31000" in text
    save_profile(load_profile(path).with_changes(host=None))
    assert "host" not in load_profile(path).to_doc() and load_profile(path).host is None
    path.write_text('host = 3\n[server]\nmodel_path = "/m"\n')
    with pytest.raises(ProfileError, match=r"host: must be a host name of hosts.toml, not an integer \(line 1\)"):
        load_profile(path)


def test_engine_never_starts_another_hosts_profile_here(home, emulator_model_dir, free_port) -> None:
    """ServerSession.launch of a profile with ``host`` (bench compare, restart, any engine caller) refuses:
    its machine checks are that host's, so starting it here would run it unchecked on the wrong machine."""
    from sessions.profiles import load_profile
    from sessions.server import LaunchError, ServerSession

    path = home.profiles_dir / "far.toml"
    path.write_text(emulator_profile("far", emulator_model_dir, free_port, host="gpu2"))
    with pytest.raises(LaunchError, match="runs on host gpu2") as info:
        ServerSession.launch_group(load_profile(path), home)
    assert info.value.code == 2
    assert list(home.sessions_dir.iterdir()) == []
