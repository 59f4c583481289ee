"""What a start ran with, kept so that a failed start can be diffed against the last good one.

At launch, `collect` notes everything that can make one start of a profile behave differently from the
previous one: the resolved command line and environment (redacted), the SGLang version, a hash of the
model's (and the draft model's) ``config.json``, the GPU names and the driver, ``CUDA_VISIBLE_DEVICES``
and, for the emulator, its settings.  The facts are written to ``start_facts.json`` in the session folder
and copied into the profile's history when the start ends (`sessions.history`), where `diff` turns two of
them into the list of changes the diagnosis shows: ``{what, before, after}``.

Everything here is redacted before it is written (secret env names and flag values, secret-shaped and
known secret values), so a diff never shows a secret; two different secrets both read ``***`` and do not
count as a change.
"""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions import safe_files
from sessions.home import atomic_write_json
from sessions.redaction import redact_argv, redact_env, redact_text, secret_values

if TYPE_CHECKING:
    from sessions.profiles import LaunchProfile

FACTS_FILE = "start_facts.json"
FACTS_VERSION = 1
# Environment that can change how SGLang starts (the rest of a shell's environment is noise for a diff).
_RELEVANT_ENV = re.compile(
    r"^(NCCL_|CUDA_|SGLANG_|SGL_|TORCH_|TORCHINDUCTOR_|GLOO_|FLASHINFER_|TRITON_|HF_|NVIDIA_|OMP_|MASTER_"
    r"|PYTORCH_|DG_|DEEPGEMM_|NVSHMEM_|UCX_|MC_|LD_LIBRARY_PATH$|PYTHONPATH$|VIRTUAL_ENV$)"
    r"|^(http_proxy|https_proxy|all_proxy|no_proxy)$",
    re.IGNORECASE,
)
# Set by eagle3-tui for every launch (the session id differs each time): never a change.
_OUR_ENV = frozenset({"EAGLE3_TUI_SESSION", "PYTHONUNBUFFERED"})
# The emulator's own flags are covered by the emulator settings; a diff lists them once, as settings.
_EMULATOR_FLAG = re.compile(r"^--(?:emulate-|time-scale)")
EMULATED_DRIVER = "570.172.08 (emulated)"
NVML_TIMEOUT_S = 3.0  # NVML can hang on a sick driver; a launch never waits longer than this for it


# --- collecting -----------------------------------------------------------------------------------------


def config_sha256(model_path: str | os.PathLike | None) -> str | None:
    """sha256 of ``<model_path>/config.json`` (the bytes), None when there is none to read."""
    if not model_path:
        return None
    path = Path(os.path.expanduser(str(model_path))) / "config.json"
    try:  # a FIFO, /dev/zero or a huge file there is refused at once, never hashed
        return hashlib.sha256(safe_files.read_bytes(path, safe_files.MODEL_CONFIG)).hexdigest()
    except OSError:
        return None


def argv_value(argv: Sequence[str], *flags: str) -> str | None:
    """The value of the last of ``flags`` in ``argv`` (``--flag v`` or ``--flag=v``), as argparse keeps it."""
    found = None
    for i, token in enumerate(argv):
        for flag in flags:
            if token == flag and i + 1 < len(argv):
                found = argv[i + 1]
            elif token.startswith(flag + "="):
                found = token[len(flag) + 1:]
    return found


def _visible(count: int, cvd: str | None) -> list[int]:
    """GPU indices a process sees with ``CUDA_VISIBLE_DEVICES`` = ``cvd`` (None: all of them)."""
    if cvd is None:
        return list(range(count))
    picked = []
    for part in cvd.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count:
            picked.append(int(part))
    return picked


