"""Hugging Face parity of MiMo-V2-Flash (archlab/interop/families/mimo_v2_flash.py): value heads narrower
than the query/key heads (``v_head_dim``), values times ``attention_value_scale`` (folded into v_proj), sliding
layers with twice the key/value heads and sinks beside full ones, each layer type with its own partial RoPE,
dense layers beside MoE ones with DeepSeek-V3's router (groups, correction bias, routed scale) and no shared
experts.

Tiny random models (every parameter and correction bias redrawn; a window of 4 under 12 tokens) give HF
eager's float32 logits and map back to the family; every token's experts are HF's; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy and left-padded generation equal HF ``generate``; a
save_pretrained directory (its checkpoint names, each expert apart, a multi-token-prediction tensor left
out) loads and saves again; the narrower values move the logits; what the record cannot hold is refused
both ways, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW
from safetensors.torch import load_file, save_file

from archlab.interop.hf import config_from_hf, from_hf, to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.334},
}
HF = dict(HF_SIZES, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, **NO_TOKENS)
HF |= dict(head_dim=24, v_head_dim=16, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8)
HF |= dict(num_experts_per_tok=2, sliding_window=WINDOW, rope_parameters=ROPE)
HF |= dict(layer_types=["full_attention", "sliding_attention", "sliding_attention"])
CLASSES = ("MiMoV2FlashForCausalLM", "MiMoV2FlashConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # its first layer dense (the default), values times 0.707, q/k/v biases, grouped and scaled routing
    "mimo-v2-flash": (*CLASSES, dict(HF, attention_bias=True, n_group=2, topk_group=1, routed_scaling_factor=2.5)),
    "mimo-v2-flash-all-moe-unscaled": (
        *CLASSES,
        dict(HF, attention_value_scale=None, mlp_layer_types=["sparse"] * 3, norm_topk_prob=False),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, impl=EAGER, only=parity.ROUTED_MOE_TESTS))


def test_every_token_s_experts_and_weights_are_hf_s():
    parity.check_routed_as_hf(hf_model("mimo-v2-flash-all-moe-unscaled"))  # unscaled: HF scales after


def test_the_values_are_narrower_and_their_scale_folded():
    hf = hf_model("mimo-v2-flash")
    model = from_hf(hf)
    assert (model.cfg.attention.head_dim, model.cfg.attention.v_head_dim) == (24, 16)
    qkv, v_proj = (
        model.get_parameter("blocks.1.attn.qkv.weight"),
        hf.get_parameter("model.layers.1.self_attn.v_proj.weight"),
    )
    torch.testing.assert_close(qkv[-2 * 16 :], v_proj * 0.707)  # the sliding layer's two key/value heads of 16
    assert to_hf(model, **EAGER).config.attention_value_scale is None


def _add_mtp(path):
    """A multi-token-prediction tensor beside the causal LM's, as the published checkpoint holds (left out)."""
    state = load_file(path / "model.safetensors")
    state["model.mtp.layers.0.eh_proj.weight"] = torch.zeros(4, 4)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})


def test_a_checkpoint_with_mtp_tensors_loads(tmp_path):
    parity.check_directory_round_trip(hf_model("mimo-v2-flash", seed=8), tmp_path, edit=_add_mtp, **EAGER)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(mlp_layer_types=["dense"] * 3), "MiMoV2FlashConfig.mlp_layer_types"),
        (dict(hidden_act="relu"), "MiMoV2FlashConfig.hidden_act"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "mimo-v2-flash", **changes)), field)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(kinds__sliding__attention__sinks=False), "model.layers.kinds.sliding.attention.sinks"),
        (dict(kinds__sliding__attention__n_kv_head=1), "model.layers.kinds.sliding.attention.n_kv_head"),
        (dict(attention__out_bias=True), "model.attention.out_bias"),
        (dict(mlp__n_shared_experts=1), "model.mlp.n_shared_experts"),
        (dict(kinds__full_dense__attention__v_head_dim=24), "model.layers.kinds.full_dense.attention.v_head_dim"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "mimo-v2-flash")), **change)
    parity.check_family_refuses("mimo_v2_flash", cfg, field)
