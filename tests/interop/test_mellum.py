"""Hugging Face parity of Mellum (archlab/interop/families/mellum.py): Qwen3-MoE's layers whose sliding and
full layers have their own RoPE bases, a dense layer between MoE ones.

A tiny random model (every parameter redrawn; GQA; a window of 4 under 12 tokens) gives HF eager's float32
logits in archlab, exports to its own family and back bit for bit and loads from a save_pretrained
directory; a layout with a dense layer after a MoE one, which Qwen3-MoE refuses, exports to it. What the
record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab import compose_model
from archlab.config.layers import layer_configs
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf, hf_family

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "mellum": (
        "MellumForCausalLM",
        "MellumConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            sliding_window=WINDOW,
            **NO_TOKENS,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            mlp_layer_types=["sparse", "dense", "sparse"],
            attention_bias=True,
            norm_topk_prob=False,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "mellum", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF's logits, its dense layer where HF builds a dense MLP; archlab -> HF -> archlab bit for bit; a
    save_pretrained directory loads and saves again."""
    hf = hf_model()
    model = parity.check_from_hf(hf)
    parity.check_dense_layers_as_hf(hf, model)
    parity.check_back_and_again(hf, model, **EAGER)
    parity.check_directory_round_trip(hf, tmp_path, **EAGER)


def test_read_values():
    """The local RoPE base beside the global one."""
    mellum = config_from_hf(hf_model().config)
    assert [lc.position.theta for lc in layer_configs(mellum)] == [100.0, 500000.0, 100.0]


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_act="relu"), "MellumConfig.hidden_act"),
        (
            dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
            "MellumConfig.rope_parameters.sliding_attention",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "mellum", **changes)), field)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(mlp__n_shared_experts=1), "model.mlp.n_shared_experts"),
        (dict(attention__qk_norm="none"), "model.attention.qk_norm"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, **fields)
    parity.check_family_refuses("mellum", cfg, field)


def test_dense_layer_after_a_moe_one_exports_to_mellum():
    """Qwen3-MoE's dense layers come first (mlp_only_layers): a dense layer after a MoE one, which it
    refuses, Mellum holds (mlp_layer_types), so the layout exports there."""
    overrides = ["model=qwen3-30b-a3b", "model/layers=dense_first", "model.layers.first=[moe,dense]"]
    cfg = compose_model([*overrides, "+model.layers.kinds.moe={}"])
    parity.check_refuses(lambda: FAMILIES["qwen3_moe"].check(cfg), "model.layers.kinds.dense.mlp.kind")
    assert hf_family(cfg) == "mellum"
    assert FAMILIES["mellum"].to_hf(cfg)["mlp_layer_types"][:2] == ["sparse", "dense"]
