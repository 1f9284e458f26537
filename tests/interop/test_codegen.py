"""Hugging Face parity of CodeGen (archlab/interop/families/codegen.py): GPT-J's layout (partial rotary, a
parallel block), whose record exports it; CodeGen's own record writes CodeGen's fused q/k/v shards.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives HF eager's float32
logits; its layout maps to GPT-J's record, which exports it, and this record still writes its own class with
HF's logits and reads back bit for bit; a save_pretrained directory loads; what the record cannot hold is
refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

GPT = dict(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # GPT-J's layout: GPT-J's record exports it; CodeGen's writes CodeGen's fused shards
    "codegen": ("CodeGenForCausalLM", "CodeGenConfig", dict(GPT, rotary_dim=8, n_inner=96)),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "codegen", seed, **ATTN)


def test_from_hf_gives_hf_logits_maps_back_and_loads_saved(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "gptj", **ATTN)


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "codegen")), d_model=66, attention__n_head=6)
    parity.check_family_refuses("codegen", cfg, "model.d_model")
