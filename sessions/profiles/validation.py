"""Everything that stops a profile from launching on this machine: model dir, port, GPUs, python, the installed SGLang, capture rules."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessions.model_config import ModelConfigError, read_model_config
from sessions.profiles.command import _number, _server_env
from sessions.profiles.fields import (
    _gpus,
    dp_replicas_of,
    field_problems,
    gpus_per_server,
    nnodes_of,
    pp_size_of,
)
from sessions.profiles.model import _EMULATOR_FLAGS, _FIELD_FLAGS, _NEGATIVE_NUMBER, LaunchProfile, Problem
from sessions.profiles.toml_lines import _did_you_mean

# --- validation ------------------------------------------------------------------------------------------


def validate_profile(
    profile: LaunchProfile, check_port: bool = True, *, nvml_gpu_count: int | None = None
) -> list[Problem]:
    """Every problem that stops ``profile`` from launching here (errors) or deserves a look (warnings).

    ``nvml_gpu_count`` replaces the NVML device count (None: ask NVML; without NVML the check is skipped).
    """
    problems = list(field_problems(profile))
    bad_fields = {p.field for p in problems if p.is_error}
    if profile.host is not None and profile.host != "local" and "host" not in bad_fields:
        # Another host's profile: the machine checks (python, model, GPUs, port) are that host's, and its
        # own CLI runs them when it launches; here only the host must be known.
        problems += _remote_host_problems(profile)
        return [_with_line(p, profile) for p in problems]

    def usable(*prefixes: str) -> bool:  # machine checks only look at well-formed values
        return not any(f == pre or f.startswith((pre + ".", pre + "[")) for f in bad_fields for pre in prefixes)

    s = profile.server

    def machine(field: str, check: Callable[[], list[Problem]]) -> None:
        # A check of this machine never tracebacks: what it could not look at is a problem of its field.
        try:
            problems.extend(check())
        except Exception as exc:  # noqa: BLE001 - validation answers, it never raises
            problems.append(Problem(field, f"cannot be checked: {type(exc).__name__}: {str(exc)[:200]}"))

    python_ok = False
    if usable("server.python"):
        found: list[Problem] = []
        machine("server.python", lambda: [] if _python_problems(profile, found) else found)
        python_ok = not found and not any(p.field == "server.python" for p in problems)
    if usable("server.model_path"):
        machine("server.model_path", lambda: _model_problems(profile))
    if usable("server.host"):
        machine("server.host", lambda: _host_problems(profile, check_port and usable("server.port")))
    if s.launcher == "sglang" and usable("server.tp_size", "server.env", "server.replicas", "server.extra_args"):
        machine("server.tp_size", lambda: _gpu_problems(profile, nvml_gpu_count))
    if usable("server.extra_args", "server.env", "server.launcher"):
        machine("server.extra_args", lambda: _sglang_problems(profile, python_ok, bad_fields))
    if usable("capture", "server.launcher"):
        machine("capture", lambda: _capture_problems(profile))
    return [_with_line(p, profile) for p in problems]


def _remote_host_problems(profile: LaunchProfile) -> list[Problem]:
    from sessions.home import resolve_home
    from sessions.remote.hosts import HostsError, hosts_path, load_hosts

    home = resolve_home()
    try:
        hosts = load_hosts(home)
    except HostsError as exc:
        return [Problem("host", f"cannot be checked: {exc}", profile.line_of("host"))]
    if profile.host in hosts:
        return []
    known = ", ".join(sorted(hosts)) or "none"
    return [Problem("host", f"no host {profile.host!r} in {hosts_path(home)} (hosts there: {known})",
                    profile.line_of("host"))]


def _with_line(problem: Problem, profile: LaunchProfile) -> Problem:
    if problem.line is not None or not profile.key_lines:
        return problem
    line = profile.line_of(problem.field)
    return dataclasses.replace(problem, line=line) if line else problem


def _python_problems(profile: LaunchProfile, problems: list[Problem]) -> bool:
    from sessions.sglang_source import resolve_python

    python = profile.server.python
    resolved = resolve_python(python)
    if resolved is None:
        problems.append(Problem("server.python", f"{python} is not an executable Python interpreter"))
        return False
    problem = python_version_problem(resolved)
    if problem is not None:
        problems.append(Problem("server.python", f"{python}: {problem}"))
        return False
    return True


PYTHON_CHECK_TIMEOUT_S = 10.0
MIN_PYTHON = (3, 10)
_PYTHON_PROBE = "import sys; print('eagle3-python', sys.version_info[0], sys.version_info[1])"


@functools.lru_cache(maxsize=32)  # one run per interpreter per process: validation runs on every edit
def python_version_problem(python: str) -> str | None:
    """None when ``python`` runs ``-c`` as a Python >= 3.10 would, else what is wrong (``/bin/sh`` is an
    executable but not a Python)."""
    import subprocess

    try:
        done = subprocess.run([python, "-c", _PYTHON_PROBE], capture_output=True, text=True,
                              timeout=PYTHON_CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return f"did not answer `-c` within {PYTHON_CHECK_TIMEOUT_S:g} s; is it a Python interpreter?"
    except (OSError, ValueError) as exc:
        return f"cannot be run: {getattr(exc, 'strerror', None) or exc}"
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 3 or words[0] != "eagle3-python":
        return "is not a Python interpreter (running it with -c did not print its version)"
    try:
        version = (int(words[1]), int(words[2]))
    except ValueError:
        return "is not a Python interpreter (running it with -c did not print its version)"
    if version < MIN_PYTHON:
        return f"is Python {version[0]}.{version[1]}; SGLang needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer"
    return None


def _model_problems(profile: LaunchProfile) -> list[Problem]:
    raw = profile.server.model_path
    if not raw:
        return [Problem("server.model_path", "is not set: give the model folder (the one with config.json)")]
    path = Path(os.path.expanduser(raw))
    if not path.exists():
        return [Problem("server.model_path", f"model folder {path} does not exist")]
    if not path.is_dir():
        return [Problem("server.model_path", f"{path} is not a folder")]
    if not (path / "config.json").is_file():
        return [Problem("server.model_path", f"{path} has no config.json")]
    try:
        shape = read_model_config(path)
    except ModelConfigError as exc:
        return [Problem("server.model_path", str(exc))]
    if shape.num_hidden_layers is None or shape.hidden_size is None:
        return [Problem("server.model_path",
                        f"{path / 'config.json'} has no num_hidden_layers/hidden_size (nor under text_config)",
                        severity="warning")]
    return []


# Names of this machine that the resolver answers from /etc/hosts, not from DNS.
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def _is_ip_literal(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host.split("%", 1)[0])  # fe80::1%eth0: a scoped IPv6 address
    except ValueError:
        return False
    return True


def is_local_name(host: str) -> bool:
    """True for an IP literal and for this machine's own names (``localhost``, its host name): the only
    hosts validation may bind or connect to.  Any other name would be a DNS query the user did not ask
    for (typing in the profile editor validates on every key)."""
    import socket

    name = host.strip("[]").rstrip(".").lower()
    return _is_ip_literal(name) or name in _LOCAL_NAMES or name == socket.gethostname().lower()


def _host_problems(profile: LaunchProfile, check_port: bool) -> list[Problem]:
    import errno
    import socket

    s = profile.server
    problems = []
    host = s.host.strip("[]")
    if host in ("0.0.0.0", "::"):
        problems.append(Problem("server.host", f"{s.host} listens on every interface: anyone who can reach this "
                                "machine can use the server (use 127.0.0.1 unless you mean it)", severity="warning"))
    if not is_local_name(host):
        # Never resolved here (no DNS traffic from validation); the port check needs an address too.
        return problems + [Problem("server.host", f"{s.host!r} is a host name, not an address of this machine: it "
                                   "is not looked up here (no DNS from validation), so it and the port are not "
                                   "checked; give an IP address such as 127.0.0.1", severity="warning")]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind((host, 0))
    except socket.gaierror as exc:
        return problems + [Problem("server.host", f"cannot resolve {s.host!r}: {exc.strerror}")]
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            return problems + [Problem("server.host", f"{s.host} is not an address of this machine")]
        return problems + [Problem("server.host", f"cannot bind {s.host}: {exc.strerror or exc}")]
    finally:
        probe.close()
    if check_port:
        from sessions import probes

        if not probes.port_free(s.host, s.port):
            if s.port < 1024 and os.geteuid() != 0 and not probes.port_listening(s.host, s.port):
                message = f"port {s.port} is below 1024 and needs root"
            else:
                message = probes.describe_port_user(s.host, s.port) + "; pick another port or stop that server"
            problems.append(Problem("server.port", message))
    return problems


def visible_gpu_count(cuda_visible_devices: str | None, device_count: int) -> int:
    """How many GPUs CUDA will show, given ``CUDA_VISIBLE_DEVICES`` and the devices NVML sees.

    CUDA stops reading the list at the first invalid entry; UUIDs (``GPU-…``, ``MIG-…``) count as given.
    """
    if cuda_visible_devices is None:
        return device_count
    count, seen = 0, set()
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if re.fullmatch(r"\d+", entry):
            index = int(entry)
            if index >= device_count or index in seen:
                break
            seen.add(index)
        elif not entry.startswith(("GPU-", "MIG-")):
            break
        count += 1
    return count


def nvml_device_count() -> int | None:
    """The number of GPUs NVML sees, or None when NVML is not available (no driver, no library)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses or OSError without a driver
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _gpu_problems(profile: LaunchProfile, nvml_gpu_count: int | None) -> list[Problem]:
    count = nvml_gpu_count if nvml_gpu_count is not None else nvml_device_count()
    if count is None:
        return []
    cvd = profile.server.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    visible = visible_gpu_count(cvd, count)
    tp = profile.server.tp_size
    replicas, pp = profile.server.replicas, pp_size_of(profile.server.extra_args)
    dp, nnodes = dp_replicas_of(profile.server), nnodes_of(profile.server)
    need = gpus_per_server(profile.server) * max(1, replicas)  # a node of a multi-node server holds its share
    if need <= visible:
        return []
    source = ""
    if cvd is not None:
        where = "server.env" if "CUDA_VISIBLE_DEVICES" in profile.server.env else "the environment"
        source = f", CUDA_VISIBLE_DEVICES={cvd!r} from {where}"
    what, field = f"TP {tp}" + (f" over {nnodes} nodes" if nnodes > 1 else ""), "server.tp_size"
    if dp > 1:  # the DP controller's replicas sit side by side too
        what, field = f"TP {tp} x PP {pp} x DP {dp}", "server.dp_size"
    if replicas > 1:  # the replicas sit side by side: all of them must fit at once
        what, field = f"{replicas} replicas x {what if dp > 1 else f'TP {tp} x PP {pp}'}", "server.replicas"
    return [Problem(field,
                    f"{what} needs {_gpus(need)} but only {visible} {'is' if visible == 1 else 'are'} visible "
                    f"(NVML sees {count}{source})")]


