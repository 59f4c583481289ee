"""Secret redaction for everything that reaches a screen, a log we write, a command preview or a bundle.

A value is secret when its variable or flag name looks secret (token, key, secret, password, ...),
or when it has the shape of a well-known credential (``hf_…``, ``sk-…``, bearer tokens, URL passwords).
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


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
    """Redact known secret values (and their JSON/TOML/shell-escaped forms), then credential-shaped
    substrings and secret-named assignments, from free text."""
    known = _known_pattern(tuple(known_secrets) if not isinstance(known_secrets, tuple) else known_secrets)
    if known is not None:
        text = known.sub(REDACTED, text)
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


# --- secrets known by value --------------------------------------------------------------------------------
SECRETS_FILE = "secrets.json"  # in the session folder, 0600: the exact values to hide, never shown
MIN_SECRET_CHARS = 4  # shorter values would blank ordinary words out of every line


def escaped_forms(value: str) -> set[str]:
    """``value`` as it may appear in an artifact: raw, JSON- and TOML-escaped, Python repr, shell-quoted,
    and each line of a multi-line value (logs and stacks are read line by line)."""
    import shlex

    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1],
             shlex.quote(value), value.replace("\\", "\\\\").replace('"', '\\"')}
    forms |= {form.replace("\\n", "\\\\n") for form in forms}  # escaped once more (JSON holding a repr)
    if "\n" in value or "\r" in value:
        forms.update(part for part in re.split(r"[\r\n]+", value) if len(part.strip()) >= MIN_SECRET_CHARS)
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS}


@functools.lru_cache(maxsize=256)  # the same session's secrets redact every line of its log
def _known_pattern(known: tuple[str, ...]) -> re.Pattern[str] | None:
    forms: set[str] = set()
    for secret in known:
        if isinstance(secret, str) and len(secret) >= MIN_SECRET_CHARS:
            forms |= escaped_forms(secret)
    if not forms:
        return None
    return re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))


def _is_secret_flag(flag: str) -> bool:
    return flag in SECRET_FLAGS or (flag.startswith("-") and is_secret_name(flag.lstrip("-")))


def collect_secrets(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> list[str]:
    """The exact secret values a launch carries: values of secret-named flags (``--api-key V`` and
    ``--api-key=V``, wherever they come from, e.g. free-form extra_args), values of secret-named env vars,
    and credential-shaped values under any name (``FOO=hf_...``)."""
    found: list[str] = []
    args = [str(a) for a in argv]
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("-") and _is_secret_flag(flag):
            found.append(value)
        elif _is_secret_flag(arg) and i + 1 < len(args):
            found.append(args[i + 1])
        found.extend(m.group(0) for m in _SECRET_VALUE.finditer(arg))
    for name, value in (env or {}).items():
        value = str(value)
        if is_secret_name(str(name)):
            found.append(value)
        found.extend(m.group(0) for m in _SECRET_VALUE.finditer(value))
    unique: list[str] = []
    for value in found:
        if value and len(value) >= MIN_SECRET_CHARS and value not in unique:
            unique.append(value)
    return unique


def profile_secrets(profile: Any) -> list[str]:
    """The secrets a profile's launch would carry: those of its extra args and env (the flags it builds from
    its typed fields carry none).  Read from the fields, so this module stays below `sessions.profiles`."""
    server = getattr(profile, "server", None)
    return collect_secrets(list(getattr(server, "extra_args", ()) or ()), dict(getattr(server, "env", {}) or {}))


def write_secrets_file(session_dir: Path, secrets: Iterable[str]) -> None:
    """Keep the launch's secret values (0600) so every later reader can hide them by value."""
    path = Path(session_dir) / SECRETS_FILE
    data = json.dumps({"values": list(secrets)}).encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_secrets_file(session_dir: Path) -> list[str]:
    """The values ``write_secrets_file`` kept (empty when absent or unreadable; never follows a link)."""
    from sessions import safe_files

    try:  # private: a FIFO, a device, a symlink or a hard link is refused at once
        data = safe_files.read_json(Path(session_dir) / SECRETS_FILE, safe_files.SECRETS)
        values = data.get("values", []) if isinstance(data, dict) else []
    except OSError:
        return []
    if not isinstance(values, list):
        return []
    return [v for v in values if isinstance(v, str)]


class Redactor:
    """Hides one session's secrets: its known values (every escaped form) first, then shapes and names.

    Build it with ``Redactor.for_session(session)`` (a `ServerSession` or its folder); ``text`` redacts a
    string, ``json`` every string inside a JSON-like value (keys included).
    """

    def __init__(self, known: Iterable[str] = ()) -> None:
        self.known: tuple[str, ...] = tuple(dict.fromkeys(v for v in known if v and len(v) >= MIN_SECRET_CHARS))

    @classmethod
    def for_session(cls, session: Any, extra: Iterable[str] = ()) -> Redactor:
        """The session's secrets file (every value its launch carried) plus its loaded profile's secrets."""
        session_dir = Path(getattr(session, "session_dir", session))
        known = list(read_secrets_file(session_dir))
        try:
            profile = getattr(session, "profile", None)
        except Exception:  # noqa: BLE001 - a damaged snapshot: the secrets file and shapes still apply
            profile = None
        if profile is not None:
            known += profile_secrets(profile)
        return cls([*known, *extra])

    def with_values(self, values: Iterable[str]) -> Redactor:
        return Redactor([*self.known, *values])

    def text(self, text: str) -> str:
        return redact_text(text, self.known)

    def json(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {(self.text(k) if isinstance(k, str) else k): self.json(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.json(v) for v in value]
        return value
