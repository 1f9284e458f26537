"""Parameter matching: the sized variant's analytic count lands within tolerance of the reference."""

import pytest

from archlab import ConfigError, compose_model, count_params
from archlab.matching import match_params

NANO = ["model=nano"]


def test_swiglu_d_ff_matches_gelu_by_hand():
    # Per block, gelu MLP: 2·d·4d + 4d + d;  swiglu: 3·d·f + 2f + d.  d = 128:
    # 2·128·512 + 640 = 131712 = 386·f + 128  ->  f = 340.88..., the closest integer is 341.
    result = match_params(compose_model([*NANO, "model/mlp=swiglu", "model.mlp.d_ff=1000"]), compose_model(NANO))
    assert result.value == 341
    assert result.config.mlp.d_ff == 341
    assert result.target == count_params(compose_model(NANO))["total"]
    assert result.params == count_params(result.config)["total"]


@pytest.mark.parametrize(
    "variant, reference, field, step",
    [
        (["model/mlp=swiglu"], [], "mlp.d_ff", 1),
        (["model/mlp=geglu", "model.mlp.bias=false"], [], "mlp.d_ff", 1),
        (["model/attention=mqa"], [], "mlp.d_ff", 1),  # MQA's saved k/v weights go to the MLP
        (["model/head=untied"], [], "mlp.d_ff", 1),
        (["model/position=rope"], [], "mlp.d_ff", 1),  # the learned table's parameters go to the MLP
        (["model=llama-7b", "model/mlp=gelu"], ["model=llama-7b"], "mlp.d_ff", 1),
    ],
)
def test_matched_variant_is_within_half_a_percent(variant, reference, field, step):
    ref_cfg = compose_model([*NANO, *reference])
    result = match_params(compose_model([*NANO, *variant]), ref_cfg, field=field, step=step)
    target = count_params(ref_cfg)["total"]
    got = count_params(result.config)["total"]
    assert got == result.params
    assert abs(got - target) / target <= 0.005
    # the next value down or up is no closer: the match is the best the field allows
    for other in (result.value - step, result.value + step):
        other_cfg = compose_model([*NANO, *variant, f"model.{field}={other}"])
        assert abs(count_params(other_cfg)["total"] - target) >= abs(got - target)


def test_d_model_match_keeps_heads_whole():
    # An untied head adds V·d = 256·128 parameters to nano; d_model moves in steps of n_head = 4.
    ref = compose_model(NANO)
    result = match_params(compose_model([*NANO, "model/head=untied"]), ref, field="d_model", step=4, tolerance=0.05)
    assert result.value % 4 == 0 and result.value < 128
    assert result.params == count_params(result.config)["total"]
    assert abs(result.relative_difference) <= 0.05


def test_unreachable_tolerance_names_the_field():
    with pytest.raises(ConfigError, match="match.tolerance"):
        match_params(
            compose_model([*NANO, "model/attention=mqa"]), compose_model(NANO), field="n_layer", tolerance=0.001
        )


def test_unknown_field_lists_the_choices():
    with pytest.raises(ConfigError, match=r"match.field='vocab_size'.*mlp.d_ff"):
        match_params(compose_model(NANO), 10**6, field="vocab_size")
