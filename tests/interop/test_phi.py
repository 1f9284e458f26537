"""Hugging Face parity of Phi (archlab/interop/families/neox.py, model_type phi): a parallel block with one
LayerNorm, partial RoPE, a biased head, a per-head QK LayerNorm.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²), far
from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has it;
sequences longer than every window of 4) give the same float32 logits in archlab and in transformers' eager
implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab gives
back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF ``generate``; a
save_pretrained directory loads and saves again; what the family cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL
from helpers.published import HF_CONFIGS

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "phi-gqa": ("PhiForCausalLM", "PhiConfig", dict(SMALL, num_key_value_heads=2, partial_rotary_factor=0.5)),
    "phi-qk-layernorm": ("PhiForCausalLM", "PhiConfig", dict(SMALL, qk_layernorm=True, partial_rotary_factor=0.75)),
}

# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    # 8 of 20 dims rotate
    "phi-2": ("phi-2", "PhiForCausalLM", ["model.d_model=80", "model.attention.n_head=4"]),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    phi = from_hf(hf_model("phi-gqa")).cfg
    assert (phi.block.shared_norm, phi.attention.n_kv_head, phi.head.bias, phi.mlp.approximate) == (
        True,
        2,
        True,
        "tanh",
    )
    assert from_hf(hf_model("phi-qk-layernorm")).cfg.attention.qk_norm == "head"


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model=phi-2", "model.attention.out_bias=false"], "model.attention.out_bias"),
        (["model=phi-2", "model.attention.qk_norm=full"], "model.attention.qk_norm"),
        (["model=phi-2", "model.attention.qk_norm=head", "model.attention.head_dim=40"], "model.attention.head_dim"),
        (["model=phi-2", "model.head.bias=false"], "model.head.bias"),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    parity.check_routed_family_refuses("phi", compose_model(overrides), field)


def test_phi2_s_two_dropout_rates_read_as_two_fields():
    """microsoft/phi-2 trained with resid_pdrop 0.1 and embd_pdrop 0.0: model.dropout 0.1 beside
    model.embedding_dropout 0.0, written back as the same two rates."""
    _, keys = HF_CONFIGS["phi-2"]
    cfg = config_from_hf(transformers.PhiConfig(**keys, resid_pdrop=0.1, embd_pdrop=0.0))
    assert (cfg.dropout, cfg.embedding_dropout) == (0.1, 0.0)
    back = config_to_hf(cfg)
    assert (type(back).__name__, back.resid_pdrop, back.embd_pdrop) == ("PhiConfig", 0.1, 0.0)


@pytest.mark.parametrize("case", ["phi-qk-layernorm"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)
