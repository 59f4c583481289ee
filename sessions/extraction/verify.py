"""``extract verify``: check an output dir file by file, optionally against the server and the lm_head.

* Every ``*.ckpt``: loads (``weights_only=True``: no arbitrary unpickling), has the four tensors with the
  contract's dtypes and shapes (1-D int64 ids and mask, ``[1, T, H]`` and ``[1, T, K·H]`` bf16), the widths
  of ``dataset.json``, T and sample id and checksum as the manifest says, no NaN/Inf, a 0/1 mask.
* The manifest: readable, no duplicate index or sample id, every ``ok`` line's file present, no file
  without a line (SpecForge would train on it).
* ``--against-http N``: N samples are sent again with ``return_hidden_states: true``; SGLang returns the
  aux rows of the prompt (sglang-facts §4.11), which must match the file's ``aux_hidden_state``.
* ``--lm-head-check``: only the ``lm_head`` weight is read from the model's safetensors; the top-1 of
  ``hidden_state @ lm_headᵀ`` must mostly equal the next token on assistant positions.  A wrong final-state
  capture (pre-norm, or a middle layer) fails this without loading the model.
"""
from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions import safe_files
from sessions.extraction.output import ManifestEntry, OutputDir, file_crc32

_CHECKSUM_RE = re.compile(r"^crc32:([0-9a-f]{8})$")
_LM_HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight")
_EMBED_KEYS = ("model.embed_tokens.weight", "language_model.model.embed_tokens.weight", "embed_tokens.weight")


@dataclass(frozen=True)
class VerifyProblem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True)
class HttpComparison:
    path: str
    tokens: int
    min_cosine: float | None
    max_abs_diff: float | None
    ok: bool
    note: str = ""


@dataclass(frozen=True)
class LmHeadReport:
    positions: int
    agree: int
    min_top1: float

    @property
    def top1(self) -> float:
        return self.agree / self.positions if self.positions else 0.0

    @property
    def ok(self) -> bool:
        return self.positions > 0 and self.top1 >= self.min_top1


