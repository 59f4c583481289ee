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

# --- the catalogue of secret names ---------------------------------------------------------------------
# A name is split into words (on _, -, ., camelCase); a word's trailing digits are a numbered variant
# (TOKEN2, PASSWORD2) and a word of digits only (HF_TOKEN_1) is dropped, so both count as the word itself.
# Words, not substrings: `num_tokens`, `max_new_tokens`, `tokenizer_path`, `enable_forward_pass_metrics` and
# `PWD` (the shell's working directory) are not secrets; `HF_TOKEN`, `WANDB_API_KEY` and `MYSQL_PWD` are.
#
# Secret wherever it stands in the name:
_SECRET_WORDS = frozenset(
    {"secret", "secrets", "password", "passwd", "passphrase", "passcode", "apikey", "apitoken", "credential",
     "credentials", "auth", "authorization", "cookie", "privatekey", "accesskey", "secretkey", "accesstoken",
     "authtoken", "sessiontoken", "refreshtoken", "clientsecret", "cred", "creds", "webhook", "webhooks", "jwt",
     "bearer"}
)
_SECRET_SUFFIXES = ("password", "passwd", "secret")  # dbpassword, rootPassword (one word), clientsecret
# Secret as the last word after another one (`*_KEY`, `*_PAT`, DB_PASS, MYSQL_PWD), never alone: a bare
# KEY, PAT or PWD is a setting, a name or the working directory.  "pass" before another word is a count
# of passes (SGLang's enable_forward_pass_metrics), so it is secret as the last word only, alone too.
_LAST_WORD_SECRETS = frozenset({"key", "pat", "pwd", "pw", "pass", "keys"})
_LAST_WORD_ALONE = frozenset({"pass"})
# `*_KEY` that name no credential: an index, an order, a cache slot, a public key (SGLang's
# SGLANG_LOG_DECODE_GRAPH_KEY is a switch).
_KEY_NOT_SECRET_AFTER = frozenset(
    {"sort", "cache", "primary", "foreign", "hot", "dict", "lookup", "partition", "shard", "routing", "group",
     "column", "field", "map", "hash", "graph", "public", "idempotency", "object", "index", "dedup", "join",
     "row", "metric", "label", "config", "file", "path"}
)
_SECRET_PAIRS = frozenset({("api", "key"), ("api", "keys"), ("access", "key"), ("private", "key"),
                           ("session", "key"), ("secret", "key"), ("admin", "key"), ("api", "token"),
                           ("client", "secret"), ("signing", "key"), ("encryption", "key")})
