"""Per-family Hugging Face parity of the mixture-of-experts families whose layers differ: gpt-oss,
Llama 4 (text) and AFMoE.

Tiny random models of each, their per-layer descriptions read into ``model.layers`` kinds (gpt-oss:
sliding and full layers, or all full; Llama 4: RoPE layers chunked with the L2 QK-norm, NoPE layers
with the query temperature, MoE and dense layers interleaved, or given layer by layer; AFMoE: sliding
RoPE and full NoPE layers, dense first layers, shared experts, a correction bias), give the same
float32 logits in archlab and in transformers' eager attention and experts, from HF to archlab and from
each shrunk preset to HF; archlab -> HF -> archlab gives back the config and every tensor bit for bit;
greedy decoding (left-padded batches too) equals HF ``generate``. Sequences of 12 tokens run past every
window and chunk of 4 and past the temperature's floor of 4; every parameter is redrawn (matrices
N(0, 0.2²), vectors (biases, norm scales, sinks, router biases) 0.5 + N(0, 0.3²)), and each per-layer
part is checked to change the logits (so a part dropped on one side could not pass).
"""

import functools

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, WINDOW, changed_cfg, logits, max_diff, randomize
from helpers.published import LAYOUT_CONFIGS

from archlab import ConfigError, build_model, compose_model
from archlab.config import LayersConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.layered_moe import shortest_layout
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(
    HF_SIZES,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    intermediate_size=32,
    **NO_TOKENS,
)
# YaRN as gpt-oss publishes it: no mscales, truncate false, the ramp's ends as computed (pairs 1.62 and
# 4.03 of 8: rounded outward they would be 1 and 5)
YARN = dict(
    rope_type="yarn",
    rope_theta=100.0,
    factor=4.0,
    original_max_position_embeddings=16,
    beta_fast=1.0,
    beta_slow=0.25,
    truncate=False,
)
# AFMoE counts its experts as num_experts, its routed width moe_intermediate_size; intermediate_size is its dense one
AFMOE = dict(
    {k: v for k, v in SMALL.items() if k not in ("num_local_experts", "intermediate_size")},
    num_experts=4,
    moe_intermediate_size=32,
    intermediate_size=48,
)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # layers 0, 2 slide over 4 positions, layer 1 is full (transformers' default layer_types)
    "gpt_oss-sliding-yarn": (
        "GptOssForCausalLM",
        "GptOssConfig",
        dict(SMALL, num_hidden_layers=3, sliding_window=WINDOW, swiglu_limit=1.5, rope_parameters=YARN),
    ),
    "gpt_oss-full-tied": (
        "GptOssForCausalLM",
        "GptOssConfig",
        dict(
            SMALL,
            num_hidden_layers=2,
            layer_types=["full_attention"] * 2,
            attention_bias=False,
            swiglu_limit=2.0,
            swiglu_alpha=1.2,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=500.0),
        ),
    ),
    # iRoPE: layers 0-2 RoPE, chunked, L2 QK-norm; layer 3 NoPE with the temperature; MoE on 1 and 3
    "llama4-irope-interleaved": (
        "Llama4ForCausalLM",
        "Llama4TextConfig",
        dict(
            SMALL,
            num_hidden_layers=4,
            intermediate_size_mlp=48,
            interleave_moe_layer_step=2,
            attention_chunk_size=WINDOW,
            floor_scale=4,
            attn_scale=0.5,
            rope_parameters=dict(rope_type="default", rope_theta=100.0),
        ),
    ),
    # layer by layer: NoPE on layer 1, a chunked NoPE layer 2, no QK-norm, no temperature, MoE on 0 and 2,
    # llama3 RoPE scaling, top-1 routing, a tied head
    "llama4-listed-llama3": (
        "Llama4ForCausalLM",
        "Llama4TextConfig",
        dict(
            SMALL,
            num_hidden_layers=3,
            intermediate_size_mlp=40,
            num_experts_per_tok=1,
            no_rope_layers=[1, 0, 0],
            layer_types=["chunked_attention", "full_attention", "chunked_attention"],
            moe_layers=[0, 2],
            attention_chunk_size=WINDOW,
            use_qk_norm=False,
            attn_temperature_tuning=False,
            attention_bias=True,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=100.0,
                factor=4.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    # layers 0, 2 slide over 4 positions with RoPE, 1, 3 full without positions (global_attn_every_n_layers);
    # layer 0 dense, then MoE with two shared experts, a route scale, muP's scaled embeddings
    "afmoe-sliding-nope": (
        "AfmoeForCausalLM",
        "AfmoeConfig",
        dict(
            AFMOE,
            num_hidden_layers=4,
            num_dense_layers=1,
            num_shared_experts=2,
            route_scale=2.5,
            global_attn_every_n_layers=2,
            sliding_window=WINDOW,
            mup_enabled=True,
            rope_parameters=dict(rope_type="default", rope_theta=100.0),
        ),
    ),
    # layer by layer: a full NoPE layer first, then two sliding ones; every layer MoE, one shared expert,
    # tanh-GeGLU, linear RoPE scaling, a tied head, no muP
    "afmoe-listed-linear": (
        "AfmoeForCausalLM",
        "AfmoeConfig",
        dict(
            AFMOE,
            num_hidden_layers=3,
            num_dense_layers=0,
            num_shared_experts=1,
            hidden_act="gelu_pytorch_tanh",
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            sliding_window=WINDOW,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0),
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def test_from_hf_reads_each_layer_into_a_kind():
    cfgs = {case: config_from_hf(_hf_config(case)) for case in HF_CASES}
    oss = cfgs["gpt_oss-sliding-yarn"]
    assert oss.layers.kinds == {"sliding": {"attention": {"window": WINDOW}}, "full": {}}
    assert (oss.layers.first, oss.layers.pattern) == ([], ["sliding", "full"])
    assert (oss.attention.sinks, oss.attention.qkv_bias, oss.attention.out_bias, oss.position.scaling.kind) == (
        True,
        True,
        True,
        "yarn",
    )
    m = oss.mlp
    assert (m.bias, m.routing.router_bias, m.swiglu_limit, m.swiglu_alpha, m.up_offset, m.expert_d_ff) == (
        True,
        True,
        1.5,
        1.702,
        1.0,
        32,
    )
    full = cfgs["gpt_oss-full-tied"]  # one kind for every layer: the model's own parts
    assert (full.layers.kinds, full.layers.pattern, full.attention.window, full.head.tied) == (None, [], None, True)
    irope = cfgs["llama4-irope-interleaved"]
    assert irope.layers.kinds == {
        "rope_dense": {"attention": {"chunk": WINDOW, "qk_norm": "l2"}, "mlp": {"kind": "swiglu"}},
        "rope": {"attention": {"chunk": WINDOW, "qk_norm": "l2"}},
        "nope": {
            "position": {"kind": "none"},
            "attention": {"query_scale_beta": 0.5, "query_scale_length": 4, "query_scale_offset": 1},
        },
    }
    assert (irope.layers.first, irope.layers.pattern) == ([], ["rope_dense", "rope", "rope_dense", "nope"])
    assert (irope.mlp.d_ff, irope.mlp.expert_d_ff, irope.mlp.routing.weight_input, irope.position.pairing) == (
        48,
        32,
        True,
        "interleaved",
    )
    listed = cfgs["llama4-listed-llama3"]
    assert listed.layers.kinds == {
        "rope": {"attention": {"chunk": WINDOW}},  # no QK-norm: use_qk_norm false
        "nope_dense": {"position": {"kind": "none"}, "mlp": {"kind": "swiglu"}},
        "nope_chunked": {"position": {"kind": "none"}, "attention": {"chunk": WINDOW}},
    }
    assert listed.layers.pattern == ["rope", "nope_dense", "nope_chunked"]
    assert (listed.position.scaling.kind, listed.attention.qkv_bias, listed.mlp.routing.top_k) == ("llama3", True, 1)
    afmoe = cfgs["afmoe-sliding-nope"]
    assert afmoe.layers.kinds == {
        "sliding_dense": {"attention": {"window": WINDOW}, "mlp": {"kind": "swiglu"}},  # num_dense_layers 1
        "sliding": {"attention": {"window": WINDOW}},
        "full": {"position": {"kind": "none"}},
    }
    assert (afmoe.layers.first, afmoe.layers.pattern) == (["sliding_dense"], ["full", "sliding"])
    assert (afmoe.block.kind, afmoe.scale_embedding, afmoe.attention.qk_norm, afmoe.attention.gate) == (
        "sandwich",
        True,
        "head",
        "elementwise",
    )
    m = afmoe.mlp
    assert (
        m.routing.scoring,
        m.routing.correction_bias,
        m.routing.normalize_top_k,
        m.routing.routed_scale,
        m.n_shared_experts,
    ) == (
        "sigmoid",
        True,
        True,
        2.5,
        2,
    )
    kinds = [lc.mlp.kind for lc in layer_configs(afmoe)]  # num_dense_layers 1: a layer kind of one SwiGLU
    assert (kinds, m.d_ff, m.expert_d_ff, m.routing.n_experts) == (["swiglu", "moe", "moe", "moe"], 48, 32, 4)
    listed = cfgs["afmoe-listed-linear"]
    assert (listed.layers.first, listed.layers.pattern) == (["full"], ["sliding"])
    assert (listed.mlp.expert, listed.mlp.approximate, listed.position.scaling.kind, listed.scale_embedding) == (
        "geglu",
        "tanh",
        "linear",
        False,
    )


def test_shortest_layout():
    assert shortest_layout(["a", "b", "a", "b", "a"]) == ([], ["a", "b"])
    assert shortest_layout(["d", "d", "m", "m", "m"]) == (["d", "d"], ["m"])
    assert shortest_layout(["a", "b", "c"]) == ([], ["a", "b", "c"])


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_logits_and_hf_to_archlab_to_hf_and_back(case):
    """archlab's logits equal HF's; the archlab model converts back to the same HF class with the same
    per-layer description and logits, and from there to an archlab model with the same config and
    bit-identical tensors."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    back = parity.check_back_and_again(hf, model, **EAGER)  # the same class: the layout read maps back to the family
    for key in ("layer_types", "no_rope_layers", "moe_layers", "sliding_window", "attention_chunk_size"):
        if key in HF_CASES[case][2] or key == "layer_types":
            assert getattr(back.config, key) == getattr(hf.config, key)


TINY = ["model.vocab_size=96", "model.context_length=64", "model.d_model=64", "model.attention.n_head=4"]
TINY += ["model.attention.n_kv_head=2", "model.attention.head_dim=16", "model.mlp.routing.n_experts=4"]
PRESET_CASES = {
    "gpt-oss-20b": (
        "GptOssForCausalLM",
        ["model.n_layer=3", "model.mlp.routing.top_k=2", "model.mlp.expert_d_ff=32", "model.mlp.swiglu_limit=1.5"]
        + [
            "model.layers.kinds.sliding.attention.window=4",
            "model.position.scaling.original_context=16",
            "model.position.scaling.factor=4.0",
        ],
    ),
    "llama4-scout-17b-16e": (
        "Llama4ForCausalLM",
        [
            "model.n_layer=4",
            "model.mlp.expert_d_ff=32",
            "model.mlp.d_ff=48",
            "model.layers.kinds.rope.attention.chunk=4",
        ]
        + [
            "model.layers.kinds.nope.attention.query_scale_length=4",
            "model.layers.kinds.nope.attention.query_scale_beta=0.5",
        ],
    ),
}


@pytest.mark.parametrize("preset", list(PRESET_CASES))
def test_archlab_to_hf_to_archlab_is_bit_identical(preset):
    """A shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit and the same counts."""
    expected_class, sizes = PRESET_CASES[preset]
    model = randomize(build_model(compose_model([f"model={preset}", *TINY, *sizes])), seed=3)
    _, back = parity.check_to_hf_and_back(model, expected_class, **EAGER)
    assert back.cfg.layers == model.cfg.layers  # the preset's kinds are the ones from_hf names


PARTS = {  # case -> (changed_cfg's field, the value that takes the part away)
    "gpt_oss-sliding-yarn": [
        ("kinds__sliding__attention__window", None),  # the sliding layers' window
        ("mlp__swiglu_limit", None),  # the SwiGLU clamp is reached
        ("position__scaling__truncate", True),  # YaRN's ramp ends as computed
    ],
    "llama4-irope-interleaved": [
        ("kinds__rope__attention__chunk", None),  # the RoPE layers' chunks
        ("kinds__rope__attention__qk_norm", "none"),  # their L2 QK-norm
        ("kinds__nope__attention__query_scale_beta", None),  # the NoPE layer's temperature
        ("kinds__nope__position__kind", "rope"),  # its missing RoPE
    ],
    "afmoe-sliding-nope": [
        ("kinds__sliding__attention__window", None),  # the sliding layers' window
        ("kinds__full__position__kind", "rope"),  # the full layers' missing RoPE
        ("scale_embedding", False),  # muP's sqrt(d_model)
        ("mlp__routing__routed_scale", 1.0),  # route_scale
    ],
}


@pytest.mark.parametrize("case", list(PARTS))
def test_each_per_layer_part_changes_the_logits(case):
    """The same weights with one part taken away (on a layer kind, or on every layer) give other logits:
    the parity above depends on each."""
    model = from_hf(hf_model(case))
    for field, value in PARTS[case]:
        parity.check_changes_logits(model, changed_cfg(model.cfg, **{field: value}), field)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_generation_matches_hf_generate(case):
    """20 new tokens after a 5-token prompt, past every window and chunk of 4, and prompts of 7, 3 and 5
    tokens left-padded into one batch: the same ids as HF ``generate``, and at every step archlab's
    logits through its KV cache equal HF's."""
    hf = hf_model(case, seed=4)
    parity.check_greedy_generation(hf)
    parity.check_padded_generation(hf)


def test_an_afmoe_layout_written_in_archlab_exports():
    """An AFMoE layout of archlab's own (a full NoPE layer, then sliding ones; two dense layers), its
    weights and correction bias drawn on archlab's side, gives HF's logits and the layer_types it says."""
    cfg = config_from_hf(_hf_config("afmoe-sliding-nope"))
    kinds = cfg.layers.kinds
    kinds["full_dense"] = {**kinds["full"], "mlp": {"kind": "swiglu"}}
    cfg.layers.first, cfg.layers.pattern = ["full_dense", "sliding_dense"], ["sliding"]
    model = randomize(build_model(cfg), seed=3)
    hf = to_hf(model, **EAGER).eval()
    assert type(hf).__name__ == "AfmoeForCausalLM"
    assert hf.config.layer_types == ["full_attention"] + ["sliding_attention"] * 3
    assert (hf.config.num_dense_layers, hf.config.mup_enabled) == (2, True)
    assert max_diff(logits(model), logits(hf)) <= TOL


@pytest.mark.parametrize("case", ["gpt_oss-sliding-yarn", "llama4-irope-interleaved", "afmoe-sliding-nope"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **EAGER)


# ---------------------------------------------------------------- which family, and what is refused


@functools.cache
def preset(name: str):
    return compose_model([f"model={name}"])


def changed(name: str, **fields):
    """Preset ``name`` with ``fields`` set: ``attention__window=...`` on the model,
    ``kinds__nope__attention__qk_norm=...`` on (or added to) a layer kind."""
    return changed_cfg(preset(name), **fields)


OSS, SCOUT = "gpt-oss-20b", "llama4-scout-17b-16e"
# every other layer global among the model's sliding ones (conf/model/layers/every_other_global)
LOCAL_GLOBAL = LayersConfig(kinds={"local": {}, "global": {"attention": {"window": None}}}, pattern=["local", "global"])
# Llama 4 Scout's layers with the first one dense (one SwiGLU of d_ff) instead of a MoE
SCOUT_DENSE_FIRST = LayersConfig(
    kinds={
        **preset(SCOUT).layers.kinds,
        "rope_dense": {**preset(SCOUT).layers.kinds["rope"], "mlp": {"kind": "swiglu"}},
    },
    first=["rope_dense"],
    pattern=["rope", "rope", "nope", "rope"],
)


@pytest.mark.parametrize(
    "name, fields, config_class",
    [
        (OSS, {}, "GptOssConfig"),
        (SCOUT, {}, "Llama4TextConfig"),
        # the same layers by other kinds (the model's window, global layers overriding it), and a dense
        # first layer as a kind, export alike
        (OSS, dict(layers=LOCAL_GLOBAL, attention__window=128), "GptOssConfig"),
        (SCOUT, dict(layers=SCOUT_DENSE_FIRST), "Llama4TextConfig"),
    ],
)
def test_the_layout_picks_the_family(name, fields, config_class):
    assert type(config_to_hf(changed(name, **fields))).__name__ == config_class


def test_global_layers_among_the_model_s_window_give_gpt_oss_s_layer_types():
    hf_cfg = config_to_hf(changed(OSS, layers=LOCAL_GLOBAL, attention__window=128))
    assert hf_cfg.layer_types == config_to_hf(preset(OSS)).layer_types
    assert hf_cfg.layer_types[:2] == ["sliding_attention", "full_attention"] and hf_cfg.sliding_window == 128


@pytest.mark.parametrize("name", [OSS, "gpt-oss-120b"])
def test_published_gpt_oss_config_loads_as_the_preset_and_back(name):
    """openai/gpt-oss's published config (GptOssConfig's YaRN: factor 32, beta 32 / 1, 4096 positions,
    truncate false) reads into the preset exactly, and writes back the same rope_parameters."""
    _, config_class, keys, _ = LAYOUT_CONFIGS[name]
    published = getattr(transformers, config_class)(**keys)
    assert published.rope_parameters["truncate"] is False
    cfg = config_from_hf(published)
    assert cfg == preset(name) and cfg.position.scaling.truncate is False
    assert config_to_hf(cfg).rope_parameters == published.rope_parameters


@pytest.mark.parametrize(
    "name, fields, field",
    [
        # a layer kind that changes what gpt-oss holds once: named as the kind's field
        (OSS, dict(kinds__sliding__attention__n_kv_head=4), "model.layers.kinds.sliding.attention.n_kv_head"),
        (OSS, dict(kinds__full__position__theta=1000.0), "model.layers.kinds.full.position.theta"),
        (OSS, dict(kinds__full__attention__window=64), "model.attention.window"),  # two windows
        (OSS, dict(mlp__swiglu_limit=None), "model.mlp.swiglu_limit"),
        (OSS, dict(mlp__routing__router_bias=False), "model.mlp.routing.router_bias"),
        (OSS, dict(attention__sinks=False), "model.attention.sinks"),
        (OSS, dict(mlp__n_shared_experts=1), "model.mlp.n_shared_experts"),
        (OSS, dict(mlp__swiglu_clamp="activation"), "model.mlp.swiglu_clamp"),
        (
            OSS,
            dict(position__scaling__mscale=1.0, position__scaling__mscale_all_dim=1.0),
            "model.position.scaling.mscale",
        ),
        (OSS, dict(attention__out_bias=False), "model.attention.out_bias"),
        (OSS, dict(kinds__full__mlp__kind="swiglu"), "model.layers.kinds.full.mlp.kind"),
        # Llama 4
        (SCOUT, dict(kinds__nope__attention__qk_norm="l2"), "model.layers.kinds.nope.attention.qk_norm"),
        (SCOUT, dict(kinds__rope__attention__qk_norm="head"), "model.layers.kinds.rope.attention.qk_norm"),
        (
            SCOUT,
            dict(kinds__rope__attention__query_scale_beta=0.1),
            "model.layers.kinds.rope.attention.query_scale_beta",
        ),
        (
            SCOUT,
            dict(kinds__nope__attention__query_scale_offset=0),
            "model.layers.kinds.nope.attention.query_scale_offset",
        ),
        (SCOUT, dict(kinds__nope__attention__chunk=16), "model.layers.kinds.nope.attention.chunk"),
        (SCOUT, dict(kinds__nope__attention__window=16), "model.layers.kinds.nope.attention.window"),
        (SCOUT, dict(kinds__nope__position__kind="alibi"), "model.layers.kinds.nope.position.kind"),
        (SCOUT, dict(mlp__n_shared_experts=2), "model.mlp.n_shared_experts"),
        (SCOUT, dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
        (SCOUT, dict(mlp__routing__weight_input=False), "model.mlp.routing.weight_input"),
        (SCOUT, dict(position__pairing="half"), "model.position.pairing"),
        (SCOUT, dict(kinds__nope__mlp__kind="geglu"), "model.layers.kinds.nope.mlp.kind"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(name, fields, field):
    with pytest.raises(ConfigError) as err:
        config_to_hf(changed(name, **fields))
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)


@pytest.mark.parametrize(
    "fields, field",
    [
        # RoPE exactly on the sliding layers
        (dict(kinds__full__position__kind="rope"), "model.layers.kinds.full.position.kind"),
        (dict(kinds__sliding__position__kind="none"), "model.layers.kinds.sliding.position.kind"),
        (dict(kinds__full__attention__window=8), "model.attention.window"),  # two windows
        (dict(kinds__full__attention__n_kv_head=4), "model.layers.kinds.full.attention.n_kv_head"),
        (dict(block__kind="pre"), "model.block.kind"),
        (dict(attention__qk_norm="none"), "model.attention.qk_norm"),
        (dict(attention__gate="head"), "model.attention.gate"),
        (dict(attention__qkv_bias=True, attention__out_bias=True), "model.attention.qkv_bias"),
        (dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
        (dict(mlp__routing__correction_bias=False), "model.mlp.routing.correction_bias"),
        (dict(mlp__routing__normalize_top_k=False), "model.mlp.routing.normalize_top_k"),
        (dict(mlp__routing__n_groups=2), "model.mlp.routing.n_groups"),
        (dict(mlp__n_shared_experts=0), "model.mlp.n_shared_experts"),
        (dict(kinds__full__mlp__kind="swiglu"), "model.layers.kinds.full.mlp.kind"),
    ],
)
def test_config_to_hf_refuses_what_afmoe_cannot_hold(fields, field):
    cfg = changed_cfg(config_from_hf(_hf_config("afmoe-sliding-nope")), **fields)
    with pytest.raises(ConfigError) as err:
        config_to_hf(cfg)
    assert err.value.field == field
    assert "Hugging Face AFMoE" in str(err.value)


def _hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


@pytest.mark.parametrize(
    "case, changes, field",
    [
        (
            "gpt_oss-sliding-yarn",
            dict(rope_parameters=dict(YARN, truncate="no")),
            "GptOssConfig.rope_parameters.truncate",
        ),
        (
            "gpt_oss-sliding-yarn",
            dict(rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=0.8)),
            "GptOssConfig.rope_parameters.mscale",
        ),
        (
            "gpt_oss-sliding-yarn",
            dict(rope_parameters=HF_CASES["llama4-listed-llama3"][2]["rope_parameters"]),
            "GptOssConfig.rope_parameters.rope_type",
        ),
        ("llama4-irope-interleaved", dict(router_jitter_noise=0.1), "Llama4TextConfig.router_jitter_noise"),
        ("llama4-irope-interleaved", dict(hidden_act="relu"), "Llama4TextConfig.hidden_act"),
        ("llama4-irope-interleaved", dict(moe_layers=[]), "Llama4TextConfig.moe_layers"),
        ("afmoe-sliding-nope", dict(attention_bias=True), "AfmoeConfig.attention_bias"),
        ("afmoe-sliding-nope", dict(num_shared_experts=0), "AfmoeConfig.num_shared_experts"),
        ("afmoe-sliding-nope", dict(hidden_act="relu"), "AfmoeConfig.hidden_act"),
        ("afmoe-sliding-nope", dict(rope_parameters=YARN), "AfmoeConfig.rope_parameters.rope_type"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(_hf_config(case, **changes))
    assert err.value.field == field
