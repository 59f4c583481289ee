"""Input rows of a regeneration job: their stable ids, their conversations, and SpecForge's rules for both.

* A row's id is its ``id`` (or ``uuid``) as a string, else ``sha256:<hex>`` of its canonical JSON: the
  same row has the same id in every run, so a resume skips exactly the rows already written (speculators'
  ``primary_id``, scaleout-facts §C2).  A second row with an id already seen gets ``<id>@line<N>``, so
  every input line has its own id and the accounting stays one output row per input row.
* ShareGPT ``conversations`` (``from``/``value`` or ``role``/``content``) and OpenAI ``messages`` are both
  read; the output row always carries ``conversations`` of ``{role, content}`` (SpecForge's layout), and a
  row read from ``messages`` has that key replaced.
* `input_problem` is SpecForge's ``validate_conversation(error_style="regeneration")``
  (``scripts/conversation_validation.py``): such a row goes to ``_skipped.jsonl`` with that message.
* `output_problem` is ``scripts/validate_regenerated_data.py``'s ``validate_row``: the job checks every
  row it writes to ``<out>.jsonl`` against it, so the validation step of SpecForge's recipe accepts it.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.safe_files import DATASET, open_file

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "model": "assistant", "system": "system"}
REASON_MAX = 300


@dataclass(frozen=True)
class InputRow:
    """One non-blank input line.  ``data`` is None when the line is not a JSON object (``problem`` says why)."""

    index: int  # 0-based among non-blank lines
    line: int  # 1-based line number in the file
    row_id: str
    data: dict[str, Any] | None
    raw: str
    problem: str | None = None


def has_think_marker(text: str) -> bool:
    lowered = text.lower()
    return "<think>" in lowered or "</think>" in lowered


def _content_hash(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def own_id(data: Any) -> str | None:
    if isinstance(data, dict):
        for key in ("id", "uuid"):
            value = data.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
                return str(value)
    return None


def read_rows(path: Path, limit: int | None = None) -> Iterator[InputRow]:
    """Every non-blank line of the dataset (opened through `safe_files`: a FIFO or device is refused)."""
    seen: set[str] = set()
    index = 0
    with open_file(path, DATASET) as handle:
        for number, raw_bytes in enumerate(handle, start=1):
            if not raw_bytes.strip():
                continue
            if limit is not None and index >= limit:
                return
            raw = raw_bytes.decode("utf-8", "replace").rstrip("\r\n")
            problem = None
            try:
                data = json.loads(raw_bytes)
            except json.JSONDecodeError as exc:
                data, problem = None, f"line {number}: not JSON: {exc.msg}"
            if data is not None and not isinstance(data, dict):
                data, problem = None, f"line {number}: Expected a JSON object"
            row_id = own_id(data) or _content_hash(data if data is not None else raw)
            if row_id in seen:
                row_id = f"{row_id}@line{number}"
            seen.add(row_id)
            yield InputRow(index, number, row_id, data, raw, problem)
            index += 1


def messages_of(data: dict[str, Any], dataset_format: str = "auto") -> tuple[str, Any]:
    """(the key the chat came from, its messages as ``{role, content}`` where they can be read)."""
    key = "conversations"
    if dataset_format == "openai" or (dataset_format == "auto" and "conversations" not in data
                                      and "messages" in data):
        key = "messages"
    raw = data.get(key)
    if not isinstance(raw, list):
        return key, raw
    out: list[Any] = []
    for message in raw:
        if isinstance(message, dict) and "role" not in message and "from" in message:
            role = _ROLES.get(str(message.get("from")).lower(), message.get("from"))
            message = {"role": role, "content": message.get("value")}
        elif isinstance(message, dict) and message.get("role") in ("developer",):
            message = {**message, "role": "system"}
        out.append(message)
    return key, out


def input_problem(messages: Any) -> str | None:
    """Why SpecForge's regeneration would not take this conversation (its own messages), or None."""
    if not isinstance(messages, list) or not messages:
        return "Missing or empty conversations list"
    expected, saw_user = "user", False
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"Invalid message at position {index}: expected object"
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str) or not content.strip():
            return f"Invalid message content at position {index}: expected non-empty string"
        if role == "system" and not saw_user:
            continue
        if role not in ("user", "assistant"):
            return f"Invalid message role: {role}"
        if role != expected:
            if not saw_user and role == "assistant":
                return "Data starts with an assistant message"
            return f"Invalid conversation role order at position {index}: expected {expected}, got {role}"
        saw_user = True
        expected = "assistant" if role == "user" else "user"
    return None if saw_user else "Data does not contain a user message"


def output_problem(row: dict[str, Any], reasoning: str = "none") -> str | None:
    """Why ``validate_regenerated_data.py`` would reject a success row (``--strict-think-markers``, with
    ``--expect-reasoning`` when reasoning is saved, else ``--expect-non-reasoning``, as SpecForge's
    ``run_qwen_sharegpt_regeneration.sh`` runs it), or None."""
    row_id = row.get("id")
    if not isinstance(row_id, str) or not row_id.strip():
        return "id must be a non-empty string"
    if row.get("status") != "success":
        return "status must be 'success'"
    messages = row.get("conversations")
    problem = input_problem(messages)
    if problem or not isinstance(messages, list):
        return problem or "conversations must be a non-empty list"
    assistants = 0
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        assistants += 1
        thought = message.get("reasoning_content")
        if thought is not None and not isinstance(thought, str):
            return f"assistant message {index} reasoning_content must be a string or null"
        if reasoning != "save" and thought and thought.strip():
            return f"assistant message {index} has non-empty reasoning_content"
        if reasoning == "save" and (not isinstance(thought, str) or not thought.strip()):
            return f"assistant message {index} has empty reasoning_content"
        if has_think_marker(message["content"]) or (isinstance(thought, str) and has_think_marker(thought)):
            return f"assistant message {index} contains a thinking marker"
    if not assistants:
        return "conversation has no assistant message"
    if messages[-1].get("role") != "assistant":
        return "conversation must end with an assistant message"
    return None


def cut(text: str, limit: int = REASON_MAX) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def output_row(row: InputRow, status: str, conversations: list[dict[str, Any]] | None = None,
               error: str | None = None, source_key: str = "conversations") -> dict[str, Any]:
    """The input row with ``conversations`` replaced (when regenerated), ``id`` set to the row id and
    ``status`` (+ ``error``) added, as SpecForge writes its three files."""
    if row.data is None:
        out: dict[str, Any] = {"id": row.row_id, "status": status, "error": cut(error or row.problem or ""),
                               "data": cut(row.raw, 2000)}
        return out
    out = {k: v for k, v in row.data.items() if not (k == source_key and source_key != "conversations")}
    out["id"] = row.row_id
    if conversations is not None:
        out["conversations"] = conversations
    out["status"] = status
    if error is not None:
        out["error"] = cut(error)
    return out
