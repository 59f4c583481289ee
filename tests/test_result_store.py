"""The result store's one primitive (issue 22 item 12): `sessions.home.write_new_file` gives every writer
its own name (O_EXCL temp file, then link(), which never replaces), 0600, one link, the whole content or
no file.  Raced by threads and by real processes at once."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

from sessions import safe_files
from sessions.home import write_new_file

WRITER = """
import json, sys
from pathlib import Path
from sessions.home import write_new_file
folder, who = Path(sys.argv[1]), sys.argv[2]
for i in range(10):
    write_new_file(folder, "20260101-000000-p", lambda stem: json.dumps({"who": who, "i": i, "id": stem}).encode())
"""


def _check(folder: Path, expected: int) -> list[dict]:
    files = sorted(p for p in folder.iterdir() if p.suffix == ".json")
    assert len(files) == expected, [p.name for p in files]
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # no temp file left behind
    records = []
    for path in files:
        st = path.lstat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1, (path, oct(st.st_mode), st.st_nlink)
        record = safe_files.read_json(path, safe_files.BENCH_RESULT)  # private: would refuse a second link
        assert record["id"] == path.stem
        records.append(record)
    return records


def test_forty_threads_saving_in_the_same_second_keep_forty_files(tmp_path) -> None:
    folder = tmp_path / "bench"
    start = threading.Barrier(40)

    def save(i: int) -> None:
        start.wait()
        write_new_file(folder, "20260101-000000-p", lambda stem: json.dumps({"i": i, "id": stem}).encode())

    threads = [threading.Thread(target=save, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = _check(folder, 40)
    assert sorted(r["i"] for r in records) == list(range(40))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_processes_racing_never_share_a_path(tmp_path) -> None:
    folder = tmp_path / "bench"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(n)], env=env) for n in range(6)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 6
    records = _check(folder, 60)
    assert sorted((r["who"], r["i"]) for r in records) == sorted((str(n), i) for n in range(6) for i in range(10))


def test_an_existing_file_or_link_is_never_replaced(tmp_path) -> None:
    folder = tmp_path / "bench"
    folder.mkdir(mode=0o700)
    (folder / "x.json").write_text("mine")
    (folder / "x-2.json").symlink_to("/etc/passwd")
    os.mkfifo(folder / "x-3.json")
    path = write_new_file(folder, "x", b"{}")
    assert path.name == "x-4.json"
    assert (folder / "x.json").read_text() == "mine" and (folder / "x-2.json").is_symlink()
