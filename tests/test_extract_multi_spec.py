"""`servers = [...]` in a job spec and `extract run --servers`: checked entries, one way to name servers, the
spec copy keeps them; the per-server window (AIMD) and the model comparison between servers."""
from __future__ import annotations

from pathlib import Path

import pytest
from _extract_support import chat_rows, make_tokenizer_dir, run_cli, write_dataset, write_spec

from sessions.extraction.scheduler import AimdWindow
from sessions.extraction.servers import model_differences, reference_identity
from sessions.extraction.spec import JobSpecError, parse_job_spec

BASE = """\
[job]
name = "multi"
dataset = "/data/d.jsonl"
output_dir = "/data/out"
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(JobSpecError) as info:
        parse_job_spec(text, "job.toml")
    return [str(p) for p in info.value.problems]


def test_servers_entries_are_sessions_groups_or_urls_and_bad_ones_are_named_with_their_line() -> None:
    spec = parse_job_spec(BASE + 'servers = ["emu-20261202-1", "g-emu-2026", "http://127.0.0.1:30001"]\n'
                                 'model_path = "/m"\n')
    assert spec.servers == ("emu-20261202-1", "g-emu-2026", "http://127.0.0.1:30001")
    assert spec.to_toml_dict()["job"]["servers"] == list(spec.servers)  # the job dir's spec copy keeps them
    assert parse_job_spec(spec_text := BASE + 'session = "s"\n').servers == () and "servers" not in \
        parse_job_spec(spec_text).to_toml_dict()["job"]
    assert problems_of(BASE + 'servers = ["http://127.0.0.1"]\nmodel_path = "/m"\n') == [
        "job.servers (line 5): entry 1 ('http://127.0.0.1'): name the port, e.g. http://127.0.0.1:30000"]
    assert problems_of(BASE + 'servers = ["a b"]\n') == [
        "job.servers (line 5): entry 1 ('a b'): neither a URL (http://HOST:PORT) nor a session or group id"]
    assert problems_of(BASE + 'servers = ["a", "a"]\n') == [
        "job.servers (line 5): a named twice (each server is one lane of the job)"]
    assert problems_of(BASE + "servers = []\n") == ["job.servers (line 5): name at least one server"]
    assert problems_of(BASE + "servers = [1]\n") == ["job.servers (line 5): must be a list of strings, not list [1]"]
    assert problems_of(BASE + 'servers = ["a"]\nsession = "b"\n') == [
        "job.server_url (line 5): give exactly one of server_url, session and servers"]
    assert problems_of(BASE + 'servers = ["http://127.0.0.1:1"]\n') == [
        "job.model_path (line 1): is required when servers names a URL (a session would supply it)"]
    assert problems_of(BASE) == [("job.server_url (line 1): give server_url, session or servers (or extract run "
                                  "--servers)")]
    assert parse_job_spec(BASE, servers_given=True).servers == ()  # --servers names them


def test_extract_run_servers_refuses_a_bad_entry_and_a_session_that_does_not_exist(home, cli_env,
                                                                                  tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl", chat_rows(2))
    spec = write_spec(tmp_path / "job.toml", name="t", dataset=dataset, output_dir=tmp_path / "out",
                      model_path=make_tokenizer_dir(tmp_path / "model", "llama3"))
    bad = run_cli(["extract", "run", str(spec), "--servers", "ok-id,http://127.0.0.1"], cli_env)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "--servers: 'http://127.0.0.1': name the port" in bad.stderr
    missing = run_cli(["extract", "run", str(spec), "--servers", "no-such-session,other"], cli_env)
    assert missing.returncode == 2 and "job.servers: no-such-session" in missing.stderr
    assert not list(home.jobs_dir.iterdir())  # nothing was started


def test_the_window_starts_small_doubles_then_grows_by_one_per_window_and_backs_off() -> None:
    window = AimdWindow(ceiling=16)
    assert window.size == 2
    for _ in range(6):  # slow start: +1 per success while the latency stays at its best
        window.on_success(0.1)
    assert window.size == 8
    window.on_failure()  # multiplicative decrease, and slow start is over
    assert window.size == 4
    for _ in range(4):  # one window of successes: about one more
        window.on_success(0.1)
    assert window.size == 4 or window.size == 5
    for _ in range(20):  # the server queues (latency far above its best): the window shrinks
        window.on_success(2.0)
    assert window.size == 1
    window.reset()
    assert window.size == 2 and window.slow_start
    small = AimdWindow(ceiling=1)
    small.on_success(0.1)
    assert small.size == 1  # never above the spec's concurrency


def test_servers_agree_on_the_model_and_the_odd_one_is_told_apart_by_its_differences() -> None:
    base = {"model_config": "sha256:a", "weights": {"m.safetensors": [100, 111]}, "numerics": {"dtype": "auto"},
            "capture_layers": [2, 4, 5], "chat_template": "sha256:t", "sglang_version": "0.5.23",
            "capture_dir": "/dev/shm/a", "rid_prefix": "eagle3-", "model_path": "/m"}
    copy = {**base, "weights": {"m.safetensors": [100, 999]}, "capture_dir": "/dev/shm/b", "model_path": "/n"}
    assert model_differences(base, copy) == []  # another host's copy: other file times, dir and path
    odd = {**base, "model_config": "sha256:b", "capture_layers": [2, 6, 9]}
    assert model_differences(base, odd) == ["model_config: sha256:a → sha256:b",
                                            "capture_layers: [2, 4, 5] → [2, 6, 9]"]
    assert model_differences(base, {**base, "weights": {"m.safetensors": [101, 111]}}) == [
        "weights: m.safetensors changed (size 100 → 101 bytes, modified ? → ?)"]
    # The reference is what most servers show; the odd one listed first does not become it.
    assert reference_identity([odd, base, copy])["model_config"] == "sha256:a"
    assert reference_identity([odd, base])["model_config"] == "sha256:b"  # a tie: the one listed first
    assert reference_identity([None, None]) is None
