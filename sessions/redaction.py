"""Secret redaction for everything that reaches a screen, a log we write, a command preview or a bundle.

A value is secret when its variable or flag name looks secret (token, key, secret, password, ...),
or when it has the shape of a well-known credential (``hf_…``, ``sk-…``, bearer tokens, URL passwords).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

REDACTED = "***"

# A name is secret when one of its words (split on _, -, ., camelCase) is a secret word, or when two
# adjacent words form one ("api key").  Words, not substrings: `num_tokens`, `max_new_tokens` and
# `tokenizer_path` are not secrets, `HF_TOKEN` and `WANDB_API_KEY` are.
_SECRET_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "pwd", "apikey", "credential", "credentials", "auth",
     "authorization", "cookie", "passphrase", "privatekey", "accesskey"}
)
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("session", "key"),
                           ("secret", "key"), ("admin", "key")})
# "token" names a credential as the last word of a name (HF_TOKEN, access_token, --token), not before
# another word (speculative_token_map, ds_heavy_token_num, token_usage) nor after a word that makes it a
# position, a count or a kind of token (bucket_time_to_first_token, kt_max_deferred_experts_per_token,
# eos_token: SGLang server_args fields).
_TOKEN_NOT_SECRET_AFTER = frozenset(
    {"per", "first", "last", "next", "new", "cached", "num", "max", "min", "total", "input", "output",
     "eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "image", "video", "audio", "start", "end"}
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# Flags whose next argv element is a secret (SGLang has --api-key and --admin-api-key).
SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key", "--hf-token", "--token"})

_SECRET_VALUE_PATTERN_LIST = [
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),  # Hugging Face tokens
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}\b"),  # OpenAI-style keys
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"),  # GitHub tokens
    re.compile(r"\bxox[abpr]-[A-Za-z0-9\-]{10,}\b"),  # Slack tokens
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key ids
]
# One pass over the text for every credential shape (a log line at 100 lines/s is redacted as it is shown).
_SECRET_VALUE = re.compile("|".join(f"(?:{p.pattern})" for p in _SECRET_VALUE_PATTERN_LIST))
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-~+/]{8,}=*")
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)[^@\s/]+(@)")
# ``name=value``, ``'name': 'value'``, ``name: value``; a quoted value is taken whole (spaces and all).
# A leading ``#`` belongs to the name (SGLang's counts, see is_secret_name).
_ASSIGNMENT = re.compile(
    r"(?P<name>#?\b[A-Za-z_][A-Za-z0-9_\-]*)(?P<nq>['\"]?)(?P<sep>\s*[=:]\s*|\s+)"
    r"(?P<value>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\",(){}\[\]=]+)"
)
# Only text holding one of these (lowercased) can hold a secret name; the rest skips the assignment scan.
_NAME_HINTS = ("token", "secret", "pass", "pwd", "credential", "auth", "cookie", "key")


@functools.lru_cache(maxsize=4096)  # log lines repeat the same few names every second
def is_secret_name(name: str) -> bool:
    """True when an env var / flag / key name looks like it holds a secret.

    A name written ``#name`` is a count (SGLang's ``#new-token: 12``, ``#cached-token: 0``), never a secret.
    """
    if name.startswith("#"):
        return False
    words = [w.lower() for w in _WORD_SPLIT.split(name) if w]
    for i, word in enumerate(words):
        if word == "token":
            if i == len(words) - 1 and (i == 0 or words[i - 1] not in _TOKEN_NOT_SECRET_AFTER):
                return True
        elif word in _SECRET_WORDS:
            return True
    return any(pair in _SECRET_PAIRS for pair in zip(words, words[1:]))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) and v else v) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("--") and "=" in arg:
            flag, _, _ = arg.partition("=")
            if flag in SECRET_FLAGS or is_secret_name(flag):
                out.append(f"{flag}={REDACTED}")
                continue
        if arg in SECRET_FLAGS or (arg.startswith("--") and is_secret_name(arg)):
            hide_next = True
        out.append(redact_text(arg))
    return out


def redact_text(text: str, known_secrets: Iterable[str] = ()) -> str:
    """Redact known secret values and credential-shaped substrings from free text."""
    for secret in sorted({s for s in known_secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _SECRET_VALUE.sub(REDACTED, text)
    low = text.lower()
    if "bearer" in low:
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(2), text)
    if not any(hint in low for hint in _NAME_HINTS):
        return text

    def _assignment(m: re.Match[str]) -> str:
        value = m.group("value")
        if m.group("sep").strip() not in ("=", ":") or not is_secret_name(m.group("name")):
            return m.group(0)
        if value in ("None", "''", '""'):
            return m.group(0)  # no secret set (ServerArgs(api_key=None)): nothing to hide
        quote = value[0] if value[0] in "'\"" else ""
        return f"{m.group('name')}{m.group('nq')}{m.group('sep')}{quote}{REDACTED}{quote}"

    return _ASSIGNMENT.sub(_assignment, text)


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values in ``env`` whose names look secret: pass them to ``redact_text(known_secrets=…)``."""
    return [v for k, v in env.items() if is_secret_name(k) and v]
