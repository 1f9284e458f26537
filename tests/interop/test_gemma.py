"""Hugging Face parity of Gemma (archlab/interop/families/gemma.py): (1 + w) RMSNorms, embeddings scaled by
√d_model, a tanh-GeGLU MLP, MQA with heads wider than d_model / n_head.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has
it; sequences longer than every window of 4) gives the same float32 logits in archlab and in transformers'
eager implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF
``generate``; what the family cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL

from archlab import compose_model
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(SMALL, num_key_value_heads=1, head_dim=32)),
}
D64 = ["model.d_model=64", "model.attention.n_head=4"]
# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    "gemma-2b": ("gemma-2b", "GemmaForCausalLM", [*D64, "model.attention.head_dim=32"]),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    gemma = from_hf(hf_model("gemma")).cfg
    assert (gemma.norm.unit_offset, gemma.scale_embedding, gemma.mlp.kind, gemma.mlp.approximate) == (
        True,
        True,
        "geglu",
        "tanh",
    )


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model=gemma-2b", "model.norm.unit_offset=false"], "model.norm.unit_offset"),
        (["model=gemma-2b", "model.attention.softcap=50.0"], "model.attention.softcap"),
        (["model=qwen3-8b", "model.norm.unit_offset=true"], "model.scale_embedding"),  # (1 + w) alone: Gemma's half
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    parity.check_routed_family_refuses("gemma", compose_model(overrides), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("gemma", dict(use_bidirectional_attention=True), "GemmaConfig.use_bidirectional_attention"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)
