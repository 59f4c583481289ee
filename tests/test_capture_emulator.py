"""End to end on the emulator: a capture launch dumps exactly the tiny model's HF hidden states.

The reference is computed here with transformers on the same demo model: aux rows = HF
``hidden_states[p]`` for the physical points p (the input of decoder layer p), ``last`` = the post-norm
final state.  bf16 rounding of values computed in float32 along a different path (chunked with a KV
cache vs one full forward) may differ by one bf16 step; a wrong layer differs by far more, which the
tests check too.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from sessions.capture.plugin.eagle3_capture.spec import ENV_NAME, CaptureSpec
from sessions.capture.writer import chunks_complete, list_chunks, read_chunk_metadata, read_chunks
from sessions.extraction.collector import wait_for_dumps

BF16_RTOL = 2**-7  # one bf16 step relative to the value, plus rounding of both sides
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory) -> Path:
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "tiny-llama", seed=3)


@pytest.fixture(scope="module")
def hf_model(demo_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo_model, local_files_only=True, dtype=torch.float32).eval()


def reference(hf_model, ids: list[int], points: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        out = hf_model.model(torch.tensor([ids]), output_hidden_states=True)
    aux = torch.cat([out.hidden_states[p][0] for p in points], dim=-1)
    return aux, out.last_hidden_state[0]


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    diff = (got.float() - want).abs()
    bound = BF16_RTOL * want.abs() + 1e-6
    assert bool((diff <= bound).all()), f"max excess {(diff - bound).max().item()}"


def test_demo_model_is_a_real_model_with_a_chat_template(demo_model):
    from transformers import AutoTokenizer

    config = json.loads((demo_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] >= 8
    tok = AutoTokenizer.from_pretrained(demo_model, local_files_only=True)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.encode("The capital city of France is Paris.")) == "The capital city of France is Paris."


def test_demo_model_weights_match_the_hf_architectures_exactly(demo_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from sessions.demo_model import write_demo_model

    for path in (demo_model, write_demo_model(tmp_path / "qwen2", arch="qwen2", seed=1)):
        model, info = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, output_loading_info=True)
        assert type(model).__name__ == json.loads((path / "config.json").read_text())["architectures"][0]
        assert {k: v for k, v in info.items() if v} == {}  # no missing, unexpected or mismatched weights


def test_a_thin_demo_model_keeps_the_hidden_size_and_loads_exactly(tmp_path):
    """The extraction bench's CPU model: the real width (the dumps' size), 2 heads and a narrow MLP."""
    from transformers import AutoModelForCausalLM

    from sessions.demo_model import DemoModelError, write_demo_model

    path = write_demo_model(tmp_path / "thin", hidden_size=256, attention_heads=2, intermediate_size=32)
    config = json.loads((path / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"], config["intermediate_size"]) == (256, 2, 1, 16, 32)
    model, info = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}
    out = model(torch.tensor([[10, 11, 12]]), output_hidden_states=True)
    assert out.hidden_states[-1].shape == (1, 3, 256)
    with pytest.raises(DemoModelError, match="attention_heads"):
        write_demo_model(tmp_path / "bad", attention_heads=0)


def test_demo_model_weights_are_seeded(demo_model, tmp_path):
    from safetensors.torch import load_file

    from sessions.demo_model import write_demo_model

    again = write_demo_model(tmp_path / "again", seed=3)
    other = write_demo_model(tmp_path / "other", seed=4)
    a, b, c = (load_file(str(p / "model.safetensors")) for p in (demo_model, again, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_model_backend_dumps_chunked_prompts_equal_to_hf_hidden_states(demo_model, hf_model, tmp_path):
    from sessions.emulator.model_backend import ModelBackend

    cap = tmp_path / "cap"
    env = {ENV_NAME: CaptureSpec(dir=str(cap), rid_prefix="eagle3-", fsync=False).to_json()}
    flags = ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
             "--return-aux-hidden-state-layer-ids", "1", "3", "5", "--chunked-prefill-size", "16"]
    backend = ModelBackend(demo_model, flags, environ=env, device="cpu")
    assert backend.layers_to_capture == [2, 4, 6]  # Llama family: ids + 1
    assert backend.capture_log_line == (
        f"eagle3-capture active: layers_to_capture=[2, 4, 6], dir={cap}, rid_prefix=eagle3-")
    prompt = list(range(10, 50))  # 40 tokens: chunks 0-16, 16-32, 32-40
    response = backend.generate({"input_ids": prompt, "rid": "eagle3-job-0",
                                 "sampling_params": {"max_new_tokens": 1}})
    assert response["meta_info"]["prompt_tokens"] == 40 and len(response["output_ids"]) == 1
    backend.flush()  # the dumps go through the plugin's background writer, as in SGLang
    assert [c.name for c in list_chunks(cap, "eagle3-job-0")] == [
        "0-16.safetensors", "16-32.safetensors", "32-40.safetensors"]
    aux, last, ids = read_chunks(cap, "eagle3-job-0", expected_tokens=40)
    want_aux, want_last = reference(hf_model, prompt, [2, 4, 6])
    assert ids.tolist() == prompt
    assert_bf16_close(aux, want_aux)
    assert_bf16_close(last, want_last)
    # the check discriminates: the next layer over is far off
    wrong, _ = reference(hf_model, prompt, [3, 5, 7])
    assert not torch.allclose(aux.float(), wrong, rtol=BF16_RTOL, atol=1e-3)
    meta = read_chunk_metadata(cap, "eagle3-job-0")
    assert json.loads(meta["layers"]) == [2, 4, 6] and meta["hidden_size"] == "64"


def test_model_backend_skips_other_rids_and_answers_hidden_states_like_sglang(demo_model, hf_model, tmp_path):
    from sessions.emulator.model_backend import ModelBackend, ModelBackendError

    cap = tmp_path / "cap"
    env = {ENV_NAME: CaptureSpec(dir=str(cap), rid_prefix="eagle3-", fsync=False).to_json()}
    flags = {"enable_return_aux_hidden_states": True, "speculative_algorithm": "EAGLE3",
             "chunked_prefill_size": 8}
    backend = ModelBackend(demo_model, flags, environ=env, device="cpu")
    assert backend.layers_to_capture == [2, 4, 5]  # SGLang's default [2, L//2, L-3] for L=8
    prompt = list(range(100, 120))
    response = backend.generate({"input_ids": prompt, "rid": "HEALTH_CHECK_1", "return_hidden_states": True,
                                 "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    assert not cap.exists()  # not the job's prefix
    hidden = response["meta_info"]["hidden_states"]
    # SGLang's HTTP path: the prefill element holds only the LAST chunk's rows (16-20), then one row per
    # decode step (sglang-facts §2.2, §4.8)
    assert len(hidden) == 1 + 2 and len(hidden[0]) == 4 and len(hidden[0][0]) == 3 * 64
    assert len(hidden[1]) == 3 * 64
    want_aux, _ = reference(hf_model, prompt, [2, 4, 5])
    assert torch.allclose(torch.tensor(hidden[0]), want_aux[16:20], rtol=1e-4, atol=1e-5)
    plain = ModelBackend(demo_model, [], environ={}, device="cpu")
    with pytest.raises(ModelBackendError, match="not configured to return hidden states"):
        plain.generate({"input_ids": prompt, "return_hidden_states": True})


def test_model_backend_refuses_what_sglang_refuses(demo_model):
    from sessions.emulator.model_backend import capture_config

    with pytest.raises(ValueError, match="out of range for a target with 8 layers"):
        capture_config(demo_model, ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
                                    "--return-aux-hidden-state-layer-ids", "1", "8"])
    with pytest.raises(ValueError, match="requires --enable-return-aux-hidden-states"):
        capture_config(demo_model, ["--return-aux-hidden-state-layer-ids", "1"])
    with pytest.raises(ValueError, match="fewer aux hidden states"):
        capture_config(demo_model, ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
                                    "--return-aux-hidden-state-layer-ids", "1", "7"])


def test_capture_launch_through_server_session_dumps_the_models_hidden_states(
        demo_model, hf_model, make_emulator_profile, launched, home, tmp_path):
    """Toggle capture on a profile, launch it as a session, send a job request, read the dump."""
    import httpx

    from sessions.profiles.capture_toggle import capture_status, toggle_capture

    cap = tmp_path / "cap"
    profile = make_emulator_profile("capture-e2e", tp=2, model_path=str(demo_model), chunked_prefill_size=12,
                                    capture={"enabled": False, "dir": str(cap), "layers": [2, 4, 5]})
    profile = toggle_capture(profile)
    assert profile.capture.enabled
    session = launched.launch(profile)
    end = time.monotonic() + DEADLINE_S
    status = session.status()
    while status.state != "ready":
        assert status.state not in ("crashed", "exited"), session.log_path.read_text()[-3000:]
        assert time.monotonic() < end, session.log_path.read_text()[-3000:]
        time.sleep(0.1)
        status = session.status()
    launched.remember(session)
    log = session.log_path.read_text()
    assert f"eagle3-capture active: layers_to_capture=[2, 4, 5], dir={cap}, rid_prefix=eagle3-" in log
    prompt = list(range(200, 230))
    url = f"http://127.0.0.1:{status.port}/generate"
    response = httpx.post(url, json={"input_ids": prompt, "rid": "eagle3-e2e-0",
                                     "sampling_params": {"max_new_tokens": 1}}, timeout=60)
    assert response.status_code == 200, response.text
    # The response may come before the background writer renamed the last chunk into place: wait as the
    # collector does (bounded; AttemptFailed names what is missing).
    wait_for_dumps(cap, "eagle3-e2e-0", len(prompt), timeout_s=DEADLINE_S)
    assert chunks_complete(cap, "eagle3-e2e-0", len(prompt))
    assert [c.name for c in list_chunks(cap, "eagle3-e2e-0")] == [
        "0-12.safetensors", "12-24.safetensors", "24-30.safetensors"]
    aux, last, ids = read_chunks(cap, "eagle3-e2e-0", expected_tokens=len(prompt))
    want_aux, want_last = reference(hf_model, prompt, [2, 4, 5])
    assert ids.tolist() == prompt
    assert_bf16_close(aux, want_aux)
    assert_bf16_close(last, want_last)
    shown = capture_status(profile)
    assert shown.file_count == 3 and shown.points == (2, 4, 5) and shown.draft_ids == (1, 3, 4)


def test_the_model_backend_refuses_prompts_over_the_context_length_with_sglangs_texts(demo_model):
    """tokenizer_manager.py:1333-1378: a prompt as long as the context, or one whose max_new_tokens would
    not fit, is refused at once (an over-long prompt used to be prefilled for minutes)."""
    from sessions.emulator.backend import RequestError
    from sessions.emulator.model_backend import ModelBackend

    backend = ModelBackend(demo_model, ["--context-length", "64"], environ={}, device="cpu")
    with pytest.raises(RequestError, match=r"^The input \(64 tokens\) is longer than the model's context "
                                           r"length \(64 tokens\)\.$"):
        backend.generate_steps({"input_ids": [5] * 64, "sampling_params": {"max_new_tokens": 1}})
    with pytest.raises(RequestError, match=r"^Requested token count exceeds the model's maximum context length "
                                           r"of 64 tokens\. You requested a total of 70 tokens: 60 tokens"):
        backend.generate_steps({"input_ids": [5] * 60, "sampling_params": {"max_new_tokens": 10}})
    backend.generate_steps({"input_ids": [5] * 30, "sampling_params": {"max_new_tokens": 10}})
