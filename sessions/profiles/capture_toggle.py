"""The capture toggle and its status snapshot.

* `toggled`, `toggle_summary`, `toggle_capture` — the TUI's ``c`` key: what flipping ``[capture] enabled``
  changes, then flip and save.
* `capture_status` — a `CaptureStatus` snapshot for ``widgets.capture_panel.CapturePanel``.

What ``[capture]`` adds to a launch and refuses (`capture_additions`, `capture_problems`, the layer plan,
the capture dir) lives in `sessions.profiles.capture_launch`, below both the profiles and this module; it
is re-exported here for the callers that import it from the toggle.

Nothing here imports torch or SGLang (the TUI imports this module).
"""
from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sessions.capture.layers import standard_points
from sessions.profiles.capture_launch import (  # re-exported: callers import these from the toggle
    CAPTURE_FLAGS,
    CUDA_GRAPH_NOTE,
    LAYER_IDS_FLAG,
    PLUGIN_NAME,
    PLUGINS_ENV,
    RADIX_OFF_FLAG,
    ModelFacts,
    capture_additions,
    capture_dir,
    capture_problems,
    capture_spec,
    default_capture_dir,
    disk_usage_near,
    draft_path,
    has_capture_only_mode,
    has_option,
    installed_sglang,
    layer_plan,
    layer_rule,
    model_facts,
)

if TYPE_CHECKING:  # pragma: no cover
    from sessions.profiles.model import LaunchProfile

__all__ = ["CAPTURE_FLAGS", "CUDA_GRAPH_NOTE", "LAYER_IDS_FLAG", "PLUGINS_ENV", "PLUGIN_NAME", "RADIX_OFF_FLAG",
           "CaptureStatus", "ModelFacts", "capture_additions", "capture_dir", "capture_problems", "capture_spec",
           "capture_status", "default_capture_dir", "has_capture_only_mode", "installed_sglang", "layer_plan",
           "layer_rule", "model_facts", "radix_cache_on", "toggle_capture", "toggle_summary", "toggled"]


# -- the toggle -----------------------------------------------------------------------------------------
def toggled(profile: LaunchProfile) -> LaunchProfile:
    """``profile`` with ``[capture] enabled`` flipped, not saved (the TUI shows the diff before saving).

    Turning capture on also drops an explicit ``radix_cache = true`` back to the default (which is the
    same value): capture disables the radix cache itself, and an explicit true would be refused.
    """
    enable = not profile.capture.enabled
    changed = profile.with_changes(capture={"enabled": enable})
    if enable and changed.server.radix_cache and changed.is_explicit("server.radix_cache"):
        changed = dataclasses.replace(changed, explicit_keys=changed.explicit_keys - {"server.radix_cache"})
    return changed


def toggle_capture(profile: LaunchProfile, home: Any = None) -> LaunchProfile:
    """Flip ``[capture] enabled`` (see `toggled`), save the profile and return the saved copy."""
    from sessions.profiles.toml_io import save_profile

    changed = toggled(profile)
    path = save_profile(changed, home=home)
    return dataclasses.replace(changed, path=path)


def radix_cache_on(profile: LaunchProfile) -> bool:
    """Whether a launch of ``profile`` runs with SGLang's radix (prefix) cache."""
    s = profile.server
    return s.radix_cache and not profile.capture.enabled and not has_option(s.extra_args, RADIX_OFF_FLAG)


def toggle_summary(old: LaunchProfile, new: LaunchProfile) -> list[str]:
    """What a toggle from ``old`` to ``new`` changes besides the flags, in words: capture itself, the radix
    cache, a key dropped from the file, and why a capture launch would be refused."""
    word = {True: "on", False: "off"}
    lines = [f"capture: {word[old.capture.enabled]} -> {word[new.capture.enabled]}"]
    before, after = radix_cache_on(old), radix_cache_on(new)
    if before != after:
        why = (" (a cached prefix is not recomputed, so its hidden states would be missing)"
               if not after else " (capture no longer disables it)")
        lines.append(f"radix cache: {word[before]} -> {word[after]}{why}")
    else:
        lines.append(f"radix cache: stays {word[after]}")
    if old.is_explicit("server.radix_cache") and not new.is_explicit("server.radix_cache"):
        lines.append("the profile's radix_cache = true is removed (capture refuses it)")
    if new.capture.enabled:
        lines.append(f"capture dir: {capture_dir(new)}")
        source = installed_sglang(new)
        if not has_capture_only_mode(source):
            draft = draft_path(new.server.extra_args)
            lines.append(f"SGLang {source.version or '?'} has no capture-only mode: capture runs with the EAGLE-3 "
                         + (f"draft {draft}, whose config names the layers" if draft else
                            "draft that --speculative-draft-model-path must name in extra_args"))
        lines += [f"will refuse to launch: {p.field}: {p.message}" for p in capture_problems(new) if p.is_error]
    return lines


