"""Hugging Face parity of HunYuan dense (archlab/interop/families/hunyuan.py, model_type hunyuan_v1_dense):
a per-head QK-norm after RoPE, attention biases, and the published fixed-alpha NTK base, which becomes
archlab's theta.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1) gives the same float32 logits in archlab and in transformers' eager implementation;
archlab -> HF -> archlab gives back every tensor bit for bit; greedy decoding, alone and in a left-padded
batch, equals HF ``generate``; a save_pretrained directory loads; an archlab layout exports to it; what it
cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, LLAMA, SMALL

from archlab import compose_model
from archlab.interop.hf import config_from_hf
from archlab.nn.validation import validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (model class, config class, config keys): attention biases, the published fixed-alpha NTK base
# (its other keys unread by transformers)
HF_CASES = {
    "hunyuan_v1_dense": (
        "HunYuanDenseV1ForCausalLM",
        "HunYuanDenseV1Config",
        dict(
            SMALL,
            num_key_value_heads=2,
            head_dim=16,
            attention_bias=True,
            rope_parameters=dict(rope_type="dynamic", alpha=10.0, rope_theta=10000.0, factor=1.0),
        ),
    ),
}
# the archlab layout HunYuan dense holds, and only it among the converted families
LAYOUT = [*LLAMA, "model.attention.qk_norm=head", "model.attention.qk_norm_after_rope=true"]


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "hunyuan_v1_dense", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        generation_seed=3,
        only=parity.AND_BACK_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    hunyuan = config_from_hf(parity.hf_config(HF_CASES, "hunyuan_v1_dense"))
    a = hunyuan.attention
    assert (a.qk_norm, a.qk_norm_after_rope, a.qkv_bias, a.out_bias, hunyuan.mlp.bias) == (
        "head",
        True,
        True,
        True,
        False,
    )
    assert hunyuan.position.theta == 10000.0 * 10.0 ** (16 / 14)  # transformers' NTK base: theta · alpha^(hd/(hd-2))


def test_save_pretrained_directory_round_trip(tmp_path):
    parity.check_directory_round_trip(hf_model(seed=4), tmp_path, **ATTN)


def test_an_archlab_layout_exports_to_the_family_that_holds_it():
    parity.check_exports(compose_model(LAYOUT), "HunYuanDenseV1ForCausalLM", "hunyuan_v1_dense", seed=6, **ATTN)


def test_from_hf_refuses_what_archlab_cannot_hold():
    rope = dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)
    config = parity.hf_config(HF_CASES, "hunyuan_v1_dense", rope_parameters=rope)
    parity.check_refuses(lambda: config_from_hf(config), "HunYuanDenseV1Config.rope_parameters.rope_type")


def test_the_family_refuses_what_it_cannot_hold():
    cfg = validate(compose_model([*LAYOUT, "model.attention.qk_norm=full"]))
    parity.check_family_refuses("hunyuan_v1_dense", cfg, "model.attention.qk_norm")
