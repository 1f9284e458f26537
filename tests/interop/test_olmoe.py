"""Hugging Face parity of OLMoE (archlab/interop/families/olmoe.py): OLMo 2's layers with a QK-norm over the
whole projection and a softmax-routed mixture of experts, its top-k weights not renormalised.

A tiny random model (GQA, 4 experts top-2) gives the same float32 logits in archlab and in transformers' eager
attention and experts; its layout maps back to its family; archlab -> HF -> archlab gives back every tensor
bit for bit; a save_pretrained directory (experts saved as the family's checkpoints hold them) loads and saves
again; it decodes as HF ``generate`` does, padded batches too; what the record cannot hold is refused both
ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
MOE = dict(SMALL, intermediate_size=32, num_experts_per_tok=2)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(MOE, num_experts=4, norm_topk_prob=False)),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def test_family_reads_its_logits_maps_back_and_loads_its_checkpoints(tmp_path):
    hf = hf_model("olmoe")
    parity.check_converts_both_ways(hf, tmp_path, **EAGER)
    parity.check_generation(hf)  # decodes as HF ``generate`` does, a padded batch too


def test_the_record_reads_the_parts_that_set_it_apart():
    c = config_from_hf(hf_model("olmoe").config)
    assert (c.attention.qk_norm, c.mlp.routing.normalize_top_k) == ("full", False)


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "olmoe", clip_qkv=8.0)
    parity.check_refuses(lambda: config_from_hf(config), "OlmoeConfig.clip_qkv")


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = config_from_hf(hf_model("olmoe").config)
    parity.check_problem("olmoe", cfg, "model.attention.qk_norm", attention__qk_norm="head")
