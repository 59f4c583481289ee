"""Secrets are hidden by value and by name in every artifact (issue 14 item 1).

A real emulator session is launched with several secret shapes: a free-form ``--api-key`` value and an
``--admin-api-key=...`` in extra_args, ``DB_PASSWORD`` holding quotes, a backslash and a newline, and an
``hf_`` token under a plain name.  Every artifact (status --json, diagnose text and --json, the bundle's
every member, logs, command.json, state.json) is searched for each secret in raw, JSON- and TOML-escaped
form.  The session's own profile.toml (0600) keeps the real values: restart needs them.
"""
from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest
import tomli_w
from _extract_support import run_cli, wait_for

from sessions.redaction import Redactor, collect_secrets, escaped_forms

API_KEY = "MyServerKey-Zq81x"
ADMIN_KEY = "Adm1n-K3y-77qQ"
DB_PASSWORD = 'pa"ss\\wo\nrd-Zz9'
HF_TOKEN = "hf_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4y"
# Names of issue 22's catalogue that were shown raw in command.json and `profile command`.
CATALOGUED = {"OPENAI_KEY": "Op3nAI-raw-value", "GH_PAT": "GhPat-raw-value-9", "TOKEN2": "T0ken2-raw-value",
              "HF_TOKEN_1": "HfTok1-raw-value", "DB_PASS": "DbPass-raw-value"}
SECRETS = {"api key": API_KEY, "admin key": ADMIN_KEY, "db password": DB_PASSWORD, "hf token": HF_TOKEN,
           **{name.lower(): value for name, value in CATALOGUED.items()}}


def forms(value: str) -> dict[str, str]:
    """The raw, JSON-escaped and TOML-escaped spellings of ``value`` (and the lines of a multi-line one)."""
    out = {"raw": value, "json": json.dumps(value)[1:-1],
           "toml": tomli_w.dumps({"k": value}).split("=", 1)[1].strip()[1:-1]}
    for n, line in enumerate(value.splitlines()):
        if len(line) >= 4:
            out[f"line {n}"] = line
    return out


def assert_clean(name: str, text: str) -> None:
    for secret_name, secret in SECRETS.items():
        for form_name, form in forms(secret).items():
            assert form not in text, f"{secret_name} ({form_name} form) leaks in {name}"


@pytest.mark.slow
def test_every_artifact_hides_every_planted_secret(home, cli_env, make_emulator_profile, launched,
                                                     tmp_path) -> None:
    profile = make_emulator_profile(
        "secrets", tp=2,
        extra_args=["--api-key", API_KEY, f"--admin-api-key={ADMIN_KEY}"],
        env={"DB_PASSWORD": DB_PASSWORD, "FOO": HF_TOKEN, **CATALOGUED, "PWD": "/srv/launch-dir-7"},
    )
    session = launched.launch(profile)
    wait_for(lambda: session.status().state == "ready", "session ready", 180)
    launched.remember(session)
    # SGLang logs its whole server_args at start-up, the API key included: the log holds the raw value.
    assert API_KEY in (session.session_dir / "server.log").read_text()

    artifacts: dict[str, str] = {}
    for args in (["status", "--json"], ["status"], ["diagnose", session.session_id, "--json"],
                 ["diagnose", session.session_id], ["logs", session.session_id]):
        result = run_cli(args, cli_env, timeout=180)
        assert result.returncode == 0, result.stderr
        artifacts[" ".join(args)] = result.stdout + result.stderr
    bundle_dir = tmp_path / "bundle"
    bundle_dir.mkdir()
    result = run_cli(["diagnose", session.session_id, "--bundle", str(bundle_dir)], cli_env, timeout=180)
    assert result.returncode == 0, result.stderr
    artifacts["diagnose --bundle"] = result.stdout + result.stderr
    (bundle,) = bundle_dir.iterdir()
    with tarfile.open(bundle) as tar:
        members = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert any(n.endswith("profile.toml") for n in members) and any("stacks/" in n for n in members)
    for name, text in members.items():
        artifacts[f"bundle {name}"] = text
    for name in ("command.json", "state.json", "start_facts.json"):
        if (session.session_dir / name).exists():
            artifacts[name] = (session.session_dir / name).read_text()
    command = json.loads(artifacts["command.json"])
    assert command["env_changes"]["PWD"] == "/srv/launch-dir-7"  # the launch dir is no secret
    assert all(command["env_changes"][name] == "***" for name in CATALOGUED)

    diag = json.loads(artifacts[f"diagnose {session.session_id} --json"])
    main = diag["processes"][0]
    assert main["title"] and "***" in main["title"]  # the main process's command line, redacted
    assert any(p.get("stack") and p["stack"].get("text") for p in diag["processes"])  # py-spy ran
    for name, text in artifacts.items():
        assert_clean(name, text)

    # The session's own profile keeps the real values (0600): a restart needs them.
    own = session.session_dir / "profile.toml"
    assert stat.S_IMODE(own.stat().st_mode) == 0o600 and API_KEY in own.read_text()
    kept = session.session_dir / "secrets.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert set(json.loads(kept.read_text())["values"]) >= set(SECRETS.values())


