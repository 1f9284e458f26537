"""Hugging Face parity of FlexOlmo (archlab/interop/families/olmoe.py): OLMoE's experts under OLMo 2's
post-sublayer norms, its top-k weights renormalised.

A tiny random model (GQA, 4 experts top-2) gives the same float32 logits in archlab and in transformers' eager
attention and experts; its layout maps back to its family; archlab -> HF -> archlab gives back every tensor
bit for bit; a save_pretrained directory (experts saved as the family's checkpoints hold them) loads and saves
again; what the record cannot hold is refused both ways, naming the field."""

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
    "flex_olmo": ("FlexOlmoForCausalLM", "FlexOlmoConfig", dict(MOE, num_experts=4, norm_topk_prob=True)),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def test_family_reads_its_logits_maps_back_and_loads_its_checkpoints(tmp_path):
    hf = hf_model("flex_olmo")
    parity.check_converts_both_ways(hf, tmp_path, **EAGER)


def test_the_record_reads_the_parts_that_set_it_apart():
    assert config_from_hf(hf_model("flex_olmo").config).block.kind == "post_sublayer"


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = config_from_hf(hf_model("flex_olmo").config)
    parity.check_problem("flex_olmo", cfg, "model.block.kind", block__kind="pre")
