"""Field checks of a loaded profile: types first, then ranges, text hygiene (NULs, control characters, overlong paths)."""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from sessions.profiles.model import _ENV_NAME, _KINDS, FAULT_IDS, LAUNCHERS, SECTIONS, LaunchProfile, Problem
from sessions.profiles.toml_lines import _line_of

# --- field checks (types and ranges) ---------------------------------------------------------------------


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return f"a {type(value).__name__}"


_KIND_TEXT = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "list[str]": "an array of strings",
    "list[int]": "an array of integers",
    "table[str]": "a table of strings",
}


def _scalar_ok(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def _type_problems(dotted: str, value: Any, kind: str, lines: Mapping[str, int]) -> list[Problem]:
    """Problems with the TOML type of one value (None means "not set" and is fine)."""
    if value is None:
        return []
    if kind in ("str", "int", "float", "bool"):
        if _scalar_ok(value, kind):
            return []
        return [Problem(dotted, f"must be {_KIND_TEXT[kind]}, not {_toml_type(value)}", _line_of(lines, dotted))]
    if kind.startswith("list["):
        if not isinstance(value, (list, tuple)):
            return [Problem(dotted, f"must be {_KIND_TEXT[kind]}, not {_toml_type(value)}", _line_of(lines, dotted))]
        elem = kind[5:-1]
        return [
            Problem(f"{dotted}[{i}]", f"must be {_KIND_TEXT[elem]}, not {_toml_type(v)}",
                    _line_of(lines, f"{dotted}[{i}]"))
            for i, v in enumerate(value)
            if not _scalar_ok(v, elem)
        ]
    if kind == "table[str]":
        if not isinstance(value, Mapping):
            return [Problem(dotted, f"must be a table, not {_toml_type(value)}", _line_of(lines, dotted))]
        out = []
        for k, v in value.items():
            key_path = f"{dotted}.{k}"
            if not isinstance(v, str):
                out.append(Problem(key_path, f"must be a string, not {_toml_type(v)} (quote it: {k} = \"{v}\")",
                                   _line_of(lines, key_path)))
        return out
    return []


_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # as sessions.remote.hosts names them


def _host_key_problems(profile: LaunchProfile) -> list[Problem]:
    """The top-level ``host``: a string naming a host (that hosts.toml has it is `validate_profile`'s)."""
    host = profile.host
    if host is None:
        return []
    line = _line_of(profile.key_lines, "host")
    if not isinstance(host, str):
        return [Problem("host", f"must be a host name of hosts.toml, not {_toml_type(host)}", line)]
    if not _HOST_NAME.match(host):
        return [Problem("host", f"{host!r} is not a host name (letters, digits, '.', '_', '-')", line)]
    return []


def field_problems(profile: LaunchProfile) -> list[Problem]:
    """Types and ranges of every value: what a profile must satisfy on any machine."""
    lines = profile.key_lines
    problems: list[Problem] = []
    bad: set[str] = set()
    for section in SECTIONS:
        obj = getattr(profile, section)
        for key, kind in _KINDS[section].items():
            found = _type_problems(f"{section}.{key}", getattr(obj, key), kind, lines)
            if found:
                bad.add(f"{section}.{key}")
                problems += found

    def check(dotted: str, ok: Callable[[], bool], message: str, severity: str = "error") -> None:
        # ``ok`` runs only for a well-typed field: a range check never sees a string ("0.85" < 1.0).
        if dotted in bad or any(dotted.startswith((f + "[", f + ".")) for f in bad):
            return
        try:
            passed = ok()
        except (TypeError, ValueError, OverflowError):
            passed = False
        if not passed:
            problems.append(Problem(dotted, message, _line_of(lines, dotted), severity))

    problems += _text_problems(profile, bad)
    problems += _host_key_problems(profile)

    s, c, w, e = profile.server, profile.capture, profile.watch, profile.emulator
    check("server.launcher", lambda: s.launcher in LAUNCHERS,
          f"must be one of {', '.join(repr(x) for x in LAUNCHERS)}, not {s.launcher!r}")
    check("server.python", lambda: bool(str(s.python).strip()), "must name a Python interpreter")
    check("server.tp_size", lambda: isinstance(s.tp_size, int) and s.tp_size >= 1, f"must be at least 1, not {s.tp_size}")
    check("server.replicas", lambda: 1 <= s.replicas <= MAX_REPLICAS,
          f"must be between 1 and {MAX_REPLICAS} servers, not {s.replicas}")
    replicas_ok = "server.replicas" not in bad  # a wrong type is reported above; no comparison with it
    if replicas_ok and s.replicas > 1 and "server.extra_args" not in bad and any(
            a == "--base-gpu-id" or a.startswith("--base-gpu-id=") for a in s.extra_args):
        problems.append(Problem(
            "server.extra_args", f"--base-gpu-id conflicts with server.replicas = {s.replicas}: each replica "
            "gets its own --base-gpu-id (replica i starts at GPU i x tp x pp); remove it from extra_args",
            _line_of(lines, "server.extra_args")))
    problems += node_field_problems(profile, bad, lambda dotted: _line_of(lines, dotted))
    problems += _dp_problems(s, bad, lines)
    check("server.host", lambda: bool(str(s.host).strip()) and str(s.host).isascii()
          and str(s.host).isprintable() and not any(ch.isspace() for ch in str(s.host)),
          f"must be a host name or address, not {s.host!r}")
    check("server.port", lambda: isinstance(s.port, int) and 1 <= s.port <= 65535,
          f"must be between 1 and 65535, not {s.port}")
    if s.attention_backend is not None:
        check("server.attention_backend", lambda: bool(str(s.attention_backend).strip()),
              "must name a backend (leave it out for SGLang's automatic choice)")
    # The optional values are bound to locals: a lambda keeps the narrowing of a local, not of an attribute.
    if (mem_fraction := s.mem_fraction_static) is not None:
        check("server.mem_fraction_static",
              lambda: math.isfinite(mem_fraction) and 0.0 < mem_fraction < 1.0,
              f"must be between 0 and 1 (exclusive), not {mem_fraction}")
    if (chunk := s.chunked_prefill_size) is not None:
        check("server.chunked_prefill_size", lambda: chunk == -1 or chunk > 0,
              f"must be -1 (no chunking) or a positive token count, not {chunk}")
    # In the loops each check gets its value bound by ``partial``, not read late from the loop variable.
    if "server.extra_args" not in bad:
        for i, arg in enumerate(s.extra_args):
            check(f"server.extra_args[{i}]", partial(bool, arg), "is an empty argument")
    if "server.env" not in bad:
        for name in s.env:
            check(f"server.env.{name}", partial(_is_env_name, name),
                  f"{name!r} is not a valid environment variable name")
    if c.layers is not None and "capture.layers" not in bad:
        seen: set[int] = set()
        for i, layer in enumerate(c.layers):
            check(f"capture.layers[{i}]", partial(_is_layer_index, layer),
                  f"must be a layer index >= 0, not {layer}")
            check(f"capture.layers[{i}]", partial(_not_seen, layer, seen),
                  f"layer {layer} is listed twice")
            seen.add(layer)
    if c.dir is not None:
        check("capture.dir", lambda: bool(str(c.dir).strip()), "must be a folder path (leave it out for the default)")
    check("capture.rid_prefix", lambda: bool(c.rid_prefix),
          "must not be empty: it selects which requests are dumped")
    check("watch.stall_after_s", lambda: _positive(w.stall_after_s), f"must be a number of seconds > 0, not {w.stall_after_s}")
    check("emulator.time_scale", lambda: _positive(e.time_scale), f"must be > 0, not {e.time_scale}")
    check("emulator.fault", lambda: e.fault in FAULT_IDS,
          f"unknown fault {e.fault!r}; known: {', '.join(FAULT_IDS)}")
    if e.gpu_memory_gb is not None:
        check("emulator.gpu_memory_gb", lambda: _positive(e.gpu_memory_gb), f"must be > 0, not {e.gpu_memory_gb}")
    check("emulator.gpus", lambda: isinstance(e.gpus, int) and e.gpus >= 1, f"must be at least 1, not {e.gpus}")
    if (accept := e.spec_accept_length) is not None:
        tokens = _num_draft_tokens(s.extra_args) if isinstance(s.extra_args, (list, tuple)) else None
        check("emulator.spec_accept_length", lambda: accept >= 1 and (tokens is None or accept <= tokens),
              f"must be between 1 and the number of draft tokens ({tokens if tokens else 'num-draft-tokens'}), "
              f"not {accept}: it counts the accepted drafts plus the bonus token of each step")
    if (draft_cost := e.spec_draft_cost) is not None:
        check("emulator.spec_draft_cost", lambda: 0 < draft_cost <= 1,
              f"must be a fraction of a decode step in (0, 1], not {draft_cost}")
    if (verify_cost := e.spec_verify_cost) is not None:
        check("emulator.spec_verify_cost", lambda: verify_cost >= 1,
              f"must be at least 1 (a verify step costs at least a decode step), not {verify_cost}")
    check("emulator.decode_tokens_per_s", lambda: _positive(e.decode_tokens_per_s),
          f"must be a rate in tokens per second > 0, not {e.decode_tokens_per_s}")
    if s.launcher == "emulator" and "emulator.gpus" not in bad and "server.tp_size" not in bad:
        check("server.tp_size", lambda: s.tp_size <= e.gpus,
              f"TP {s.tp_size} needs {_gpus(s.tp_size)} but the emulator has {e.gpus} (emulator.gpus)")
        if replicas_ok and "server.extra_args" not in bad and "server.dp_size" not in bad and (
                s.replicas > 1 or dp_replicas_of(s) > 1):
            need = max(1, s.replicas) * gpus_per_server(s)
            what = (f"{s.replicas} replicas x " if s.replicas > 1 else "") + f"TP {s.tp_size} x PP {pp_size_of(s.extra_args)}"
            if dp_replicas_of(s) > 1:
                what += f" x DP {dp_replicas_of(s)}"
            check("server.replicas" if s.replicas > 1 else "server.dp_size", lambda: need <= e.gpus,
                  f"{what} need {_gpus(need)} but the emulator has {e.gpus} (emulator.gpus)")
    return problems


def _dp_problems(s: Any, bad: set[str], lines: Mapping[str, int]) -> list[Problem]:
    """SGLang's own refusals of a DP layout (parallel_hook.py:287-292, validation_hook.py:199-202), named at
    the profile's field instead of at the server's traceback."""
    if "server.dp_size" in bad or "server.extra_args" in bad:
        return []
    problems = []
    where = _line_of(lines, "server.dp_size")
    if not isinstance(s.dp_size, int) or s.dp_size < 1:
        return [Problem("server.dp_size", f"must be at least 1, not {s.dp_size}", where)]
    args = tuple(str(a) for a in s.extra_args)
    flag = _size_flag(args, DP_FLAGS)
    if s.dp_size > 1 and any(a.partition("=")[0] in DP_FLAGS for a in args):
        problems.append(Problem("server.extra_args", f"--dp-size conflicts with server.dp_size = {s.dp_size}: "
                                "give the DP size once (remove it from extra_args)", _line_of(lines, "server.extra_args")))
    dp = s.dp_size if s.dp_size > 1 else (flag or 1)
    attn_dp = _size_flag(args, ("--attn-dp-size", "--attention-data-parallel-size")) or 1
    if dp > 1 and attn_dp > 1:
        problems.append(Problem("server.dp_size" if s.dp_size > 1 else "server.extra_args",
                                f"--dp-size {dp} with --attn-dp-size {attn_dp}: data-parallel replicas combined "
                                "with attention data parallelism are not supported (SGLang refuses it)", where))
    if dp > 1 and (_size_flag(args, ("--nnodes",)) or 1) > 1:
        problems.append(Problem("server.dp_size" if s.dp_size > 1 else "server.extra_args",
                                "multi-node data-parallel replicas are not supported; use attention DP "
                                "(--attn-dp-size) across nodes (SGLang refuses --dp-size with --nnodes > 1)", where))
    return problems


MAX_REPLICAS = 64


def pp_size_of(extra_args: tuple[str, ...] | list[str]) -> int:
    """The ``--pp-size`` in ``extra_args`` (the last one, as argparse keeps it), 1 when absent or bad."""
    return _size_flag(extra_args, ("--pp-size", "--pipeline-parallel-size")) or 1


DP_FLAGS = ("--dp-size", "--data-parallel-size")
ATTENTION_DP_FLAGS = ("--enable-dp-attention",)


def _size_flag(extra_args: tuple[str, ...] | list[str], names: tuple[str, ...]) -> int | None:
    """The last of ``names`` in ``extra_args`` as an int >= 1 (argparse keeps the last); None when absent
    or bad."""
    value = None
    for i, token in enumerate(extra_args):
        name, eq, inline = str(token).partition("=")
        if name in names:
            text = inline if eq else (extra_args[i + 1] if i + 1 < len(extra_args) else "")
            try:
                value = max(1, int(text))
            except (TypeError, ValueError):
                value = None
    return value


def dp_replicas_of(server: Any) -> int:
    """How many TP groups one server of this profile runs: SGLang's ``--dp-size`` (``server.dp_size`` or the
    flag in extra_args) under its DP controller; 1 under attention DP (``--enable-dp-attention`` or
    ``--attn-dp-size``), which splits the TP group's GPUs and adds none."""
    args = tuple(str(a) for a in server.extra_args)
    if any(a in ATTENTION_DP_FLAGS for a in args) or (_size_flag(args, ("--attn-dp-size",)) or 1) > 1:
        return 1
    dp = server.dp_size if isinstance(server.dp_size, int) and server.dp_size > 1 else None
    return max(1, dp or _size_flag(args, DP_FLAGS) or 1)


def nnodes_of(server: Any) -> int:
    """The nodes one server spans: ``[server] nnodes`` or ``--nnodes`` in extra_args (1: one host)."""
    return max(1, int(server.nnodes), int_flag_of(server.extra_args, ("--nnodes",)) or 1)


def gpus_per_server(server: Any) -> int:
    """GPUs one server takes on each of its hosts: tp x pp x dp (the DP controller's replicas sit side by
    side), shared out over its nodes when it spans several (SGLang refuses DP across nodes)."""
    total = max(1, int(server.tp_size)) * pp_size_of(server.extra_args) * dp_replicas_of(server)
    return max(1, total // nnodes_of(server))


def _num_draft_tokens(extra_args: tuple[str, ...] | list[str]) -> int | None:
    """Tokens per verify step that SGLang will use for these flags (topk 1: steps + 1), None if unknown."""

    def value(flag: str) -> int | None:
        found = None
        for i, token in enumerate(extra_args):
            if not isinstance(token, str):  # a wrong type is field_problems' to report; it names no flag here
                continue
            text = extra_args[i + 1] if token == flag and i + 1 < len(extra_args) else (
                token[len(flag) + 1:] if token.startswith(flag + "=") else None)
            if text is not None:
                try:
                    found = int(text)
                except (TypeError, ValueError):
                    found = None
        return found

    steps, topk = value("--speculative-num-steps"), value("--speculative-eagle-topk")
    if steps is not None and topk == 1:
        return steps + 1
    return value("--speculative-num-draft-tokens")


# C0/C1 control characters and DEL; a NUL can never reach exec, a path or the environment.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 255


def _text_problems(profile: LaunchProfile, bad: set[str]) -> list[Problem]:
    """NULs and control characters in any text field, and overlong paths, named by field (before anything
    hands the value to the OS, which would raise ``embedded null byte`` or ``File name too long``)."""
    lines = profile.key_lines
    problems: list[Problem] = []

    def visit(dotted: str, value: str, allow_newline: bool = False, path: bool = False) -> None:
        if dotted in bad:
            return
        if "\x00" in value:
            problems.append(Problem(dotted, f"holds a NUL character at position {value.index(chr(0))}",
                                    _line_of(lines, dotted)))
            bad.add(dotted)
            return
        found = _CONTROL.search(value if not allow_newline else value.replace("\n", "").replace("\t", ""))
        if found:
            problems.append(Problem(dotted, f"holds the control character {found.group(0)!r}",
                                    _line_of(lines, dotted)))
            bad.add(dotted)
            return
        if path and (len(value) > MAX_PATH_CHARS or any(len(part) > MAX_NAME_CHARS for part in value.split("/"))):
            problems.append(Problem(dotted, f"is too long for a path ({len(value)} characters; the OS allows "
                                    f"{MAX_PATH_CHARS}, {MAX_NAME_CHARS} per name)", _line_of(lines, dotted)))
            bad.add(dotted)

    for section in SECTIONS:
        obj = getattr(profile, section)
        for key, kind in _KINDS[section].items():
            dotted, value = f"{section}.{key}", getattr(obj, key)
            if dotted in bad or value is None:
                continue
            is_path = key in ("model_path", "python", "dir", "tokenizer_path")
            if kind == "str" and isinstance(value, str):
                visit(dotted, value, path=is_path)
            elif kind == "list[str]" and isinstance(value, (list, tuple)):
                for n, item in enumerate(value):
                    if isinstance(item, str):
                        visit(f"{dotted}[{n}]", item)
            elif kind == "table[str]" and isinstance(value, Mapping):
                for name, item in value.items():
                    visit(f"{dotted}.{name}", str(name))
                    if isinstance(item, str):
                        visit(f"{dotted}.{name}", item, allow_newline=True)  # a secret may hold a newline
    return problems


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _is_env_name(name: Any) -> bool:
    return bool(_ENV_NAME.match(name))


def _is_layer_index(layer: Any) -> bool:
    return bool(layer >= 0)


def _not_seen(layer: Any, seen: set[int]) -> bool:
    return layer not in seen


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


MAX_NODES = 64
_DIST_INIT_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


def int_flag_of(extra_args: tuple[str, ...] | list[str], names: tuple[str, ...]) -> int | None:
    """The last ``--flag N`` / ``--flag=N`` of ``names`` in ``extra_args``; None when absent or not a number."""
    value = None
    for i, token in enumerate(extra_args):
        name, eq, inline = str(token).partition("=")
        if name in names:
            text = inline if eq else (extra_args[i + 1] if i + 1 < len(extra_args) else "")
            try:
                value = int(text)
            except ValueError:
                value = None
    return value


def node_field_problems(profile: LaunchProfile, bad: set[str], line_of: Callable[[str], int | None]) -> list[Problem]:
    """``nnodes``/``hosts``/``dist_init_addr``, checked as SGLang checks ``--nnodes`` (validation_hook.py
    check_server_args; docs/sglang-facts.md §10) before anything starts on any node."""
    s = profile.server
    if "server.nnodes" in bad or "server.hosts" in bad:
        return []
    problems: list[Problem] = []

    def problem(dotted: str, message: str) -> None:
        problems.append(Problem(dotted, message, line_of(dotted)))

    if not 1 <= s.nnodes <= MAX_NODES:
        problem("server.nnodes", f"must be between 1 and {MAX_NODES} nodes, not {s.nnodes}")
        return problems
    if s.nnodes == 1:
        if s.hosts and len(s.hosts) != 1:
            problem("server.hosts", f"names {len(s.hosts)} hosts but server.nnodes is 1")
        if s.gated_launch:
            problem("server.gated_launch", "holds the ranks until every node joined: it needs server.nnodes > 1")
        return problems
    if len(s.hosts) != s.nnodes:
        problem("server.hosts", f"must name {s.nnodes} hosts (node 0 first) for server.nnodes = {s.nnodes}, "
                f"not {len(s.hosts)}")
    elif len(set(s.hosts)) != len(s.hosts):
        problem("server.hosts", f"names a host twice: {list(s.hosts)} (one node per host)")
    if "server.extra_args" not in bad:
        pp = pp_size_of(s.extra_args)
        if isinstance(s.tp_size, int) and s.tp_size >= 1 and (s.tp_size * pp) % s.nnodes:
            problem("server.nnodes", f"tp_size x pp_size = {s.tp_size} x {pp} must be divisible by the "
                    f"{s.nnodes} nodes (SGLang: \"tp_size must be divisible by number of nodes\")")
        dp = int_flag_of(s.extra_args, ("--dp-size", "--data-parallel-size"))
        if dp is not None and dp > 1:
            problem("server.extra_args", f"--dp-size {dp} across {s.nnodes} nodes: SGLang refuses multi-node "
                    "data-parallel replicas; use attention DP (--attn-dp-size) across nodes")
        if profile.capture.enabled and pp != 1:
            problem("capture.enabled", f"capture needs pp_size = 1 (SGLang's capture mode), not --pp-size {pp}")
        if s.gated_launch and any(str(a) == "--gated-launch-port" or str(a).startswith("--gated-launch-port=")
                                  for a in s.extra_args):
            problem("server.extra_args", "--gated-launch-port is set by server.gated_launch = true (a free port on "
                    "node 0); remove one of them")
        for flag in ("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr"):
            if any(str(a) == flag or str(a).startswith(flag + "=") for a in s.extra_args):
                problem("server.extra_args", f"{flag} is set per node by server.nnodes/hosts/dist_init_addr; "
                        "remove it from extra_args")
    if s.replicas > 1:
        problem("server.replicas", f"replicas = {s.replicas} cannot be combined with server.nnodes = {s.nnodes}")
    if s.dist_init_addr is not None and "server.dist_init_addr" not in bad:
        match = _DIST_INIT_RE.match(str(s.dist_init_addr))
        if not match or not 1 <= int(match.group(1)) <= 65535:
            problem("server.dist_init_addr", f"must be HOST:PORT (e.g. 192.168.0.2:25000), not {s.dist_init_addr!r}")
    return problems
