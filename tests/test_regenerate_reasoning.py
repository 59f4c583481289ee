"""Reasoning in regeneration jobs, as SpecForge's ``regenerate_train_data.py --reasoning none|save|disable``.

``disable`` sends ``chat_template_kwargs.enable_thinking = false``: against a template that reads the kwarg,
each regenerated answer is the server's reply to the history rendered with it.  ``save`` sends
``enable_thinking = true`` and keeps each answer's ``reasoning_content`` (SGLang's reasoning parser splits
it off the answer) next to its ``content``; a reply without reasoning makes the row an error, as SpecForge
does.  The thinking model is the emulator's model-free backend with ``--emulate-thinking`` (Qwen3's answer
shape), served with ``--reasoning-parser qwen3``."""
from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from _emulator_support import Emulator
from _extract_support import run_job_to_end, write_spec
from test_emulator_openai import demo_model, server  # noqa: F401 - fixtures

from sessions.regeneration.rows import has_think_marker, output_problem

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("reasoning", ["disable", "none"])
def test_reasoning_disable_reaches_the_chat_template(home, cli_env, server, tmp_path, reasoning) -> None:  # noqa: F811
    dataset = tmp_path / "data.jsonl"
    dataset.write_text(json.dumps({"id": "a", "conversations": [
        {"role": "user", "content": "What is the capital city of France?"},
        {"role": "assistant", "content": "Paris."}]}) + "\n")
    spec = write_spec(tmp_path / "r.toml", mode="regenerate", name="r", dataset=dataset,
                      output=tmp_path / "o" / "r.jsonl", servers=[server.url("")], max_tokens=12,
                      temperature=0.0, reasoning=reasoning)
    done = run_job_to_end(spec, cli_env, home, "regenerate")
    assert done.state == "done", done.reason
    row = json.loads((tmp_path / "o" / "r.jsonl").read_text())
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="None", max_retries=0)
    kwargs = {"enable_thinking": False} if reasoning == "disable" else {}
    reply = client.chat.completions.create(model="demo", messages=row["conversations"][:1], max_tokens=12,
                                           temperature=0.0, extra_body={"chat_template_kwargs": kwargs})
    assert row["conversations"][1]["content"] == reply.choices[0].message.content
    other = client.chat.completions.create(
        model="demo", messages=row["conversations"][:1], max_tokens=12, temperature=0.0,
        extra_body={"chat_template_kwargs": {} if kwargs else {"enable_thinking": False}})
    assert other.usage.prompt_tokens != reply.usage.prompt_tokens  # the two renders really differ
    assert other.choices[0].message.content != reply.choices[0].message.content  # and so do their answers


@pytest.fixture
def thinking_server(tmp_path: Path, models):
    """A config-only model served with ``--reasoning-parser qwen3`` by a backend that thinks first (Qwen3's
    answer shape: ``<think>``, a thought, ``</think>``, the answer)."""
    emu = Emulator(tmp_path / "run", models["small"], "--served-model-name", "small", "--reasoning-parser", "qwen3",
                   "--emulate-thinking", tp=1)
    try:
        emu.wait_ready()
        yield emu
    finally:
        emu.kill()