# "token" names a credential as the last word of a name (HF_TOKEN, access_token, --token, TOKEN2,
# HF_TOKEN_1), not before another word (speculative_token_map, ds_heavy_token_num, token_usage) nor after
# a word that makes it a position, a count or a kind of token (bucket_time_to_first_token,
# kt_max_deferred_experts_per_token, eos_token: SGLang server_args fields).
_TOKEN_NOT_SECRET_AFTER = frozenset(
    {"per", "first", "last", "next", "new", "cached", "num", "max", "min", "total", "input", "output",
     "eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "image", "video", "audio", "start", "end"}
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_TRAILING_DIGITS = re.compile(r"(?<=[a-z])\d+$")
# Flags whose next argv element is a secret (SGLang has --api-key and --admin-api-key).
SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key", "--hf-token", "--token"})

# --- the catalogue of value shapes ---------------------------------------------------------------------
# Each is a credential on its own, whatever name it is under (``FOO=hf_...``, a line of a log): name ->
# (the characters it can begin with, its pattern).
SECRET_SHAPES: dict[str, tuple[str, str]] = {
    "jwt": ("e", r"\beyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"),  # header.payload.signature
    "hugging face": ("h", r"\bhf_[A-Za-z0-9]{20,}\b"),
    "openai / anthropic": ("s", r"\bsk-[A-Za-z0-9_\-]{16,}"),  # sk-..., sk-proj-..., sk-ant-api03-...
    "github": ("g", r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"),
    "github fine-grained": ("g", r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    "gitlab": ("g", r"\bgl(?:pat|dt|rt|ptt|cbt|oas|soat|ffct|imt|agent)-[A-Za-z0-9_\-]{20,}"),
    "slack": ("x", r"\bxox[abpres]-[A-Za-z0-9\-]{10,}"),
    "aws access key id": ("A", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    "nvidia ngc": ("n", r"\bnvapi-[A-Za-z0-9_\-]{20,}"),
    "google api": ("A", r"\bAIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"),
    "private key block": ("-", r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----|.*)"),
}
# One pass over the text for every credential shape (a log line at 100 lines/s is redacted as it is shown);
# the lookahead on the first characters makes the pass skip, at one test a position, what begins no shape.
_SHAPE_STARTS = "".join(sorted({c for starts, _ in SECRET_SHAPES.values() for c in starts}))
_SECRET_VALUE = re.compile(f"(?=[{re.escape(_SHAPE_STARTS)}])(?:"
                           + "|".join(f"(?:{pattern})" for _, pattern in SECRET_SHAPES.values()) + ")")
# ``Bearer <credential>``: the whole credential.  ``Basic <base64>``: when the base64 decodes to
# ``user:password`` (so "Basic checks passed" stays).  Both keep the scheme word, as curl's -v does.
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._\-~+/]{8,}=*")
_BASIC = re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])")
# ``scheme://user:password@host``: the password runs to the last ``@`` before the host (a password may hold
# ``@`` or ``/``), never past a space, a quote, ``?`` or ``#``.
_URL_PASSWORD = re.compile(r"(://[^/\s:@'\"<>]*:)([^\s?#'\"<>]+)(@[^\s/?#@'\"<>]+)")
# An auth scheme before a credential (``Authorization: Basic <b64>``): the credential is the value.
_SCHEME = r"(?:(?i:basic|bearer|token|digest|negotiate|ntlm|apikey|key|otp)\s+)?"
# A quoted value is taken whole, backslash escapes included (``"pa\"ss"``: TOML, JSON, repr).
_QUOTED = r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\""
# ``name=value``, ``'name': 'value'``, ``name: value``.  A leading ``#`` belongs to the name (SGLang's counts,
# see is_secret_name).
_ASSIGNMENT = re.compile(
    r"(?P<name>#?\b[A-Za-z_][A-Za-z0-9_\-]*)(?P<nq>['\"]?)(?P<sep>\s*[=:]\s*|\s+)"
    rf"(?P<scheme>{_SCHEME})(?P<value>{_QUOTED}|[^\s'\",(){{}}\[\]=]+)"
)
# A secret flag and its value in free text: ``--api-key V`` (a log's command line) and ``"--api-key", "V"``
# (a TOML or JSON argv list).  ``--api-key=V`` is an assignment.
_FLAG_VALUE = re.compile(
    r"(?P<flag>(?<![\w-])--?[A-Za-z][A-Za-z0-9_\-]*)(?P<mid>\s+|['\"]\s*,\s*|['\"]\s+)"
    rf"(?P<value>{_QUOTED}|(?!-)[^\s'\",\]\)]+)"
)
# Only text holding one of these (lowercased) can hold a secret name; the rest skips the assignment scan.
# Every catalogued word holds one of them (tests/test_redaction_catalogue.py checks it: adv22 added CREDS and
# WEBHOOK to the words, and text holding only those skipped the scan).
_NAME_HINTS = ("token", "secret", "pass", "pw", "cred", "auth", "cookie", "key", "pat", "webhook", "jwt", "bearer")


def _name_words(name: str) -> list[str]:
    words = []
    for word in _WORD_SPLIT.split(name):
        if word and not word.isdigit():
            words.append(_TRAILING_DIGITS.sub("", word.lower()))
    return words


@functools.lru_cache(maxsize=4096)  # log lines repeat the same few names every second
def is_secret_name(name: str) -> bool:
    """True when an env var / flag / key name looks like it holds a secret (see the catalogue above).

    A name written ``#name`` is a count (SGLang's ``#new-token: 12``, ``#cached-token: 0``), never a secret.
    """
    if name.startswith("#"):
        return False
    words = _name_words(name)
    last = len(words) - 1
    for i, word in enumerate(words):
        if word == "token":
            if i == last and (i == 0 or words[i - 1] not in _TOKEN_NOT_SECRET_AFTER):
                return True
        elif word in _SECRET_WORDS or word.endswith(_SECRET_SUFFIXES) or (i == last and word in _LAST_WORD_SECRETS and (i > 0 or word in _LAST_WORD_ALONE)
              and not (word in ("key", "keys") and words[i - 1] in _KEY_NOT_SECRET_AFTER)):
            return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def redact_env(env: Mapping[str, str], known_secrets: Iterable[str] = ()) -> dict[str, str]:
    """Secret-named values become ``***``; every other value is redacted by value and by shape."""
    known = tuple(known_secrets)
    return {k: (REDACTED if is_secret_name(k) and v else redact_text(v, known)) for k, v in env.items()}


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


def _basic_credential(m: re.Match[str]) -> str:
    """``Basic <b64>`` -> ``Basic ***`` when the base64 is a ``user:password`` pair."""
    import base64
    import binascii

    encoded = m.group(2)
    try:
        decoded = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        return m.group(0)
    return m.group(1) + REDACTED if b":" in decoded else m.group(0)


def _flag_value(m: re.Match[str]) -> str:
    flag = m.group("flag")
    if not (flag in SECRET_FLAGS or is_secret_name(flag.lstrip("-"))) or m.group("value") in ("None", "''", '""'):
        return m.group(0)
    return m.group("flag") + m.group("mid") + _hidden(m.group("value"))


def _hidden(value: str) -> str:
    """``***`` in the quotes ``value`` had."""
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{quote}{REDACTED}{quote}"


def _assignment(m: re.Match[str]) -> str:
    value, scheme = m.group("value"), m.group("scheme")
    if m.group("sep").strip() not in ("=", ":") or not is_secret_name(m.group("name")):
        return m.group(0)
    if value in ("None", "''", '""') and not scheme:
        return m.group(0)  # no secret set (ServerArgs(api_key=None)): nothing to hide
    head = f"{m.group('name')}{m.group('nq')}{m.group('sep')}"
    if scheme and "auth" not in m.group("name").lower():
        return head + REDACTED  # "password: token abc": the first word is part of the secret, not a scheme
    return head + scheme + _hidden(value)


def redact_text(text: str, known_secrets: Iterable[str] = ()) -> str:
    """Redact known secret values (and their JSON/TOML/shell-escaped forms), then credential-shaped
    substrings (`SECRET_SHAPES`, Bearer/Basic credentials, URL passwords), then the values of secret-named
    flags and assignments, from free text."""
    known = _known_pattern(tuple(known_secrets) if not isinstance(known_secrets, tuple) else known_secrets)
    if known is not None:
        text = known.sub(REDACTED, text)
    text = _SECRET_VALUE.sub(REDACTED, text)
    low = text.lower()
    if "bearer" in low:
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    if "basic" in low:
        text = _BASIC.sub(_basic_credential, text)
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    if not any(hint in low for hint in _NAME_HINTS):
        return text
    if "-" in text:
        text = _FLAG_VALUE.sub(_flag_value, text)
    return _assignments(text)


def _assignments(text: str) -> str:
    """``_ASSIGNMENT.sub(_assignment, text)``, except that a match hiding nothing gives back what followed
    its name: in ``export HF_TOKEN=V`` the first match is ``export HF_TOKEN`` (a name, a space, a value),
    and in ``https://h/api?access_token=V`` it is ``https://h/api?access_token``; a plain ``sub`` went on
    after them, so the secret assignment inside was never looked at (adv22).  The plain ``sub`` (one C loop)
    stands when no such match swallowed a hint of a secret name, which is nearly every log line; else the
    text is scanned again, going on after each name."""
    swallowed = False

    def one(m: re.Match[str]) -> str:
        nonlocal swallowed
        shown = _assignment(m)
        if shown == m.group(0) and not swallowed:
            rest = text[m.end("name"):m.end()].lower()
            swallowed = any(hint in rest for hint in _NAME_HINTS)
        return shown

    quick = _ASSIGNMENT.sub(one, text)
    if not swallowed:
        return quick
    out: list[str] = []
    pos = 0
    while (m := _ASSIGNMENT.search(text, pos)) is not None:
        shown = _assignment(m)
        if shown == m.group(0):
            # Look again after the name only when the rest can hold a secret name (none without a hint).
            rest = text[m.end("name"):m.end()].lower()
            end = m.end("name") if any(hint in rest for hint in _NAME_HINTS) else m.end()
            out.append(text[pos:end])
            pos = end
        else:
            out.append(text[pos:m.start()] + shown)
            pos = m.end()
    out.append(text[pos:])
    return "".join(out)


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


# --- records: nested JSON ---------------------------------------------------------------------------------
# Deeper than this, a record is not walked: what cannot be looked at is hidden whole (never a RecursionError).
RECORD_MAX_DEPTH = 64


def record_secrets(obj: Any) -> list[str]:
    """The exact secret values a JSON-like record carries: values under secret-named keys, values after
    secret flags in its string lists (an argv), and credential-shaped strings.  `redact_record` hides them
    wherever else they appear in the record (a profile's TOML text, a command's shell text)."""
    found: list[str] = []
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > RECORD_MAX_DEPTH:
            continue
        if isinstance(value, Mapping):
            for key, item in value.items():
                if isinstance(key, str) and is_secret_name(key) and isinstance(item, (str, int, float)) \
                        and not isinstance(item, bool):
                    found.append(str(item))
                stack.append((item, depth + 1))
        elif isinstance(value, (list, tuple)):
            if value and all(isinstance(v, str) for v in value):
                found += collect_secrets(value)
            else:
                stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            found.extend(m.group(0) for m in _SECRET_VALUE.finditer(value))
    return [v for v in dict.fromkeys(found) if len(v) >= MIN_SECRET_CHARS]


def redact_record(obj: Any, known_secrets: Iterable[str] = ()) -> Any:
    """A redacted copy of a JSON-like record (bench and compare results, history, start facts), by key and by
    value: a secret-named key's value becomes ``***`` (every leaf, when it is a container), a string list
    is redacted as an argv, and every string (keys too) by `redact_text` with the record's own secrets
    (`record_secrets`) and ``known_secrets``.  Numbers, bools and None stay; ``obj`` is not changed."""
    known = tuple(dict.fromkeys([*known_secrets, *record_secrets(obj)]))
    return _redact_value(obj, known, 0, hide=False)


def _redact_value(value: Any, known: tuple[str, ...], depth: int, hide: bool) -> Any:
    if depth > RECORD_MAX_DEPTH:
        return REDACTED
    if isinstance(value, str):
        return REDACTED if hide and value else redact_text(value, known)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            secret = hide or (isinstance(key, str) and is_secret_name(key))
            shown_key = redact_text(key, known) if isinstance(key, str) else key
            out[shown_key] = _redact_value(item, known, depth + 1, secret)
        return out
    if isinstance(value, (list, tuple)):
        if not hide and value and all(isinstance(v, str) for v in value):
            return [redact_text(v, known) for v in redact_argv(value)]
        return [_redact_value(item, known, depth + 1, hide) for item in value]
    if hide and isinstance(value, (int, float)) and not isinstance(value, bool):
        return REDACTED
    return value


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
        """`redact_record` with this session's known values."""
        return redact_record(value, self.known)
