"""The job spec: defaults, and every bad key or value refused with its name and line."""
from __future__ import annotations

from pathlib import Path

import pytest

from sessions.extraction.spec import JobSpecError, load_job_spec, parse_job_spec

GOOD = """\
[job]
name = "kimi-sharegpt"
server_url = "http://127.0.0.1:30000"
dataset = "data/sharegpt.jsonl"
output_dir = "/data/eagle3-kimi"
model_path = "/models/Kimi-K2.5"
capture_dir = "/dev/shm/eagle3-capture-me"
rid_prefix = "eagle3-"
max_length = 2048
on_too_long = "truncate"
concurrency = 8
"""


def problems_of(text: str) -> list:
    with pytest.raises(JobSpecError) as info:
        parse_job_spec(text, "job.toml")
    return info.value.problems


def test_the_contract_example_parses_and_relative_paths_follow_the_spec_file(tmp_path: Path) -> None:
    spec_file = tmp_path / "job.toml"
    spec_file.write_text(GOOD)
    spec = load_job_spec(spec_file)
    assert spec.name == "kimi-sharegpt"
    assert spec.dataset == tmp_path / "data" / "sharegpt.jsonl"
    assert spec.output_dir == Path("/data/eagle3-kimi")
    assert (spec.max_length, spec.on_too_long, spec.concurrency) == (2048, "truncate", 8)
    assert spec.system_prompt is None and spec.thinking is None  # nothing injected, nothing assumed


def test_unknown_key_is_named_with_its_line_and_a_suggestion() -> None:
    (problem,) = problems_of(GOOD + "concurency = 4\n")
    assert problem.field == "job.concurency"
    assert problem.line == 12
    assert "concurrency" in problem.message


def test_wrong_types_and_values_name_key_and_line() -> None:
    text = GOOD.replace("concurrency = 8", 'concurrency = "eight"').replace(
        'on_too_long = "truncate"', 'on_too_long = "drop"').replace("max_length = 2048", "max_length = 0")
    found = {p.field: p for p in problems_of(text)}
    assert found["job.concurrency"].line == 11 and "integer" in found["job.concurrency"].message
    assert found["job.on_too_long"].line == 10 and "'drop'" in found["job.on_too_long"].message
    assert found["job.max_length"].line == 9 and "greater than 0" in found["job.max_length"].message


def test_server_url_and_session_are_exclusive_and_urls_are_checked() -> None:
    both = problems_of(GOOD + 'session = "abc"\n')
    assert any(p.field == "job.server_url" and "exactly one" in p.message for p in both)
    bad_url = problems_of(GOOD.replace("http://127.0.0.1:30000", "127.0.0.1:30000"))
    assert [p.field for p in bad_url] == ["job.server_url"]
    no_port = problems_of(GOOD.replace("http://127.0.0.1:30000", "http://127.0.0.1"))
    assert "port" in no_port[0].message


def test_server_url_needs_capture_dir_and_model_path() -> None:
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith(("capture_dir", "model_path")))
    fields = {p.field for p in problems_of(text)}
    assert fields == {"job.capture_dir", "job.model_path"}


def test_missing_required_keys_unknown_tables_and_toml_errors() -> None:
    fields = {p.field for p in problems_of('[job]\nname = "x"\nsession = "s"\n[extra]\na = 1\n')}
    assert {"job.dataset", "job.output_dir", "extra"} <= fields
    (syntax,) = problems_of(GOOD + "max_length = = 3\n")
    assert syntax.field == "toml" and syntax.line == 12
    bad_name = problems_of(GOOD.replace('name = "kimi-sharegpt"', 'name = "has space"'))
    assert bad_name[0].field == "job.name" and bad_name[0].line == 2


def test_error_message_lists_every_problem() -> None:
    with pytest.raises(JobSpecError) as info:
        parse_job_spec(GOOD + "concurency = 4\ncapture_fill_threshold = 1.5\n", "job.toml")
    text = str(info.value)
    assert "job.concurency (line 12)" in text and "job.capture_fill_threshold (line 13)" in text
