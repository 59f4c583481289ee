"""The catalogue of secret names and value shapes (issue 22 item 13), both ways: each secret is hidden,
each look-alike is not.  Then records (bench results, history, start facts) redacted by key and by value,
and a look over the tree: no module outside `sessions.redaction` builds its own secret pattern."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import tomli_w

from sessions.redaction import (
    RECORD_MAX_DEPTH,
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_record,
    redact_text,
)

SECRET_NAMES = [
    # the field's usual ones
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "WANDB_API_KEY", "WANDB_KEY", "OPENAI_API_KEY",
    "OPENAI_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_KEY", "GITHUB_TOKEN", "GH_TOKEN", "GH_PAT", "GITLAB_TOKEN",
    "GITLAB_PAT", "CI_JOB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID",
    "SGLANG_S3_SECRET_ACCESS_KEY", "NGC_API_KEY", "CRUSOE_API_KEY",
    # *_KEY, *_TOKEN*, *PASS*, *SECRET*, *_PAT, numbered variants
    "DB_PASS", "SMTP_PASS", "PASS", "PASSWORD", "PASSWORD2", "DB_PASSWORD", "SMTP_PASSWD", "rootPassword",
    "dbpassword", "MYSQL_PWD", "DB_PW", "TOKEN", "TOKEN2", "HF_TOKEN_1", "HF_TOKEN2", "ACCESS_TOKEN_3",
    "CLIENT_SECRET", "CLIENT_SECRET_2", "clientSecret", "MY_SECRETS", "SIGNING_KEY", "STRIPE_KEY",
    "apiKey", "accessToken", "x-api-key", "--api-key", "--admin-api-key", "--hf-token", "--token",
    "ssl_keyfile_password", "--control-plane-api-keys", "Authorization", "Cookie", "PASSPHRASE",
    # adv22: shown raw in `profile command` before
    "MY_SERVICE_CREDS", "AWS_CRED", "SLACK_WEBHOOK_URL", "DISCORD_WEBHOOK", "JWT", "SERVICE_JWT", "BEARER",
]
NOT_SECRET_NAMES = [
    "PWD", "OLDPWD", "PATH", "HOME", "USER", "num_tokens", "max_new_tokens", "tokenizer_path", "NCCL_ALGO",
    "http_proxy", "#tokens", "#new-token", "max_total_num_tokens", "keyboard", "KEY", "PAT", "eos_token",
    "speculative_token_map", "ds_heavy_token_num", "bucket_time_to_first_token", "enable_forward_pass_metrics",
    "SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES", "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", "SGLANG_LOG_DECODE_GRAPH_KEY",
    "COMPASS_DIR", "NCCL_BYPASS", "SGLANG_DEEPEP_BF16_DISPATCH", "ssl_keyfile", "SORT_KEY", "CACHE_KEY",
    "passthrough", "PATTERN", "SPEC_PATH", "token_usage", "TOKENIZERS_PARALLELISM",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_are_hidden(name: str) -> None:
    assert is_secret_name(name), name
    assert redact_env({name: "value-of-it-1234"}) == {name: REDACTED}
    assert REDACTED in redact_text(f"{name}=value-of-it-1234") and "value-of-it" not in redact_text(
        f"{name}=value-of-it-1234")


def test_every_catalogued_word_passes_the_quick_gate_of_free_text() -> None:
    """`redact_text` scans assignments only in text holding a hint; a catalogued word no hint covers would
    be hidden in an env table and shown raw in a log line."""
    from sessions import redaction

    words = (redaction._SECRET_WORDS | redaction._LAST_WORD_SECRETS | set(redaction._SECRET_SUFFIXES)
             | {w for pair in redaction._SECRET_PAIRS for w in pair if is_secret_name(w)} | {"token"})
    uncovered = sorted(w for w in words if not any(h in w for h in redaction._NAME_HINTS))
    assert not uncovered, uncovered


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_ordinary_names_are_not_hidden(name: str) -> None:
    assert not is_secret_name(name), name
    assert redact_env({name: "/home/u/launch-dir"}) == {name: "/home/u/launch-dir"}
    assert redact_text(f"{name}=/home/u/launch-dir") == f"{name}=/home/u/launch-dir"


# (text, the secret part that must go, what must stay)
SHAPES = [
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
     "eyJhbGciOiJIUzI1NiJ9", "jwt "),
    ("hf hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 end", "hf_AbCdEf", "hf "),
    ("openai sk-proj-AbCdEfGh12345678IjKl end", "sk-proj", "openai "),
    ("anthropic sk-ant-api03-AbCdEfGh12345678-IjKl end", "sk-ant", "anthropic "),
    ("gh ghp_AbCdEfGhIjKlMnOpQrStUvWxYz012345 end", "ghp_", "gh "),
    ("gh github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ end", "github_pat_", "gh "),
    ("gl glpat-Ab12Cd34Ef56Gh78Ij90 end", "glpat-", "gl "),
    ("slack xoxb-1234567890-abcdefghij end", "xoxb-", "slack "),
    ("aws AKIAIOSFODNN7EXAMPLE and ASIAIOSFODNN7EXAMPLE end", "IOSFODNN7", "aws "),
    ("Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy", "Authorization: Basic "),
    ("curl -u x -H 'Authorization: Bearer abcDEF123456.xyz'", "abcDEF123456", "Authorization: Bearer "),
    ("header Basic dXNlcjpodW50ZXIy sent", "dXNlcjpodW50ZXIy", " sent"),
    ("Authorization: Token abcdef0123456789", "abcdef0123456789", "Authorization: Token "),
    ("db postgres://admin:p@ss/w0rd@db.internal:5432/x", "w0rd", "@db.internal:5432/x"),
    ("git https://oauth2:s3cr3tv4lue@gitlab.example/x.git", "s3cr3tv4lue", "https://oauth2:"),
    ("redis redis://:hunter2hunter2@cache:6379/0", "hunter2", "@cache:6379/0"),
    ("python -m sglang.launch_server --api-key MyServerKey-Zq81x --port 30000", "MyServerKey", "--port 30000"),
    ('extra_args = ["--api-key", "MyServerKey-Zq81x", "--tp", "8"]', "MyServerKey", '"--tp", "8"'),
    ('DB_PASSWORD = "pa\\"ss\\\\wo\\nrd-Zz9"', "ss\\\\wo", "DB_PASSWORD = "),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA", ""),
    ("ngc nvapi-AbCdEfGh12345678IjKlMnOp end", "nvapi-AbCd", "ngc "),
    ("gcp AIzaSyA1234567890abcdefghijklmnopqrstuv end", "AIzaSyA123", "gcp "),
    # a secret assignment right after a name and a value that hide nothing (adv22: the match of
    # ``export HF_TOKEN`` or ``https://h/x?token`` used to swallow the secret's name)
    ("export HF_TOKEN=value-of-it-1234", "value-of-it", "export HF_TOKEN="),
    ("docker run -e HF_TOKEN=value-of-it-1234 img", "value-of-it", " img"),
    ("GET http://h:30000/generate?token=value-of-it-1234 HTTP/1.1", "value-of-it", " HTTP/1.1"),
    ("see https://hf.co/api/models?access_token=value-of-it-1234", "value-of-it", "https://hf.co/api/models?"),
    ("wandb https://api.wandb.ai/x?api_key=value-of-it-1234", "value-of-it", "wandb https://api.wandb.ai/x?"),
]
NOT_SECRET_TEXTS = [
    "Basic checks passed; Bearer tokens are fine",
    "Capturing prefill shape (num_tokens=240 avail_mem=71.20 GB):  50%|#####     | 5/10",
    "Decode batch, #running-req: 8, #token: 1234, token usage: 0.01, gen throughput (token/s): 85.2",
    "see https://github.com/sgl-project/sglang/blob/main/x.py and http://127.0.0.1:30000/ready",
    "task-0123456789abcdefgh done; ask-abcdefghijklmnopq",
    "PWD=/home/u/launch OLDPWD=/home/u",
    "--tokenizer-path /m --max-new-tokens 128 --speculative-token-map /m/map.pt",
    "enable_forward_pass_metrics=True, prefill_delayer_max_delay_passes=3",
    "eyJ alone is no token; sk- neither",
    "user@example.com wrote http://example.com/a@b",
]


@pytest.mark.parametrize(("text", "secret", "kept"), SHAPES)
def test_secret_shapes_are_hidden_whole(text: str, secret: str, kept: str) -> None:
    out = redact_text(text)
    assert secret not in out, out
    assert REDACTED in out and kept in out, out


@pytest.mark.parametrize("text", NOT_SECRET_TEXTS)
def test_look_alikes_are_not_hidden(text: str) -> None:
    assert redact_text(text) == text


def test_every_shape_in_the_catalogue_is_caught_by_its_example() -> None:
    """Each catalogued shape has a row above (the one-pass pattern only tries positions where a shape may
    begin: a shape whose first characters were declared wrong would never match)."""
    from sessions.redaction import SECRET_SHAPES

    examples = [text for text, _, _ in SHAPES]
    for name, (_, pattern) in SECRET_SHAPES.items():
        hits = [t for t in examples if re.search(pattern, t)]
        assert hits, f"no example for the {name} shape"
        assert all(REDACTED in redact_text(t) for t in hits), name


def test_an_argv_hides_flag_values_and_shapes_everywhere() -> None:
    out = redact_argv(["python", "--api-key", "k-1234567", "--password=pw-123456", "-H",
                       "Authorization: Basic dXNlcjpodW50ZXIy", "--model-path", "/m", "--token2", "t-12345678"])
    assert out == ["python", "--api-key", REDACTED, f"--password={REDACTED}", "-H",
                   f"Authorization: Basic {REDACTED}", "--model-path", "/m", "--token2", REDACTED]


def test_env_values_are_redacted_by_shape_under_any_name() -> None:
    env = {"FOO": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", "DATABASE_URL": "postgres://u:pw-secret-1@db/x",
           "PWD": "/srv/launch", "CUDA_VISIBLE_DEVICES": "0,1"}
    out = redact_env(env)
    assert out == {"FOO": REDACTED, "DATABASE_URL": f"postgres://u:{REDACTED}@db/x", "PWD": "/srv/launch",
                   "CUDA_VISIBLE_DEVICES": "0,1"}


def test_a_record_is_redacted_by_key_and_by_value() -> None:
    """A bench result as the bench writes it: the profile TOML raw, the command, env, nested runs."""
    toml = tomli_w.dumps({"server": {"model_path": "/m", "extra_args": ["--api-key", "MyServerKey-Zq81x"],
                                     "env": {"HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
                                             "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
                                             "DB_URL": "mysql://root:Sup3r-S3cret@db/x", "PWD": "/srv/a"}}})
    record = {
        "profile": "p", "profile_toml": toml, "time": 1.5, "ok": True, "none": None,
        "command": ["python", "-m", "sglang.launch_server", "--api-key", "MyServerKey-Zq81x", "--tp", "8"],
        "env": {"OPENAI_KEY": "plain-openai-value", "PWD": "/srv/a", "n": 3},
        "credentials": {"user": "me", "password": "nested-pass-99", "port": 5432},
        "runs": [{"concurrency": 8, "output_throughput": 123.4, "note": "ran with Bearer abcdefgh12345678"}],
    }
    before = json.dumps(record)
    out = redact_record(record)
    assert json.dumps(record) == before  # the input is not changed
    text = json.dumps(out)
    for secret in ["MyServerKey", "hf_AbCd", "0123456789abcdef0123456789abcdef01234567", "Sup3r-S3cret",
                   "plain-openai-value", "nested-pass-99", "abcdefgh12345678"]:
        assert secret not in text, secret
    assert out["credentials"] == {"user": REDACTED, "password": REDACTED, "port": REDACTED}
    assert out["env"]["PWD"] == "/srv/a" and out["env"]["n"] == 3 and out["time"] == 1.5 and out["ok"] is True
    assert out["runs"][0]["concurrency"] == 8 and out["runs"][0]["output_throughput"] == 123.4
    assert out["command"][-2:] == ["--tp", "8"] and 'PWD = "/srv/a"' in out["profile_toml"]
    assert out["none"] is None


def test_a_deep_record_is_hidden_below_the_depth_limit_never_a_recursion_error() -> None:
    deep: object = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"
    for _ in range(RECORD_MAX_DEPTH * 100):
        deep = {"a": [deep]}
    out = redact_record(deep)
    assert "hf_AbCd" not in json.dumps(out)[:1000]  # walked to the limit, then hidden whole
    node = out
    levels = 0
    while isinstance(node, dict):
        node, levels = node["a"], levels + 1
        node = node[0] if isinstance(node, list) else node
    assert node == REDACTED and levels <= RECORD_MAX_DEPTH


# --- one redaction module for the whole tree ----------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
# Words and shapes that only a secret pattern would hold; a regex in another module holding one of these
# is a second, private catalogue that the next secret shape will miss.
_SECRET_PATTERN_HINT = re.compile(
    r"(?i:token|secret|passw|bearer|basic\\s|api.?key|authoriz|cookie|credential|github_pat|glpat|private key)"
    r"|hf_|sk-|gh[pousr]_|AKIA|eyJ|://[^/]*:[^/]*@"
)
_RE_FUNCS = {"compile", "sub", "subn", "search", "match", "fullmatch", "findall", "finditer", "split"}
# Regexes that hold one of the words above but match no secret (each one read and kept on purpose).
_ALLOWED = {
    ("sessions/logs/lines.py", "(DP|PP|ATTN_CP|MOE_DP|CP|TP|EP)(\\d+)"),
}


def _regex_literals(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _RE_FUNCS and isinstance(func.value, ast.Name) \
                and func.value.id in ("re", "regex"):
            for part in ast.walk(node.args[0]):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found.append((node.lineno, part.value))
    return found


def test_no_module_outside_the_redaction_module_builds_a_secret_pattern() -> None:
    offenders = []
    for folder in ("sessions", "app", "widgets", "benches"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "sessions/redaction.py":
                continue
            tree = ast.parse(path.read_text(), rel)
            for lineno, pattern in _regex_literals(tree):
                if _SECRET_PATTERN_HINT.search(pattern) and (rel, pattern) not in _ALLOWED:
                    offenders.append(f"{rel}:{lineno}: {pattern!r}")
    assert not offenders, ("secret patterns belong in sessions/redaction.py (its catalogues): "
                           + "; ".join(offenders))


def test_the_tree_check_sees_a_planted_private_secret_regex(tmp_path: Path) -> None:
    planted = ast.parse('import re\n_MINE = re.compile(r"(?i)(api[_-]?key|token)=\\S+")\n')
    assert any(_SECRET_PATTERN_HINT.search(p) for _, p in _regex_literals(planted))


def test_profile_command_hides_the_catalogued_names_and_keeps_pwd(make_emulator_profile) -> None:
    """`profile command` (and the launch's command.json, built from the same redacted argv and env)."""
    from sessions.profiles import build_command

    secrets = {"OPENAI_KEY": "openai-raw-1", "ANTHROPIC_KEY": "anthropic-raw", "WANDB_KEY": "wandb-raw-12",
               "DB_PASS": "dbpass-raw-1", "PASSWORD2": "password2-raw", "TOKEN2": "token2-raw-1",
               "HF_TOKEN_1": "hftoken1-raw", "GH_PAT": "ghpat-raw-12"}
    profile = make_emulator_profile("names", tp=1, env={**secrets, "PWD": "/srv/launch-a"},
                                    extra_args=["--api-key", "apikey-raw-12"])
    text = build_command(profile).shell_text(redacted=True)
    assert not [v for v in [*secrets.values(), "apikey-raw-12"] if v in text], text
    assert "PWD=/srv/launch-a" in text and all(f"{name}='{REDACTED}'" in text for name in secrets)


def test_a_crash_file_keeps_a_redacted_traceback(home) -> None:
    from app.tui import write_crash_file

    try:
        raise RuntimeError("launch failed: --api-key sk-live-abcdefghijklmnop via https://u:Pw-Secret-9@h/x")
    except RuntimeError as exc:
        path = write_crash_file(home, exc)
    assert path is not None
    text = path.read_text()
    assert "RuntimeError: launch failed" in text and "sk-live" not in text and "Pw-Secret-9" not in text


def test_a_job_log_line_is_redacted(capsys) -> None:
    from sessions.extraction.run_report import log_line

    log_line("j", "connecting via http://user:Pw-Secret-9@127.0.0.1:30000 with Bearer abcdefgh12345678")
    out = capsys.readouterr().out
    assert "[j] connecting via http://user:***@127.0.0.1:30000" in out and "abcdefgh12345678" not in out