def _nvml_gpus() -> tuple[list[str], str | None, str | None]:
    """(GPU names, driver version, why not) from NVML, read on a thread that may not take long."""
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            try:
                driver = pynvml.nvmlSystemGetDriverVersion()
                names = []
                for i in range(pynvml.nvmlDeviceGetCount()):
                    name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                    names.append(name.decode() if isinstance(name, bytes) else str(name))
                result["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
                result["names"] = names
            finally:
                with contextlib.suppress(Exception):
                    pynvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - no driver, no library: the facts say so
            result["error"] = f"NVML not available: {type(exc).__name__}: {exc}"

    thread = threading.Thread(target=read, name="start-facts-nvml", daemon=True)
    thread.start()
    thread.join(NVML_TIMEOUT_S)
    if thread.is_alive():
        return [], None, f"NVML did not answer within {NVML_TIMEOUT_S:.0f} s"
    return list(result.get("names", [])), result.get("driver"), result.get("error")


def _sglang_version(profile: LaunchProfile, env: Mapping[str, str]) -> str | None:
    if profile.server.launcher == "emulator":
        from sessions.emulator.args import SGLANG_VERSION

        return SGLANG_VERSION
    try:
        from sessions.sglang_source import find_sglang

        source = find_sglang(profile.server.python, env=env)
    except Exception:  # noqa: BLE001 - an unreadable install is a fact too: no version
        return None
    return source.version if source is not None else None


def collect(profile: LaunchProfile, argv: Sequence[str], env_changes: Mapping[str, str],
            base_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The facts of a start about to run ``argv`` with ``env_changes`` on top of ``base_env``
    (default: this process's environment), redacted.  Never raises for what it probes."""
    base = dict(os.environ if base_env is None else base_env)
    full_env = base | dict(env_changes)
    known = secret_values(full_env)
    env = redact_env({name: full_env[name] for name in sorted(full_env)
                      if name not in _OUR_ENV and (name in env_changes or _RELEVANT_ENV.search(name))}, known)
    cvd = full_env.get("CUDA_VISIBLE_DEVICES")
    server = profile.server
    driver: str | None
    gpu_note: str | None
    if server.launcher == "emulator":
        from sessions.emulator.gpu_memory import EMULATED_GPU_NAME

        count = int(getattr(profile.emulator, "gpus", 8) or 8)
        names = [EMULATED_GPU_NAME] * len(_visible(max(count, server.tp_size), cvd))
        driver, gpu_note = EMULATED_DRIVER, "emulated"
    else:
        all_names, driver, gpu_note = _nvml_gpus()
        names = [all_names[i] for i in _visible(len(all_names), cvd)]
    draft = argv_value(argv, "--speculative-draft-model-path", "--speculative-draft-model")
    facts: dict[str, Any] = {
        "v": FACTS_VERSION,
        "launcher": server.launcher,
        "argv": [redact_text(a, known) for a in redact_argv(argv)],
        "env": env,
        "sglang_version": _sglang_version(profile, full_env),
        "model_path": redact_text(str(server.model_path), known),
        "model_config_sha256": config_sha256(server.model_path),
        "gpus": names,
        "gpu_driver": driver,
        "gpu_note": gpu_note,
        "cuda_visible_devices": cvd,
    }
    if draft:
        facts["draft_config_sha256"] = config_sha256(draft)
    if server.launcher == "emulator":
        emulator = profile.emulator
        facts["emulator"] = {k: getattr(emulator, k) for k in emulator.__dataclass_fields__}
    return facts


def write(session_dir: Path, facts: Mapping[str, Any]) -> None:
    atomic_write_json(Path(session_dir) / FACTS_FILE, dict(facts))


def read(session_dir: Path | None) -> dict[str, Any] | None:
    """The facts a session was launched with; None for a session launched before they were kept, or
    whose facts cannot be read (`read_checked` says why)."""
    return read_checked(session_dir)[0]


def read_checked(session_dir: Path | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the facts, None), or (None, the problem) when ``start_facts.json`` is there but cannot be used: a
    device such as ``/dev/urandom``, a FIFO, a hard link, deep JSON, not an object.  Never raises, so a
    bad facts file fails only the part of a diagnosis that shows them."""
    if session_dir is None:
        return None, None
    path = Path(session_dir) / FACTS_FILE
    try:
        data = safe_files.read_json(path, safe_files.START_FACTS)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, safe_files.describe_os_error(exc, path)
    if not isinstance(data, dict):
        return None, f"{path}: not a JSON object"
    return checked(data), None


_FACT_TEXTS = ("launcher", "sglang_version", "model_path", "model_config_sha256", "draft_config_sha256",
               "gpu_driver", "gpu_note", "cuda_visible_devices")


def checked(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Facts with the types `diff` relies on; a field of another type is dropped (a damaged or hand-edited
    file): ``argv`` and ``gpus`` lists of strings, ``env`` strings by name, ``emulator`` scalars."""
    # scalars are kept as they are (a field added later); the fields `diff` reads are checked below
    out: dict[str, Any] = {k: v for k, v in facts.items() if v is None or isinstance(v, (str, int, float, bool))}
    for key in _FACT_TEXTS:
        if key in out and out[key] is not None and not isinstance(out[key], str):
            del out[key]
    for key in ("argv", "gpus", "env", "emulator"):
        out.pop(key, None)  # collections only; a scalar under these names is damage
    for key in ("argv", "gpus"):
        values = safe_files.text_list(facts.get(key), 1 << 16)
        if values is not None:
            out[key] = values
    env = facts.get("env")
    if isinstance(env, dict):
        out["env"] = {k: v for k, v in env.items() if isinstance(v, str)}
    emulator = facts.get("emulator")
    if isinstance(emulator, dict):
        out["emulator"] = {k: v for k, v in emulator.items() if v is None or isinstance(v, (str, int, float, bool))}
    return out


# --- diffing --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One difference between the last good start and this one; ``before``/``after`` None = absent."""

    what: str  # "--attention-backend", "env NCCL_P2P_DISABLE", "SGLang version", ...
    before: str | None
    after: str | None
    kind: str  # flag, env, version, model_config, draft_config, gpus, driver, cuda_visible_devices,
    # emulator, launcher
    name: str  # the flag or variable itself (what a known cause's `implicates` is matched against)
    implicated_by: tuple[str, ...] = ()  # known causes (catalogue ids) that name this flag/variable
    hinted_by: tuple[str, ...] = ()  # those of them that match this start now (they are among its hints)

    @property
    def change(self) -> str:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "changed"

    def describe(self) -> str:
        if self.before is None:
            return f"{self.what} added: {self.after}"
        if self.after is None:
            return f"{self.what} removed (was {self.before})"
        return f"{self.what}: {self.before} -> {self.after}"

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "before": self.before,
            "after": self.after,
            "kind": self.kind,
            "change": self.change,
            "implicated_by": list(self.implicated_by),
            "hinted_by": list(self.hinted_by),
        }


_SET = "(set)"  # a flag without a value


def _is_value(token: str) -> bool:
    # argparse takes a token that starts with "-" as the next option unless it is a negative number
    return not token.startswith("-") or bool(re.fullmatch(r"-\d+(\.\d*)?|-\.\d+", token))


def parse_flags(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """(``--flag`` -> value (``(set)`` for a bare flag, values of ``nargs='+'`` joined by spaces), the
    tokens before the first flag (interpreter, ``-m``, module))."""
    flags: dict[str, str] = {}
    head: list[str] = []
    i = 0
    while i < len(argv) and not argv[i].startswith("--"):
        head.append(argv[i])
        i += 1
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            continue  # a stray positional: argparse would have refused it
        if "=" in token:
            name, _, value = token.partition("=")
            flags[name] = value
            continue
        values = []
        while i < len(argv) and _is_value(argv[i]):
            values.append(argv[i])
            i += 1
        flags[token] = " ".join(values) if values else _SET
    return flags, head


def _fmt(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _gpus_text(names: Iterable[str] | None) -> str | None:
    names = list(names or [])
    if not names:
        return None
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n}x {name}" for name, n in counts.items())


def diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[Change]:
    """Every change from ``before`` (the last good start) to ``after`` (this one), flags first.

    Either side missing (a start recorded before facts were kept) gives no changes: nothing is known.
    """
    if not before or not after:
        return []
    changes: list[Change] = []
    if before.get("launcher") != after.get("launcher"):
        changes.append(Change("launcher", _fmt(before.get("launcher")), _fmt(after.get("launcher")),
                              "launcher", "launcher"))
    b_flags, b_head = parse_flags(before.get("argv") or [])
    a_flags, a_head = parse_flags(after.get("argv") or [])
    if b_head != a_head:
        changes.append(Change("command", " ".join(b_head) or None, " ".join(a_head) or None, "command",
                              "command"))
    for name in list(dict.fromkeys([*b_flags, *a_flags])):
        if _EMULATOR_FLAG.match(name):
            continue
        b, a = b_flags.get(name), a_flags.get(name)
        if b != a:
            changes.append(Change(name, b, a, "flag", name))
    b_env, a_env = before.get("env") or {}, after.get("env") or {}
    for name in sorted(set(b_env) | set(a_env)):
        if name == "CUDA_VISIBLE_DEVICES":
            continue  # its own row below
        b, a = b_env.get(name), a_env.get(name)
        if b != a:
            changes.append(Change(f"env {name}", b, a, "env", name))
    singles = (
        ("SGLang version", "sglang_version", "version"),
        ("model config.json (sha256)", "model_config_sha256", "model_config"),
        ("draft model config.json (sha256)", "draft_config_sha256", "draft_config"),
        ("GPU driver", "gpu_driver", "driver"),
        ("CUDA_VISIBLE_DEVICES", "cuda_visible_devices", "cuda_visible_devices"),
    )
    for what, key, kind in singles:
        b, a = _fmt(before.get(key)), _fmt(after.get(key))
        if key.endswith("sha256"):
            b, a = (b[:12] if b else b), (a[:12] if a else a)
        if b != a:
            changes.append(Change(what, b, a, kind, "CUDA_VISIBLE_DEVICES" if kind == "cuda_visible_devices"
                                  else key))
    b_gpus, a_gpus = _gpus_text(before.get("gpus")), _gpus_text(after.get("gpus"))
    if b_gpus != a_gpus:
        changes.append(Change("GPUs", b_gpus, a_gpus, "gpus", "gpus"))
    b_emu, a_emu = before.get("emulator") or {}, after.get("emulator") or {}
    for key in list(dict.fromkeys([*b_emu, *a_emu])):
        b, a = _fmt(b_emu.get(key)), _fmt(a_emu.get(key))
        if b != a:
            changes.append(Change(f"emulator.{key}", b, a, "emulator", f"emulator.{key}"))
    return changes


@dataclass(frozen=True)
class Implication:
    """A known cause and the flags/variables (shell-style patterns) it names in ``implicates``."""

    cause_id: str
    patterns: tuple[str, ...] = field(default_factory=tuple)

    def names(self, change: Change) -> bool:
        if change.kind not in ("flag", "env", "cuda_visible_devices"):
            return False
        return any(fnmatch.fnmatchcase(change.name, p) for p in self.patterns)


def mark(changes: Iterable[Change], implications: Iterable[Implication],
         hinted: Iterable[str] = ()) -> list[Change]:
    """``changes`` with ``implicated_by`` (causes that name them) and ``hinted_by`` (of those, the ones in
    ``hinted``, the ids matching this start now) filled in; implicated changes first, order kept."""
    rules = list(implications)
    hinted_ids = set(hinted)
    marked = []
    for change in changes:
        ids = tuple(r.cause_id for r in rules if r.names(change))
        marked.append(Change(change.what, change.before, change.after, change.kind, change.name, ids,
                             tuple(i for i in ids if i in hinted_ids)))
    return sorted(marked, key=lambda c: (not c.hinted_by, not c.implicated_by))


def to_json_list(changes: Iterable[Change]) -> list[dict[str, Any]]:
    return [c.to_json() for c in changes]
