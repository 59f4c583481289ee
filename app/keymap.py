"""Every key of the TUI: one `KeySpec` per action with a stable binding id, and the `[keys]` remap.

Users remap keys by binding id in ``<config>/config.toml``::

    [keys]
    "dashboard.stop" = "S"          # one key
    "dashboard.launch" = "l,ctrl+l" # several keys, comma-separated

tmux, zellij and terminals eat some keys (posting#95), so every binding can move.  A bad entry never
stops the TUI: it is reported (naming the file, the line and what is wrong) and the default stays.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sessions import safe_files
from widgets.bindings import (  # noqa: F401 - bindings is re-exported
    CHOICE_KEYS,
    CONFIRM_KEYS,
    LOG_KEYS,
    KeySpec,
    bindings,
)

APP_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "app.quit",
        "q,ctrl+q",
        "quit",
        "Quit",
        priority=False,
        key_display="q",
        help="Quit the TUI. Servers keep running; reattach with eagle3-tui.",
    ),
    KeySpec(
        "app.help",
        "question_mark",
        "help",
        "Help",
        key_display="?",
        help="Show every key (scroll with the arrows or PgUp/PgDn).",
    ),
    KeySpec(
        "app.command_palette",
        "ctrl+p",
        "command_palette",
        "Palette",
        show=False,
        help="Search every action by name.",
    ),
)

DASHBOARD_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "dashboard.launch", "l", "launch", "Launch", help="Launch the selected profile as a detached server."
    ),
    KeySpec(
        "dashboard.restart",
        "r",
        "restart",
        "Restart",
        help="Restart the selected session with its profile as saved now (shows the flag diff, y/N).",
    ),
    KeySpec(
        "dashboard.stop",
        "s",
        "stop",
        "Stop",
        help="Stop the selected session: SIGTERM, then SIGKILL after the grace period (y/N).",
    ),
    KeySpec(
        "dashboard.edit",
        "e",
        "edit",
        "Edit",
        help="Edit the selected profile: flags, env, capture; live validation and command preview.",
    ),
    KeySpec(
        "dashboard.filter",
        "slash",
        "filter",
        "Filter",
        key_display="/",
        # Before the key goes to the focused widget, so "/Load" typed in one burst lands in the filter
        # (the dashboard's check_action lets "/" through to an input that has focus).
        priority=True,
        help="Filter the log by text, /regex/ or rank. Esc in the log clears the filter.",
    ),
    KeySpec(
        "dashboard.fullscreen",
        "f",
        "fullscreen",
        "Full",
        help="Show the log full-screen (f or Esc to come back).",
    ),
    KeySpec("dashboard.wrap", "w", "wrap", "Wrap", show=False, help="Wrap long log lines."),
    KeySpec(
        "dashboard.timestamps", "t", "timestamps", "Time", show=False, help="Show or hide log timestamps."
    ),
    KeySpec(
        "dashboard.focus_profiles",
        "1",
        "focus_pane(1)",
        "Profiles",
        show=False,
        help="Focus pane 1: profiles.",
    ),
    KeySpec(
        "dashboard.focus_sessions",
        "2",
        "focus_pane(2)",
        "Sessions",
        show=False,
        help="Focus pane 2: sessions.",
    ),
    KeySpec("dashboard.focus_gpus", "3", "focus_pane(3)", "GPUs", show=False, help="Focus pane 3: GPUs."),
    KeySpec("dashboard.focus_log", "4", "focus_pane(4)", "Log", show=False, help="Focus pane 4: the log."),
    KeySpec(
        "dashboard.focus_nodes",
        "5",
        "focus_pane(5)",
        "Multi-node",
        show=False,
        help="Focus the Multi-node pane (up/down pick a server, Enter opens its view; s and d act on it).",
    ),
    KeySpec(
        "dashboard.diagnose",
        "d",
        "diagnose",
        "Diag",
        help="Diagnose the selected session: stacks of every rank, baseline, hints.",
    ),
    KeySpec(
        "dashboard.capture",
        "c",
        "capture",
        "Capture",
        help="Toggle hidden-state capture for the selected profile.",
    ),
    KeySpec("dashboard.jobs", "x", "jobs", "Jobs", help="Extraction jobs."),
    KeySpec(
        "dashboard.prune",
        "P",
        "prune",
        "Prune",
        show=False,
        help="Remove ended sessions' folders (lists them, asks y/N); never a running one, and the "
        "baselines' good starts stay (eagle3-tui prune).",
    ),
    KeySpec(
        "dashboard.bench",
        "b",
        "bench",
        "Bench",
        help="Benchmark the selected ready session like SGLang's bench_serving (concurrency 1, 8, 32); "
        "then the kept results of every profile side by side (c there compares two profiles, A then B).",
    ),
    KeySpec(
        "dashboard.refresh",
        "ctrl+r",
        "refresh",
        "Refresh",
        show=False,
        help="Poll now instead of waiting for the next refresh.",
    ),
)

EDITOR_KEYS: tuple[KeySpec, ...] = (
    KeySpec("editor.save", "ctrl+s", "save", "Save", help="Save the profile."),
    KeySpec("editor.save_as", "f2", "save_as", "Save as", help="Save under a new profile name."),
    KeySpec("editor.add_env", "ctrl+n", "add_env", "Add env", help="Add an environment variable."),
    KeySpec("editor.close", "escape", "close", "Back", help="Close the editor (asks when unsaved)."),
)

# The multi-node view (app/screens/nodes.py): one server across nodes, its GPU panels and logs.
NODES_KEYS: tuple[KeySpec, ...] = (
    KeySpec("nodes.next_log", "n", "next_log(1)", "Next node", help="Show the next node's log (then the merged one)."),
    KeySpec("nodes.prev_log", "p", "next_log(-1)", "Prev node", help="Show the previous node's log."),
    KeySpec("nodes.merged_log", "m", "merged_log", "Merged",
            help="Show the merged log: every node's lines in time order, each prefixed with its node (n0, n1)."),
    KeySpec("nodes.stop", "s", "stop", "Stop",
            help="Stop the server on every node (y/N): node 0 first, then the workers, then every node's GPUs "
            "are checked free."),
    KeySpec("nodes.diagnose", "d", "diagnose", "Diag",
            help="Diagnose every node (py-spy of each rank there), with the hints across nodes."),
    KeySpec("nodes.filter", "slash", "filter", "Filter", key_display="/", priority=True,
            help="Filter the log shown by text or /regex/ (in the merged log, 'n1 ' keeps node 1's lines)."),
    KeySpec("nodes.fullscreen", "f", "fullscreen", "Full", help="Show the log full-screen (f or Esc to come back)."),
    KeySpec("nodes.wrap", "w", "wrap", "Wrap", show=False, help="Wrap long log lines."),
    KeySpec("nodes.timestamps", "t", "timestamps", "Time", show=False, help="Show or hide log timestamps."),
    KeySpec("nodes.back", "escape", "back", "Back", priority=True,
            help="Close the filter bar, else clear the filter, else leave full-screen, else back to the dashboard."),
)

ALL_KEYS: tuple[KeySpec, ...] = (APP_KEYS + DASHBOARD_KEYS + LOG_KEYS + EDITOR_KEYS + NODES_KEYS + CONFIRM_KEYS
                                 + CHOICE_KEYS)
KEYS_BY_ID = {spec.id: spec for spec in ALL_KEYS}

# Textual key names: letters, digits, names like "slash"/"f5"/"pageup", modifiers joined by "+".
_KEY = re.compile(r"^(?:(?:ctrl|shift|alt|meta|super|hyper)\+)*(?:[A-Za-z0-9_]+|[!-~])$")


@dataclass(frozen=True)
class KeymapProblem:
    """One bad `[keys]` entry: where it is and what is wrong."""

    path: Path
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        return f"{where}: {self.message}"


def load_keymap(config_file: Path) -> tuple[dict[str, str], list[KeymapProblem]]:
    """Read `[keys]` from ``config_file``: (binding id -> keys, problems).  A missing file is fine."""
    try:
        text = safe_files.read_text(config_file, safe_files.SETTINGS)
    except FileNotFoundError:
        return {}, []
    except OSError as exc:  # a FIFO, a device, over the cap, not UTF-8: refused at once
        return {}, [KeymapProblem(Path(config_file), None, f"cannot read: {exc.strerror}")]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None) or _line_from_message(str(exc))
        return {}, [KeymapProblem(Path(config_file), line, f"not valid TOML: {exc}")]
    section = data.get("keys", {})
    if not isinstance(section, dict):
        return {}, [KeymapProblem(Path(config_file), _find_line(text, "[keys]"), "[keys] must be a table")]
    keymap: dict[str, str] = {}
    problems: list[KeymapProblem] = []
    for binding_id, value in section.items():
        line = _find_line(text, binding_id)
        if binding_id not in KEYS_BY_ID:
            known = ", ".join(sorted(KEYS_BY_ID))
            problems.append(
                KeymapProblem(
                    Path(config_file), line, f"[keys] unknown binding id {binding_id!r} (known: {known})"
                )
            )
            continue
        if not isinstance(value, str) or not value.strip():
            problems.append(
                KeymapProblem(
                    Path(config_file), line, f'[keys] {binding_id}: expected a key string such as "ctrl+l"'
                )
            )
            continue
        keys = [k.strip() for k in value.split(",")]
        bad = [k for k in keys if not _KEY.match(k)]
        if bad:
            problems.append(
                KeymapProblem(
                    Path(config_file),
                    line,
                    f"[keys] {binding_id}: {', '.join(map(repr, bad))} is not a key name",
                )
            )
            continue
        keymap[binding_id] = ",".join(keys)
    return keymap, problems


def effective_keys(keymap: dict[str, str]) -> dict[str, str]:
    """binding id -> the keys in force (remapped or default), for the help screen."""
    return {spec.id: keymap.get(spec.id, spec.keys) for spec in ALL_KEYS}


def key_label(keys: str) -> str:
    """ "question_mark,ctrl+q" -> "? ctrl+q" (how the help screen shows keys)."""
    names = {"question_mark": "?", "slash": "/", "escape": "Esc", "pageup": "PgUp", "pagedown": "PgDn"}
    return " ".join(names.get(k, k) for k in keys.split(","))


def _find_line(text: str, needle: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return None


def _line_from_message(message: str) -> int | None:
    match = re.search(r"line (\d+)", message)
    return int(match.group(1)) if match else None


# The command palette's name for each action (`app.tui.ActionsProvider` lists every binding of APP_KEYS and
# DASHBOARD_KEYS, with the keys in force); names carry the words people search for ("bench", "extract").
PALETTE_NAMES: dict[str, str] = {
    "app.quit": "Quit (servers keep running)",
    "app.help": "Help: every key",
    "app.command_palette": "Command palette",
    "dashboard.launch": "Launch selected profile",
    "dashboard.restart": "Restart session",
    "dashboard.stop": "Stop session",
    "dashboard.edit": "Edit profile",
    "dashboard.filter": "Filter log",
    "dashboard.fullscreen": "Full-screen log",
    "dashboard.wrap": "Toggle wrap",
    "dashboard.timestamps": "Toggle timestamps",
    "dashboard.focus_profiles": "Focus pane 1: profiles",
    "dashboard.focus_sessions": "Focus pane 2: sessions",
    "dashboard.focus_gpus": "Focus pane 3: GPUs",
    "dashboard.focus_log": "Focus pane 4: log",
    "dashboard.focus_nodes": "Focus the Multi-node pane (Enter opens a server across nodes)",
    "dashboard.diagnose": "Diagnose session (stacks, hints)",
    "dashboard.capture": "Capture: toggle hidden-state capture",
    "dashboard.jobs": "Jobs: extraction jobs (extract)",
    "dashboard.bench": "Bench session (bench_serving, compare)",
    "dashboard.refresh": "Refresh now",
}
