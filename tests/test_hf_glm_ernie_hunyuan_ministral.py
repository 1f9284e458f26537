"""Hugging Face parity of GLM-4, ERNIE 4.5 (dense), HunYuan dense, Ministral and Ministral 3
(archlab/interop/families/glm4.py, ernie.py, hunyuan.py, ministral.py), and of YaRN's ``softmax_mscale``.

Tiny random models of each, every parameter redrawn (matrices N(0, 0.2²), biases and norm scales
0.5 + N(0, 0.3²), far from 0 and 1), give the same float32 logits in archlab and in transformers' eager
implementation; archlab -> HF -> archlab gives back every tensor bit for bit; greedy decoding, alone and
in a left-padded batch, equals HF ``generate``; save_pretrained directories load. Heads are grouped
(GQA); sequences are longer than the windows (4) of Ministral (sliding and full layers by layer_types) and
Ministral 3 (one window on every layer); GLM-4 rotates half of each head, pairing adjacent dims; HunYuan's
published fixed-alpha NTK base becomes archlab's theta; Ministral 3 has the generic YaRN with mscales
that differ (so cos and sin are scaled, the softmax not) and queries scaled by position from position 8.
"""

import math

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, HF_SIZES, NO_TOKENS, TOL, WINDOW, logits, max_diff, randomize
from helpers.parts import short_fit, tiny

from archlab import ConfigError, build_model, compose_model
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf, from_hf, hf_family
from archlab.nn.mixers.attention import softmax_scale
from archlab.nn.validation import validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
SMALL = dict(
    HF_SIZES, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS
)
# transformers' generic YaRN as Ministral 3 publishes it, shrunk: a 4x longer context than 8 positions,
# mscales that differ, and queries scaled by 1 + 0.3·log(1 + ⌊p / 8⌋)
YARN = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=8,
    max_position_embeddings=32,
    beta_fast=8.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=0.5,
    llama_4_scaling_beta=0.3,
)
# case -> (model class, config class, config keys)
HF_CASES = {
    # half of each head of 24 rotated, q/k/v biases, four norms per block
    "glm4": (
        "Glm4ForCausalLM",
        "Glm4Config",
        dict(
            SMALL, head_dim=24, rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)
        ),
    ),
    # biases on every projection
    "ernie4_5": ("Ernie4_5ForCausalLM", "Ernie4_5Config", dict(SMALL, head_dim=16, use_bias=True)),
    # attention biases, the published fixed-alpha NTK base (its other keys unread by transformers)
    "hunyuan_v1_dense": (
        "HunYuanDenseV1ForCausalLM",
        "HunYuanDenseV1Config",
        dict(
            SMALL,
            head_dim=16,
            attention_bias=True,
            rope_parameters=dict(rope_type="dynamic", alpha=10.0, rope_theta=10000.0, factor=1.0),
        ),
    ),
    # sliding, full, sliding
    "ministral": (
        "MinistralForCausalLM",
        "MinistralConfig",
        dict(SMALL, head_dim=16, num_hidden_layers=3, sliding_window=WINDOW, layer_types=[S, F, S]),
    ),
    "ministral3": (
        "Ministral3ForCausalLM",
        "Ministral3Config",
        dict(SMALL, head_dim=16, sliding_window=WINDOW, rope_parameters=YARN),
    ),
}


def hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_back(case):
    """HF -> archlab: the same logits, and the layout maps back to the family; archlab -> HF: the same class
    and logits; -> archlab again: the same config and bit-identical tensors."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == case
    parity.check_back_and_again(hf, model, **ATTN)


def test_from_hf_reads_each_family_s_parts():
    glm = config_from_hf(hf_config("glm4"))
    assert (glm.block.kind, glm.position.pairing, glm.position.rotary_fraction, glm.attention.head_dim) == (
        "sandwich",
        "interleaved",
        0.5,
        24,
    )
    assert (glm.attention.qkv_bias, glm.attention.out_bias, glm.mlp.bias, glm.attention.n_kv_head) == (
        True,
        False,
        False,
        2,
    )
    ernie = config_from_hf(hf_config("ernie4_5"))
    assert (ernie.position.pairing, ernie.attention.qkv_bias, ernie.attention.out_bias, ernie.mlp.bias) == (
        "interleaved",
        True,
        True,
        True,
    )
    hunyuan = config_from_hf(hf_config("hunyuan_v1_dense"))
    a = hunyuan.attention
    assert (a.qk_norm, a.qk_norm_after_rope, a.qkv_bias, a.out_bias, hunyuan.mlp.bias) == (
        "head",
        True,
        True,
        True,
        False,
    )
    assert hunyuan.position.theta == 10000.0 * 10.0 ** (16 / 14)  # transformers' NTK base: theta · alpha^(hd/(hd-2))
    ministral = config_from_hf(hf_config("ministral"))
    assert (ministral.layers.first, ministral.layers.pattern) == ([], ["local", "global"])
    assert ministral.layers.kinds["local"] == {"attention": {"window": WINDOW}}
    assert (ministral.attention.window, ministral.attention.qkv_bias, ministral.attention.out_bias) == (
        None,
        False,
        False,
    )
    m3 = config_from_hf(hf_config("ministral3"))
    p, a = m3.position.scaling, m3.attention
    assert (p.kind, p.factor, p.original_context, p.mscale, p.mscale_all_dim, p.softmax_mscale) == (
        "yarn",
        4.0,
        8,
        1.0,
        0.5,
        False,
    )
    assert (a.window, a.query_scale_beta, a.query_scale_length, a.query_scale_offset, a.query_scale_by) == (
        WINDOW,
        0.3,
        8,
        0,
        "position",
    )
    # Ministral 3 without the query scale (β 0) and with its mscales equal: cos, sin and softmax unscaled
    plain = config_from_hf(
        hf_config("ministral3", rope_parameters=dict(YARN, llama_4_scaling_beta=0.0, mscale_all_dim=1.0))
    )
    assert plain.attention.query_scale_beta is None
    assert softmax_scale(plain) == 1 / math.sqrt(16)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_generation_matches_hf_generate(case):
    """Greedy decoding through the KV cache, alone and in a left-padded batch, gives HF ``generate``'s ids
    and logits at every step (past the windows, and past position 8 where Ministral 3's query scale steps)."""
    hf = hf_model(case, seed=3)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_save_pretrained_directory_round_trip(case, tmp_path):
    parity.check_directory_round_trip(hf_model(case, seed=4), tmp_path, attn_implementation="eager")


TINY = ["model.vocab_size=96", "model.context_length=64", "model.n_layer=2", "model.mlp.d_ff=96"]
GQA = ["model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2"]
LLAMA = ["model=llama2-7b", *TINY, *GQA]
# an archlab layout -> the class that holds it (and only it, among the converted families)
LAYOUT_CASES = {
    "glm4": (
        [
            *LLAMA,
            "model/block=sandwich",
            "model.position.pairing=interleaved",
            "model.position.rotary_fraction=0.5",
            "model.attention.qkv_bias=true",
        ],
        "Glm4ForCausalLM",
    ),
    "ernie4_5": (
        [
            *LLAMA,
            "model.position.pairing=interleaved",
            "model.attention.qkv_bias=true",
            "model.attention.out_bias=true",
            "model.mlp.bias=true",
        ],
        "Ernie4_5ForCausalLM",
    ),
    "hunyuan_v1_dense": (
        [*LLAMA, "model.attention.qk_norm=head", "model.attention.qk_norm_after_rope=true"],
        "HunYuanDenseV1ForCausalLM",
    ),
    "ministral": (
        [
            "model=mistral-7b",
            *TINY,
            *GQA,
            "model.n_layer=3",
            "model/layers=every_other_global",
            f"model.attention.window={WINDOW}",
        ],
        "MinistralForCausalLM",
    ),
    "ministral3": (
        [
            "model=mistral-7b",
            *TINY,
            *GQA,
            f"model.attention.window={WINDOW}",
            "model.attention.query_scale_beta=0.2",
            "model.attention.query_scale_length=8",
            "model.attention.query_scale_by=position",
            "model/position=yarn",
            "model.position.scaling.factor=4.0",
            "model.position.scaling.original_context=8",
            "model.position.scaling.mscale=0.8",
            "model.position.scaling.mscale_all_dim=0.6",
            "model.position.scaling.softmax_mscale=false",
        ],
        "Ministral3ForCausalLM",
    ),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_an_archlab_layout_exports_to_the_family_that_holds_it(case):
    overrides, hf_class = LAYOUT_CASES[case]
    model = randomize(build_model(compose_model(overrides)), seed=6)
    assert hf_family(model.cfg) == case
    parity.check_to_hf_and_back(model, hf_class, attn_implementation="eager")


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("glm4", dict(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)), "rope_type"),
        ("ernie4_5", dict(rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5)), "partial_rotary_factor"),
        ("hunyuan_v1_dense", dict(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)), "rope_type"),
        ("ministral", dict(layer_types=[S, "chunked_attention", S]), "layer_types"),
        ("ministral3", dict(rope_parameters=dict(YARN, llama_4_scaling_beta=-0.1)), "llama_4_scaling_beta"),
        ("ministral3", dict(rope_parameters=dict(YARN, truncate="yes")), "truncate"),
    ],
)
def test_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(hf_config(case, **changes))
    assert err.value.field.startswith(HF_CASES[case][1])
    assert err.value.field.endswith(field)


