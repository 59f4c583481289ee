"""Issue 22, "one reader for every file the app reads": each class of attack on a file the app reads,
planted for real (FIFOs, hard links, sockets, device links, deep JSON, bad shapes, a file where a folder
is expected, names over 255 characters).  In every case the bad file is named with its problem and
skipped alone: its neighbours stay listed, no command tracebacks, nothing waits.

Every read runs under `answered` (a thread with a limit): a reader that blocks on a FIFO fails the test
instead of hanging the suite.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.cli import main as cli_main
from sessions import safe_files
from sessions.bench.store import bench_dir, best_row, load_compares, load_history
from sessions.home import ensure_private_dir
from tests._hang_support import answered

GOOD = {"profile": "good", "time": 1764000000.0, "sglang_version": "0.5.23",
        "command": ["python", "-m", "sglang.launch_server", "--port", "1"], "profile_toml": "",
        "runs": [{"max_concurrency": 1, "output_throughput": 50.0, "median_ttft_ms": 10.0, "failed": 0},
                 {"max_concurrency": 4, "output_throughput": 150.0, "median_ttft_ms": 12.0, "failed": 0}]}
SECRET = "root:$6$SECRETHASH:19000:0:99999:7:::"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = answered(lambda: cli_main(list(argv)))
    out, err = capsys.readouterr()
    assert not isinstance(rc, BaseException), (argv, rc, err)
    assert "Traceback" not in out + err, err
    return rc, out, err


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def plant(path: Path, how: str, sockets: list[socket.socket]) -> None:
    """Put a special file of kind ``how`` at ``path``."""
    path.unlink(missing_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dir":
        path.mkdir()
    elif how in ("/dev/zero", "/dev/urandom", "/dev/null"):
        path.symlink_to(how)
    elif how == "socket":
        s = socket.socket(socket.AF_UNIX)
        with contextlib.chdir(path.parent):  # a socket's path may have 108 bytes at most: bind it by name
            s.bind(path.name)
        sockets.append(s)
    elif how == "dangling":
        path.symlink_to(path.parent / "nowhere" / "x")
    elif how == "self-loop":
        path.symlink_to(path)
    else:
        raise AssertionError(how)


SPECIALS = ["fifo", "dir", "/dev/zero", "/dev/urandom", "socket", "dangling", "self-loop"]


# -- the reader itself -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", SPECIALS)
def test_the_reader_refuses_each_special_file_at_once(how, tmp_path, sockets) -> None:
    path = tmp_path / "x.json"
    plant(path, how, sockets)
    for kind in (safe_files.STATE, safe_files.BENCH_RESULT, safe_files.MODEL_CONFIG):
        result = answered(lambda k=kind: safe_files.read_json(path, k))
        assert isinstance(result, OSError), (how, kind, result)
        assert str(path) in str(result) or str(path) in safe_files.describe_os_error(result), (how, result)


def test_private_kinds_refuse_a_hard_link_and_a_symlink_user_kinds_follow_them(tmp_path) -> None:
    target = tmp_path / "shadow"
    target.write_text('{"leak": true}')
    linked, sym = tmp_path / "hard.json", tmp_path / "sym.json"
    os.link(target, linked)
    sym.symlink_to(target)
    for private in (safe_files.STATE, safe_files.START_FACTS, safe_files.BENCH_RESULT, safe_files.SESSION_RECORD,
                    safe_files.SECRETS, safe_files.START_HISTORY):
        for path, kind in ((linked, "a hard link"), (sym, "a symlink")):
            result = answered(lambda p=path, k=private: safe_files.read_json(p, k))
            assert isinstance(result, safe_files.SpecialFileError) and result.kind == kind, (private, path, result)
    # a Hugging Face cache links config.json to a blob: the model's own files are the user's to link
    assert safe_files.read_json(sym, safe_files.MODEL_CONFIG) == {"leak": True}
    assert safe_files.read_json(linked, safe_files.PROFILE) == {"leak": True}


@pytest.mark.parametrize("text", [
    deep(100000), deep(65), b'{"a":' * 70 + b"1" + b"}" * 70, b'{"x": ' + deep(5000) + b"}",
    b'[{"a": [' * 40 + b"]}]" * 40,
])
def test_deep_json_is_refused_before_it_is_parsed(text, tmp_path) -> None:
    path = tmp_path / "deep.json"
    path.write_bytes(text)
    result = answered(lambda: safe_files.read_json(path, safe_files.STATE))
    assert isinstance(result, safe_files.FileRefused) and result.kind == "nested too deeply", result
    assert str(path) in str(result)


def test_a_name_with_a_nul_byte_is_refused_naming_it(tmp_path) -> None:
    """``os.open`` raises ValueError ("embedded null byte") for such a name, which callers that list an
    OSError with its file let through (a job spec's dataset path may hold a ``\\u0000``)."""
    for kind in (safe_files.STATE, safe_files.DATASET):
        result = answered(lambda kind=kind: safe_files.read_bytes(tmp_path / "a\0b.json", kind))
        assert isinstance(result, safe_files.FileRefused) and "NUL" in str(result), result
        assert kind.what in str(result) and "a\\x00b.json" in str(result)


@pytest.mark.parametrize("text", [b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}',
                                  b'{"a": "\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}',
                                  deep(64)])
