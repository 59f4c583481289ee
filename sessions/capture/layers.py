"""Capture layers: physical capture points ↔ the ids SGLang and draft configs take, per model family.

A *physical capture point* p is the input of decoder layer p, i.e. HF ``hidden_states[p]`` (0 is the
embeddings).  That is what SGLang stores in ``model.layers_to_capture`` and what the profile's
``[capture] layers`` name.  The ids passed to ``--return-aux-hidden-state-layer-ids`` (and the ids in a
draft's ``eagle_aux_hidden_state_layer_ids``) go through the model's ``set_eagle3_layers_to_capture``,
whose "+1" rule differs by family (sglang-facts §4.3):

* most models: ``[i + 1 for i in ids]`` (``sglang/srt/models/llama.py:929-941``, ``qwen2.py:781-794``);
* DeepSeek-V2/V3 (hence Kimi-K2/K2.5) and GLM-4-MoE-Lite: +1 only when ``ids[0] == 1``, else verbatim
  (``deepseek_v2.py:3458-3473``, ``glm4_moe_lite.py:805-820``);
* GPT-OSS: verbatim when ``max(ids) == num_hidden_layers``, else +1 (``gpt_oss.py:1337-1352``);
* MiniMax-M3 VL: +1, and its default list gets +1 too (``minimax_m3_vl.py:246-270``).

Capture-only mode also refuses ids >= num_hidden_layers at start-up
(``model_runner_components/spec_aux_hidden_state.py:113-129``) and negative ids
(``arg_groups/validation_hook.py:694-754``).  The EAGLE-3 standard set is ``[2, L//2, L-3]``
(extraction-anchors §4.3).  Pure Python: no torch, no SGLang.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class LayerRule(str, Enum):
    """How one family's ``set_eagle3_layers_to_capture(ids)`` turns ids into capture points."""

    PLUS_ONE = "plus_one"
    FIRST_ID_ONE = "plus_one_if_first_is_1"
    KEEP_IF_MAX_IS_L = "verbatim_if_max_is_L"
    PLUS_ONE_SHIFTED_DEFAULT = "plus_one_default_too"


# Architectures with set_eagle3_layers_to_capture in SGLang 0.5.23 (sglang-facts §4.2), with their rule.
_FIRST_ID_ONE = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLMNextN", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN",
    "MistralLarge3ForCausalLM", "Glm5NextForConditionalGenerationNextN", "Glm4MoeLiteForCausalLM",
    "KimiK25ForConditionalGeneration",  # delegates to its DeepseekV3ForCausalLM (kimi_k25.py:693,928)
})
_KEEP_IF_MAX_IS_L = frozenset({"GptOssForCausalLM"})
_PLUS_ONE_SHIFTED_DEFAULT = frozenset({"MiniMaxM3SparseForConditionalGeneration"})
_PLUS_ONE = frozenset({
    "ApertusForCausalLM", "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
    "SarvamMoEForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM", "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
    "Glm4MoeForCausalLM", "Glm5NextForConditionalGeneration", "LongcatFlashForCausalLM",
    "MindSporeForCausalLM", "MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM", "LlamaForCausalLM",
    "Llama4ForConditionalGeneration", "Llama4ForCausalLM", "MistralForCausalLM", "Ministral3ForCausalLM",
    "Phi3ForCausalLM", "InternLM3ForCausalLM", "TeleFLMForCausalLM", "IQuestCoderForCausalLM",
    "LlamaForCausalLMEagle3", "Qwen2ForCausalLM", "Qwen2_5_VLForConditionalGeneration",
    "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
    "Qwen3MoeForCausalLM", "MellumForCausalLM", "Qwen3NextForCausalLM", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
})
KNOWN_ARCHITECTURES: dict[str, LayerRule] = {
    **{a: LayerRule.PLUS_ONE for a in _PLUS_ONE},
    **{a: LayerRule.FIRST_ID_ONE for a in _FIRST_ID_ONE},
    **{a: LayerRule.KEEP_IF_MAX_IS_L for a in _KEEP_IF_MAX_IS_L},
    **{a: LayerRule.PLUS_ONE_SHIFTED_DEFAULT for a in _PLUS_ONE_SHIFTED_DEFAULT},
}
# Architectures known to lack EAGLE-3 capture (sglang-facts §4.2: V4 has only DSpark capture).
KNOWN_UNSUPPORTED = frozenset({"DeepseekV4ForCausalLM"})


class LayerError(ValueError):
    """Capture points this family cannot produce, or ids out of range; the message says why."""


