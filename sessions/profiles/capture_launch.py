"""What ``[capture]`` adds to a launch and what it refuses: the capture flags and env, the capture dir, the
model's layer plan, and the checks (DESIGN §5).  Moved here from ``sessions.capture.toggle`` (issue 24 item
6): `sessions.profiles.build_command` and `validate_profile` need them, and a profile module importing
capture's toggle (which itself works on profiles) was the one upward import of the tree.  This module
imports only capture's leaves (`sessions.capture.layers`, ``inject``, ``compat``, ``layer_source``, the
plugin's spec and writer); the toggle and the status snapshot (`sessions.profiles.capture_toggle`, also
moved from capture) import it.  Nothing in `sessions.capture` imports `sessions.profiles`: the dependency
points one way, profiles → capture (tests/test_import_hygiene.py pins it).

* `capture_additions` — the flags of SGLang's capture-only mode (``--enable-return-aux-hidden-states
  --speculative-algorithm EAGLE3 --disable-radix-cache [--return-aux-hidden-state-layer-ids ...]``,
  sglang-facts §4.1) and the env that loads our plugin (``EAGLE3_CAPTURE`` + the generated PYTHONPATH dir).
* `capture_problems` — refusals with reasons (``validate_profile`` calls it).

Nothing here imports torch or SGLang (the TUI imports this module).
"""
from __future__ import annotations

import getpass
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions import safe_files
from sessions.capture.layers import (
    KNOWN_UNSUPPORTED,
    LayerError,
    LayerPlan,
    LayerRule,
    plan_layers,
    rule_for,
)
from sessions.capture.plugin.eagle3_capture.spec import ENV_NAME, CaptureSpec
from sessions.capture.plugin.eagle3_capture.writer import CaptureDirError, check_capture_dir

if TYPE_CHECKING:  # pragma: no cover
    from sessions.profiles.model import LaunchProfile, Problem

CAPTURE_FLAGS = ("--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3")
LAYER_IDS_FLAG = "--return-aux-hidden-state-layer-ids"
RADIX_OFF_FLAG = "--disable-radix-cache"
PLUGINS_ENV = "SGLANG_PLUGINS"  # SGLang's whitelist of plugin names (sglang/srt/plugins/__init__.py:52-56)
PLUGIN_NAME = "eagle3_capture"
CUDA_GRAPH_NOTE = (
    "CUDA graphs may stay on: the hook runs eagerly after ModelRunner.forward, "
    "prefill graphs only cover the transformer body"
)
LOW_SPACE_FRACTION = 0.10  # warn when the capture filesystem has less than this free
_PP_FLAGS = ("--pp-size", "--pipeline-parallel-size")

# -- the capture dir ----------------------------------------------------------------------------------
def default_capture_dir() -> str:
    """``/dev/shm/eagle3-capture-<user>`` (DESIGN §1b), or the temp dir where there is no /dev/shm."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"eagle3-capture-{user}")


def capture_dir(profile: LaunchProfile) -> str:
    raw = profile.capture.dir
    return os.path.abspath(os.path.expanduser(raw)) if raw else default_capture_dir()


# -- the model's shape and layer plan ------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFacts:
    """What capture needs from the model dir (or why it is not known)."""

    architecture: str | None
    num_layers: int | None
    hidden_size: int | None
    error: str | None = None
    has_weights: bool = False


def model_facts(model_path: str) -> ModelFacts:
    from sessions.model_config import ModelConfigError, read_model_config

    path = Path(os.path.expanduser(model_path or ""))
    if not model_path:
        return ModelFacts(None, None, None, "server.model_path is not set")
    try:
        shape = read_model_config(path)
    except ModelConfigError as exc:
        return ModelFacts(None, None, None, str(exc))
    try:
        has_weights = any(path.glob("*.safetensors"))
    except OSError:
        has_weights = False
    return ModelFacts(shape.architecture, shape.num_hidden_layers, shape.hidden_size, None, has_weights)


def layer_plan(profile: LaunchProfile, facts: ModelFacts | None = None) -> LayerPlan | None:
    """The capture points and ids for this profile; None when the model or its family is unknown or the
    layers cannot be captured (`capture_problems` says why)."""
    facts = facts or model_facts(profile.server.model_path)
    rule = layer_rule(profile, facts.architecture)
    if rule is None or not facts.num_layers:
        return None
    try:
        return plan_layers(profile.capture.layers, facts.num_layers, rule)
    except LayerError:
        return None


# -- the installed SGLang -------------------------------------------------------------------------------
def installed_sglang(profile: LaunchProfile) -> Any:
    """The SGLang the profile's Python would import (a `SglangSource`), None when unknown or not SGLang."""
    if profile.server.launcher != "sglang":
        return None
    try:
        from sessions.sglang_source import find_sglang

        return find_sglang(profile.server.python, env={**os.environ, **profile.server.env})
    except Exception:  # noqa: BLE001 - a lookup failure must not block validation; the table decides
        return None