def test_brackets_in_strings_and_the_allowed_depth_are_read(text, tmp_path) -> None:
    path = tmp_path / "ok.json"
    path.write_bytes(text)
    assert safe_files.read_json(path, safe_files.STATE) == json.loads(text)


def test_each_kind_has_a_size_cap_checked_on_the_bytes_read(tmp_path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:  # sparse: st_size says 40 MiB, the reader must not load it
        fh.truncate(40 << 20)
    for kind in (safe_files.STATE, safe_files.BENCH_RESULT, safe_files.START_FACTS, safe_files.PROFILE,
                 safe_files.SETTINGS):
        result = answered(lambda k=kind: safe_files.read_json(path, k))
        assert isinstance(result, safe_files.FileRefused) and result.kind == "too large", (kind, result)


@pytest.mark.parametrize(("value", "expected"), [
    (1.5, 1.5), (3, 3.0), (float("nan"), None), (float("inf"), None), (1e300, None), ("12", None), (True, None),
    (10 ** 400, None), (None, None), ([1], None),
])
def test_finite_numbers_only(value, expected) -> None:
    assert safe_files.finite(value) == expected


# -- 1: bench results of unexpected shapes -----------------------------------------------------------------

SHAPES = {
    "time yesterday": dict(GOOD, time="yesterday"), "time 1e300": dict(GOOD, time=1e300),
    "time NaN": dict(GOOD, time=float("nan")),
    "mixed max_concurrency": dict(GOOD, runs=[{"max_concurrency": 1, "output_throughput": 1.0},
                                              {"max_concurrency": "4", "output_throughput": 2.0}]),
    "string throughput": dict(GOOD, runs=[{"max_concurrency": 1, "output_throughput": "fast"}]),
    "dict sglang_version": dict(GOOD, sglang_version={"v": 1}), "int command": dict(GOOD, command=7),
    # own variants
    "time -1e20": dict(GOOD, time=-1e20), "failed many": dict(GOOD, runs=[{"max_concurrency": 1, "failed": "many"}]),
    "ttft Infinity": dict(GOOD, runs=[{"max_concurrency": 1, "median_ttft_ms": float("inf")}]),
    "max_concurrency 1e300": dict(GOOD, runs=[{"max_concurrency": 1e300, "output_throughput": 2.0}]),
    "huge int throughput": dict(GOOD, runs=[{"max_concurrency": 1, "output_throughput": 10 ** 400}]),
    "command of dicts": dict(GOOD, command=[{"a": 1}, None]), "profile a list": dict(GOOD, profile=["a"]),
    "runs of ints": dict(GOOD, runs=[1, 2, 3]), "id a dict": dict(GOOD, id={"x": 1}),
    "negative throughput": dict(GOOD, runs=[{"max_concurrency": 1, "output_throughput": -5.0}]),
}


def _json_bytes(obj) -> bytes:
    return json.dumps(obj).encode()


@pytest.fixture
def results(home) -> Path:
    folder = ensure_private_dir(bench_dir(home))
    (folder / "20251124-000000-good.json").write_bytes(_json_bytes(GOOD))
    return folder


def test_every_bad_result_shape_is_listed_without_a_crash_and_never_ranked_best(home, results, capsys) -> None:
    for i, obj in enumerate(SHAPES.values()):
        (results / f"20251125-00000{i:02d}-bad.json").write_bytes(_json_bytes(obj))
    (results / "20251126-000000-deep.json").write_bytes(deep(100000))
    (results / "20251126-000001-deep2.json").write_bytes(b'{"runs": [], "x": ' + deep(5000) + b"}")
    rows, problems = answered(lambda: load_history(home))
    assert len(rows) == 1 + len(SHAPES) - 0 or len(rows) >= len(SHAPES)
    assert best_row(rows).profile == "good"
    assert sum("nested" in p for p in problems) == 2, problems
    for row in rows:
        json.dumps(row.to_json(), allow_nan=False)  # every figure finite, every field its type
        assert isinstance(row.profile, str) and isinstance(row.time, float)
        assert all(isinstance(a, str) for a in row.command)
    rc, out, err = cli(capsys, "bench", "history")
    assert rc == 0 and "good" in out and "deep.json" in err
    rc, out, _err = cli(capsys, "bench", "history", "--json")
    assert rc == 0 and len(json.loads(out)) == len(rows)


@pytest.mark.parametrize("report", [
    {"kind": "compare", "runs": ["x"], "a": "A", "b": 3},
    {"kind": "compare", "runs": [{"max_concurrency": 1, "speedup": "big"}], "time": "now"},
    {"kind": "compare", "runs": [{"max_concurrency": "1", "speedup": float("nan")}], "a": [1], "time": 1e300},
    {"kind": "compare", "runs": [], "a": {"profile": {"x": 1}}, "b": {"profile": 7}, "verdict": ["x"]},
    {"kind": "compare", "runs": [{"speedup": 10 ** 400}], "id": 5},
    {"kind": "compare", "runs": 5},
])
def test_a_malformed_compare_report_never_breaks_bench_history(report, home, results, capsys) -> None:
    (results / "compare-20251125-000000-a-vs-b.json").write_bytes(_json_bytes(report))
    (results / "compare-20251125-000001-deep.json").write_bytes(deep(50000))
    reports, problems = load_compares(home)
    assert any("compare-20251125-000001-deep.json" in p for p in problems)
    rc, out, err = cli(capsys, "bench", "history", "--compare")
    assert rc == 0, err
    rc, out, err = cli(capsys, "bench", "history", "--compare", "--json")
    assert rc == 0 and len(json.loads(out)) == len(reports)
    rc, out, err = cli(capsys, "bench", "history")
    assert rc == 0 and "good" in out


def test_the_bench_screen_shows_the_good_result_beside_every_bad_one(home, results, sockets) -> None:
    from textual.widgets import DataTable

    from app.screens.bench import BenchScreen
    from app.tui import Eagle3App
    from tests._tui_support import first_poll, run, wait_until

    for i, obj in enumerate(SHAPES.values()):
        (results / f"20251125-00000{i:02d}-bad.json").write_bytes(_json_bytes(obj))
    (results / "20251126-000000-deep.json").write_bytes(deep(100000))
    plant(results / "fifo.json", "fifo", sockets)
    plant(results / "zero.json", "/dev/zero", sockets)

    async def scenario() -> None:
        app = Eagle3App(home, refresh_s=0.2)
        async with app.run_test(size=(140, 45)) as pilot:
            await first_poll(pilot, app)
            await app.push_screen(BenchScreen(home))
            screen = await wait_until(pilot, lambda: isinstance(app.screen, BenchScreen) and app.screen,
                                      "the bench screen opens", 20)
            table = screen.query_one("#history", DataTable)
            await wait_until(pilot, lambda: table.row_count >= len(SHAPES), "the history rows", 20)
            assert table.row_count == 1 + len(SHAPES)
            assert any(r.profile == "good" for r in screen.rows)

    run(scenario)


# -- 2: special files and hard links in the bench folder -------------------------------------------------


@pytest.mark.parametrize("how", SPECIALS)
def test_a_special_file_among_results_is_named_and_skipped(how, home, results, sockets, capsys) -> None:
    plant(results / "x.json", how, sockets)
    plant(results / "compare-x.json", how if how != "socket" else "fifo", sockets)
    rc, out, err = cli(capsys, "bench", "history")
    assert rc == 0 and "good" in out and "x.json" in err
    rc, out, err = cli(capsys, "bench", "history", "--compare")
    assert rc == 0 and "compare-x.json" in err


def test_a_hard_linked_result_is_not_read(home, results, tmp_path, capsys) -> None:
    elsewhere = tmp_path / "someone-elses.json"
    elsewhere.write_bytes(_json_bytes(dict(GOOD, profile="LEAKED")))
    os.link(elsewhere, results / "20251125-000000-linked.json")
    rc, out, err = cli(capsys, "bench", "history")
    assert rc == 0 and "LEAKED" not in out and "hard link" in err


# -- 3 and 4: state.json -----------------------------------------------------------------------------------

BAD = "bad-20260101-100000-dddd"
GOOD_ID = "alpha-20260101-100000-aaaa"


def _session(home, session_id: str) -> Path:
    d = ensure_private_dir(home.sessions_dir / session_id)
    (d / "server.log").write_text("[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m', tp_size=1)\n")
    (d / "profile.toml").write_text('[server]\nlauncher = "emulator"\nmodel_path = "/m"\n')
    now = time.time()
    (d / "state.json").write_text(json.dumps({
        "version": 1, "session_id": session_id, "profile": session_id.rsplit("-", 3)[0], "pid": 999999999,
        "create_time": 1.0, "host": "127.0.0.1", "port": 1, "started_at": now - 60,
        "phase_entered_at": {"launching": now - 60}, "descendants": [], "launcher": "emulator", "tp_size": 1}))
    return d


def _listed(capsys) -> dict[str, dict]:
    rc, out, err = cli(capsys, "status", "--json")
    assert rc == 0, err
    return {r["session_id"]: r for r in json.loads(out)}


STATE_DAMAGE: dict[str, Callable[[Path, list], None]] = {
    "[[[ 100000": lambda p, s: p.write_bytes(deep(100000)),
    "{a: 5000": lambda p, s: p.write_bytes(b'{"a":' * 5000 + b"1" + b"}" * 5000),
    "stop field 3000 deep": lambda p, s: p.write_bytes(b'{"stop": ' + deep(3000) + b"}"),
    "model_info 900 deep": lambda p, s: p.write_bytes(b'{"model_info": ' + b'{"a": ' * 900 + b"1" + b"}" * 901),
    "20 MiB": lambda p, s: p.write_bytes(b" " * (20 << 20) + b"{}"),
    # json.loads raises ValueError (not JSONDecodeError) past Python's 4300-digit int limit
    "a 5000-digit port": lambda p, s: p.write_bytes(b'{"port": ' + b"1" * 5000 + b"}"),
    **{how: (lambda p, s, how=how: plant(p, how, s)) for how in SPECIALS},
}


@pytest.mark.parametrize("damage", list(STATE_DAMAGE))
def test_a_bad_state_file_shows_its_session_with_a_problem_and_hides_no_neighbour(damage, home, sockets,
                                                                                   capsys) -> None:
    _session(home, GOOD_ID)
    bad = _session(home, BAD)
    STATE_DAMAGE[damage](bad / "state.json", sockets)
    rows = _listed(capsys)
    assert rows[GOOD_ID]["problem"] is None
    assert BAD in rows and "state.json" in (rows[BAD]["problem"] or ""), rows.get(BAD)
    rc, out, err = cli(capsys, "status")
    assert rc == 0 and BAD in out and GOOD_ID in out and f"{BAD}: " in err


def test_a_hard_linked_state_file_is_not_trusted(home, tmp_path, capsys) -> None:
    _session(home, GOOD_ID)
    bad = _session(home, BAD)
    copy = tmp_path / "forged.json"
    copy.write_bytes((bad / "state.json").read_bytes())
    (bad / "state.json").unlink()
    os.link(copy, bad / "state.json")
    rows = _listed(capsys)
    assert "hard link" in rows[BAD]["problem"]


@pytest.mark.parametrize("damage", ["[[[ 100000", "fifo", "/dev/zero", "dir"])
def test_stop_and_diagnose_of_a_session_with_a_bad_state_file_say_what_is_wrong(damage, home, sockets,
                                                                               capsys) -> None:
    bad = _session(home, BAD)
    STATE_DAMAGE[damage](bad / "state.json", sockets)
    rc, out, err = cli(capsys, "diagnose", BAD, "--no-stacks")
    assert rc == 0 and "state.json" in out, err
    rc, out, err = cli(capsys, "stop", BAD)
    assert rc in (0, 1) and "no session" not in err


# -- 5: start facts and the start history fail only their own section -------------------------------------


def _with_baseline(home) -> Path:
    d = _session(home, "kimi-20260101-100000-aaaa")
    history = ensure_private_dir(home.history_dir)
    (history / "kimi.jsonl").write_text(json.dumps({
        "v": 1, "session_id": "kimi-old", "profile": "kimi", "outcome": "ready", "line_count": 5,
        "phases": [{"phase": "ready", "at_s": 5.0, "line": 5}], "facts": {"v": 1, "argv": ["python", "--a", "1"]}}) + "\n")
    return d


FACTS_DAMAGE: dict[str, Callable[[Path, list], None]] = {
    **{how: (lambda p, s, how=how: plant(p, how, s)) for how in SPECIALS},
    "deep": lambda p, s: p.write_bytes(deep(100000)),
    "not UTF-8": lambda p, s: p.write_bytes(b"\xff\xfe{"),
    "a list": lambda p, s: p.write_text("[1]"),
    "hard link": lambda p, s: ((p.parent / "x").write_text("{}"), os.link(p.parent / "x", p)),
}


@pytest.mark.parametrize("damage", list(FACTS_DAMAGE))
def test_bad_start_facts_fail_only_the_changes_section(damage, home, sockets, capsys) -> None:
    d = _with_baseline(home)
    FACTS_DAMAGE[damage](d / "start_facts.json", sockets)
    rc, out, err = cli(capsys, "diagnose", d.name, "--json", "--no-stacks")
    assert rc == 0, err
    report = json.loads(out)
    assert report["changes_since_last_good"] is None
    assert "start_facts.json" in report["changes_note"], report["changes_note"]
    assert report["session_id"] == d.name and report["last_lines"]


@pytest.mark.parametrize("facts", [{"v": 1, "argv": 5, "env": "x", "gpus": {"a": 1}},
                                   {"v": 1, "argv": [1, 2], "env": {"A": 3}, "emulator": [1]},
                                   {"v": 1, "argv": ["python", {"x": 1}], "sglang_version": 5}])
def test_start_facts_of_the_wrong_types_are_diffed_with_what_is_right(facts, home, capsys) -> None:
    d = _with_baseline(home)
    (d / "start_facts.json").write_text(json.dumps(facts))
    rc, out, err = cli(capsys, "diagnose", d.name, "--json", "--no-stacks")
    assert rc == 0, err
    assert json.loads(out)["session_id"] == d.name


@pytest.mark.parametrize("line", [
    deep(100000), b'{"session_id": "s", "phases": "x", "outcome": "ready"}',
    b'{"session_id": "s", "phases": [], "facts": {"a": ' + deep(3000) + b"}}",
    b'{"session_id": "s", "phases": [{"phase": "ready", "at_s": "x", "line": 1e300}], "line_count": "x"}',
    b'{"session_id": "s", "phases": [{"phase": "ready", "at_s": 1e400}], "outcome": "ready"}',
    b'{"session_id": ["s"], "phases": [{"phase": 5}]}',
])
def test_a_bad_start_history_line_is_skipped_alone(line, home, capsys) -> None:
    d = _with_baseline(home)
    with open(home.history_dir / "kimi.jsonl", "ab") as fh:
        fh.write(line + b"\n")
    rc, out, err = cli(capsys, "diagnose", d.name, "--json", "--no-stacks")
    assert rc == 0, err
    assert "kimi-old" in (json.loads(out).get("changes_note") or "") or json.loads(out)["baseline"] is not None


@pytest.mark.parametrize("how", ["fifo", "/dev/zero", "dir", "socket"])
def test_a_special_start_history_file_never_stops_a_diagnosis(how, home, sockets, capsys) -> None:
    d = _with_baseline(home)
    plant(home.history_dir / "kimi.jsonl", how, sockets)
    rc, _out, err = cli(capsys, "diagnose", d.name, "--json", "--no-stacks")
    assert rc == 0, err


# -- 6: hard links to another file's content --------------------------------------------------------------


@pytest.fixture
def linked_log(home, tmp_path) -> Path:
    d = _session(home, "kimi-20260101-100000-aaaa")
    shadow = tmp_path / "shadow"
    shadow.write_text(SECRET + "\n")
    (d / "server.log").unlink()
    os.link(shadow, d / "server.log")
    return d


def test_a_hard_linked_server_log_never_reaches_logs(linked_log, capsys) -> None:
    rc, out, err = answered(lambda: cli(capsys, "logs", linked_log.name))
    assert rc != 0 and "SECRETHASH" not in out + err and "hard link" in err


def test_a_hard_linked_server_log_never_reaches_the_diagnosis_or_the_bundle(linked_log, tmp_path, capsys) -> None:
    bundle = tmp_path / "bundle.tar.gz"
    rc, out, err = cli(capsys, "diagnose", linked_log.name, "--no-stacks", "--bundle", str(bundle))
    assert rc == 0, err
    assert "SECRETHASH" not in out + err
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            fh = tar.extractfile(member)
            assert fh is None or b"SECRETHASH" not in fh.read(), member.name
    rc, out, err = cli(capsys, "status", "--json")
    assert "SECRETHASH" not in out + err


@pytest.mark.parametrize("name", ["command.json", "start_facts.json", "secrets.json", "emulated_gpus.json"])
def test_other_hard_linked_session_files_are_not_read(name, home, tmp_path, capsys) -> None:
    d = _with_baseline(home)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"argv": ["SECRETHASH"], "values": ["SECRETHASH"], "gpus": [], "v": 1}))
    (d / name).unlink(missing_ok=True)
    os.link(other, d / name)
    rc, out, err = cli(capsys, "diagnose", d.name, "--json", "--no-stacks")
    assert rc == 0, err
    assert "SECRETHASH" not in out