@pytest.mark.parametrize(
    "case, overrides, field",
    [
        ("glm4", ["model.attention.out_bias=true"], "model.attention.out_bias"),
        ("ernie4_5", ["model.mlp.bias=false"], "model.mlp.bias"),
        ("ernie4_5", ["model.attention.dropout=0.1"], "model.attention.dropout"),
        ("hunyuan_v1_dense", ["model.attention.qk_norm=full"], "model.attention.qk_norm"),
        ("ministral", ["+model.layers.kinds.global.attention.window=8"], "model.layers.kinds.global.attention.window"),
        ("ministral3", ["model.attention.query_scale_offset=1"], "model.attention.query_scale_offset"),
        ("ministral3", ["model.attention.query_scale_length=16"], "model.attention.query_scale_length"),
        ("ministral3", ["model.attention.query_scale_by=index"], "model.attention.query_scale_by"),
        ("ministral3", ["model.position.scaling.softmax_mscale=true"], "model.position.scaling.softmax_mscale"),
    ],
)
def test_each_family_refuses_what_it_cannot_hold(case, overrides, field):
    cfg = validate(compose_model([*LAYOUT_CASES[case][0], *overrides]))
    with pytest.raises(ConfigError) as err:
        FAMILIES[case].check(cfg)
    assert err.value.field == field
    assert FAMILIES[case].title in str(err.value)


# ---- YaRN's softmax_mscale


def _yarn(**scaling):
    """A tiny model with YaRN (factor 4 over 8 positions) and these fields of its scaling."""
    return tiny(
        vocab_size=96, position=dict(kind="rope", scaling=dict(kind="yarn", factor=4.0, original_context=8, **scaling))
    )


def test_softmax_mscale_says_whether_mscale_all_dim_scales_the_softmax():
    """With mscale_all_dim 0.5 and factor 4 the softmax scale is hd^-0.5 · (0.1 · 0.5 · ln 4 + 1)² (DeepSeek),
    or hd^-0.5 with softmax_mscale false (transformers' generic yarn); the logits differ."""
    deepseek = validate(_yarn(mscale=1.0, mscale_all_dim=0.5))
    generic = validate(_yarn(mscale=1.0, mscale_all_dim=0.5, softmax_mscale=False))
    assert math.isclose(softmax_scale(deepseek), 8**-0.5 * (0.05 * math.log(4) + 1) ** 2, rel_tol=1e-12)
    assert softmax_scale(generic) == 1 / math.sqrt(8)
    model = randomize(build_model(deepseek), seed=2)
    parity.check_changes_logits(model, generic, "softmax_mscale")
    losses = short_fit(build_model(generic), generic.vocab_size, 16)
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize(
    "scaling", [dict(softmax_mscale=False), dict(mscale=None, mscale_all_dim=None, softmax_mscale=False)]
)
def test_softmax_mscale_false_needs_yarn_s_mscale_all_dim(scaling):
    cfg = _yarn(**scaling) if "mscale" in scaling else tiny(position=dict(kind="rope", scaling=scaling))
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.field == "model.position.scaling.softmax_mscale"


def test_config_to_hf_writes_ministral3_s_query_scale_and_yarn():
    cfg = compose_model(LAYOUT_CASES["ministral3"][0])
    rope = config_to_hf(cfg).rope_parameters
    assert (rope["llama_4_scaling_beta"], rope["original_max_position_embeddings"], rope["mscale_all_dim"]) == (
        0.2,
        8,
        0.6,
    )


def test_query_scale_by_position_reads_each_row_s_rope_positions():
    """With ``query_scale_by: position`` a left-padded row's logits are those it has alone (its positions
    count from its first token, as RoPE's do); by index (Llama 4) the padding shifts the query scale."""
    rope = dict(kind="rope")
    cfg = tiny(vocab_size=96, position=rope, attention=dict(query_scale_beta=0.5, query_scale_length=2))
    by_position = validate(tiny(vocab_size=96, position=rope, attention=dict(
        query_scale_beta=0.5, query_scale_length=2, query_scale_by="position")))  # fmt: skip
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    padded, mask = torch.cat((torch.zeros(1, 3, dtype=torch.long), ids), 1), torch.tensor([[0] * 3 + [1] * 6])
    for c, alike in ((by_position, True), (validate(cfg), False)):
        model = randomize(build_model(c), seed=5)
        with torch.no_grad():
            alone, in_batch = model(ids), model(padded, attention_mask=mask)[:, 3:]
        assert (max_diff(alone, in_batch) <= 1e-5) == alike
