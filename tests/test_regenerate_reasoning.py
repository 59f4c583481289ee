"""``reasoning = "disable"`` sends ``chat_template_kwargs.enable_thinking = false`` (SpecForge's
``--reasoning disable``): against a template that reads the kwarg, each regenerated answer is the server's
reply to the history rendered with it."""
from __future__ import annotations

import json

import openai
import pytest
from _extract_support import run_job_to_end, write_spec
from test_emulator_openai import demo_model, server  # noqa: F401 - fixtures

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
