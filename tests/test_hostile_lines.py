"""Hostile dataset lines: every line that cannot be decoded, parsed or rendered is a bad line with its line
number and a short reason; nothing a line holds stops the reader or the renderer (issue 14 item 2)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from _extract_support import make_tokenizer_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions.extraction.datasets import (
    REASON_MAX_CHARS,
    DatasetLineError,
    DatasetRecord,
    cut_reason,
    iter_dataset,
    parse_line,
)
from sessions.extraction.output import ManifestEntry

# Longest reason a line may produce: the cut plus its "… (N more characters)" tail.
REASON_LIMIT = REASON_MAX_CHARS + 40

SURROGATE_ANSWER = b'{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "a\\ud800b"}]}'
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_IN_MESSAGE = (b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", '
                   b'"tool_calls": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}")
HUGE_KEY = b'{"' + b"k" * 2_000_000 + b'": 1}'
NAMED = {
    "surrogate": SURROGATE_ANSWER,
    "surrogate key": b'{"conversations": [{"from": "gpt", "value": "x", "\\udfff": 1}]}',
    "deep": DEEP,
    "deep in a message": DEEP_IN_MESSAGE,
    "2 MB key": HUGE_KEY,
    "wrong role type": b'{"messages": [{"role": 5, "content": "x"}]}',
    "content dict": b'{"messages": [{"role": "assistant", "content": {"a": 1}}]}',
    "tools string": b'{"messages": [{"role": "assistant", "content": "x"}], "tools": "no"}',
    "ids floats": b'{"input_ids": [1.5, 2]}',
    "ids bools": b'{"input_ids": [true]}',
    "huge int": b'{"input_ids": [' + b"9" * 5000 + b"]}",
    "nan": b'{"input_ids": [NaN]}',
    "not utf-8": b'{"messages": "\xff\xfe"}',
    "null": b"null",
}


def assert_bad_line(result: object, line: int) -> None:
    assert isinstance(result, DatasetLineError), result
    assert result.line == line
    assert result.reason and len(result.reason) <= REASON_LIMIT
    result.reason.encode("utf-8")  # writable into errors.jsonl as it is
    json.dumps(result.reason, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("name", sorted(NAMED))
def test_each_named_hostile_line_is_a_bad_line_with_a_short_reason(name: str) -> None:
    assert_bad_line(parse_line(NAMED[name], 4), 5)


def test_the_surrogate_and_depth_reasons_say_what_is_wrong() -> None:
    assert "surrogate" in parse_line(SURROGATE_ANSWER, 0).reason
    assert "\\ud800" in parse_line(SURROGATE_ANSWER, 0).reason
    assert "nested too deeply" in parse_line(DEEP, 0).reason
    huge = parse_line(HUGE_KEY, 0).reason
    assert "more characters" in huge or len(huge) < 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
messages = st.lists(
    st.dictionaries(st.sampled_from(["role", "from", "content", "value", "tool_calls", "name"]),
                    json_values | st.sampled_from(["user", "gpt", "assistant", "human", "system"]), max_size=5),
    max_size=4,
) | json_values
rows = st.dictionaries(st.sampled_from(["conversations", "messages", "input_ids", "loss_mask", "tools", "system"]),
                       messages, max_size=4)


def _encode(row: object, surrogate: bool) -> bytes:
    text = json.dumps(row, ensure_ascii=True)
    if surrogate and '"' in text:  # drop a lone surrogate escape into the first string
        at = text.index('"') + 1
        text = text[:at] + "\\ud83d" + text[at:]
    return text.encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=rows | json_values, surrogate=st.booleans(), garbage=st.binary(max_size=40))
def test_no_line_makes_the_reader_raise_and_every_reason_is_short(row: object, surrogate: bool,
                                                                  garbage: bytes) -> None:
    for raw in (_encode(row, surrogate), garbage, _encode(row, False)[:-1] + garbage):
        result = parse_line(raw, 9)
        assert isinstance(result, DatasetRecord | DatasetLineError)
        if isinstance(result, DatasetLineError):
            assert_bad_line(result, 10)
        else:  # a record never carries invalid Unicode on to the tokenizer
            json.dumps([result.messages, result.tools], ensure_ascii=False, default=str).encode("utf-8")


@settings(max_examples=150, deadline=None)
@given(reason=st.text(max_size=2000) | st.just("\ud800" * 500))
def test_every_manifest_reason_is_cut_and_encodable(reason: str) -> None:
    entry = ManifestEntry(index=0, line=1, sample_id="j-0", status="error", reason=reason)
    assert len(entry.reason) <= REASON_LIMIT
    entry.to_json().encode("utf-8")
    assert cut_reason(reason) == entry.reason


def test_a_file_of_hostile_lines_reads_through_with_every_line_numbered(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    good = b'{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}'
    path.write_bytes(b"\n".join([good, *NAMED.values(), good]) + b"\n")
    results = list(iter_dataset(path))
    assert [r.line for r in results] == list(range(1, len(NAMED) + 3))
    assert isinstance(results[0], DatasetRecord) and isinstance(results[-1], DatasetRecord)
    for result in results[1:-1]:
        assert_bad_line(result, result.line)


def test_a_record_the_tokenizer_or_template_rejects_is_a_bad_line_in_the_job(tmp_path: Path) -> None:
    """The job's render stage turns any exception of one line into an error entry (here: a message whose
    passthrough field makes the template raise a TypeError, as wrong types anywhere can)."""
    from sessions.extraction.rendering import ChatRenderer
    from sessions.extraction.sample_source import SampleSource

    model = make_tokenizer_dir(tmp_path / "tok", "llama3")
    renderer = ChatRenderer.load(model, max_length=4096, on_too_long="truncate")
    source = SampleSource("j", row_ids_wanted=False)  # sample ids are line indices (not a regeneration's row ids)
    ok = parse_line(b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', 0)
    hostile = DatasetRecord(index=1, line=2, kind="openai",
                            messages=({"role": "user", "content": "hi"}, {"role": "assistant", "content": 7}))

    class Exploding:
        index, line, kind, input_ids, loss_mask, tools = 2, 3, "openai", None, None, None

        @property
        def messages(self) -> tuple:
            raise RecursionError("maximum recursion depth exceeded")

    out = list(source.rendered(iter([ok, hostile, Exploding()]), renderer))
    assert not isinstance(out[0], ManifestEntry)
    assert [(e.line, e.status) for e in out[1:]] == [(2, "error"), (3, "error")]
    assert all(len(e.reason) <= REASON_LIMIT for e in out[1:])