def has_capture_only_mode(source: Any) -> bool:
    """Whether this SGLang has 0.5.23's capture-only mode (``--enable-return-aux-hidden-states``); True when
    SGLang is unknown (the emulator follows 0.5.23).  0.5.14 and 0.5.18 have neither of its flags: aux capture
    there comes only with an EAGLE-3 draft (docs/sglang-facts.md §9)."""
    return source is None or CAPTURE_FLAGS[0] in source.flags()


def layer_rule(profile: LaunchProfile, architecture: str | None) -> LayerRule | None:
    """The architecture's rule as the installed SGLang's own set_eagle3_layers_to_capture has it (GPT-OSS
    differs between 0.5.14 and 0.5.18), else eagle3-tui's table."""
    if architecture is None:
        return None
    source = installed_sglang(profile)
    if source is None:
        return rule_for(architecture)
    from sessions.capture.layer_source import source_rule

    return source_rule(source.root, architecture).rule


def draft_path(extra: Sequence[str]) -> str | None:
    values = _option_values(extra, "--speculative-draft-model-path") or _option_values(extra, "--speculative-draft-model")
    return values[-1] if values else None


# -- flags and env --------------------------------------------------------------------------------------
def capture_spec(profile: LaunchProfile, plan: LayerPlan | None = None) -> CaptureSpec:
    plan = plan if plan is not None else layer_plan(profile)
    return CaptureSpec(
        dir=capture_dir(profile),
        rid_prefix=profile.capture.rid_prefix,
        layers=plan.points if plan else (tuple(profile.capture.layers) if profile.capture.layers else None),
        draft_layer_ids=plan.ids if plan else None,
    )


def has_option(args: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in args)


def _option_values(args: Sequence[str], option: str) -> list[str]:
    """Values given to ``option`` in ``args`` (``--x v`` and ``--x=v``)."""
    out = []
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            out.append(args[i + 1])
        elif arg.startswith(option + "="):
            out.append(arg.split("=", 1)[1])
    return out


def capture_additions(profile: LaunchProfile) -> tuple[list[str], dict[str, str]]:
    """``(argv_extra, env_extra)`` for a profile with capture on; ``([], {})`` when it is off.

    Flags already in ``extra_args`` are not repeated; ``--disable-radix-cache`` is de-duplicated by
    ``build_command``.  ``PYTHONPATH`` is the plugin dir (``build_command`` appends the profile's own
    entries; when the profile sets none, the inherited ``PYTHONPATH`` is kept here).
    """
    if not profile.capture.enabled:
        return [], {}
    from sessions.capture.inject import plugin_path

    s = profile.server
    extra = list(s.extra_args)
    # Before 0.5.23 there is no capture-only mode: the EAGLE-3 draft in extra_args turns capture on and its
    # config names the layers, so neither capture-only flag is passed (`capture_problems` asks for the draft).
    capture_only = has_capture_only_mode(installed_sglang(profile))
    argv: list[str] = []
    if capture_only and not has_option(extra, "--enable-return-aux-hidden-states"):
        argv.append("--enable-return-aux-hidden-states")
    if not has_option(extra, "--speculative-algorithm"):
        argv += ["--speculative-algorithm", "EAGLE3"]
    if not has_option(extra, RADIX_OFF_FLAG):
        argv.append(RADIX_OFF_FLAG)
    plan = layer_plan(profile)
    if capture_only and profile.capture.layers is not None and plan is not None \
            and not has_option(extra, LAYER_IDS_FLAG):
        argv += [LAYER_IDS_FLAG, *(str(i) for i in plan.ids)]

    env: dict[str, str] = {ENV_NAME: capture_spec(profile, plan).to_json()}
    entry = str(plugin_path())
    inherited = os.environ.get("PYTHONPATH", "")
    env["PYTHONPATH"] = entry if s.env.get("PYTHONPATH") or not inherited else os.pathsep.join([entry, inherited])
    allowed = s.env.get(PLUGINS_ENV, os.environ.get(PLUGINS_ENV, ""))
    if allowed.strip():
        names = [n.strip() for n in allowed.split(",") if n.strip()]
        if PLUGIN_NAME not in names:  # SGLang loads only whitelisted plugins when the list is set
            env[PLUGINS_ENV] = ",".join(names + [PLUGIN_NAME])
    return argv, env


