"""Hugging Face parity of GPT-NeoX Japanese (archlab/interop/families/neox_japanese.py): GPT-NeoX's
per-head fused q/k/v and partial RoPE in pre-norm LayerNorm blocks without biases but for the last layer's
attention output (``dense_bias``), read as a layer layout whose last layer alone has ``attention.out_bias``.

Tiny random models (every weight redrawn: the last layer's output bias and the norm scales far from 0 and 1)
of 2, 1 and 3 layers give HF eager's float32 logits and map back to the family; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy and left-padded generation equal HF ``generate``; a
save_pretrained directory loads and saves again; the closed-form count is HF's; the bias moves the logits;
a layout the record cannot hold is refused naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS

from archlab import count_params
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
HF = dict(vocab_size=96, max_position_embeddings=64, hidden_size=64, num_attention_heads=4, **NO_TOKENS)
HF |= dict(num_hidden_layers=2, intermediate_multiple_size=2, rope_parameters=ROPE)
CLASSES = ("GPTNeoXJapaneseForCausalLM", "GPTNeoXJapaneseConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "two-layers": (*CLASSES, HF),
    "one-layer": (*CLASSES, dict(HF, num_hidden_layers=1)),
    "three-layers-untied-relu": (*CLASSES, dict(HF, num_hidden_layers=3, tie_word_embeddings=False, hidden_act="relu")),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=parity.MAPPED_TESTS))


@pytest.mark.parametrize("case", list(HF_CASES))
def test_the_last_layer_alone_has_an_output_bias_counted_as_hf_counts(case):
    hf = hf_model(case)
    model = from_hf(hf)
    biased = {name.split(".")[1] for name in model.state_dict() if name.endswith("attn.proj.bias")}
    hf_biased = {name.split(".")[2] for name in hf.state_dict() if name.endswith("attention.dense_bias")}
    assert biased == hf_biased == {str(hf.config.num_hidden_layers - 1)}
    assert count_params(model.cfg)["total"] == hf.num_parameters()


def test_the_last_layer_s_bias_moves_the_logits():
    model = from_hf(hf_model("two-layers"))
    before = parity.logits(model)
    with torch.no_grad():
        model.get_parameter(f"blocks.{model.cfg.n_layer - 1}.attn.proj.bias").zero_()
    assert parity.max_diff(parity.logits(model), before) > 1e-3


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(kinds__no_out_bias__attention__out_bias=True), "model.layers.kinds.no_out_bias.attention.out_bias"),
        (dict(attention__out_bias=False), "model.attention.out_bias"),  # the last layer's, the model's own
        (dict(kinds__no_out_bias__attention__window=4), "model.layers.kinds.no_out_bias.attention.window"),
        (dict(mlp__d_ff=100), "model.mlp.d_ff"),  # not d_model times intermediate_multiple_size
        (dict(mlp__bias=True), "model.mlp.bias"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "two-layers")), **change)
    parity.check_family_refuses("gpt_neox_japanese", cfg, field)


def test_from_hf_refuses_a_rope_scaling_it_cannot_hold():
    rope = dict(ROPE, rope_type="yarn", factor=2.0)
    config = parity.hf_config(HF_CASES, "two-layers", rope_parameters=rope)
    parity.check_refuses(lambda: config_from_hf(config), "GPTNeoXJapaneseConfig.rope_parameters.rope_type")