def test_collect_secrets_finds_flag_values_in_both_forms_env_names_and_shapes() -> None:
    found = collect_secrets(["python", "-m", "sglang.launch_server", "--api-key", API_KEY,
                             f"--admin-api-key={ADMIN_KEY}", "--model-path", "/m", "--tp", "8"],
                            {"DB_PASSWORD": DB_PASSWORD, "FOO": HF_TOKEN, "PLAIN": "visible-value",
                             "NUM_TOKENS": "8192"})
    assert set(found) == {API_KEY, ADMIN_KEY, DB_PASSWORD, HF_TOKEN}


@pytest.mark.parametrize("render", [
    lambda v: v, lambda v: json.dumps({"x": v}), lambda v: tomli_w.dumps({"DB_PASSWORD": v}),
    lambda v: repr({"api_key": v}), lambda v: json.dumps(repr(v)), lambda v: f"--api-key {v} --x",
])
def test_a_known_value_is_hidden_in_every_escaped_form(render) -> None:
    redactor = Redactor(SECRETS.values())
    for secret in SECRETS.values():
        text = redactor.text("before " + render(secret) + " after")
        for form in forms(secret).values():
            assert form not in text
        assert text.startswith("before ") and text.endswith(" after")
    assert escaped_forms(DB_PASSWORD) >= {DB_PASSWORD, json.dumps(DB_PASSWORD)[1:-1]}


def test_the_bundle_takes_only_regular_files_and_follows_no_symlink(tmp_path: Path) -> None:
    """A planted ``server.log`` → /etc/shadow (here a marker file) and a FIFO state.json are refused at once."""
    from types import SimpleNamespace

    from sessions.diagnosis import write_bundle

    secret = tmp_path / "shadow"
    secret.write_text("root:SHADOW-MARKER-HASH:19000:0:99999:7:::\n")
    session_dir = tmp_path / "session"
    session_dir.mkdir()
    (session_dir / "server.log").symlink_to(secret)
    (session_dir / "command.json").symlink_to(secret)
    os.mkfifo(session_dir / "state.json")
    (session_dir / "profile.toml").write_text('[server]\nmodel_path = "/m"\n')
    diagnosis = SimpleNamespace(session_id="s", taken_at=0.0, log_path=str(session_dir / "server.log"),
                                processes=(), env={}, to_json=lambda: {"session_id": "s"})
    session = SimpleNamespace(session_dir=session_dir, profile=SimpleNamespace(server=SimpleNamespace(env={})),
                              pid=None, is_alive=lambda: False, state_record={})
    import sessions.diagnosis.bundle as bundle_mod

    original = bundle_mod.format_report
    bundle_mod.format_report = lambda _d: "report\n"
    try:
        path = write_bundle(diagnosis, session, tmp_path / "b.tar.gz")
    finally:
        bundle_mod.format_report = original
    with tarfile.open(fileobj=io.BytesIO(path.read_bytes())) as tar:
        texts = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert all("SHADOW-MARKER" not in t for t in texts.values())
    assert "command.json" not in texts and "symlink" in texts["command.json.refused"]
    assert "FIFO" in texts["state.json.refused"]
    assert texts["server.log.tail"].startswith("(log not read:") and "symbolic link" in texts["server.log.tail"]