# -- 7: a file where a folder is expected, names over 255 characters ---------------------------------------


@pytest.mark.parametrize("argv", [["status"], ["status", "--json"], ["stop", "x"], ["diagnose", "x"], ["logs", "x"],
                                  ["restart", "x"], ["bench", "x"]])
def test_a_file_where_the_sessions_folder_should_be_is_named(argv, home, capsys) -> None:
    import shutil

    shutil.rmtree(home.sessions_dir)
    home.sessions_dir.write_text("not a folder")
    rc, _out, err = cli(capsys, *argv)
    assert rc != 0 and str(home.sessions_dir) in err and "folder" in err, err


@pytest.mark.parametrize(("folder", "argv"), [
    ("bench", ["bench", "history"]), ("history", ["diagnose", "kimi-20260101-100000-aaaa", "--no-stacks"]),
    ("profiles", ["profile", "new", "p"]), ("demo", ["--demo", "profile", "list"]),
])
def test_a_file_where_another_folder_should_be_is_named(folder, argv, home, capsys) -> None:
    import shutil

    _with_baseline(home)
    target = {"bench": bench_dir(home), "history": home.history_dir, "profiles": home.profiles_dir,
              "demo": home.state_root.parent / "demo"}[folder]
    if target.is_dir():
        shutil.rmtree(target)
    target.write_text("x")
    rc, _out, err = cli(capsys, *argv)
    if folder == "history":
        assert rc == 0, err  # the diagnosis stands; there is no baseline to compare with
    else:
        assert str(target) in err and ("folder" in err or "directory" in err), (rc, err)