@dataclass(frozen=True)
class VerifyReport:
    output_dir: str
    files_checked: int
    samples_in_manifest: int
    problems: tuple[VerifyProblem, ...]
    warnings: tuple[str, ...] = ()
    http: tuple[HttpComparison, ...] = ()
    lm_head: LmHeadReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (not self.problems and all(c.ok for c in self.http)
                and (self.lm_head is None or self.lm_head.ok))

    def summary(self) -> str:
        head = (f"{self.output_dir}: {'OK' if self.ok else 'FAILED'} — {self.files_checked} files checked, "
                f"{self.samples_in_manifest} samples in the manifest")
        lines = [head]
        lines += [f"  problem: {p}" for p in self.problems[:50]]
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more problems")
        lines += [f"  warning: {w}" for w in self.warnings]
        for c in self.http:
            lines.append(f"  http {c.path}: {'ok' if c.ok else 'MISMATCH'} (T={c.tokens}, min cosine "
                         f"{_fmt(c.min_cosine)}, max |diff| {_fmt(c.max_abs_diff)}){' ' + c.note if c.note else ''}")
        if self.lm_head is not None:
            h = self.lm_head
            lines.append(f"  lm_head top-1 agreement {h.top1:.1%} on {h.positions} assistant positions "
                         f"({'ok' if h.ok else f'below {h.min_top1:.0%}: the final states look wrong'})")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "output_dir": self.output_dir, "ok": self.ok, "files_checked": self.files_checked,
            "samples_in_manifest": self.samples_in_manifest,
            "problems": [{"path": p.path, "message": p.message} for p in self.problems],
            "warnings": list(self.warnings),
            "http": [c.__dict__ for c in self.http],
            "lm_head": None if self.lm_head is None else {
                "positions": self.lm_head.positions, "agree": self.lm_head.agree, "top1": self.lm_head.top1,
                "min_top1": self.lm_head.min_top1, "ok": self.lm_head.ok},
        }


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def check_sample_file(path: Path, hidden_size: int | None, aux_width: int | None) -> tuple[list[str], dict]:
    """The contract checks of one file: (problems, the loaded dict or {})."""
    import torch

    try:
        with safe_files.opened_path(path, safe_files.OUTPUT_DATA) as opened:
            data = torch.load(opened, weights_only=True, mmap=True)
    except OSError as exc:  # a FIFO, a device, a folder: named, never waited on
        return [f"cannot be loaded: {safe_files.describe_os_error(exc, path)}"], {}
    except Exception as exc:  # noqa: BLE001 - a corrupt zip raises many types; the file is what's wrong
        return [f"cannot be loaded: {type(exc).__name__}: {exc}"], {}
    if not isinstance(data, dict):
        return [f"holds a {type(data).__name__}, not a dict"], {}
    problems = []
    missing = [k for k in ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state", "sample_id")
               if k not in data]
    if missing:
        return [f"missing keys {missing}"], data
    ids, mask, hidden, aux = data["input_ids"], data["loss_mask"], data["hidden_state"], data["aux_hidden_state"]
    for name, tensor, dtype in (("input_ids", ids, torch.int64), ("loss_mask", mask, torch.int64),
                                ("hidden_state", hidden, torch.bfloat16), ("aux_hidden_state", aux, torch.bfloat16)):
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"{name} is not a tensor")
        elif tensor.dtype != dtype:
            problems.append(f"{name} is {tensor.dtype}, expected {dtype}")
    if problems:
        return problems, data
    t = ids.shape[0] if ids.dim() == 1 else None
    if t is None:
        return [f"input_ids has shape {tuple(ids.shape)}, expected 1-D [T]"], data
    if tuple(mask.shape) != (t,):
        problems.append(f"loss_mask has shape {tuple(mask.shape)}, expected [{t}]")
    elif bool(((mask != 0) & (mask != 1)).any()):
        problems.append("loss_mask holds values other than 0 and 1")
    if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[1] != t:
        problems.append(f"hidden_state has shape {tuple(hidden.shape)}, expected [1, {t}, H]")
    elif hidden_size and hidden.shape[2] != hidden_size:
        problems.append(f"hidden_state width {hidden.shape[2]} != hidden_size {hidden_size} (dataset.json)")
    if aux.dim() != 3 or aux.shape[0] != 1 or aux.shape[1] != t:
        problems.append(f"aux_hidden_state has shape {tuple(aux.shape)}, expected [1, {t}, K*H]")
    elif aux_width and aux.shape[2] != aux_width:
        problems.append(f"aux_hidden_state width {aux.shape[2]} != aux_width {aux_width} (dataset.json)")
    if not problems:
        from sessions.extraction.collector import count_nonfinite

        for name, tensor in (("hidden_state", hidden), ("aux_hidden_state", aux)):
            bad = count_nonfinite(tensor)
            if bad:
                problems.append(f"{bad} NaN/Inf values in {name}")
    return problems, data


def verify_output(out_dir: Path, *, against_http: int = 0, server_url: str | None = None,
                  lm_head_check: bool = False, model_path: Path | None = None, min_top1: float = 0.5,
                  lm_head_samples: int = 32, log: Callable[[str], None] | None = None) -> VerifyReport:
    """Check ``out_dir`` step by step: dataset.json, the manifest, manifest against disk, every sample file,
    the counts, then (when asked) samples against the server and the final states against the lm_head."""
    out = OutputDir(Path(out_dir))
    problems: list[VerifyProblem] = []
    warnings: list[str] = []
    info = _read_dataset_json(out, problems)
    entries = _read_manifest(out, problems)
    ok_entries = {e.path: e for e in entries.values() if e.status == "ok" and e.path}
    present = _match_manifest_to_disk(out, ok_entries, problems, warnings)
    checked = _check_files(out, ok_entries, present, info, problems, log)
    _check_counts(info, ok_entries, problems)
    by_index = sorted(ok_entries.values(), key=lambda e: e.index)
    http = _check_against_http(out, info, by_index, against_http, server_url, problems)
    lm_head = None
    if lm_head_check:
        lm_head = _check_lm_head(out, info, by_index, model_path, min_top1, lm_head_samples, problems)
    return VerifyReport(str(out.root), checked, len(entries), tuple(problems), tuple(warnings), http, lm_head)