def standard_points(num_layers: int) -> list[int]:
    """The EAGLE-3 standard capture points for L layers: ``[2, L//2, L-3]``."""
    return [2, num_layers // 2, num_layers - 3]


def rule_for(architecture: str | None) -> LayerRule | None:
    """The known rule for an architecture name, or None when it is not in the 0.5.23 list."""
    if architecture is None:
        return None
    return KNOWN_ARCHITECTURES.get(architecture)


@dataclass(frozen=True)
class LayerConvention:
    """One model's capture convention: its family rule and its number of decoder layers."""

    rule: LayerRule
    num_layers: int

    def default_points(self) -> list[int]:
        """What SGLang captures without ``--return-aux-hidden-state-layer-ids``."""
        points = standard_points(self.num_layers)
        if self.rule is LayerRule.PLUS_ONE_SHIFTED_DEFAULT:
            return [p + 1 for p in points]
        return points

    def points_from_ids(self, ids: Sequence[int] | None) -> list[int]:
        """What SGLang's ``set_eagle3_layers_to_capture(ids)`` stores in ``layers_to_capture``."""
        if ids is None:
            return self.default_points()
        ids = [int(i) for i in ids]
        if self.rule is LayerRule.FIRST_ID_ONE:
            return [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids)
        if self.rule is LayerRule.KEEP_IF_MAX_IS_L:
            return list(ids) if ids and max(ids) == self.num_layers else [i + 1 for i in ids]
        return [i + 1 for i in ids]

    def ids_for_points(self, points: Sequence[int]) -> list[int]:
        """The ids to pass (flag or draft config) so that SGLang captures exactly ``points``.

        Prefers the "output layer" spelling ``p - 1`` (SpecForge's convention, also right under SGLang's
        older always-+1 rule) and falls back to the verbatim spelling where the family allows it.
        Raises LayerError when no ids produce these points or they are out of range.
        """
        points = [int(p) for p in points]
        check_points(points, self)
        minus_one = [p - 1 for p in points]
        for candidate in (minus_one, list(points)):
            if min(candidate) < 0 or max(candidate) >= self.num_layers:
                continue  # capture-only mode refuses negative ids and ids >= L
            if self.points_from_ids(candidate) == points:
                return candidate
        if self.rule is LayerRule.FIRST_ID_ONE and points and points[0] == 1:
            raise LayerError(
                "capture point 1 cannot be reached on this family: ids starting with 1 get +1 "
                "(→ 2), any other first id is used as is (deepseek_v2.py:3468-3473)"
            )
        if min(points) == 0:
            raise LayerError("capture point 0 (the embeddings) cannot be reached on this family: every id "
                             "gets +1 and negative ids are refused")
        raise LayerError(f"no --return-aux-hidden-state-layer-ids value captures {points} on this family")


def check_points(points: Sequence[int], convention: LayerConvention) -> None:
    """Refuse duplicates and points outside what the family can capture; LayerError says why."""
    points = [int(p) for p in points]
    if not points:
        raise LayerError("layers is empty")
    if len(set(points)) != len(points):
        raise LayerError(f"layers {points} has duplicates")
    top = convention.num_layers if convention.rule is LayerRule.KEEP_IF_MAX_IS_L else convention.num_layers - 1
    bad = [p for p in points if p < 0 or p > top]
    if bad:
        raise LayerError(
            f"layers {bad} out of range for a model with num_hidden_layers = {convention.num_layers} "
            f"(capture points run 0..{top}; point p is the input of decoder layer p)"
        )


def layer_warnings(points: Sequence[int], num_layers: int) -> list[str]:
    """Warnings for a valid but unusual choice (not the standard set, not ascending, not 3 points)."""
    points = [int(p) for p in points]
    out = []
    standard = standard_points(num_layers)
    if points != standard:
        hint = ""
        if len(points) == len(standard) and all(p == s + 1 for p, s in zip(points, standard)):
            hint = " (each one above the standard: output-layer ids given +1 twice?)"
        out.append(f"layers {points} are not the standard EAGLE-3 set {standard} for L={num_layers}{hint}")
    if points != sorted(points):
        out.append(f"layers {points} are not ascending; drafts expect the aux rows in ascending layer order")
    if len(points) != 3:
        out.append(f"{len(points)} capture points; EAGLE-3 drafts are built for 3 (fc is Linear(3H, H))")
    return out


@dataclass(frozen=True)
class LayerPlan:
    """What a capture launch will record: both conventions side by side, plus warnings."""

    points: tuple[int, ...]  # physical capture points (SGLang's layers_to_capture)
    ids: tuple[int, ...]  # --return-aux-hidden-state-layer-ids / draft-config eagle_aux_hidden_state_layer_ids
    explicit: bool  # True when the profile named the layers (the flag is passed)
    num_layers: int
    rule: LayerRule
    warnings: tuple[str, ...]


def plan_layers(points: Sequence[int] | None, num_layers: int, rule: LayerRule) -> LayerPlan:
    """The plan for a profile's ``[capture] layers`` (None: SGLang's default). Raises LayerError."""
    convention = LayerConvention(rule, num_layers)
    explicit = points is not None
    chosen = [int(p) for p in points] if points is not None else convention.default_points()
    ids = convention.ids_for_points(chosen)
    return LayerPlan(tuple(chosen), tuple(ids), explicit, num_layers, rule,
                     tuple(layer_warnings(chosen, num_layers)))