def _sglang_problems(profile: LaunchProfile, python_ok: bool, bad_fields: set[str]) -> list[Problem]:
    from sessions.sglang_source import locate_sglang

    s = profile.server
    source = None
    if python_ok:
        location = locate_sglang(s.python, env=_server_env(profile))
        source = location.source
        if source is None and s.launcher == "sglang":
            return _extra_arg_problems(profile, None) + [Problem(
                "server.python", f"SGLang checks skipped (attention backend, extra flags): {location.reason}",
                severity="warning")]
    problems = []
    if source is not None and s.attention_backend and "server.attention_backend" not in bad_fields:
        choices = source.attention_backends()
        if choices is not None and s.attention_backend not in choices:
            problems.append(Problem(
                "server.attention_backend",
                f"{s.attention_backend!r} is not an attention backend of SGLang {source.version or '?'} "
                f"(at {source.root}){_did_you_mean(s.attention_backend, choices)}. "
                f"Choices: {', '.join(choices)}"))
    return problems + _extra_arg_problems(profile, source)


def _extra_arg_problems(profile: LaunchProfile, source: Any) -> list[Problem]:
    """Walk extra_args as SGLang's argparse would (``allow_abbrev=True``), reporting every bad token.

    Without a source (SGLang not found) only the flags that profile fields own are recognised, by their
    exact spelling.
    """
    from sessions.sglang_source import resolve_option

    args = list(profile.server.extra_args)
    flags = source.flags() if source is not None else None
    version = f"SGLang {source.version or '?'}" if source is not None else "SGLang"
    owned = dict(_FIELD_FLAGS)
    if profile.server.launcher == "emulator":
        owned.update(_EMULATOR_FLAGS)
    problems: list[Problem] = []
    i = 0
    while i < len(args):
        arg, where = args[i], f"server.extra_args[{i}]"
        i += 1
        if arg == "--":
            problems.append(Problem(where, "'--' ends the options, but SGLang takes no positional arguments"))
            continue
        if not _looks_like_option(arg):
            if flags is not None:
                problems.append(Problem(where, f"{arg!r} follows no flag that takes a value ({version} would "
                                        "stop with 'unrecognized arguments')"))
            continue
        option, eq, inline = arg.partition("=")
        if flags is None or (option in owned and option not in flags):
            field_name = owned.get(option)
            if field_name is None:
                continue
            values = [inline] if eq else []
            if not eq and field_name not in _SWITCH_FIELDS and i < len(args) and not _looks_like_option(args[i]):
                values.append(args[i])
                i += 1
            problems += _owned_flag_problems(where, option, field_name, values, profile)
            continue
        flag, candidates = resolve_option(arg, flags)
        if flag is None:
            if candidates:
                shown = ", ".join(candidates[:8]) + (f" (+{len(candidates) - 8} more)" if len(candidates) > 8 else "")
                problems.append(Problem(where, f"{option} is ambiguous in {version}: it could be {shown}; "
                                        "spell the flag out"))
            else:
                problems.append(Problem(where, f"{version} has no flag {option}" + _did_you_mean(option, flags)))
            while i < len(args) and not _looks_like_option(args[i]):
                i += 1  # most likely the bad flag's own values: one report is enough
            continue
        info = flags[flag]
        if eq:
            values = [inline]
            if not info.takes_value:
                problems.append(Problem(where, f"{flag} takes no value ({arg!r})"))
        else:
            values = []
            most = 1 if info.nargs in (None, "?") else len(args)
            while info.takes_value and i < len(args) and len(values) < most and not _looks_like_option(args[i]):
                values.append(args[i])
                i += 1
            if info.takes_value and not values and info.nargs in (None, "+"):
                wanted = "a value" if info.nargs is None else "one or more values"
                problems.append(Problem(where, f"{flag} expects {wanted}"))
        if info.takes_value:
            problems += _choice_problems(where, flag, values, info)
        field_name = owned.get(flag) or owned.get(info.canonical)
        if field_name is not None:
            problems += _owned_flag_problems(where, option, field_name, values, profile)
    return problems