def _read_dataset_json(out: OutputDir, problems: list[VerifyProblem]) -> dict[str, Any]:
    info = out.read_dataset_json()
    if info is None:
        problems.append(VerifyProblem("dataset.json", "missing or not JSON"))
        return {}
    return info


def _read_manifest(out: OutputDir, problems: list[VerifyProblem]) -> dict[int, ManifestEntry]:
    """The manifest's entries by line index; unreadable lines and repeated indexes or sample ids are problems."""
    try:
        raw_lines = safe_files.read_text(out.manifest_path, safe_files.MANIFEST).splitlines()
    except FileNotFoundError:
        problems.append(VerifyProblem("manifest.jsonl", "missing"))
        return {}
    except OSError as exc:  # a FIFO, a device, over the cap, not UTF-8: named, never waited on
        problems.append(VerifyProblem("manifest.jsonl", safe_files.describe_os_error(exc, out.manifest_path)))
        return {}
    entries: dict[int, ManifestEntry] = {}
    seen_ids: dict[str, int] = {}
    for no, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            entry = ManifestEntry.from_json(raw)
        except (ValueError, TypeError) as exc:
            problems.append(VerifyProblem(f"manifest.jsonl:{no}", f"unreadable line: {exc}"))
            continue
        if entry.index in entries:
            problems.append(VerifyProblem(f"manifest.jsonl:{no}", f"line index {entry.index} appears twice"))
        if entry.sample_id in seen_ids:
            problems.append(VerifyProblem(f"manifest.jsonl:{no}", f"sample id {entry.sample_id} appears twice"))
        entries[entry.index] = entry
        seen_ids[entry.sample_id] = entry.index
    return entries


def _match_manifest_to_disk(out: OutputDir, ok_entries: dict[str, ManifestEntry], problems: list[VerifyProblem],
                            warnings: list[str]) -> set[str]:
    """The sample files on disk (relative paths); a file without an ``ok`` line, or the reverse, is a problem."""
    on_disk = sorted(p for p in out.root.rglob("*") if p.is_file() and p.name.endswith((".ckpt", ".ckpt.gz")))
    rels = {str(p.relative_to(out.root)) for p in on_disk}
    for rel in sorted(rels - set(ok_entries)):
        problems.append(VerifyProblem(rel, "not in manifest.jsonl (SpecForge would train on it)"))
    for rel in sorted(set(ok_entries) - rels):
        problems.append(VerifyProblem(rel, f"listed in manifest.jsonl (sample {ok_entries[rel].sample_id}) "
                                           "but missing"))
    tmp_left = list(out.root.rglob("*.tmp"))
    if tmp_left:
        warnings.append(f"{len(tmp_left)} leftover .tmp files (an interrupted write; SpecForge ignores them)")
    return rels


def _check_files(out: OutputDir, ok_entries: dict[str, ManifestEntry], present: set[str], info: dict[str, Any],
                 problems: list[VerifyProblem], log: Callable[[str], None] | None) -> int:
    """Every sample file that is both listed and present, in manifest order; returns how many were checked."""
    checked = 0
    for rel in sorted(present & set(ok_entries), key=lambda r: ok_entries[r].index):
        checked += 1
        found = _check_one_file(out.root / rel, ok_entries[rel], info.get("hidden_size"), info.get("aux_width"))
        problems.extend(VerifyProblem(rel, message) for message in found)
        if log and checked % 1000 == 0:
            log(f"verified {checked}/{len(ok_entries)} files")
    return checked


def _check_one_file(path: Path, entry: ManifestEntry, hidden_size: Any, aux_width: Any) -> list[str]:
    """The file's own checks, then what its manifest line says of it (checksum, T, sample id)."""
    found, data = check_sample_file(path, hidden_size, aux_width)
    actual = file_crc32(path) if entry.checksum and _CHECKSUM_RE.match(entry.checksum) else None
    if actual is not None and actual != entry.checksum:
        found.append(f"checksum {actual} != manifest {entry.checksum} (the file changed after writing)")
    if data and not found:
        if data["input_ids"].shape[0] != entry.tokens:
            found.append(f"T = {data['input_ids'].shape[0]} but the manifest says {entry.tokens}")
        if data.get("sample_id") != entry.sample_id:
            found.append(f"sample_id {data.get('sample_id')!r} != manifest {entry.sample_id!r}")
    return found


