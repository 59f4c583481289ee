"""A damaged state.json affects only its own session: the class of damage, not a few instances.

Every whole-file damage (a JSON list, a string, invalid UTF-8, truncated, empty, a symlink) and every
field of the record with values of every wrong type: `status` exits 0 and lists the damaged session
with its problem, `status --json` lists every other session, `diagnose` says what is wrong.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main as cli_main
from sessions.home import atomic_write_json, ensure_private_dir
from sessions.server import list_sessions
from sessions.state_file import FIELD_TYPES, read_state

READY_LOG = (
    "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m', tp_size=1)\n"
    "[2026-01-01 10:00:09] The server is fired up and ready to roll!\n"
)
BAD = "bad-20260101-100000-dddd"


def dead_identity() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    create_time = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, create_time


def good_record(session_id: str, pid: int, create_time: float) -> dict:
    now = time.time()
    return {
        "version": 1, "session_id": session_id, "profile": session_id.rsplit("-", 3)[0], "pid": pid,
        "create_time": create_time, "pgid": pid, "host": "127.0.0.1", "port": 1, "started_at": now - 60,
        "stall_after_s": 300, "phase_entered_at": {"launching": now - 60}, "descendants": [],
        "launcher": "emulator", "tp_size": 1, "outcome": None,
    }


def write_session(home, session_id: str, record: object | None = None, raw: bytes | None = None) -> None:
    session_dir = ensure_private_dir(home.sessions_dir / session_id)
    (session_dir / "server.log").write_text(READY_LOG)
    (session_dir / "profile.toml").write_text('[server]\nlauncher = "emulator"\nmodel_path = "/m"\n')
    if raw is not None:
        (session_dir / "state.json").write_bytes(raw)
    else:
        atomic_write_json(session_dir / "state.json", record)


@pytest.fixture
def two_good(home):
    pid, ct = dead_identity()
    for sid in ("alpha-20260101-100000-aaaa", "beta-20260101-100000-bbbb"):
        write_session(home, sid, good_record(sid, pid, ct))
    return pid, ct


def run_status(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli_main(["status", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def check_isolated(capsys, expect_in_problem: str | None = None) -> dict:
    """status and status --json: exit 0, the two good sessions intact, the damaged one listed with a
    problem naming its state.json."""
    rc, out, err = run_status(capsys, "--json")
    assert rc == 0, err
    rows = {r["session_id"]: r for r in json.loads(out)}
    assert rows["alpha-20260101-100000-aaaa"]["state"] == "exited" and rows["alpha-20260101-100000-aaaa"]["problem"] is None
    assert rows["beta-20260101-100000-bbbb"]["state"] == "exited"
    assert BAD in rows
    bad = rows[BAD]
    assert bad["problem"] and "state.json" in bad["problem"], bad
    if expect_in_problem:
        assert expect_in_problem in bad["problem"], bad["problem"]
    rc, out, err = run_status(capsys)
    assert rc == 0
    assert "alpha-20260101-100000-aaaa" in out and "beta-20260101-100000-bbbb" in out and BAD in out
    assert f"{BAD}: " in err and "Traceback" not in err
    return bad


WHOLE_FILE = [
    (b"[1, 2, 3]\n", "holds an array"),
    (b'"a string"\n', "holds a string"),
    (b"42\n", "holds a number"),
    (b"null\n", "holds null"),
    (b'{"pid": 12\xff\xfe}', "not UTF-8 text"),
    (b'{"pid": 123, "port": ', "not valid JSON"),
    (b"", "empty"),
    (b"\x00" * 64, "not valid JSON"),
]


@pytest.mark.parametrize(("raw", "expected"), WHOLE_FILE, ids=[w[1] + str(i) for i, w in enumerate(WHOLE_FILE)])
def test_a_damaged_state_file_is_listed_with_its_problem_and_hides_nothing(raw, expected, home, two_good,
                                                                           capsys):
    write_session(home, BAD, raw=raw)
    check_isolated(capsys, expected)


def test_a_symlinked_state_file_is_not_followed(home, two_good, capsys, tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(good_record(BAD, *two_good)))
    write_session(home, BAD, raw=b"{}")
    (home.sessions_dir / BAD / "state.json").unlink()
    os.symlink(target, home.sessions_dir / BAD / "state.json")
    assert read_state(home.sessions_dir / BAD).unreadable
    check_isolated(capsys, "cannot be opened")


# One wrong value of each JSON type; each field gets every one its schema refuses.
WRONG_VALUES = ["text", 7, -3, 2.5, True, [1, "x"], {"a": 1}, float("nan")]


def _wrong_cases():
    for name, (check, _what) in sorted(FIELD_TYPES.items()):
        for value in WRONG_VALUES:
            try:
                ok = check(value)
            except Exception:  # noqa: BLE001
                ok = False
            if not ok:
                yield name, value


@pytest.mark.parametrize(("field_name", "value"), list(_wrong_cases()))
def test_every_field_with_a_wrong_type_is_named_and_stays_local(field_name, value, home, two_good, capsys):
    record = good_record(BAD, *two_good) | {field_name: value}
    raw = json.dumps(record).encode()  # NaN is written as NaN: Python's json reads it back
    write_session(home, BAD, raw=raw)
    bad = check_isolated(capsys, f"'{field_name}' should be")
    assert bad["session_id"] == BAD


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=st.dictionaries(st.sampled_from(sorted(FIELD_TYPES)), json_values, max_size=8))
def test_any_record_of_any_shape_never_breaks_the_listing(record, home, two_good):
    write_session(home, BAD, raw=json.dumps(record).encode())
    sessions = {s.session_id: s for s in list_sessions(home)}
    assert set(sessions) >= {"alpha-20260101-100000-aaaa", "beta-20260101-100000-bbbb", BAD}
    for session in sessions.values():
        status = session.status(probe_http=False)
        json.dumps(status.to_json())
    assert sessions["alpha-20260101-100000-aaaa"].status(probe_http=False).problem is None


def test_diagnose_of_a_damaged_session_says_what_is_wrong(home, two_good, cli_env):
    write_session(home, BAD, raw=b"[1, 2]")
    (home.sessions_dir / BAD / "profile.toml").write_bytes(b"\xff\xfe not toml")
    result = subprocess.run([sys.executable, "-m", "app", "diagnose", BAD, "--no-stacks"], env=cli_env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "problem:" in result.stdout and "holds an array" in result.stdout
    assert "profile.toml" in result.stdout and "cannot be read" in result.stdout


def test_a_damaged_record_is_never_overwritten_by_a_status(home, two_good, capsys):
    write_session(home, BAD, raw=b'{"pid": "1234", "port": 1}')
    run_status(capsys)
    assert (home.sessions_dir / BAD / "state.json").read_bytes() == b'{"pid": "1234", "port": 1}'