def test_the_server_splits_a_thinking_answer_as_sglangs_qwen3_parser_does(thinking_server) -> None:
    client = openai.OpenAI(base_url=thinking_server.url("/v1"), api_key="None", max_retries=0)
    ask = [{"role": "user", "content": "What is the capital city of France?"}]
    thinking = client.chat.completions.create(model="small", messages=ask, max_tokens=200, temperature=0.0)
    message = thinking.choices[0].message
    reasoning = message.model_extra["reasoning_content"]  # SGLang's extra field, as SpecForge reads it
    assert reasoning.startswith("\nThe user asked something") and reasoning.endswith("answers.\n")
    assert message.content.startswith("\n\n") and message.content.strip()  # the rest after </think>, unstripped
    assert not has_think_marker(message.content) and not has_think_marker(reasoning)
    cut = client.chat.completions.create(model="small", messages=ask, max_tokens=20, temperature=0.0)
    assert cut.choices[0].message.content == "" and cut.choices[0].finish_reason == "length"  # still thinking
    assert cut.choices[0].message.model_extra["reasoning_content"] == reasoning[:20 - len("<think>")]
    off = client.chat.completions.create(model="small", messages=ask, max_tokens=200, temperature=0.0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.model_extra["reasoning_content"] is None and off.choices[0].message.content
    raw = client.chat.completions.create(model="small", messages=ask, max_tokens=200, temperature=0.0,
                                         extra_body={"separate_reasoning": False})
    assert raw.choices[0].message.content.startswith("<think>\nThe user asked")  # not split when asked not to
    streamed = client.chat.completions.create(model="small", messages=ask, max_tokens=200, temperature=0.0,
                                              stream=True)
    parts = {"reasoning": "", "content": ""}
    for chunk in streamed:
        if chunk.choices:
            delta = chunk.choices[0].delta
            parts["reasoning"] += (delta.model_extra or {}).get("reasoning_content") or ""
            parts["content"] += delta.content or ""
    assert parts == {"reasoning": reasoning, "content": message.content}


@pytest.mark.parametrize("reasoning", ["save", "disable", "none"])
def test_reasoning_save_keeps_the_reasoning_content_in_every_assistant_turn(
        home, cli_env, thinking_server, tmp_path, reasoning) -> None:
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"t{i}", "conversations": [
        {"role": "user", "content": f"Question {i}: what is the capital city of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "an old thought"},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome."}]}) + "\n" for i in range(3)))
    out = tmp_path / "o" / "r.jsonl"
    spec = write_spec(tmp_path / "r.toml", mode="regenerate", name="think", dataset=dataset, output=out,
                      servers=[thinking_server.url("")], max_tokens=200, temperature=0.0, reasoning=reasoning)
    done = run_job_to_end(spec, cli_env, home, "regenerate")
    assert done.state == "done", done.reason
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == ["t0", "t1", "t2"] and done.ok == 3
    client = openai.OpenAI(base_url=thinking_server.url("/v1"), api_key="None", max_retries=0)
    for row in rows:
        conv = row["conversations"]
        assert output_problem(row, reasoning) is None  # validate_regenerated_data.py, as SpecForge's recipe runs it
        for turn in (1, 3):
            kwargs = {"save": {"enable_thinking": True}, "disable": {"enable_thinking": False}}.get(reasoning, {})
            asked = [{"role": m["role"], "content": m["content"]} for m in conv[:turn]]  # no reasoning sent back
            reply = client.chat.completions.create(model="small", messages=asked, max_tokens=200, temperature=0.0,
                                                   extra_body={"chat_template_kwargs": kwargs}).choices[0].message
            assert conv[turn]["content"] == reply.content
            if reasoning == "save":  # kept as the server split it, next to the answer
                assert conv[turn]["reasoning_content"] == reply.model_extra["reasoning_content"]
                assert conv[turn]["reasoning_content"].strip()
            else:
                assert "reasoning_content" not in conv[turn]


def test_reasoning_save_puts_a_row_without_reasoning_in_the_error_file_as_specforge_does(
        home, cli_env, tmp_path, models) -> None:
    emu = Emulator(tmp_path / "run", models["small"], "--served-model-name", "small", tp=1)  # does not think
    try:
        emu.wait_ready()
        dataset = tmp_path / "data.jsonl"
        dataset.write_text(json.dumps({"id": "a", "conversations": [{"role": "user", "content": "Hi there!"}]}) + "\n")
        out = tmp_path / "o" / "r.jsonl"
        spec = write_spec(tmp_path / "r.toml", mode="regenerate", name="think", dataset=dataset, output=out,
                          servers=[emu.url("")], max_tokens=16, reasoning="save")
        done = run_job_to_end(spec, cli_env, home, "regenerate")
    finally:
        emu.kill()
    assert done.state == "done" and (done.ok, done.failed_lines) == (0, 1), done.reason
    error = json.loads((tmp_path / "o" / "r_error.jsonl").read_text())
    assert error["error"] == "Reasoning generation requires non-empty assistant content and reasoning_content"
