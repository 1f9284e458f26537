"""Hugging Face parity of gpt-oss (archlab/interop/families/gpt_oss.py), a mixture-of-experts family whose
layers differ: sliding and full layers (or all full) read into ``model.layers`` kinds, attention sinks, q/k/v
and output biases, a router bias, a clamped SwiGLU and YaRN as gpt-oss publishes it.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), vectors (biases, norm scales, sinks,
router biases) 0.5 + N(0, 0.3²); 12 tokens past every window of 4) give the same float32 logits in archlab
and in transformers' eager attention and experts, from HF to archlab and from the shrunk preset to HF;
archlab -> HF -> archlab gives back the config, the per-layer description and every tensor bit for bit;
greedy decoding (left-padded batches too) equals HF ``generate``; each per-layer part changes the logits
(so a part dropped on one side could not pass); a save_pretrained directory loads; the published config
reads into the preset; what gpt-oss cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW, changed_cfg

from archlab import compose_model
from archlab.config import LayersConfig
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, **NO_TOKENS)
SMALL |= dict(num_experts_per_tok=2, intermediate_size=32)
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
}
OSS = "gpt-oss-20b"
TINY = ["model.vocab_size=96", "model.context_length=64", "model.d_model=64", "model.attention.n_head=4"]
TINY += ["model.attention.n_kv_head=2", "model.attention.head_dim=16", "model.mlp.routing.n_experts=4"]
# the preset shrunk, its routing, windows and RoPE kept
PRESET = ["model.n_layer=3", "model.mlp.routing.top_k=2", "model.mlp.expert_d_ff=32", "model.mlp.swiglu_limit=1.5"]
PRESET += ["model.layers.kinds.sliding.attention.window=4", "model.position.scaling.original_context=16"]
PRESET += ["model.position.scaling.factor=4.0"]
# every other layer global among the model's sliding ones (conf/model/layers/every_other_global)
LOCAL_GLOBAL = LayersConfig(kinds={"local": {}, "global": {"attention": {"window": None}}}, pattern=["local", "global"])


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def changed(**fields):
    """The gpt-oss-20b preset with ``fields`` set (``helpers.hf.changed_cfg``)."""
    return changed_cfg(parity.composed(f"model={OSS}"), **fields)


def test_from_hf_reads_each_layer_into_a_kind():
    oss = config_from_hf(parity.hf_config(HF_CASES, "gpt_oss-sliding-yarn"))
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
    full = config_from_hf(parity.hf_config(HF_CASES, "gpt_oss-full-tied"))  # one kind for every layer
    assert (full.layers.kinds, full.layers.pattern, full.attention.window, full.head.tied) == (None, [], None, True)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_logits_and_hf_to_archlab_to_hf_and_back(case):
    """archlab's logits equal HF's; the archlab model converts back to the same HF class with the same
    per-layer description and logits, and from there to an archlab model with the same config and
    bit-identical tensors."""
    parity.check_per_layer_round_trip(hf_model(case), HF_CASES[case][2], **EAGER)


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit, the same counts and the kinds from_hf names."""
    model, hf = parity.check_exports(compose_model([f"model={OSS}", *TINY, *PRESET]), "GptOssForCausalLM", **EAGER)
    assert from_hf(hf).cfg.layers == model.cfg.layers


# changed_cfg's field -> the value that takes the part away
PARTS = [
    ("kinds__sliding__attention__window", None),  # the sliding layers' window
    ("mlp__swiglu_limit", None),  # the SwiGLU clamp is reached
    ("position__scaling__truncate", True),  # YaRN's ramp ends as computed
]


def test_each_per_layer_part_changes_the_logits():
    """The same weights with one part taken away (on a layer kind, or on every layer) give other logits:
    the parity above depends on each."""
    parity.check_each_part_changes_logits(from_hf(hf_model("gpt_oss-sliding-yarn")), PARTS)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_generation_matches_hf_generate",)))


def test_save_pretrained_directories_round_trip(tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model("gpt_oss-sliding-yarn", seed=7), tmp_path, **EAGER)


# the same layers by other kinds (the model's window, global layers overriding it) export alike
@pytest.mark.parametrize("fields", [{}, dict(layers=LOCAL_GLOBAL, attention__window=128)])
def test_the_layout_picks_the_family(fields):
    assert type(config_to_hf(changed(**fields))).__name__ == "GptOssConfig"


def test_global_layers_among_the_model_s_window_give_gpt_oss_s_layer_types():
    hf_cfg = config_to_hf(changed(layers=LOCAL_GLOBAL, attention__window=128))
    assert hf_cfg.layer_types == config_to_hf(parity.composed(f"model={OSS}")).layer_types
    assert hf_cfg.layer_types[:2] == ["sliding_attention", "full_attention"] and hf_cfg.sliding_window == 128


@pytest.mark.parametrize("name", [OSS, "gpt-oss-120b"])
def test_published_gpt_oss_config_loads_as_the_preset_and_back(name):
    """openai/gpt-oss's published config (GptOssConfig's YaRN: factor 32, beta 32 / 1, 4096 positions,
    truncate false) reads into the preset exactly, and writes back the same rope_parameters."""
    from helpers.published import LAYOUT_CONFIGS

    _, config_class, keys, _ = LAYOUT_CONFIGS[name]
    published = getattr(transformers, config_class)(**keys)
    assert published.rope_parameters["truncate"] is False
    cfg = config_from_hf(published)
    assert cfg == parity.composed(f"model={name}") and cfg.position.scaling.truncate is False
    assert config_to_hf(cfg).rope_parameters == published.rope_parameters


@pytest.mark.parametrize(
    "fields, field",
    [
        # a layer kind that changes what gpt-oss holds once: named as the kind's field
        (dict(kinds__sliding__attention__n_kv_head=4), "model.layers.kinds.sliding.attention.n_kv_head"),
        (dict(kinds__full__position__theta=1000.0), "model.layers.kinds.full.position.theta"),
        (dict(kinds__full__attention__window=64), "model.attention.window"),  # two windows
        (dict(mlp__swiglu_limit=None), "model.mlp.swiglu_limit"),
        (dict(mlp__routing__router_bias=False), "model.mlp.routing.router_bias"),
        (dict(attention__sinks=False), "model.attention.sinks"),
        (dict(mlp__n_shared_experts=1), "model.mlp.n_shared_experts"),
        (dict(mlp__swiglu_clamp="activation"), "model.mlp.swiglu_clamp"),
        (dict(position__scaling__mscale=1.0, position__scaling__mscale_all_dim=1.0), "model.position.scaling.mscale"),
        (dict(attention__out_bias=False), "model.attention.out_bias"),
        (dict(kinds__full__mlp__kind="swiglu"), "model.layers.kinds.full.mlp.kind"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(fields, field):
    parity.check_refuses(lambda: config_to_hf(changed(**fields)), field, "Hugging Face")


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(rope_parameters=dict(YARN, truncate="no")), "GptOssConfig.rope_parameters.truncate"),
        (dict(rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=0.8)), "GptOssConfig.rope_parameters.mscale"),
        (
            dict(
                rope_parameters=dict(
                    rope_type="llama3",
                    rope_theta=100.0,
                    factor=4.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position_embeddings=16,
                )
            ),
            "GptOssConfig.rope_parameters.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "gpt_oss-sliding-yarn", **changes)), field)
