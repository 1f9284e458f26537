"""Hugging Face parity of OLMo Hybrid (OlmoHybridForCausalLM; archlab/interop/families/olmo_hybrid.py): tiny
random models (every parameter redrawn: matrices N(0, 0.2²), vectors, among them the norm scales, A_log and
dt_bias, 0.5 + N(0, 0.3²)) holding both layer kinds, OLMo 2's post-norm attention layers (QK-norm over the
projection; without RoPE, as the released checkpoints, and with it) and pre-norm Gated DeltaNet layers (β
doubled, and not; fewer query/key heads than value heads, and not), give the same float32 logits in archlab
and in transformers' eager path; greedy and left-padded decoding equal HF ``generate``; HF -> archlab -> HF
-> archlab gives back every tensor bit for bit; a save_pretrained directory round trips; the refusals name
their field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, HF_SIZES, NO_TOKENS

from archlab.config.layers import layer_kind
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# width 64, 4 heads of 16 (2 KV heads), SwiGLU of 96; Gated DeltaNet: 4 value heads of 12, 2 query/key heads
# of 8, conv 4
SMALL = dict(HF_SIZES, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
SMALL |= dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # OlmoHybridConfig's layout at 4 layers (attention at 3), no RoPE (rope_theta null, as released), β in (0, 2)
    "olmo-hybrid-nope": (
        "OlmoHybridForCausalLM",
        "OlmoHybridConfig",
        dict(SMALL, num_hidden_layers=4, rope_parameters={"rope_type": "default", "rope_theta": None}),
    ),
    # attention first and last, RoPE 100, attention biases, β in (0, 1), one query/key head per value head, a
    # tied head, rms_norm_eps 1e-5
    "olmo-hybrid-rope": (
        "OlmoHybridForCausalLM",
        "OlmoHybridConfig",
        dict(SMALL, num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "full_attention"])
        | dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0}, attention_bias=True)
        | dict(linear_allow_neg_eigval=False, linear_num_key_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-5),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        only=(*parity.ONE_MODEL_TESTS[:4], "test_save_pretrained_directories_round_trip"),
    )
)


def test_from_hf_reads_the_parts():
    cfg = from_hf(hf_model("olmo-hybrid-nope")).cfg
    assert [layer_kind(cfg, i) for i in range(4)] == ["deltanet"] * 3 + ["attention"]
    linear = cfg.layers.kinds["deltanet"]
    assert linear["block"] == {"kind": "pre"}
    a = linear["attention"]
    assert (a["kind"], a["n_head"], a["key_heads"], a["key_head_dim"], a["v_head_dim"]) == (
        "gated_deltanet",
        4,
        2,
        8,
        12,
    )
    assert (a["allow_neg_eigval"], a["norm_eps"], a["dt_bias_init"]) == (True, 1e-5, None)
    assert (cfg.block.kind, cfg.attention.qk_norm, cfg.position.kind, cfg.norm.eps) == (
        "post_sublayer",
        "full",
        "none",
        1e-6,
    )
    rope = from_hf(hf_model("olmo-hybrid-rope")).cfg
    assert (rope.position.kind, rope.position.theta, rope.attention.qkv_bias, rope.head.tied) == (
        "rope",
        100.0,
        True,
        True,
    )
    assert rope.layers.kinds["deltanet"]["attention"]["allow_neg_eigval"] is False
    assert config_to_hf(rope).layer_types == ["full_attention", "linear_attention", "full_attention"]


TINY = ["model.vocab_size=96", "model.context_length=64", "model.d_model=64"]


def held():
    """The first case read into archlab: a layout the record holds."""
    return config_from_hf(hf_model("olmo-hybrid-nope").config)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda c: setattr(c.block, "kind", "pre"), "model.block.kind"),
        (lambda c: c.layers.kinds["deltanet"].update(block={"kind": "post_sublayer"}), "model.layers.kinds.deltanet.block.kind"),
        (lambda c: c.layers.kinds["deltanet"]["attention"].update(norm_eps=1e-6), "model.layers.kinds.deltanet.attention.norm_eps"),
        (lambda c: c.layers.kinds["attention"].update(block={"residual_multiplier": 0.5}), "model.layers.kinds.attention.block.residual_multiplier"),
        (lambda c: setattr(c.attention, "qk_norm", "head"), "model.attention.qk_norm"),
        (lambda c: setattr(c.layers, "pattern", ["deltanet"]), "model.layers.pattern"),
    ],
)  # fmt: skip
def test_the_record_refuses_what_olmo_hybrid_does_not_hold(change, field):
    cfg = held()
    assert FAMILIES["olmo_hybrid"].problems(cfg) == []
    change(cfg)
    assert field in {p.field for p in FAMILIES["olmo_hybrid"].problems(cfg)}


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    parity.check_refuses(
        lambda: config_from_hf(parity.hf_config(HF_CASES, "olmo-hybrid-nope", hidden_act="gelu")),
        "OlmoHybridConfig.hidden_act",
    )