# -- validation -----------------------------------------------------------------------------------------
def _problem(field: str, message: str, severity: str = "error") -> Problem:
    from sessions.profiles.model import Problem

    return Problem(field, message, severity=severity)


def _sglang_supports(profile: LaunchProfile, architecture: str) -> tuple[bool | None, str]:
    """Static answer from the profile's SGLang when it can be found (None: not known)."""
    source = installed_sglang(profile)
    if source is None:
        return None, ""
    from sessions.capture.compat import architecture_support

    found = architecture_support(source.root, architecture)
    return found.supported, f"SGLang {source.version or '?'} at {source.root}: {found.detail}"


def capture_problems(profile: LaunchProfile) -> list[Problem]:
    """Why a capture launch cannot work (errors) or deserves a look (warnings); [] when capture is off."""
    if not profile.capture.enabled:
        return []
    problems: list[Problem] = []
    s = profile.server
    extra = list(s.extra_args)
    if s.radix_cache and profile.is_explicit("server.radix_cache"):
        problems.append(_problem(
            "server.radix_cache",
            "radix_cache = true cannot be used with capture: a cached prefix is not recomputed, so its "
            "hidden states would be missing; remove the key (capture adds --disable-radix-cache)"))
    source = installed_sglang(profile)
    pp = [v for opt in _PP_FLAGS for v in _option_values(extra, opt)]
    for value in pp:
        try:
            size = int(value)
        except ValueError:
            continue
        if size > 1:
            why = ("SGLang's capture-only mode requires pp_size == 1 (arg_groups/validation_hook.py)"
                   if has_capture_only_mode(source) else
                   f"eagle3-tui has not checked draft-mode capture under PP on SGLang {source.version or '?'}")
            problems.append(_problem(
                "server.extra_args", f"pipeline parallelism (PP {size}) is not supported with capture: {why}"))
    if not has_capture_only_mode(source):
        problems += _draft_mode_problems(profile, source)
    elif draft_path(extra) is not None:
        problems.append(_problem(
            "server.extra_args",
            "a speculative draft model cannot run with capture: --enable-return-aux-hidden-states is "
            "capture-only and refuses a draft (arg_groups/validation_hook.py)"))
    for value in _option_values(extra, "--speculative-algorithm"):
        if value.upper() != "EAGLE3":
            problems.append(_problem(
                "server.extra_args",
                f"--speculative-algorithm {value} conflicts with capture, which needs EAGLE3 (it names the "
                "capture convention)"))
    if has_option(extra, LAYER_IDS_FLAG):
        severity = "error" if profile.capture.layers is not None else "warning"
        problems.append(_problem(
            "server.extra_args",
            f"{LAYER_IDS_FLAG} in extra_args bypasses the per-family conversion; set [capture] layers "
            "(physical capture points) instead", severity))
    if has_option(extra, "--enable-mixed-chunk"):
        problems.append(_problem(
            "server.extra_args",
            "--enable-mixed-chunk puts decode rows into extend forwards; a dumped rid may then hold rows "
            "past its prompt (keep max_new_tokens = 1 for capture jobs)", "warning"))

    problems += _unknown_capture_flags(profile, source)
    facts = model_facts(s.model_path)
    if facts.error is None:
        problems += _model_capture_problems(profile, facts)
        problems += _two_batch_overlap_problems(extra, facts)
    if s.launcher == "emulator" and facts.error is None and not facts.has_weights:
        problems.append(_problem(
            "server.model_path",
            "the emulator needs model weights (*.safetensors) to produce captures; make a small model "
            "with `eagle3-tui demo-model DIR`", "warning"))
    problems += _dir_problems(capture_dir(profile))
    if facts.error is None:
        problems += forward_dump_problems(profile, facts)
    return problems


def _unknown_capture_flags(profile: LaunchProfile, source: Any) -> list[Problem]:
    """Every flag capture would add, checked against the installed SGLang's own flags (the flag reader):
    a launch must never carry a flag that SGLang's parser would refuse."""
    if source is None:
        return []
    from sessions.sglang_source import resolve_option

    flags = source.flags()
    argv, _env = capture_additions(profile)
    out = []
    for arg in argv:
        if arg.startswith("--") and resolve_option(arg, flags)[0] is None:
            out.append(_problem("capture", f"capture would pass {arg}, which SGLang {source.version or '?'} "
                                f"(at {source.root}) does not have"))
    return out


