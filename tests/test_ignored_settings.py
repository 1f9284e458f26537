"""Settings a variant ignores: ``nn.validation.ignored`` names every field set away from its default
that the chosen parts do not read, and nothing else; a field it names is truly ignored (the built model
is the same, weight for weight and logit for logit); a training run says so once in
its log and in summary.json, and a ``match.field`` the variant lacks matches nothing."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.training import compose_train, tiny_config_dir

from archlab import build_model, compose_model
from archlab.build import compose
from archlab.config import left_out, to_model_config
from archlab.nn.validation import ignored, uses, without_ignored

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["model.n_layer=2", "model.d_model=32", "model.attention.n_head=4", "model.vocab_size=64"]
TINY += ["model.context_length=16"]

# (the variant, a field it ignores set away from its default); the reason where another field takes its place
IGNORED = [
    (["model/mlp=swiglu", "model.mlp.d_ff=40"], "model.mlp.multiplier", 3.0),  # an explicit d_ff wins
    (["model/mlp=swiglu", "model.mlp.d_ff=40"], "model.mlp.multiple_of", 16),  # SwiGLU's rule, which d_ff replaces
    (["model/mlp=swiglu", "model.mlp.multiplier=2.0"], "model.mlp.ffn_dim_multiplier", 1.3),
    (["model/norm=rmsnorm"], "model.norm.bias", False),
    (["model/block=pre"], "model.block.shared_norm", False),
    (["model/position=rope"], "model.position.scaling.low_freq_factor", 2.0),  # llama3 scaling's; scaling is none
    (["model/position=rope", "model.position.scaling.kind=linear"], "model.position.scaling.truncate", False),  # yarn's
    (["model/mlp=swiglu"], "model.mlp.swiglu_clamp", "activation"),  # where a limit applies; no limit set
    (["model/mlp=moe"], "model.mlp.shared_swiglu_limit", 16.0),  # the shared experts' clamp; none shared
]

# (the variant, a field another option of its section has, set; how the message names the option)
LEFT_OUT = [
    (["model/attention=mha"], "model.attention.kv_lora_rank", 8, "mixer causal"),  # mla's
    (["model/mlp=swiglu"], "model.mlp.routing.aux_loss_weight", 0.01, "MLP swiglu"),  # a mixture of experts'
    (["model/mlp=swiglu"], "model.mlp.routing.router_bias", True, "MLP swiglu"),
    (["model/mlp=swiglu"], "model.mlp.expert_d_ff", 48, "MLP swiglu"),
    (["model/mlp=gelu"], "model.mlp.multiple_of", 256, "MLP gelu"),  # the gated kinds' width rule
    (["model/mlp=gelu"], "model.mlp.swiglu_limit", 7.0, "MLP gelu"),  # SwiGLU's clamp
    (["model/mlp=geglu"], "model.mlp.up_offset", 1.0, "MLP geglu"),
    (["model/position=learned"], "model.position.theta", 500.0, "position learned"),  # RoPE's
    (["model/position=rope"], "model.position.alibi_scale", 0.5, "position rope"),  # ALiBi's
    (["model/position=alibi"], "model.position.scaling.factor", 2.0, "position alibi"),  # RoPE's scaling's
]


def _model(overrides):
    return to_model_config(compose_model([*TINY, *overrides]))


def _logits(cfg):
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        return model(torch.arange(16).reshape(1, 16) % cfg.vocab_size), model.state_dict()


@pytest.mark.parametrize(("variant", "field", "value", "option"), LEFT_OUT, ids=[f for _, f, _, _ in LEFT_OUT])
def test_another_options_field_is_left_out_and_said_so(variant, field, value, option):
    """A field of another option (mla's kv_lora_rank on a causal model, a mixture of experts' routing on a
    SwiGLU) is no field of the chosen one: as composed (a preset's or a sweep's setting), it is left out of
    the model and named; the model is the one without it, logit for logit."""
    base, cfg = _model(variant), _model([*variant, f"{field}={value}"])
    before = left_out(compose("check", [*TINY, *variant]))  # a preset's GELU approximate: tanh, on a SwiGLU
    assert left_out(compose("check", [*TINY, *variant, f"{field}={value}"])) == [
        *before,
        f"{field}={value!r} is left out: {option} has no such field",
    ]
    assert cfg == base and torch.equal(_logits(base)[0], _logits(cfg)[0])


@pytest.mark.parametrize(("variant", "field", "value"), IGNORED, ids=[f for _, f, _ in IGNORED])
def test_an_ignored_field_is_named_and_changes_nothing(variant, field, value):
    base = _model(variant)
    assert ignored(base) == []
    cfg = _model([*variant, f"{field}={value}"])
    found = ignored(cfg)
    assert [(i.field, i.value) for i in found] == [(field, value)]
    family = field.split(".")[1]
    why = f"model.{family}.kind={getattr(base, family).kind} does not use it"
    if base.mlp.d_ff is not None and field.startswith("model.mlp."):  # the width rules' fields
        why = f"model.mlp.d_ff={base.mlp.d_ff} is set, which gives the width itself"
    elif field == "model.mlp.ffn_dim_multiplier":
        why = f"model.mlp.multiplier={base.mlp.multiplier} is set, which gives the width as d_model times it"
    assert str(found[0]) == f"{field}={value!r} is ignored for this variant ({why})"
    (a, state_a), (b, state_b) = _logits(base), _logits(cfg)
    assert state_a.keys() == state_b.keys() and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert torch.equal(a, b)
    assert without_ignored(cfg) == base


@pytest.mark.parametrize(
    ("variant", "field", "value"),
    [
        (["model/mlp=moe"], "model.mlp.routing.aux_loss_weight", 0.01),
        (["model/mlp=gelu"], "model.mlp.multiplier", 3.0),
        (["model/mlp=swiglu"], "model.mlp.multiple_of", 16),
        (["model/mlp=swiglu"], "model.mlp.swiglu_alpha", 1.702),
        (["model/mlp=moe"], "model.mlp.routing.weight_input", True),
        (["model/mlp=moe", "model.mlp.n_shared_experts=1"], "model.mlp.shared_swiglu_limit", 16.0),
        (["model/norm=layernorm"], "model.norm.bias", False),
        (
            ["model/position=rope", "model.position.scaling.kind=llama3", "model.position.scaling.original_context=8"],
            "model.position.scaling.low_freq_factor",
            2.0,
        ),
        (["model/block=parallel"], "model.block.shared_norm", False),
    ],
)
def test_a_field_the_variant_reads_is_not_named(variant, field, value):
    cfg = _model([*variant, f"{field}={value}"])
    assert ignored(cfg) == []
    assert uses(cfg, field.removeprefix("model."))


def test_a_run_says_once_what_its_variant_ignores_and_matches_nothing_it_lacks(tmp_path, caplog):
    from archlab.training.run import train

    conf = tiny_config_dir(tmp_path / "conf")
    overrides = ["trainer.max_steps=6", "trainer.val_check_interval=6", "callbacks.samples=null", "logger=none"]
    overrides += ["model/mlp=swiglu", "model.mlp.routing.aux_loss_weight=0.01"]
    overrides += ["match.reference={mlp: {kind: moe}}", "match.field=mlp.expert_d_ff"]
    with caplog.at_level(logging.WARNING):
        s = train(compose_train(conf, tmp_path / "run", overrides))
    expected = [
        "model.mlp.approximate='tanh' is left out: MLP swiglu has no such field",  # the tiny preset's GELU's
        "model.mlp.routing.aux_loss_weight=0.01 is left out: MLP swiglu has no such field",
        "match.field=mlp.expert_d_ff is ignored for this variant (model.mlp.kind=swiglu does not use it): "
        "nothing was matched",
    ]
    assert s["ignored"] == expected
    assert s["match"] is None and "expert_d_ff" not in s["model"]["mlp"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warned if "ignored for this variant" in w or "is left out" in w] == expected


def test_a_width_rule_that_match_replaced_says_so(tmp_path):
    """SwiGLU reads multiple_of, until match sets d_ff: the notice names d_ff and match, not the kind."""
    from archlab.training.sweep import apply_match, ignored_settings

    conf = tiny_config_dir(tmp_path / "conf")
    overrides = ["model/mlp=swiglu", "model.mlp.multiple_of=16", "match.reference={mlp: {kind: gelu}}"]
    cfg = compose_train(conf, tmp_path / "run", overrides)
    assert ignored_settings(cfg, to_model_config(cfg.model)) == [
        "model.mlp.approximate='tanh' is left out: MLP swiglu has no such field"
    ]
    record = apply_match(cfg)
    assert record is not None and record["field"] == "mlp.d_ff"
    assert ignored_settings(cfg, to_model_config(cfg.model))[1:] == [
        f"model.mlp.multiple_of=16 is ignored for this variant (model.mlp.d_ff={record['value']} is set, which gives "
        "the width itself: match.field sets it)"
    ]
