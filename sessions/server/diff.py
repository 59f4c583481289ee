"""What a restart changes: the command-line flags and env changes of two profiles, secrets redacted."""
from __future__ import annotations

from sessions.profiles import LaunchProfile, build_command
from sessions.redaction import redact_argv, redact_env


def flag_diff(old: LaunchProfile, new: LaunchProfile) -> list[str]:
    """The command-line flags and env changes that differ, secrets redacted.

    Lines read ``+ --flag value`` (added), ``- --flag value`` (removed), ``~ --flag old -> new`` (changed),
    and the same with ``env NAME=value``.
    """
    old_cmd, new_cmd = build_command(old), build_command(new)
    lines: list[str] = []
    old_head, old_flags = _parse_argv(old_cmd.argv)
    new_head, new_flags = _parse_argv(new_cmd.argv)
    if old_head != new_head:
        lines.append(f"~ command {' '.join(redact_argv(old_head))} -> {' '.join(redact_argv(new_head))}")
    lines += _diff_maps(old_flags, new_flags, prefix="")
    old_env = {k: v for k, v in old_cmd.env_changes.items()}
    new_env = {k: v for k, v in new_cmd.env_changes.items()}
    lines += _diff_maps(
        {k: (v, redact_env({k: v})[k]) for k, v in old_env.items()},
        {k: (v, redact_env({k: v})[k]) for k, v in new_env.items()},
        prefix="env ",
        joiner="=",
    )
    return lines


def _parse_argv(argv: list[str]) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """Split argv into its head (interpreter, -m module) and flag -> (raw value, redacted value)."""
    redacted = redact_argv(argv)
    head_len = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
    flags: dict[str, tuple[list[str], list[str]]] = {}
    current: str | None = None
    for raw, shown in zip(argv[head_len:], redacted[head_len:]):
        if raw.startswith("--"):
            name, eq, value = raw.partition("=")
            _, _, shown_value = shown.partition("=")
            current = name
            entry = flags.setdefault(name, ([], []))
            if eq:
                entry[0].append(value)
                entry[1].append(shown_value)
        elif current is not None:
            flags[current][0].append(raw)
            flags[current][1].append(shown)
    return argv[:head_len], {k: (" ".join(v[0]), " ".join(v[1])) for k, v in flags.items()}


def _diff_maps(
    old: dict[str, tuple[str, str]], new: dict[str, tuple[str, str]], prefix: str, joiner: str = " "
) -> list[str]:
    def show(name: str, value: str) -> str:
        return f"{prefix}{name}{joiner}{value}" if value else f"{prefix}{name}"

    lines = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"- {show(name, old[name][1])}")
        elif name not in old:
            lines.append(f"+ {show(name, new[name][1])}")
        elif old[name][0] != new[name][0]:
            before, after = old[name][1], new[name][1]
            suffix = " (secret changed)" if before == after else ""
            lines.append(f"~ {show(name, before)} -> {after or '(no value)'}{suffix}")
    return lines