@pytest.mark.parametrize(("in_the_way", "argv"), [
    ("jobs", ["extract", "status"]), ("config", ["profile", "list"]), ("config", ["profile", "new", "p"]),
])
def test_a_file_where_a_folder_above_or_the_listed_one_should_be_is_named(in_the_way, argv, home, capsys) -> None:
    """adv22: ``<state>/jobs`` as a file made `extract status` say "no extraction jobs" (rc 0), and
    ``<home>/config`` as a file made `profile list` print nothing (rc 0): every job and profile hidden."""
    import shutil

    target = {"jobs": home.jobs_dir, "config": home.config_root}[in_the_way]
    shutil.rmtree(target)
    target.write_text("x")
    rc, _out, err = cli(capsys, *argv)
    assert rc != 0 and str(target) in err and "a file where a folder is expected" in err, (rc, err)


def test_the_demo_capture_folder_as_a_file_is_named(home, monkeypatch, capsys) -> None:
    from sessions.demo import demo_capture_dir
    from sessions.home import resolve_home

    demo_home = resolve_home(demo=True)
    target = demo_capture_dir(demo_home)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("x")
    rc, _out, err = cli(capsys, "--demo", "profile", "list")
    assert rc == 0 or (str(target) in err and "folder" in err), (rc, err)


