"""Hugging Face parity of DBRX (archlab/interop/families/dbrx.py): LayerNorms without a bias, a fused q/k/v
clamped as projected (``clip_qkv``) and a softmax-routed mixture of experts.

A tiny random model (GQA, 4 experts top-2) gives the same float32 logits in archlab and in transformers' eager
attention and experts; its layout maps back to its family; archlab -> HF -> archlab gives back every tensor
bit for bit; a save_pretrained directory (experts saved as the family's checkpoints hold them) loads and saves
again; what the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, NO_TOKENS

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "dbrx": (
        "DbrxForCausalLM",
        "DbrxConfig",
        dict(
            vocab_size=96,
            max_seq_len=64,
            d_model=64,
            n_layers=2,
            n_heads=4,
            attn_config=dict(kv_n_heads=2, clip_qkv=0.5, rope_theta=10000.0),
            ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2),
            **NO_TOKENS,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def test_family_reads_its_logits_maps_back_and_loads_its_checkpoints(tmp_path):
    hf = hf_model("dbrx")
    parity.check_converts_both_ways(hf, tmp_path, **EAGER)


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "dbrx", ffn_config=dict(moe_normalize_expert_weights=2.0))
    parity.check_refuses(lambda: config_from_hf(config), "DbrxConfig.ffn_config.moe_normalize_expert_weights")


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = config_from_hf(hf_model("dbrx").config)
    parity.check_problem("dbrx", cfg, "model.norm.bias", norm__bias=True)
