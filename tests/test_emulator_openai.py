"""The emulator's ``/v1/chat/completions`` against the real ``openai`` client (SpecForge's regenerate script
uses it): the server applies the tiny real model's chat template, streaming and non-streaming shapes,
``usage``, ``finish_reason``, ``chat_template_kwargs``, ``/v1/models`` and SGLang's error shape."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import openai
import pytest
from _emulator_support import Emulator, http, http_json

MESSAGES = [{"role": "system", "content": "You are brief."},
            {"role": "user", "content": "What is the capital city of France?"}]


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sessions.demo_model import write_demo_model

    model = write_demo_model(tmp_path_factory.mktemp("models") / "demo", num_layers=8, hidden_size=64)
    # The template also reads a kwarg, so that chat_template_kwargs visibly reach it (as Qwen3's
    # enable_thinking does).
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% if enable_thinking is defined and not enable_thinking %}{{ '<|im_start|>system\\n/no_think<|im_end|>\\n' }}"
        "{% endif %}" + config["chat_template"])
    config_path.write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_model: Path):
    emu = Emulator(tmp_path_factory.mktemp("run"), demo_model, "--served-model-name", "demo", tp=1)
    try:
        emu.wait_ready()
        yield emu
    finally:
        emu.kill()


@pytest.fixture(scope="module")
def tokenizer(demo_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model, local_files_only=True)


@pytest.fixture
def client(server: Emulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="None", max_retries=0)


def test_the_server_applies_the_models_chat_template_and_reports_usage(client, server, tokenizer) -> None:
    ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    resp = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=12, temperature=0)
    assert resp.object == "chat.completion" and resp.model == "demo"
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert resp.usage.prompt_tokens == len(ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    # The same ids through /generate give the same greedy answer: the chat endpoint rendered the template.
    status, gen = http_json("POST", server.url("/generate"),
                            {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
    assert status == 200
    assert choice.message.content == gen["text"]
    assert resp.usage.completion_tokens == gen["meta_info"]["completion_tokens"]
    expected = "length" if gen["meta_info"]["finish_reason"]["type"] == "length" else "stop"
    assert choice.finish_reason == expected


def test_max_tokens_cuts_the_answer_with_finish_reason_length(client) -> None:
    resp = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=3, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 3


def test_chat_template_kwargs_reach_the_template(client, tokenizer) -> None:
    plain = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=1)
    off = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=1,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False,
                                        enable_thinking=False)
    assert off.usage.prompt_tokens == len(ids) > plain.usage.prompt_tokens


def test_streaming_deltas_add_up_to_the_whole_answer(client) -> None:
    whole = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_models_list_names_the_served_model(client) -> None:
    assert [m.id for m in client.models.list().data] == ["demo"]


def test_bad_requests_get_sglangs_error_shape_and_status(client, server) -> None:
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model="demo", messages=[], max_tokens=4)
    assert empty.value.status_code == 400
    assert empty.value.body == {"object": "error", "message": "Messages cannot be empty.",
                                "type": "BadRequestError", "param": None, "code": 400}
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=10**7)
    assert "maximum context length" in long.value.body["message"]
    # A body that does not validate: 400 "Bad Request" (SGLang replaces FastAPI's 422), at the top level.
    status, body = http_json("POST", server.url("/v1/chat/completions"), {"model": "demo"})
    assert status == 400 and body["object"] == "error" and body["type"] == "Bad Request"
    assert "messages" in body["message"] and body["code"] == 400
    status, raw = http("POST", server.url("/v1/chat/completions"), {"messages": "hi"})
    assert status == 400 and json.loads(raw)["type"] == "Bad Request"
    # A refusal of a streaming request is still an HTTP error (SGLang kick-starts the generator first).
    with pytest.raises(openai.BadRequestError):
        list(client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=10**7, stream=True))


def test_a_config_only_model_dir_is_rendered_as_chatml(tmp_path, demo_model) -> None:
    """Without tokenizer files (the fixed backend) the emulator still answers chat, from ChatML text."""
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(demo_model / "config.json", bare / "config.json")
    emu = Emulator(tmp_path / "run", bare, tp=1)
    try:
        emu.wait_ready()
        client = openai.OpenAI(base_url=emu.url("/v1"), api_key="None", max_retries=0)
        resp = client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=5)
        rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in MESSAGES)
        rendered += "<|im_start|>assistant\n"
        assert resp.usage.prompt_tokens == len(rendered.encode())  # the fixed backend: one token per byte
        assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 5
    finally:
        emu.kill()