def _check_counts(info: dict[str, Any], ok_entries: dict[str, ManifestEntry], problems: list[VerifyProblem]) -> None:
    counts = info.get("counts") or {}
    if info.get("complete") and counts.get("ok") is not None and counts["ok"] != len(ok_entries):
        problems.append(VerifyProblem("dataset.json", f"counts.ok = {counts['ok']} but the manifest lists "
                                                      f"{len(ok_entries)} ok samples"))


def _check_against_http(out: OutputDir, info: dict[str, Any], by_index: list[ManifestEntry], n: int,
                        server_url: str | None, problems: list[VerifyProblem]) -> tuple[HttpComparison, ...]:
    if n <= 0:
        return ()
    url = server_url or info.get("server_url")
    if not url:
        problems.append(VerifyProblem("dataset.json", "no server_url recorded; pass --server-url"))
        return ()
    rid_prefix = info.get("rid_prefix") or ""
    return tuple(_compare_http(out.root, e, url, rid_prefix) for e in _spread(by_index, n))


def _check_lm_head(out: OutputDir, info: dict[str, Any], by_index: list[ManifestEntry], model_path: Path | None,
                   min_top1: float, samples: int, problems: list[VerifyProblem]) -> LmHeadReport | None:
    model = model_path or (Path(info["model"]["path"]) if info.get("model", {}).get("path") else None)
    if model is None:
        problems.append(VerifyProblem("dataset.json", "no model path recorded; pass --model-path"))
        return None
    try:
        return _lm_head_agreement(out.root, _spread(by_index, samples), model, min_top1)
    except LookupError as exc:
        problems.append(VerifyProblem(str(model), str(exc)))
        return None


