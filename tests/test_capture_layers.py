"""Layer conventions: physical capture points ↔ --return-aux-hidden-state-layer-ids, per family (facts §4.3)."""
from __future__ import annotations

import pytest

from sessions.capture.layers import (
    LayerConvention,
    LayerError,
    LayerRule,
    layer_warnings,
    plan_layers,
    rule_for,
    standard_points,
)


def test_standard_set_for_kimi_llama_qwen():
    assert standard_points(61) == [2, 30, 58]
    assert standard_points(32) == [2, 16, 29]
    assert standard_points(36) == [2, 18, 33]


@pytest.mark.parametrize("arch,rule", [
    ("DeepseekV3ForCausalLM", LayerRule.FIRST_ID_ONE),
    ("KimiK25ForConditionalGeneration", LayerRule.FIRST_ID_ONE),
    ("Glm4MoeLiteForCausalLM", LayerRule.FIRST_ID_ONE),
    ("LlamaForCausalLM", LayerRule.PLUS_ONE),
    ("Qwen3MoeForCausalLM", LayerRule.PLUS_ONE),
    ("GptOssForCausalLM", LayerRule.KEEP_IF_MAX_IS_L),
    ("MiniMaxM3SparseForConditionalGeneration", LayerRule.PLUS_ONE_SHIFTED_DEFAULT),
    ("DeepseekV4ForCausalLM", None),
])
def test_family_rules(arch, rule):
    assert rule_for(arch) is rule


def test_deepseek_adds_one_only_when_the_first_id_is_one():
    ds = LayerConvention(LayerRule.FIRST_ID_ONE, 61)
    assert ds.points_from_ids([1, 29, 57]) == [2, 30, 58]
    assert ds.points_from_ids([2, 30, 58]) == [2, 30, 58]
    assert ds.points_from_ids(None) == [2, 30, 58]
    assert ds.ids_for_points([2, 30, 58]) == [1, 29, 57]
    # the seed accounts' 3/31/59 is reachable (verbatim), but it is not the standard
    assert ds.ids_for_points([3, 31, 59]) == [3, 31, 59]
    assert ds.points_from_ids(ds.ids_for_points([3, 31, 59])) == [3, 31, 59]
    with pytest.raises(LayerError, match="capture point 1 cannot be reached"):
        ds.ids_for_points([1, 30, 58])


def test_llama_always_adds_one():
    llama = LayerConvention(LayerRule.PLUS_ONE, 32)
    assert llama.points_from_ids([2, 15, 28]) == [3, 16, 29]
    assert llama.ids_for_points([2, 16, 29]) == [1, 15, 28]
    with pytest.raises(LayerError, match="capture point 0"):
        llama.ids_for_points([0, 16, 29])
    # a Llama given the DeepSeek spelling captures one layer too deep (facts §4.3)
    assert llama.points_from_ids([2, 16, 29]) == [3, 17, 30]


def test_gpt_oss_keeps_ids_when_the_largest_equals_l():
    oss = LayerConvention(LayerRule.KEEP_IF_MAX_IS_L, 24)
    assert oss.points_from_ids([2, 12, 24]) == [2, 12, 24]
    assert oss.points_from_ids([1, 11, 23]) == [2, 12, 24]
    assert oss.ids_for_points([2, 12, 24]) == [1, 11, 23]  # capture-only mode refuses ids >= L
    assert oss.ids_for_points([2, 12, 21]) == [1, 11, 20]


def test_minimax_m3_vl_default_is_shifted():
    assert LayerConvention(LayerRule.PLUS_ONE_SHIFTED_DEFAULT, 40).default_points() == [3, 21, 38]


@pytest.mark.parametrize("points,message", [
    ([2, 30, 61], "out of range"),
    ([2, 30, 60, 61], "out of range"),
    ([2, 2, 30], "duplicates"),
    ([], "empty"),
])
def test_points_out_of_range_or_duplicated(points, message):
    with pytest.raises(LayerError, match=message):
        LayerConvention(LayerRule.FIRST_ID_ONE, 61).ids_for_points(points)


def test_ids_round_trip_for_every_reachable_point_set():
    for rule in LayerRule:
        conv = LayerConvention(rule, 12)
        for a in range(12):
            for b in range(a + 1, 12):
                points = [a, b]
                try:
                    ids = conv.ids_for_points(points)
                except LayerError:
                    continue
                assert conv.points_from_ids(ids) == points
                assert min(ids) >= 0 and max(ids) < 12


def test_warnings_name_the_standard_set_and_the_one_off_mistake():
    warnings = layer_warnings([3, 31, 59], 61)
    assert any("not the standard EAGLE-3 set [2, 30, 58] for L=61" in w and "one above" in w for w in warnings)
    assert layer_warnings([2, 30, 58], 61) == []
    assert any("ascending" in w for w in layer_warnings([30, 2, 58], 61))
    assert any("3 (fc is Linear" in w for w in layer_warnings([2, 30], 61))


def test_plan_records_both_conventions():
    plan = plan_layers(None, 61, LayerRule.FIRST_ID_ONE)
    assert plan.points == (2, 30, 58) and plan.ids == (1, 29, 57) and not plan.explicit and not plan.warnings
    plan = plan_layers([3, 31, 59], 61, LayerRule.FIRST_ID_ONE)
    assert plan.explicit and plan.ids == (3, 31, 59) and plan.warnings
