"""The launch profile as data: `LaunchProfile` and its sections, the schema (`SECTIONS`, `_KINDS`), `Problem`."""
from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions.profiles.toml_lines import _did_you_mean, _line_of

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

LAUNCHERS = ("sglang", "emulator")
FAULT_IDS = (
    "none",
    "hang-after-weights",
    "rank-missing",
    "hang-in-graph-capture",
    "oom-kv-cache",
    "address-in-use",
    "crash-while-serving",
    "slow-weights",
    "scheduler-exception",
    "node-never-joins",  # multi-node only: they hit the last node (sessions.emulator.faults)
    "node-dies-loading",
)
SGLANG_MODULE = "sglang.launch_server"
EMULATOR_MODULE = "sessions.emulator"
DEFAULT_PORT = 30000
SECTIONS = ("server", "capture", "watch", "emulator")

# Flags that a profile field produces: passing them again in extra_args would silently override the field
# (argparse keeps the last value), and our probes would then watch the wrong port or rank count.
_FIELD_FLAGS = {
    "--model-path": "server.model_path",
    "--model": "server.model_path",
    "--tp-size": "server.tp_size",
    "--tensor-parallel-size": "server.tp_size",
    "--host": "server.host",
    "--port": "server.port",
    "--attention-backend": "server.attention_backend",
    "--mem-fraction-static": "server.mem_fraction_static",
    "--chunked-prefill-size": "server.chunked_prefill_size",
    "--disable-radix-cache": "server.radix_cache",
    "--disable-cuda-graph": "server.cuda_graph",
}
_EMULATOR_FLAGS = {
    "--time-scale": "emulator.time_scale",
    "--emulate-fault": "emulator.fault",
    "--emulate-gpu-memory-gb": "emulator.gpu_memory_gb",
    "--emulate-gpus": "emulator.gpus",
    "--emulate-decode-tokens-per-s": "emulator.decode_tokens_per_s",
    "--emulate-spec-accept-length": "emulator.spec_accept_length",
    "--emulate-spec-draft-cost": "emulator.spec_draft_cost",
    "--emulate-spec-verify-cost": "emulator.spec_verify_cost",
}
_PER_PHASE_GRAPH_FLAGS = ("--disable-decode-cuda-graph", "--disable-prefill-cuda-graph")
# argparse's test for a negative number that is a value, not an option (Lib/argparse.py).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# At most 200 characters: the file (<name>.toml) and the session folders (<name>-<date>-<time>-<hex>) must
# stay under the 255 a file name may have (a longer name failed with ENAMETOOLONG deep in a command).
PROFILE_NAME_MAX = 200
_PROFILE_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{PROFILE_NAME_MAX - 1}}}$")
# Top-level keys (outside the sections): ``host = "gpu2"`` launches the profile on that host of hosts.toml.
TOP_KEYS = ("host",)


def is_profile_name(name: str) -> bool:
    """A name usable as ``<name>.toml`` and in session folder names."""
    return bool(_PROFILE_NAME.match(name))


