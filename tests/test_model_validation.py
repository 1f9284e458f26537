"""Invalid model settings: each is composed exactly as the command line composes it (Hydra overrides on
``model=nano`` unless a preset is named) and must raise one ``ConfigError`` naming the field and
what is allowed, before any tensor is allocated."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException

import archlab.build
from archlab import ConfigError, ModelConfig, build_model, compose_model, count_params
from archlab.config import HeadConfig
from archlab.errors import SweepConfigError
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import MIXERS
from archlab.nn.mlp import Gate

ROPE = "model/position=rope"

# (overrides, field named in the error, fragment of what is allowed); nano: d_model 128, 4 heads of 32
CASES = [
    # unknown registry names list the choices
    (["model.position.kind=foo"], "model.position.kind", "one of ['alibi', 'learned', 'none', 'rope', 'sinusoidal']"),
    (["model.norm.kind=batchnorm"], "model.norm.kind", "one of ['l2', 'layernorm', 'rmsnorm']"),
    (
        ["model.block.kind=hourglass"],
        "model.block.kind",
        "one of ['ngpt', 'normed_skip', 'parallel', 'post', 'post_sublayer', 'pre', 'sandwich']",
    ),
    (
        ["model.mlp.kind=mixture"],
        "model.mlp.kind",
        "one of ['geglu', 'gelu', 'moe', 'ngpt', 'none', 'relu', 'relu2', 'relu2_glu', 'rwkv_channel_mix', 'swiglu', 'xielu']",
    ),
    (
        ["model/mlp=moe", "model.mlp.shared_swiglu_limit=-1"],
        "model.mlp.shared_swiglu_limit",
        "a positive number (Step-3.5: 16.0), 0 (no clamp) or null (the routed experts' swiglu_limit)",
    ),
    # head layout
    (
        ["model.d_model=130"],
        "model.attention.n_head",
        "a divisor of model.d_model=130, or set model.attention.head_dim",
    ),
    (["model.attention.n_kv_head=3"], "model.attention.n_kv_head", "a divisor of model.attention.n_head=4"),
    (["model.attention.n_kv_head=0"], "model.attention.n_kv_head", "a positive number"),
    (["model/attention=gqa"], "model.attention.n_kv_head", "a divisor of model.attention.n_head=4"),  # gqa = 8 KV heads
    (["model=gpt2", "model/attention=gqa"], "model.attention.n_kv_head", "a divisor of model.attention.n_head=12"),
    (["model.attention.n_head=0"], "model.attention.n_head", "a positive number"),
    (["model.attention.head_dim=0"], "model.attention.head_dim", "a positive number"),
    # rope
    ([ROPE, "model.position.rotary_dim=7"], "model.position.rotary_dim", "an even number of dims in [2, head_dim=32]"),
    ([ROPE, "model.position.rotary_dim=64"], "model.position.rotary_dim", "an even number of dims in [2, head_dim=32]"),
    ([ROPE, "model.position.rotary_dim=0"], "model.position.rotary_dim", "an even number of dims in [2, head_dim=32]"),
    ([ROPE, "model.position.rotary_fraction=1.5"], "model.position.rotary_fraction", "a fraction in (0, 1]"),
    ([ROPE, "model.position.rotary_fraction=0"], "model.position.rotary_fraction", "a fraction in (0, 1]"),
    ([ROPE, "model.position.rotary_fraction=0.3"], "model.position.rotary_fraction", "an even whole number of dims"),
    (
        [ROPE, "model.position.rotary_dim=16", "model.position.rotary_fraction=0.5"],
        "model.position.rotary_fraction",
        "null when rotary_dim is set",
    ),
    ([ROPE, "model.position.pairing=diagonal"], "model.position.pairing", "one of ['half', 'interleaved']"),
    ([ROPE, "model.position.theta=0"], "model.position.theta", "a positive number"),
    ([ROPE, "model.position.theta=-10000"], "model.position.theta", "a positive number"),
    ([ROPE, "model.attention.head_dim=9"], "model.attention.head_dim", "an even number for rope"),
    ([ROPE, "model.d_model=36"], "model.attention.head_dim", "an even number for rope"),  # 36 / 4 heads = 9
    # sinusoidal
    (
        ["model/position=sinusoidal", "model.d_model=33", "model.attention.n_head=3"],
        "model.d_model",
        "an even number for sinusoidal positions",
    ),
    # non-positive sizes
    (["model.vocab_size=0"], "model.vocab_size", "a positive number"),
    (["model.context_length=-1"], "model.context_length", "a positive number"),
    (["model.n_layer=0"], "model.n_layer", "a positive number"),
    (["model.d_model=0"], "model.d_model", "a positive number"),
    (["model.init_std=0"], "model.init_std", "a positive number"),
    (["model.init_std=nan"], "model.init_std", "a positive number"),
    (["model.embedding_init_std=0"], "model.embedding_init_std", "a positive number, or null (init_std)"),
    (["model.embedding_init_std=-1.0"], "model.embedding_init_std", "a positive number, or null (init_std)"),
    (["model.norm.eps=0"], "model.norm.eps", "a positive number"),
    (["model/norm=rmsnorm", "model.norm.eps=-1e-5"], "model.norm.eps", "a positive number"),
    # MLP width
    (["model.mlp.d_ff=0"], "model.mlp.d_ff", "a positive number or null"),
    (["model.mlp.multiplier=-2"], "model.mlp.multiplier", "a positive number or null"),
    (["model.mlp.multiplier=inf"], "model.mlp.multiplier", "a positive number or null"),
    (
        ["model/mlp=swiglu", "model.mlp.ffn_dim_multiplier=0"],
        "model.mlp.ffn_dim_multiplier",
        "a positive number or null",
    ),
    (["model/mlp=swiglu", "model.mlp.multiple_of=0"], "model.mlp.multiple_of", "a positive integer"),
    (["model.mlp.multiplier=0.001"], "model.mlp.d_ff", "a resolved hidden width >= 1"),  # int(0.128) = 0
    (["model.mlp.approximate=erf"], "model.mlp.approximate", "one of ['none', 'tanh']"),
    # an enumerated value is checked whatever variant is chosen, and refused where the variant cannot honour it
    (["model/mlp=geglu", "model.mlp.approximate=bogus"], "model.mlp.approximate", "one of ['none', 'tanh']"),
    (["model/mlp=moe", "model.mlp.approximate=tanh"], "model.mlp.approximate", "none for swiglu"),  # its experts'
    (
        ["model/mlp=moe", "model.mlp.expert=relu", "model.mlp.approximate=tanh"],
        "model.mlp.approximate",
        "none for relu",
    ),
    (
        ["model/position=rope", "model.position.pairing=bogus"],
        "model.position.pairing",
        "one of ['half', 'interleaved']",
    ),
    (
        ["model.attention.kind=linear"],
        "model.attention.kind",
        f"one of {sorted(MIXERS.names())}",  # every registered mixer, a new one included
    ),
    (["model.head.kind=bogus"], "model.head.kind", "one of ['linear', 'ngpt', 'transform']"),
    # probabilities
    (["model.dropout=1.0"], "model.dropout", "a probability in [0, 1)"),
    (["model.dropout=-0.1"], "model.dropout", "a probability in [0, 1)"),
    (["model.attention.dropout=1.5"], "model.attention.dropout", "a probability in [0, 1)"),
]


@pytest.mark.parametrize("overrides, field, allowed", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_invalid_override_raises_a_clear_config_error(overrides, field, allowed):
    with pytest.raises(ConfigError) as info:
        compose_model(overrides)
    error = info.value
    assert error.field == field
    assert allowed in error.allowed
    message = str(error)
    assert message.startswith(f"{field}=") and "is invalid: allowed" in message and allowed in message


def test_explicit_head_dim_lifts_the_divisibility_rule():
    cfg = compose_model(["model.d_model=130", "model.attention.head_dim=32"])  # 130 / 4 heads is not whole
    assert build_model(cfg, device="meta").blocks[0].attn.proj.weight.shape == (130, 4 * 32)


@pytest.mark.parametrize(
    "cfg, field, allowed",
    [
        (
            ModelConfig(d_model=64, attention=AttentionConfig(n_head=5)),
            "model.attention.n_head",
            "a divisor of model.d_model=64",
        ),
        (ModelConfig(attention=AttentionConfig(n_head=12, n_kv_head=5)), "model.attention.n_kv_head", "a divisor"),
        (ModelConfig(head=HeadConfig(tied="yes")), "model.head.tied", "true or false"),
        ({"n_layer": -3}, "model.n_layer", "a positive number"),
    ],
)
def test_invalid_config_objects_raise_before_building(cfg, field, allowed, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the decoder was constructed before validation")

    monkeypatch.setattr(archlab.build, "Decoder", no_build)
    for call in (count_params, build_model, lambda c: build_model(c, device="meta")):
        with pytest.raises(ConfigError) as info:
            call(cfg)
        assert info.value.field == field and allowed in info.value.allowed


def test_sequence_past_context_length_with_learned_positions():
    cfg = compose_model(["model.context_length=8", "model.n_layer=1"])
    model = build_model(cfg)
    model(torch.zeros(1, 8, dtype=torch.long))  # at the limit: fine
    with pytest.raises(ValueError, match=r"position 8 is past model\.context_length=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_unknown_group_option_lists_the_available_options():
    with pytest.raises(MissingConfigException) as info:
        compose_model(["model/position=foo"])
    message = str(info.value)
    assert "model/position/foo" in message
    for option in ("alibi", "learned", "none", "rope", "sinusoidal"):
        assert f"\t{option}\n" in message


def test_unknown_preset_lists_the_presets():
    with pytest.raises(MissingConfigException) as info:
        compose_model(["model=gpt5"])
    message = str(info.value)
    assert "model/gpt5" in message
    for preset in ("nano", "gpt2", "gptj-6b", "llama-7b", "llama2-70b", "llama3-8b"):
        assert f"\t{preset}\n" in message


def test_wrong_type_is_rejected_by_the_schema_naming_the_key():
    with pytest.raises(ConfigCompositionException) as info:
        compose_model(["model.mlp.d_ff=2.5"])
    cause = str(info.value.__cause__)
    assert "model.mlp.d_ff" in cause and "Integer" in cause


@pytest.mark.parametrize("kind", [ConfigError, SweepConfigError])
def test_config_errors_survive_pickling(kind):
    """A parallel sweep's worker sends a failed job's error back pickled: it must come back whole."""
    import pickle

    err = pickle.loads(pickle.dumps(kind("model.attention.n_head", 5, "a divisor of d_model=384")))
    assert type(err) is kind and (err.field, err.value, err.allowed) == (
        "model.attention.n_head",
        5,
        "a divisor of d_model=384",
    )
    assert str(err) == "model.attention.n_head=5 is invalid: allowed a divisor of d_model=384"


def test_swapping_to_an_mlp_without_a_tanh_form_leaves_a_presets_tanh_out():
    """GPT-2 asks for tanh GELU; swiglu and relu have no such field (their configs: no approximate at all),
    geglu keeps it and honours it."""
    assert not hasattr(compose_model(["model=gpt2", "model/mlp=swiglu"]).mlp, "approximate")
    assert not hasattr(compose_model(["model=gpt2", "model/mlp=relu"]).mlp, "approximate")
    geglu = build_model(compose_model(["model=nano", "model/mlp=geglu"]), device="meta").blocks[0].mlp
    assert geglu.gate == Gate("gelu_tanh")
