"""JSONL dataset readers: ShareGPT ``conversations``, OpenAI ``messages``, pre-tokenized ``input_ids``.

Each non-blank line becomes either a ``DatasetRecord`` or a ``DatasetLineError`` (line number and reason);
a bad line never stops the reader (STYLE: errors are values at the edges).  A record's ``index`` is its
0-based line index, so the sample id and request id of a line never change between runs or resumes.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.safe_files import DATASET, open_file

# ShareGPT speakers (`from`) and OpenAI roles, mapped to the roles chat templates understand.
_ROLE_NAMES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant",
    "system": "system", "developer": "system",
    "tool": "tool", "function": "tool", "observation": "tool", "ipython": "tool",
}
# Message fields handed to the chat template as they are (Qwen3 reads reasoning_content, Kimi tool_calls).
_PASSTHROUGH_FIELDS = ("name", "tool_calls", "tool_call_id", "reasoning_content")


@dataclass(frozen=True)
class DatasetRecord:
    """One usable line.  Either ``messages`` (a chat) or ``input_ids`` (+ optional ``loss_mask``) is set."""

    index: int
    line: int
    kind: str  # "sharegpt" | "openai" | "tokenized"
    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] | None = None
    input_ids: tuple[int, ...] | None = None
    loss_mask: tuple[int, ...] | None = None
    row_id: str | None = None  # the row's own string ``id`` (a regeneration job's output always has one)


@dataclass(frozen=True)
class DatasetLineError:
    """A line that cannot become a sample, with the reason."""

    index: int
    line: int
    reason: str


class _LineProblem(ValueError):
    pass


REASON_MAX_CHARS = 300
_SURROGATE = re.compile("[\ud800-\udfff]")


def cut_reason(reason: str, limit: int = REASON_MAX_CHARS) -> str:
    """A reason fit for one JSONL line: at most ``limit`` characters and always encodable as UTF-8.

    A bad line's reason may quote the line (a 2 MB key, a lone surrogate): without the cut, errors.jsonl and
    manifest.jsonl would copy the bad line whole, and a surrogate would make the write itself fail.
    """
    text = str(reason)
    if _SURROGATE.search(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit} more characters)"
    return text


def _check_strings(row: Any) -> None:
    """Every string in the row must be valid Unicode: a lone surrogate (``"\\ud800"``, common in scraped
    data) passes ``json.loads`` but makes the tokenizer raise.  Iterative, so depth never recurses."""
    stack: list[tuple[Any, str]] = [(row, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if (m := _SURROGATE.search(value)) is not None:
                code = f"\\u{ord(m.group(0)):04x}"
                raise _LineProblem(f"{where or 'a value'} holds a lone surrogate {code} at character "
                                   f"{m.start()} (not valid Unicode)")
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    raise _LineProblem("an object key holds a lone surrogate (not valid Unicode)")
                stack.append((item, f"{where}.{key}" if where else key))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{n}]") for n, item in enumerate(value))


def _normalise_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: only text parts can be rendered
        texts = []
        for n, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _LineProblem(f"{where} content part {n} is {kind!r}; only text parts are supported")
        return "".join(texts)
    if content is None:
        return ""
    raise _LineProblem(f"{where} content must be a string, not {type(content).__name__}")


def _message(raw: Any, n: int, sharegpt: bool) -> dict[str, Any]:
    where = f"message {n}"
    if not isinstance(raw, dict):
        raise _LineProblem(f"{where} is {type(raw).__name__}, not an object")
    if sharegpt and "from" in raw:
        speaker, content = raw.get("from"), raw.get("value")
        speaker_key = "from"
    else:
        speaker, content = raw.get("role"), raw.get("content")
        speaker_key = "role"
    if not isinstance(speaker, str):
        keys = "`from`/`value` or `role`/`content`" if sharegpt else "`role`/`content`"
        raise _LineProblem(f"{where} has no {speaker_key!r} string (expected {keys})")
    role = _ROLE_NAMES.get(speaker.strip().lower())
    if role is None:
        raise _LineProblem(f"{where} has unknown {speaker_key} {speaker!r}")
    message: dict[str, Any] = {"role": role, "content": _normalise_content(content, where)}
    for key in _PASSTHROUGH_FIELDS:
        if key in raw and raw[key] is not None:
            message[key] = raw[key]
    return message


def _chat(row: dict, key: str, index: int, line: int) -> DatasetRecord:
    raw_messages = row[key]
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _LineProblem(f"`{key}` must be a non-empty list")
    sharegpt = key == "conversations"
    messages = [_message(m, n, sharegpt) for n, m in enumerate(raw_messages)]
    system = row.get("system")
    if isinstance(system, str) and system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})  # the data's own system prompt
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise _LineProblem("no assistant turn with content: nothing to supervise")
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise _LineProblem("`tools` must be a list of objects")
    return DatasetRecord(
        index=index, line=line, kind="sharegpt" if sharegpt else "openai",
        messages=tuple(messages), tools=tuple(tools) if tools else None,
        row_id=row["id"] if isinstance(row.get("id"), str) and row["id"] else None,
    )


def _int_list(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise _LineProblem(f"`{key}` must be a non-empty list of integers")
    for n, v in enumerate(value):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise _LineProblem(f"`{key}`[{n}] is {v!r}, not a non-negative integer")
    return tuple(value)


def _tokenized(row: dict, index: int, line: int) -> DatasetRecord:
    ids = _int_list(row["input_ids"], "input_ids")
    mask = None
    if row.get("loss_mask") is not None:
        mask = _int_list(row["loss_mask"], "loss_mask")
        if len(mask) != len(ids):
            raise _LineProblem(f"`loss_mask` has {len(mask)} entries but `input_ids` has {len(ids)}")
        if any(v not in (0, 1) for v in mask):
            raise _LineProblem("`loss_mask` must hold only 0 and 1")
    return DatasetRecord(index=index, line=line, kind="tokenized", input_ids=ids, loss_mask=mask)


_FORMAT_KEYS = {"sharegpt": "conversations", "openai": "messages", "tokenized": "input_ids"}


def _place(line: int, source: Path | str | None, column: int | None = None, byte: int | None = None) -> str:
    """``line 13, column 68 of /data/chats.jsonl``: where in the file a problem is."""
    at = f"line {line}" + (f", column {column}" if column is not None else "")
    at += f", byte {byte}" if byte is not None else ""
    return at + (f" of {source}" if source is not None else "")


def parse_line(raw: bytes, index: int, dataset_format: str = "auto",
               source: Path | str | None = None) -> DatasetRecord | DatasetLineError:
    """One JSONL line (without its newline) → a record or a line error (``source``: the file, named in
    the reasons that point at a character of the line)."""
    line = index + 1
    try:
        text = raw.decode("utf-8")
        if index == 0:
            text = text.removeprefix("\ufeff")
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            # json's messages end in "starting at" or name no place ("Expecting value"): one "at" either way.
            message = exc.msg.removesuffix(" at")
            raise _LineProblem(f"not JSON: {message} at {_place(line, source, column=exc.colno)}") from None
        if not isinstance(row, dict):
            raise _LineProblem(f"a line must be a JSON object, not {type(row).__name__}")
        _check_strings(row)
        if dataset_format == "auto":
            for fmt, key in _FORMAT_KEYS.items():
                if key in row:
                    dataset_format = fmt
                    break
            else:
                keys = ", ".join(sorted(row)[:8]) or "none"
                raise _LineProblem(f"no `conversations`, `messages` or `input_ids` key (keys: {keys})")
        key = _FORMAT_KEYS[dataset_format]
        if key not in row:
            raise _LineProblem(f"no `{key}` key (dataset_format = {dataset_format!r})")
        if dataset_format == "tokenized":
            return _tokenized(row, index, line)
        return _chat(row, key, index, line)
    except UnicodeDecodeError as exc:
        return DatasetLineError(index, line, f"not UTF-8: {exc.reason} at {_place(line, source, byte=exc.start)}")
    except _LineProblem as exc:
        return DatasetLineError(index, line, cut_reason(str(exc)))
    except RecursionError:
        return DatasetLineError(index, line, "nested too deeply to parse (JSON nesting beyond Python's limit)")
    except Exception as exc:  # noqa: BLE001 - any line that cannot be parsed is a bad line, never a stop
        return DatasetLineError(index, line, cut_reason(f"cannot parse: {type(exc).__name__}: {exc}"))


def iter_dataset(path: Path, dataset_format: str = "auto", skip: frozenset[int] | set[int] = frozenset(),
                 limit: int | None = None) -> Iterator[DatasetRecord | DatasetLineError]:
    """Records and line errors in file order; blank lines are ignored, indices in ``skip`` not parsed.

    ``limit`` counts non-blank lines, so a job with ``num_samples`` sees the same lines on every resume.
    """
    seen = 0
    with open_file(path, DATASET) as fh:
        for index, raw in enumerate(fh):
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue
            seen += 1
            if limit is not None and seen > limit:
                return
            if index in skip:
                continue
            yield parse_line(raw, index, dataset_format, source=path)


def count_lines(path: Path, limit: int | None = None) -> int:
    """Non-blank lines (the job's total), without parsing them."""
    n = 0
    with open_file(path, DATASET) as fh:
        for raw in fh:
            if raw.strip():
                n += 1
                if limit is not None and n >= limit:
                    return n
    return n


def dataset_fingerprint(path: Path) -> dict[str, Any]:
    """Size and a sha256 of the file, so a resume can refuse a dataset that changed under it."""
    import hashlib

    digest = hashlib.sha256()
    size = 0
    with open_file(path, DATASET) as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"path": str(path), "size_bytes": size, "sha256": digest.hexdigest()}
