"""Hugging Face parity of OLMo 2 (archlab/interop/families/olmo2.py): post-sublayer RMSNorms and a QK-norm over
the whole projection.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has
it; sequences longer than every window of 4) gives the same float32 logits in archlab and in transformers'
eager implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF
``generate``; a save_pretrained directory loads and saves again; what the family cannot hold is refused,
naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, GQA, SMALL

from archlab import compose_model
from archlab.interop.hf import from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(SMALL, num_key_value_heads=2)),
}

# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    "olmo2-7b": ("olmo2-7b", "Olmo2ForCausalLM", GQA),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    olmo2 = from_hf(hf_model("olmo2")).cfg
    assert (olmo2.block.kind, olmo2.attention.qk_norm) == ("post_sublayer", "full")


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model=olmo2-7b", "model.attention.qk_norm=head"], "model.attention.qk_norm"),
        (["model=olmo2-7b", "model.attention.qkv_bias=true"], "model.attention.out_bias"),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    parity.check_routed_family_refuses("olmo2", compose_model(overrides), field)


@pytest.mark.parametrize("case", ["olmo2"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)
