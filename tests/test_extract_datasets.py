"""Dataset readers: the three formats, auto-detection, and bad lines recorded with line number and reason."""
from __future__ import annotations

import json
from pathlib import Path

from sessions.extraction.datasets import DatasetLineError, DatasetRecord, count_lines, iter_dataset


def write_lines(path: Path, lines: list) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))
    return path


def test_sharegpt_openai_and_tokenized_lines_are_detected(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "d.jsonl", [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text",
                      "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "assistant", "content": "c"}]},
        {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},
        {"input_ids": [4, 5]},
    ])
    records = list(iter_dataset(path))
    assert all(isinstance(r, DatasetRecord) for r in records)
    assert [r.kind for r in records] == ["sharegpt", "sharegpt", "openai", "tokenized", "tokenized"]
    assert records[0].messages == ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"})
    assert records[2].messages[1]["content"] == "ab"
    assert records[3].loss_mask == (0, 1, 1) and records[4].loss_mask is None
    assert [r.line for r in records] == [1, 2, 3, 4, 5]


def test_bad_lines_become_errors_with_line_numbers_and_reasons(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "d.jsonl", [
        {"conversations": [{"from": "human", "value": "ok"}, {"from": "gpt", "value": "fine"}]},
        b"{not json",
        b"[1, 2]",
        {"conversations": [{"from": "martian", "value": "x"}]},
        {"conversations": [{"from": "human", "value": "only a question"}]},
        {"text": "no known key"},
        {"input_ids": [1, 2], "loss_mask": [1]},
        b"\xff\xfe bad bytes",
        b"   ",
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": {"x": 1}}]},
    ])
    out = list(iter_dataset(path))
    errors = {e.line: e.reason for e in out if isinstance(e, DatasetLineError)}
    assert [r.line for r in out if isinstance(r, DatasetRecord)] == [1]
    assert "not JSON" in errors[2]
    assert "JSON object" in errors[3]
    assert "unknown from 'martian'" in errors[4]
    assert "no assistant turn" in errors[5]
    assert "conversations" in errors[6] and "text" in errors[6]
    assert "loss_mask" in errors[7]
    assert "UTF-8" in errors[8]
    assert 9 not in errors  # a blank line is not a sample
    assert "content must be a string" in errors[10]
    assert count_lines(path) == 9


def test_forced_format_skip_set_and_limit(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": str(i)}, {"role": "assistant", "content": "a"}]}
            for i in range(6)]
    path = write_lines(tmp_path / "d.jsonl", rows)
    forced = list(iter_dataset(path, "sharegpt"))
    assert all(isinstance(e, DatasetLineError) and "conversations" in e.reason for e in forced)
    picked = list(iter_dataset(path, skip={0, 2}, limit=4))
    assert [r.index for r in picked] == [1, 3]
    assert count_lines(path, limit=4) == 4


def test_a_line_that_is_not_json_is_named_by_file_line_and_column_in_plain_words(tmp_path: Path) -> None:
    """Issue 21: "Unterminated string starting at at column 68" had a doubled "at" and no line or file."""
    cut = b'{"id": "x", "conversations": [{"from": "human", "value": "cut off'
    escape = b'{"a": "bad \\q escape"}'
    path = write_lines(tmp_path / "chats.jsonl", [
        {"conversations": [{"from": "human", "value": "ok"}, {"from": "gpt", "value": "fine"}]},
        cut, b'{"a": 1,}', b'{"a": 1} trailing', escape, b"\xff\xfe bad bytes",
    ])
    errors = {e.line: e.reason for e in iter_dataset(path) if isinstance(e, DatasetLineError)}
    # Columns are 1-based: the unterminated string starts at its opening quote, the others at the byte
    # after what they point past.
    start, comma, extra, bad = cut.index(b'"cut off') + 1, len(b'{"a": 1,'), len(b'{"a": 1} '), escape.index(b"\\q") + 1
    assert errors[2] == f"not JSON: Unterminated string starting at line 2, column {start} of {path}"
    assert errors[3].startswith("not JSON: ") and f"at line 3, column {comma + 1} of {path}" in errors[3]
    assert errors[4] == f"not JSON: Extra data at line 4, column {extra + 1} of {path}"
    assert f"at line 5, column {bad} of {path}" in errors[5]
    assert errors[6].startswith("not UTF-8: ") and f"at line 6, byte 0 of {path}" in errors[6]
    for reason in errors.values():
        assert " at at " not in reason and reason.count(" at ") == 1, reason