def _looks_like_option(arg: str) -> bool:
    return arg.startswith("-") and not _NEGATIVE_NUMBER.match(arg)


# Profile fields that emit a valueless switch (the flag is emitted when the field is false).
_SWITCH_FIELDS = frozenset({"server.radix_cache", "server.cuda_graph"})


def _emitted_value(profile: LaunchProfile, field_name: str) -> str | bool | None:
    """What the command already says for a field's flag: its value, for switches whether the flag is
    emitted, None when the field is unset (the flag is not emitted)."""
    s, e = profile.server, profile.emulator
    if field_name == "server.radix_cache":
        return not s.radix_cache
    if field_name == "server.cuda_graph":
        return not s.cuda_graph
    value = {
        "server.model_path": os.path.expanduser(s.model_path),
        "server.tp_size": s.tp_size,
        "server.host": s.host,
        "server.port": s.port,
        "server.attention_backend": s.attention_backend,
        "server.mem_fraction_static": s.mem_fraction_static,
        "server.chunked_prefill_size": s.chunked_prefill_size,
        "emulator.time_scale": e.time_scale,
        "emulator.fault": e.fault,
        "emulator.gpu_memory_gb": e.gpu_memory_gb,
        "emulator.gpus": e.gpus,
        "emulator.decode_tokens_per_s": e.decode_tokens_per_s,
        "emulator.spec_accept_length": e.spec_accept_length,
        "emulator.spec_draft_cost": e.spec_draft_cost,
        "emulator.spec_verify_cost": e.spec_verify_cost,
    }[field_name]
    if value is None:
        return None
    return _number(value) if isinstance(value, float) else str(value)