# --- problems --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile: the field (``server.port``, ``server.extra_args[2]``), what is
    wrong, the TOML line when known, and whether it stops a launch (``error``) or not (``warning``)."""

    field: str
    message: str
    line: int | None = None
    severity: str = "error"  # "error" | "warning"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.field}: {self.message}{where}"


class ProfileError(Exception):
    """A profile that cannot be loaded or used; ``.problems`` lists every reason.

    ``.profile`` is what could be read despite the problems (None for a TOML syntax error or a missing
    file), so that `validate_profile` can still report the machine-dependent problems of a broken file.
    """

    def __init__(
        self, problems: list[Problem], source: str | Path | None = None, profile: LaunchProfile | None = None
    ) -> None:
        self.problems = list(problems)
        self.profile = profile
        self.source = str(source) if source is not None else None
        head = f"invalid profile {self.source}" if self.source else "invalid profile"
        super().__init__("\n".join([head + ":"] + [f"  {p}" for p in self.problems]))


# --- the profile -----------------------------------------------------------------------------------------


def _default_python() -> str:
    return sys.executable


@dataclass(frozen=True)
class ServerSection:
    launcher: str = "sglang"
    python: str = field(default_factory=_default_python)
    model_path: str = ""
    tp_size: int = 1
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    attention_backend: str | None = None
    cuda_graph: bool = True
    mem_fraction_static: float | None = None
    radix_cache: bool = True
    chunked_prefill_size: int | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # N servers of this profile side by side on one host: member i on GPUs from i*tp*pp, port + i
    # (sessions.server.group); 1 = a plain single server.
    replicas: int = 1
    # SGLang's own data parallelism: --dp-size N (a DP controller, N TP groups behind one URL, replica k on
    # GPUs from k*tp*pp); 1 = none.  `--dp-size` in extra_args works too (not both).
    dp_size: int = 1
    # One server across nodes (sessions.server.nodes): nnodes = N, hosts = the hosts.toml names of its nodes,
    # node 0 first; dist_init_addr = HOST:PORT of the rendezvous (default: node 0's address and a free port).
    nnodes: int = 1
    hosts: tuple[str, ...] = ()
    dist_init_addr: str | None = None
    # SGLang's --gated-launch-port across nodes: every rank waits after distributed init until the launch saw
    # every node's ranks at the gate, then POSTs /gate/activate (the port: a free one on node 0).
    gated_launch: bool = False


@dataclass(frozen=True)
class CaptureSection:
    enabled: bool = False
    layers: tuple[int, ...] | None = None  # physical capture points; None = SGLang's default
    dir: str | None = None
    rid_prefix: str = "eagle3-"


@dataclass(frozen=True)
class WatchSection:
    stall_after_s: float = 300.0


@dataclass(frozen=True)
class EmulatorSection:
    time_scale: float = 0.05
    fault: str = "none"
    gpu_memory_gb: float | None = None  # real GPU memory each emulated rank holds (needs torch + a GPU)
    gpus: int = 8  # emulated GPU count
    decode_tokens_per_s: float = 90.0  # single-stream decode rate (a batch-1 step lasts 1/this seconds)
    # Speculative decoding (EAGLE3 with a draft): mean accepted tokens per verify step, the bonus token
    # included (1 .. num-draft-tokens); one draft forward's cost as a fraction of a decode step (default:
    # from the draft's config); a verify step's cost in decode steps (>= 1).
    spec_accept_length: float | None = None
    spec_draft_cost: float | None = None
    spec_verify_cost: float | None = None


_SECTION_TYPES: dict[str, type[DataclassInstance]] = {
    "server": ServerSection,
    "capture": CaptureSection,
    "watch": WatchSection,
    "emulator": EmulatorSection,
}

# Expected TOML type of each key.  "float" accepts integers too; lists are arrays of one type.
_KINDS: dict[str, dict[str, str]] = {
    "server": {
        "launcher": "str",
        "python": "str",
        "model_path": "str",
        "tp_size": "int",
        "host": "str",
        "port": "int",
        "attention_backend": "str",
        "cuda_graph": "bool",
        "mem_fraction_static": "float",
        "radix_cache": "bool",
        "chunked_prefill_size": "int",
        "extra_args": "list[str]",
        "env": "table[str]",
        "replicas": "int",
        "dp_size": "int",
        "nnodes": "int",
        "hosts": "list[str]",
        "dist_init_addr": "str",
        "gated_launch": "bool",
    },
    "capture": {"enabled": "bool", "layers": "list[int]", "dir": "str", "rid_prefix": "str"},
    "watch": {"stall_after_s": "float"},
    "emulator": {"time_scale": "float", "fault": "str", "gpu_memory_gb": "float", "gpus": "int",
                 "decode_tokens_per_s": "float", "spec_accept_length": "float", "spec_draft_cost": "float",
                 "spec_verify_cost": "float"},
}
# Keys that `to_toml` always writes (the rest only when set, changed from the default, or explicit).
_ALWAYS_WRITTEN = {
    "server": ("launcher", "python", "model_path", "tp_size", "host", "port", "cuda_graph"),
    "capture": ("enabled",),
    "watch": ("stall_after_s",),
    "emulator": ("time_scale", "fault"),
}


@dataclass(frozen=True)
class LaunchProfile:
    """A launch profile.  ``path`` is where it was loaded from (None when built in memory).

    ``explicit_keys`` holds the dotted keys the TOML (or `with_changes`) set on purpose, so that a rule can
    tell ``radix_cache = true`` written by the user from the default (DESIGN §5 refuses the former with
    capture).  ``key_lines`` maps dotted keys to TOML lines for messages.  Neither takes part in equality.
    """

    name: str
    server: ServerSection = field(default_factory=ServerSection)
    # A host of <config>/hosts.toml (sessions.remote): launching runs `launch` there; None: this machine.
    host: str | None = None
    capture: CaptureSection = field(default_factory=CaptureSection)
    watch: WatchSection = field(default_factory=WatchSection)
    emulator: EmulatorSection = field(default_factory=EmulatorSection)
    path: Path | None = field(default=None, compare=False)
    explicit_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    key_lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def is_explicit(self, dotted_key: str) -> bool:
        return dotted_key in self.explicit_keys

    def line_of(self, dotted_key: str) -> int | None:
        return _line_of(self.key_lines, dotted_key)

    def to_toml(self) -> str:
        """The profile as a new TOML file (loads back to an equal profile); `save_profile` edits an existing
        file in place instead (`sessions.profile_toml`), keeping its comments."""
        import tomli_w

        header = f"# eagle3-tui launch profile '{self.name}'\n"
        return header + tomli_w.dumps(self.to_doc())

    def to_doc(self) -> dict[str, Any]:
        """The profile as TOML tables: section -> key -> value, only what the file needs to hold."""
        doc: dict[str, Any] = {"host": self.host} if self.host is not None else {}
        for section in SECTIONS:
            if section == "emulator" and self.server.launcher != "emulator" and not self._touched(section):
                continue
            values = self._section_doc(section)
            if values:
                doc[section] = values
        return doc

    def _touched(self, section: str) -> bool:
        current, default = getattr(self, section), _SECTION_TYPES[section]()
        return any(
            getattr(current, f.name) != getattr(default, f.name) or f"{section}.{f.name}" in self.explicit_keys
            for f in dataclasses.fields(current)
        )

    def _section_doc(self, section: str) -> dict[str, Any]:
        current, default = getattr(self, section), _SECTION_TYPES[section]()
        out: dict[str, Any] = {}
        for f in dataclasses.fields(current):
            value = getattr(current, f.name)
            if value is None:
                continue
            wanted = (
                f.name in _ALWAYS_WRITTEN[section]
                or f"{section}.{f.name}" in self.explicit_keys
                or value != getattr(default, f.name)
            )
            if not wanted:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, dict):
                if not value and f"{section}.{f.name}" not in self.explicit_keys:
                    continue
                value = dict(value)
            out[f.name] = value
        return out

    def with_changes(self, **section_updates: Any) -> LaunchProfile:
        """A copy with some values changed: ``p.with_changes(server={"port": 30001}, emulator={...})``.

        A section may also be given as a whole section object; ``name=`` and ``path=`` change those.
        Changed keys become explicit.  Unknown sections or keys raise `ProfileError`; values are not
        checked here (`validate_profile` does that).
        """
        replacements: dict[str, Any] = {}
        explicit = set(self.explicit_keys)
        problems: list[Problem] = []
        for key, update in section_updates.items():
            if key in ("name", "path", "host"):
                replacements[key] = Path(update) if key == "path" and update is not None else update
                continue
            if key not in _SECTION_TYPES:
                problems.append(Problem(key, f"unknown section (sections: {', '.join(SECTIONS)})"))
                continue
            current = getattr(self, key)
            if isinstance(update, _SECTION_TYPES[key]):
                new = update
            elif isinstance(update, Mapping):
                names = {f.name for f in dataclasses.fields(current)}
                unknown = [k for k in update if k not in names]
                for k in unknown:
                    problems.append(Problem(f"{key}.{k}", "unknown key" + _did_you_mean(k, names)))
                if unknown:
                    continue
                new = dataclasses.replace(current, **{k: _normalize(key, k, v) for k, v in update.items()})
            else:
                problems.append(Problem(key, f"must be a mapping of keys to values, not {type(update).__name__}"))
                continue
            for f in dataclasses.fields(new):
                if getattr(new, f.name) != getattr(current, f.name):
                    explicit.add(f"{key}.{f.name}")
            replacements[key] = new
        if problems:
            raise ProfileError(problems)
        return dataclasses.replace(self, explicit_keys=frozenset(explicit), **replacements)


def _normalize(section: str, key: str, value: Any) -> Any:
    """Lists become tuples, ints in float fields become floats, tables are copied (only when well typed)."""
    kind = _KINDS[section].get(key)
    if kind and kind.startswith("list[") and isinstance(value, list):
        return tuple(value)
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "table[str]" and isinstance(value, Mapping):
        return dict(value)
    return value