def _draft_mode_problems(profile: LaunchProfile, source: Any) -> list[Problem]:
    """SGLang without capture-only mode (0.5.14, 0.5.18): capture needs an EAGLE-3 draft whose config names
    the layers (0.5.14 model_runner.py:458-470, 0.5.18 spec_aux_hidden_state.py:82-96)."""
    version = f"SGLang {source.version or '?'}"
    extra = list(profile.server.extra_args)
    facts = model_facts(profile.server.model_path)
    plan = layer_plan(profile, facts)
    ids = f" = {list(plan.ids)}" if plan is not None else ""
    draft = draft_path(extra)
    if draft is None:
        return [_problem(
            "server.extra_args",
            f"{version} has no capture-only mode (--enable-return-aux-hidden-states arrived in 0.5.23): "
            "add --speculative-draft-model-path DIR to extra_args, an EAGLE-3 draft whose config.json names "
            f"eagle_config.eagle_aux_hidden_state_layer_ids{ids}; SGLang then captures those layers while "
            "serving with the draft (`eagle3-tui capture check` shows where it reads them)")]
    problems: list[Problem] = []
    if has_option(extra, LAYER_IDS_FLAG):
        problems.append(_problem("server.extra_args", f"{version} has no {LAYER_IDS_FLAG}: the layers come from "
                                 "the draft's eagle_config.eagle_aux_hidden_state_layer_ids"))
    draft_ids = _draft_layer_ids(draft)
    if isinstance(draft_ids, str):
        problems.append(_problem("server.extra_args", draft_ids, "warning"))
    elif draft_ids is None:
        problems.append(_problem(
            "server.extra_args",
            f"the draft's config.json ({draft}) names no eagle_config.eagle_aux_hidden_state_layer_ids: "
            f"{version} then captures [2, L//2, L-3]", "warning" if profile.capture.layers is None else "error"))
    elif plan is not None and facts.num_layers:
        from sessions.capture.layers import LayerConvention

        got = LayerConvention(plan.rule, facts.num_layers).points_from_ids(draft_ids)
        if profile.capture.layers is not None and tuple(got) != plan.points:
            problems.append(_problem(
                "capture.layers",
                f"[capture] layers {list(plan.points)} differ from what the draft's "
                f"eagle_aux_hidden_state_layer_ids {draft_ids} capture on {version}: {got}; set the draft's "
                f"ids to {list(plan.ids)} or layers to {got}"))
    return problems


def _draft_layer_ids(draft: str) -> list[int] | str | None:
    """The draft's ``eagle_config.eagle_aux_hidden_state_layer_ids`` (None: absent; str: unreadable, why)."""

    folder = Path(os.path.expanduser(draft))
    if not folder.is_dir():
        return f"the draft {draft} is not a local folder; the layers its config names cannot be checked here"
    path = folder / "config.json"
    if not path.is_file():
        return f"cannot read the draft's layer ids: {path} does not exist"
    try:
        data = safe_files.read_json(path, safe_files.MODEL_CONFIG)
    except (OSError, ValueError) as exc:
        return f"cannot read the draft's layer ids from {path}: {exc}"
    eagle = data.get("eagle_config") if isinstance(data, dict) else None
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if ids is None:
        return None
    if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        return f"{path}: eagle_config.eagle_aux_hidden_state_layer_ids is not a list of integers: {ids!r}"
    return ids


# DeepSeek-V2/V3 (and Kimi-K2, which serves as DeepseekV3ForCausalLM): under two-batch overlap the layers
# after first_k_dense_replace run through model_forward_stages, which never captures aux hidden states
# (deepseek_v2.py), so the plugin's finalize() raises "captured 1 of 3" on the first eligible forward.
TBO_FLAG = "--enable-two-batch-overlap"
_TBO_SKIPS_CAPTURE = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
                      "KimiK2ForCausalLM", "KimiK25ForConditionalGeneration", "KimiVLForConditionalGeneration")
SGLANG_DEFAULT_CHUNKED_PREFILL = 8192  # what SGLang picks on a large GPU when the profile sets none
DOCKER_SHM_HINT = ("in Docker, /dev/shm is 64 MB unless the container runs with a larger --shm-size "
                   "(e.g. docker run --shm-size=32g)")


