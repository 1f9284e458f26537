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


def test_moe_expert_width_matches_dense_active_params_by_hand():
    # No biases. Dense SwiGLU MLP of 340: 3·128·340 = 130560 per layer. MoE, 4 experts, top 2: a router of
    # 128·4 = 512, two experts of 3·128·f active. 768·f + 512 = 130560 -> f = 169.3; 169 misses by 256 per
    # layer, 170 by 512: 169. Everything outside the MLPs is the same on both sides.
    no_bias = [*NANO, "model.mlp.bias=false"]
    reference = compose_model([*no_bias, "model/mlp=swiglu", "model.mlp.d_ff=340"])
    moe = compose_model([*no_bias, "model/mlp=moe", "model.mlp.routing.n_experts=4", "model.mlp.routing.top_k=2"])
    result = match_params(moe, reference, field="mlp.expert_d_ff", quantity="active", tolerance=0.01)
    assert result.value == 169 and result.quantity == "active"
    assert result.params - result.target == 4 * -256  # nano's 4 layers
    counts = count_params(result.config)
    assert counts["total"] - counts["active"] == 4 * 2 * 3 * 128 * 169  # per layer, the two experts not chosen


def test_flops_per_token_match_equals_the_parameter_match_when_only_the_mlp_differs():
    # FLOPs per token are 6·(active non-embedding params) + the attention term, which the MLP leaves alone:
    # holding FLOPs equal holds the non-embedding params equal, so SwiGLU gets the 341 of the hand count above.
    result = match_params(compose_model([*NANO, "model/mlp=swiglu"]), compose_model(NANO), quantity="flops_per_token")
    assert result.value == 341
    assert result.target == count_params(compose_model(NANO))["flops_per_token"]


def test_training_flops_match_sets_the_steps(tmp_path):
    """match.quantity=training_flops leaves the model and scales max_steps by the FLOPs-per-token ratio."""
    from archlab.build import compose
    from archlab.training.sweep import apply_match

    cfg = compose(
        "train",
        [
            "model=nano",
            "model.mlp.d_ff=1024",
            "match.reference={mlp: {d_ff: 512}}",
            "match.quantity=training_flops",
            "trainer.max_steps=1000",
        ],
    )
    from omegaconf import OmegaConf

    from archlab.config import to_model_config

    mine = count_params(to_model_config(cfg.model))["flops_per_token"]
    theirs = count_params(to_model_config(OmegaConf.merge(cfg.model, {"mlp": {"d_ff": 512}})))["flops_per_token"]
    record = apply_match(cfg)
    assert cfg.trainer.max_steps == record["value"] == round(1000 * theirs / mine) < 1000
    assert cfg.model.mlp.d_ff == 1024 and record["field"] == "trainer.max_steps"


def test_an_unknown_quantity_is_refused_before_work(tmp_path):
    from archlab.build import compose
    from archlab.training.validation import validate_train

    with pytest.raises(ConfigError, match=r"match.quantity='params'.*training_flops"):
        validate_train(compose("train", ["match.quantity=params"]))
