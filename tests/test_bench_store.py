"""The bench result store's writer: names no two runs share, atomic 0600 files, redacted copies only.

Real processes race real saves into one folder, all with the same profile and the same second, which is
what two benches started together do."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path

from sessions.bench.store import bench_dir, save_compare, save_result
from sessions.home import Home

SAVES = 40


def _save(state_root: str, start: multiprocessing.synchronize.Barrier, n: int, out: multiprocessing.Queue) -> None:
    home = Home(config_root=Path(state_root) / "config", state_root=Path(state_root) / "state")
    start.wait()
    result = {"profile": "same", "time": 1_800_000_000.0, "runs": [{"max_concurrency": 1, "n": n}]}
    out.put(str(save_result(home, result)))


def test_a_race_of_40_saves_gives_40_files_each_whole_and_private(tmp_path):
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(SAVES)
    out: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_save, args=(str(tmp_path), start, n, out)) for n in range(SAVES)]
    for proc in procs:
        proc.start()
    paths = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert len(set(paths)) == SAVES, "two saves printed the same saved_to path"
    folder = Path(paths[0]).parent
    files = sorted(folder.iterdir())
    assert [p.name for p in files if not p.name.endswith(".json")] == [], "temp files left behind"
    assert len(files) == SAVES
    seen = set()
    for path in files:
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1, path
        data = json.loads(path.read_text())
        assert data["id"] == path.stem
        seen.add(data["runs"][0]["n"])
    assert seen == set(range(SAVES)), "a result overwrote another"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_results_and_compares_keep_redacted_copies_only(home):
    secret_toml = ('[server]\nextra_args = ["--api-key", "sk-live-abcdefghijklmnop1234"]\n'
                   '[server.env]\nHF_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"\n'
                   'WANDB_API_KEY = "0123456789abcdef0123456789abcdef01234567"\n')
    result = {"profile": "p", "time": 1_800_000_000.0, "profile_toml": secret_toml,
              "command": ["python", "--api-key", "sk-live-abcdefghijklmnop1234"],
              "base_url": "http://user:hunter2secret@127.0.0.1:1", "runs": [{"max_concurrency": 1,
                                                                              "output_throughput": float("nan")}]}
    paths = [save_result(home, result), save_compare(home, {"a": {"profile": "p"}, "b": {"profile": "q"},
                                                            "runs": [], "sides": [result]})]
    for path in paths:
        text = path.read_text()
        for secret in ("sk-live-abcdefghijklmnop1234", "hf_abcdefghijklmnopqrstuvwxyz0123",
                       "0123456789abcdef0123456789abcdef01234567", "hunter2secret"):
            assert secret not in text, (path.name, secret)
        json.loads(text)  # NaN kept as null: still JSON
    assert json.loads(paths[0].read_text())["runs"][0]["output_throughput"] is None
    assert sorted(p.name for p in bench_dir(home).iterdir()) == sorted(p.name for p in paths)
    assert all(os.stat(p).st_nlink == 1 for p in paths)