def _same_value(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return os.path.expanduser(a) == os.path.expanduser(b)


def _owned_flag_problems(
    where: str, option: str, field_name: str, values: list[str], profile: LaunchProfile
) -> list[Problem]:
    """A flag that a profile field already produces: redundant (warning) or contradicting it (error).

    argparse keeps the last value, so extra_args would silently win over the field while eagle3-tui
    (probes, GPU and rank checks) still goes by the field.
    """
    emitted = _emitted_value(profile, field_name)
    if isinstance(emitted, bool):
        if emitted:
            return [Problem(where, f"{option} repeats {field_name} = false; drop it", severity="warning")]
        return [Problem(where, f"{option} contradicts {field_name} = true; set {field_name} = false instead")]
    if emitted is None:
        return [Problem(where, f"{option} does what {field_name} is for; set {field_name} instead, where it is "
                        "checked", severity="warning")]
    if not values:
        return []
    given = values[0]
    if _same_value(given, emitted):
        return [Problem(where, f"{option} {given} repeats {field_name}; drop it", severity="warning")]
    return [Problem(where, f"{option} {given} conflicts with {field_name} = {emitted}: SGLang would use {given} "
                    f"(the last value wins) while eagle3-tui goes by {emitted}; set {field_name} instead")]


def _choice_problems(where: str, flag: str, values: list[str], info: Any) -> list[Problem]:
    if not info.choices:
        return []
    return [
        Problem(where, f"{value!r} is not a valid choice for {flag} (choices: {', '.join(info.choices)})")
        for value in values
        if value not in info.choices
    ]


def _capture_problems(profile: LaunchProfile) -> list[Problem]:
    from sessions.profiles.capture_launch import (
        capture_problems,  # see command._capture_additions for why here
    )

    return list(capture_problems(profile))