def _two_batch_overlap_problems(extra: list[str], facts: ModelFacts) -> list[Problem]:
    if not has_option(extra, TBO_FLAG) or facts.architecture not in _TBO_SKIPS_CAPTURE:
        return []
    return [_problem(
        "server.extra_args",
        f"{TBO_FLAG} cannot be used with capture on {facts.architecture}: under two-batch overlap the layers "
        "after first_k_dense_replace run through model_forward_stages, which skips the aux hidden-state "
        "capture, so the first captured forward fails (\"captured 1 of 3 aux hidden states\"); remove the "
        "flag while capturing")]


def forward_dump_bytes(profile: LaunchProfile, facts: ModelFacts) -> int | None:
    """Bytes one forward dumps: chunked_prefill_size x (K+1) x H x 2 (bf16 aux layers plus the final)."""
    if not facts.hidden_size:
        return None
    chunk = profile.server.chunked_prefill_size
    if not isinstance(chunk, int) or chunk <= 0:
        chunk = SGLANG_DEFAULT_CHUNKED_PREFILL
    layers = len(profile.capture.layers) if profile.capture.layers else 3
    return chunk * (layers + 1) * facts.hidden_size * 2


def forward_dump_problems(profile: LaunchProfile, facts: ModelFacts) -> list[Problem]:
    """A warning when the capture dir's filesystem cannot hold one forward's dump."""
    directory = capture_dir(profile)
    need = forward_dump_bytes(profile, facts)
    usage = disk_usage_near(directory)
    if need is None or usage is None or usage.free >= need:
        return []
    chunk = profile.server.chunked_prefill_size if isinstance(profile.server.chunked_prefill_size, int) \
        and profile.server.chunked_prefill_size > 0 else SGLANG_DEFAULT_CHUNKED_PREFILL
    layers = len(profile.capture.layers) if profile.capture.layers else 3
    hint = f"; {DOCKER_SHM_HINT}" if str(directory).startswith("/dev/shm") else \
        f" (a capture dir on /dev/shm: {DOCKER_SHM_HINT})"
    return [_problem(
        "capture.dir",
        f"one forward dumps {need / 1e6:.1f} MB (chunked_prefill_size {chunk} x {layers + 1} states x hidden "
        f"{facts.hidden_size} x 2 bytes) but {directory} has {usage.free / 1e6:.1f} MB free; give capture.dir "
        f"more room or lower chunked_prefill_size{hint}", "warning")]


def _model_capture_problems(profile: LaunchProfile, facts: ModelFacts) -> list[Problem]:
    problems: list[Problem] = []
    arch = facts.architecture
    rule = layer_rule(profile, arch)
    supported, detail = _sglang_supports(profile, arch) if arch else (None, "")
    if arch is None:
        problems.append(_problem("server.model_path", "config.json names no architecture; capture needs one "
                                 "whose SGLang model implements set_eagle3_layers_to_capture"))
    elif supported is False or arch in KNOWN_UNSUPPORTED or (supported is None and rule is None):
        where = f" ({detail})" if detail else " (SGLang 0.5.23's list, sglang-facts §4.2)"
        problems.append(_problem(
            "server.model_path",
            f"architecture {arch} has no set_eagle3_layers_to_capture{where}: SGLang cannot capture aux "
            "hidden states for it"))
    if facts.num_layers is None:
        problems.append(_problem("capture.layers", "config.json has no num_hidden_layers (nor under "
                                 "text_config); the capture layers cannot be checked", "warning"))
        return problems
    if rule is None:
        rule = LayerRule.PLUS_ONE  # an architecture only the installed SGLang knows: the common rule
        if supported:
            problems.append(_problem("capture.layers", f"{arch} is not in eagle3-tui's list of layer "
                                     "conventions; assuming ids + 1 (check the capture-active log line)",
                                     "warning"))
    try:
        plan = plan_layers(profile.capture.layers, facts.num_layers, rule)
    except LayerError as exc:
        problems.append(_problem("capture.layers", str(exc)))
        return problems
    for warning in plan.warnings:
        problems.append(_problem("capture.layers", warning, "warning"))
    return problems


def _dir_problems(directory: str) -> list[Problem]:
    problems = []
    try:
        check_capture_dir(directory, create=False)
    except CaptureDirError as exc:
        problems.append(_problem("capture.dir", str(exc)))
        return problems
    usage = disk_usage_near(directory)
    if usage is not None and usage.total and usage.free < LOW_SPACE_FRACTION * usage.total:
        problems.append(_problem(
            "capture.dir", f"the filesystem of {directory} is {100 * usage.used / usage.total:.0f}% full "
            f"({usage.free / 2**30:.1f} GiB free)", "warning"))
    return problems


def disk_usage_near(directory: str) -> Any:
    probe = Path(directory)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe)
    except OSError:
        return None