LONG = "a" * 300


@pytest.mark.parametrize("argv", [["stop", LONG], ["diagnose", LONG], ["logs", LONG], ["restart", LONG],
                                  ["bench", LONG], ["profile", "new", LONG], ["profile", "validate", LONG],
                                  ["profile", "command", LONG], ["launch", LONG], ["stop", "b" * 5000],
                                  ["diagnose", "x/" + LONG], ["extract", "status", LONG]])
def test_names_over_255_characters_give_a_clear_error(argv, home, capsys) -> None:
    _session(home, GOOD_ID)
    rc, _out, err = cli(capsys, *argv)
    assert rc in (1, 2) and err.startswith(("eagle3-tui:", "profile", "  ")), err
    assert len(err) < 2000


def test_the_tree_scan_finds_the_old_readers(tmp_path) -> None:
    """The test over the tree would have failed on the code before this reader existed: the old store's
    ``json.loads(path.read_text())`` is one of the reads it sees."""
    import ast

    from tests.test_one_file_reader import reads_in

    old = "def load_history(home):\n    for path in folder.glob('*.json'):\n        data = json.loads(path.read_text())\n"
    assert reads_in(ast.parse(old)) == [(3, "load_history", ".read_text()")]


def test_no_command_waits_on_a_fifo_anywhere_in_a_session_folder(home, sockets, capsys) -> None:
    """Every file of a session folder a FIFO at once: status, diagnose and logs answer."""
    d = _session(home, BAD)
    for name in ("state.json", "server.log", "command.json", "start_facts.json", "secrets.json",
                 "emulated_gpus.json", "profile.toml"):
        plant(d / name, "fifo", sockets)
    _session(home, GOOD_ID)
    rows = _listed(capsys)
    assert BAD in rows and rows[GOOD_ID]["problem"] is None
    rc, out, err = cli(capsys, "diagnose", BAD, "--no-stacks")
    assert rc == 0 and "state.json" in out and "FIFO" in out, err
    rc, _out, err = cli(capsys, "logs", BAD)
    assert rc != 0 and "FIFO" in err


def test_the_cli_subprocess_says_it_too(home, cli_env) -> None:
    """The same from a real process (no in-process state): a FIFO result and a deep state file."""
    folder = ensure_private_dir(bench_dir(home))
    (folder / "20251124-000000-good.json").write_bytes(_json_bytes(GOOD))
    os.mkfifo(folder / "x.json")
    d = _session(home, BAD)
    (d / "state.json").write_bytes(deep(100000))
    for argv in (["bench", "history"], ["status"]):
        result = subprocess.run([sys.executable, "-m", "app", *argv], env=cli_env, capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