# -- status ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CaptureStatus:
    """A snapshot of one profile's capture setup and its capture dir, for the UI."""

    profile_name: str
    enabled: bool
    dir: str
    dir_exists: bool
    dir_problem: str | None
    file_count: int  # chunk files
    rid_count: int
    size_bytes: int
    fs_total_bytes: int | None
    fs_used_bytes: int | None
    fs_free_bytes: int | None
    rid_prefix: str
    architecture: str | None
    num_layers: int | None
    points: tuple[int, ...] | None  # physical capture points (SGLang's layers_to_capture)
    draft_ids: tuple[int, ...] | None  # --return-aux-hidden-state-layer-ids / draft-config ids
    explicit_layers: bool
    standard_points: tuple[int, ...] | None
    warnings: tuple[str, ...]
    errors: tuple[str, ...]
    cuda_graph_note: str = CUDA_GRAPH_NOTE

    @property
    def fs_fill_percent(self) -> float | None:
        if not self.fs_total_bytes:
            return None
        return 100.0 * (self.fs_used_bytes or 0) / self.fs_total_bytes

    @property
    def is_standard(self) -> bool | None:
        if self.points is None or self.standard_points is None:
            return None
        return tuple(self.points) == tuple(self.standard_points)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["fs_fill_percent"] = self.fs_fill_percent
        out["is_standard"] = self.is_standard
        for key in ("points", "draft_ids", "standard_points", "warnings", "errors"):
            if out[key] is not None:
                out[key] = list(out[key])
        return out


def _scan_capture_dir(directory: str, max_entries: int = 200_000) -> tuple[int, int, int]:
    """(chunk files, rid folders, bytes) without following symlinks; stops counting at ``max_entries``."""
    files = rids = size = 0
    seen = 0
    try:
        with os.scandir(directory) as top:
            for rid_entry in top:
                if not rid_entry.is_dir(follow_symlinks=False) or rid_entry.name.startswith("."):
                    continue
                rids += 1
                try:
                    with os.scandir(rid_entry.path) as inner:
                        for entry in inner:
                            seen += 1
                            if seen > max_entries:
                                return files, rids, size
                            if entry.name.endswith(".safetensors") and not entry.name.startswith("."):
                                st = entry.stat(follow_symlinks=False)
                                if stat.S_ISREG(st.st_mode):
                                    files += 1
                                    size += st.st_size
                except OSError:
                    continue
    except OSError:
        pass
    return files, rids, size


def capture_status(profile: LaunchProfile) -> CaptureStatus:
    """The capture setup of ``profile`` and the state of its capture dir (cheap enough for a poll)."""
    directory = capture_dir(profile)
    facts = model_facts(profile.server.model_path)
    plan = layer_plan(profile, facts)
    problems = capture_problems(dataclasses.replace(
        profile, capture=dataclasses.replace(profile.capture, enabled=True)))
    dir_problem = next((p.message for p in problems if p.field == "capture.dir" and p.is_error), None)
    is_link = os.path.islink(directory)
    exists = os.path.isdir(directory) and not is_link
    files, rids, size = _scan_capture_dir(directory) if exists and dir_problem is None else (0, 0, 0)
    usage = disk_usage_near(directory)
    return CaptureStatus(
        profile_name=profile.name,
        enabled=profile.capture.enabled,
        dir=directory,
        dir_exists=exists,
        dir_problem=dir_problem,
        file_count=files,
        rid_count=rids,
        size_bytes=size,
        fs_total_bytes=usage.total if usage else None,
        fs_used_bytes=usage.used if usage else None,
        fs_free_bytes=usage.free if usage else None,
        rid_prefix=profile.capture.rid_prefix,
        architecture=facts.architecture,
        num_layers=facts.num_layers,
        points=plan.points if plan else (tuple(profile.capture.layers) if profile.capture.layers else None),
        draft_ids=plan.ids if plan else None,
        explicit_layers=profile.capture.layers is not None,
        standard_points=tuple(standard_points(facts.num_layers)) if facts.num_layers else None,
        warnings=tuple(p.message for p in problems if not p.is_error),
        errors=tuple(p.message for p in problems if p.is_error),
    )
