"""Secrets never reach a screen, a command preview or a bundle; ordinary log numbers stay readable."""
from sessions.redaction import REDACTED, is_secret_name, redact_argv, redact_env, redact_text


def test_secret_names_are_words_not_substrings():
    for name in ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "--api-key", "AWS_SECRET_ACCESS_KEY",
                 "apiKey", "DB_PASSWORD", "--admin-api-key"]:
        assert is_secret_name(name), name
    for name in ["num_tokens", "max_new_tokens", "tokenizer_path", "NCCL_ALGO", "http_proxy", "#tokens",
                 "max_total_num_tokens", "keyboard"]:
        assert not is_secret_name(name), name


def test_sglang_log_lines_keep_their_token_counts():
    line = "Capturing prefill shape (num_tokens=240 avail_mem=71.20 GB):  50%|#####     | 5/10"
    assert redact_text(line) == line
    kv = "[2026-11-01 10:00:05 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1045000, KV size: 8 GB"
    assert redact_text(kv) == kv


def test_server_args_dump_hides_the_api_key_in_both_repr_forms():
    dump = "server_args={'model_path': '/m', 'api_key': 'sk-live-abcdefghijklmnop', 'port': 30000}"
    out = redact_text(dump)
    assert "sk-live" not in out and "'port': 30000" in out
    out = redact_text("ServerArgs(model_path='/m', api_key='hunter2hunter2', port=30000)")
    assert "hunter2" not in out and "port=30000" in out


def test_known_values_and_token_shapes_are_redacted_anywhere():
    text = "loading with hf_abcdefghijklmnopqrstuvwxyz and Bearer abc.def.ghi-jkl and https://u:pw@host/x"
    out = redact_text(text + " my-own-value-1234", known_secrets=["my-own-value-1234"])
    for secret in ["hf_abcdefghijklmnopqrstuvwxyz", "abc.def.ghi-jkl", ":pw@", "my-own-value-1234"]:
        assert secret not in out
    assert out.count(REDACTED) == 4


def test_argv_and_env_redaction():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", "s3cr3t-value", "--admin-api-key=other-secret",
            "--tp-size", "8"]
    out = redact_argv(argv)
    assert "s3cr3t-value" not in out and "--admin-api-key=" + REDACTED in out and out[-1] == "8"
    assert redact_env({"HF_TOKEN": "hf_x", "NCCL_ALGO": "Ring"}) == {"HF_TOKEN": REDACTED, "NCCL_ALGO": "Ring"}


def test_sglang_counts_and_token_named_settings_are_not_secrets():
    # Prefill/decode lines count tokens with a leading "#" (sglang scheduler_metrics_mixin log lines).
    prefill = ("[2026-11-01 10:00:05 TP0] Prefill batch, #new-seq: 1, #new-token: 12, #cached-token: 0, "
               "token usage: 0.00, #running-req: 0, #queue-req: 0")
    assert redact_text(prefill) == prefill
    decode = "[2026-11-01 10:00:05 TP3] Decode batch, #running-req: 8, #token: 1234, token usage: 0.01"
    assert redact_text(decode) == decode
    # ServerArgs fields with "token" in their names, and unset secrets (None hides nothing).
    dump = ("server_args=ServerArgs(ds_heavy_token_num=256, speculative_token_map=None, "
            "bucket_time_to_first_token=None, kt_max_deferred_experts_per_token=None, api_key=None, "
            "prefill_delayer_token_usage_low_watermark=None)")
    assert redact_text(dump) == dump
    for name in ["access_token", "GITHUB_TOKEN", "token", "--hf-token"]:
        assert is_secret_name(name), name


def test_a_quoted_secret_is_hidden_whole():
    out = redact_text("ServerArgs(admin_api_key=\"two words\", port=30000)")
    assert "two" not in out and "words" not in out and "port=30000" in out
    assert redact_text("password: hunter22") == f"password: {REDACTED}"
