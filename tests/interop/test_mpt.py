"""Hugging Face parity of MPT (archlab/interop/families/mpt.py): pre-norm LayerNorms without a shift, ALiBi (6
heads: its slopes for a head count that is not a power of two), q, k and v clamped as projected
(``clip_qkv``), a softmax scale of its own, no biases, an untied head.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives HF eager's float32
logits; its layout maps back to the family; archlab -> HF -> archlab gives back every tensor bit for bit; a
save_pretrained directory loads; greedy decoding, alone and in a left-padded batch, equals HF ``generate``;
what the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # 6 heads: ALiBi's slopes for a head count that is not a power of two
    "mpt": (
        "MptForCausalLM",
        "MptConfig",
        dict(
            vocab_size=96,
            max_seq_len=64,
            d_model=48,
            n_heads=6,
            n_layers=2,
            tie_word_embeddings=False,
            attn_config=dict(clip_qkv=0.6, softmax_scale=0.3),
            **NO_TOKENS,
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "mpt", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_from_hf_gives_hf_logits_maps_back_and_loads_saved",)))


def test_greedy_and_padded_generation_match_hf_generate():
    parity.check_generation(hf_model(seed=4))


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(attn_config=dict(alibi_bias_max=16)), "MptConfig.attn_config.alibi_bias_max"),
        (dict(attn_config=dict(qk_ln=True)), "MptConfig.attn_config.qk_ln"),
        (dict(no_bias=False), "MptConfig.no_bias"),
        (dict(expansion_ratio=2), "MptConfig.expansion_ratio"),
    ],
)
def test_from_hf_refuses_what_the_record_cannot_hold(change, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "mpt", **change)), field)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(norm__bias=True), "model.norm.bias"),
        (dict(dropout=0.1, attention__dropout=0.1, embedding_dropout=0.0), "model.dropout"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "mpt")), **change)
    parity.check_family_refuses("mpt", cfg, field)
