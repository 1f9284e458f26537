"""Hugging Face parity of GPTBigCode (archlab/interop/families/bigcode.py, model_type gpt_bigcode):
multi-query attention with learned positions, its attention scale switch and GELU variants.

Tiny random models (every weight redrawn: biases and norm scales far from 0 and 1) give HF eager's float32
logits; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and left-padded batched
decoding equal HF ``generate``; a save_pretrained directory loads; an archlab MQA layout with learned
positions exports to it; what it cannot hold is refused naming the field, and its numerics-only settings
read as the same model."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

BIGCODE_SMALL = dict(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4, n_inner=96, **NO_TOKENS)
# case -> (transformers model class, config class, config keys, the family archlab's layout maps back to)
HF_CASES = {
    "bigcode-mqa": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", BIGCODE_SMALL, "gpt_bigcode"),
    "bigcode-mha-unscaled-gelu-fast": (
        "GPTBigCodeForCausalLM",
        "GPTBigCodeConfig",
        dict(BIGCODE_SMALL, multi_query=False, scale_attn_weights=False, activation_function="gelu_fast"),
        "gpt_bigcode",
    ),
}
NANO = ["model=nano", "model.vocab_size=96", "model.context_length=64", "model.n_layer=2", "model.d_model=64"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_maps_back(case):
    """HF eager's logits, and archlab -> HF -> archlab bit for bit."""
    hf = hf_model(case)
    parity.check_back_and_again(hf, parity.check_from_hf(hf, HF_CASES[case][3]), **ATTN)


def test_from_hf_reads_the_family_s_parts():
    mqa_cfg = from_hf(hf_model("bigcode-mqa")).cfg
    mqa, mha = mqa_cfg.attention, from_hf(hf_model("bigcode-mha-unscaled-gelu-fast")).cfg.attention
    assert (mqa.n_kv_head, mqa.scale, mha.n_kv_head, mha.scale) == (1, None, None, 1.0)
    assert mqa_cfg.mlp.approximate == "tanh"


@pytest.mark.parametrize("case", ["bigcode-mqa"])
def test_greedy_and_padded_generation_match_hf_generate(case):
    parity.check_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["bigcode-mqa"])
def test_save_pretrained_directory_loads_and_saves_again(case, tmp_path):
    parity.check_directory_round_trip(hf_model(case, seed=5), tmp_path, **ATTN)


def test_archlab_layout_exports_to_the_family_and_back_bit_for_bit():
    parity.check_exports(compose_model([*NANO, "model/attention=mqa"]), "GPTBigCodeForCausalLM", **ATTN)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (
            [*NANO, "model/attention=gqa", "model.attention.n_head=4", "model.attention.n_kv_head=2"],
            "model.attention.n_kv_head",
        ),
        ([*NANO, "model/attention=mqa", "model.attention.scale=0.5"], "model.attention.scale"),
    ],
)
def test_layouts_the_family_cannot_hold_are_refused_naming_the_field(overrides, field):
    parity.check_refuses(lambda: config_to_hf(compose_model(overrides)), field, "Hugging Face")


@pytest.mark.parametrize(
    "keys, field",
    [
        (dict(BIGCODE_SMALL, add_cross_attention=True), "GPTBigCodeConfig.add_cross_attention"),
        (dict(BIGCODE_SMALL, activation_function="quick_gelu"), "GPTBigCodeConfig.activation_function"),
    ],
)
def test_hf_settings_archlab_cannot_hold_are_refused_naming_the_key(keys, field):
    parity.check_refuses(lambda: config_from_hf(transformers.GPTBigCodeConfig(**keys)), field)


def test_numerics_only_settings_are_read_as_the_same_model():
    """The softmax-in-fp32 flags (stored, unread by transformers' attention) leave the layout as it is."""
    base = config_from_hf(transformers.GPTBigCodeConfig(**BIGCODE_SMALL))
    flags = dict(attention_softmax_in_fp32=False, scale_attention_softmax_in_fp32=False)
    assert config_from_hf(transformers.GPTBigCodeConfig(**BIGCODE_SMALL, **flags)) == base