def _spread(items: list[Any], n: int) -> list[Any]:
    if n >= len(items):
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def _compare_http(root: Path, entry: Any, url: str, rid_prefix: str) -> HttpComparison:
    import json

    import torch

    from sessions import server_answers

    with safe_files.opened_path(root / entry.path, safe_files.OUTPUT_DATA) as opened:
        data = torch.load(opened, weights_only=True, mmap=True)
    ids = data["input_ids"].tolist()
    rid = f"verify-{uuid.uuid4().hex}"
    if rid_prefix and rid.startswith(rid_prefix):  # never let the capture plugin dump a verify request
        rid = f"x{rid}"
    payload = {"input_ids": ids, "rid": rid, "return_hidden_states": True,
               "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}

    def failed(note: str) -> HttpComparison:
        return HttpComparison(entry.path, len(ids), None, None, False, note)

    # The one bounded reader (adv22: httpx.post read any size for up to 600 s a byte, and a deep, NaN or
    # non-object answer raised out of verify).  The answer holds one row of floats per prompt token: it can
    # not honestly be larger than ~32 bytes per float, so the cap follows from what was asked.
    width = int(data["aux_hidden_state"].shape[-1]) if data["aux_hidden_state"].dim() else 1
    answer = server_answers.fetch(f"{url.rstrip('/')}/generate", method="POST", deadline_s=600.0,
                                  max_bytes=max(server_answers.JSON_MAX_BYTES, (len(ids) + 2) * width * 32),
                                  headers={"Content-Type": "application/json"},
                                  body=json.dumps(payload).encode("utf-8"))
    if answer.error is not None:
        return failed(f"request failed: {answer.error}")
    if answer.status != 200:
        return failed(f"HTTP {answer.status}: {answer.text()[:200]}")
    body, why = server_answers.parse_json(answer.body, expect=None)
    body = body[0] if isinstance(body, list) and body else body
    if why is not None or not isinstance(body, dict):
        return failed(f"the /generate answer {why or 'is ' + server_answers.kind_of(body) + ', not an object'}")
    meta = body.get("meta_info")
    states = meta.get("hidden_states") if isinstance(meta, dict) else None
    if not states or not isinstance(states, list) or not isinstance(states[0], list) or not states[0] \
            or not isinstance(states[0][0], list):
        return failed("the server returned no prefill hidden states (is it launched with the aux flags?)")
    try:
        served = torch.tensor(states[0], dtype=torch.float32)
    except (TypeError, ValueError) as exc:  # ragged rows, strings: not a matrix of numbers
        return failed(f"the served hidden states are not a matrix of numbers ({exc})")
    stored = data["aux_hidden_state"][0].float()
    if served.shape != stored.shape:
        width_note = (" (final states only: the server lacks --enable-return-aux-hidden-states)"
                      if served.shape[-1] == data["hidden_state"].shape[-1] else "")
        rows_note = (" (fewer rows: chunked prefill drops middle chunks on the HTTP path; use "
                     "--chunked-prefill-size -1)" if served.shape[0] < stored.shape[0] else "")
        return HttpComparison(entry.path, len(ids), None, None, False,
                              f"served shape {tuple(served.shape)} != stored {tuple(stored.shape)}"
                              f"{width_note}{rows_note}")
    cosine = torch.nn.functional.cosine_similarity(served, stored, dim=1)
    diff = (served - stored).abs().max().item()
    min_cos = float(cosine.min())
    return HttpComparison(entry.path, len(ids), min_cos, diff, min_cos >= 0.99)


def load_lm_head(model_path: Path) -> Any:
    """Only the lm_head weight (or the tied embedding) from the model's safetensors, [vocab, H]."""
    from safetensors import safe_open

    config = safe_files.read_json(model_path / "config.json", safe_files.MODEL_CONFIG) \
        if (model_path / "config.json").is_file() else {}
    config = config if isinstance(config, dict) else {}
    tied = bool(config.get("tie_word_embeddings") or (config.get("text_config") or {}).get("tie_word_embeddings"))
    keys = _LM_HEAD_KEYS + (_EMBED_KEYS if tied else ())
    index = model_path / "model.safetensors.index.json"
    files: list[Path]
    if index.is_file():
        weight_map = (safe_files.read_json(index, safe_files.WEIGHT_INDEX) or {}).get("weight_map", {})
        for key in keys:
            if key in weight_map:
                with safe_files.opened_path(model_path / weight_map[key], safe_files.WEIGHTS) as opened, \
                        safe_open(opened, "pt") as fh:
                    return fh.get_tensor(key)
        files = []
    else:
        files = sorted(model_path.glob("*.safetensors"))
    for path in files:
        with safe_files.opened_path(path, safe_files.WEIGHTS) as opened, safe_open(opened, "pt") as fh:
            names = set(fh.keys())
            for key in keys:
                if key in names:
                    return fh.get_tensor(key)
    raise LookupError(f"no lm_head weight ({', '.join(keys)}) in the safetensors of {model_path}")


def _lm_head_agreement(root: Path, entries: list[Any], model_path: Path, min_top1: float,
                       max_positions_per_sample: int = 256) -> LmHeadReport:
    import torch

    weight = load_lm_head(model_path)
    positions = agree = 0
    for entry in entries:
        with safe_files.opened_path(root / entry.path, safe_files.OUTPUT_DATA) as opened:
            data = torch.load(opened, weights_only=True, mmap=True)
        ids, mask = data["input_ids"], data["loss_mask"]
        hidden = data["hidden_state"][0]
        # Position t predicts token t+1; check where t+1 is an assistant token.
        where = (mask[1:] == 1).nonzero().flatten()[:max_positions_per_sample]
        if where.numel() == 0:
            continue
        h = hidden[where].float()
        best_score = torch.full((h.shape[0],), float("-inf"))
        best_id = torch.zeros(h.shape[0], dtype=torch.int64)
        for start in range(0, weight.shape[0], 16384):  # vocab in slices: a 160K x 7K head stays small
            scores = h @ weight[start:start + 16384].float().T
            value, index = scores.max(dim=1)
            better = value > best_score
            best_score = torch.where(better, value, best_score)
            best_id = torch.where(better, index + start, best_id)
        positions += int(where.numel())
        agree += int((best_id == ids[where + 1]).sum())
    return LmHeadReport(positions, agree, min_top1)
