"""Hugging Face parity of GraniteMoE, GraniteMoeShared and GraniteMoE SWA
(archlab/interop/families/granitemoe.py): Granite's four multipliers over a softmax-routed mixture of experts,
with a shared expert (GraniteMoeShared), or a sliding RoPE layer and a global NoPE one (GraniteMoE SWA).

One tiny random model of each (GQA, 4 experts top-2) gives the same float32 logits in archlab and in
transformers' eager attention and experts; its layout maps back to its family; archlab -> HF -> archlab gives
back every tensor bit for bit; a save_pretrained directory (experts saved as the family's checkpoints hold
them) loads and saves again; GraniteMoE SWA decodes as HF ``generate`` does, padded batches too; what the
record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
MOE = dict(SMALL, intermediate_size=32, num_experts_per_tok=2)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "granitemoe": (
        "GraniteMoeForCausalLM",
        "GraniteMoeConfig",
        dict(
            MOE,
            num_local_experts=4,
            attention_bias=True,
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.015625,
            logits_scaling=8.0,
        ),
    ),
    "granitemoeshared": (
        "GraniteMoeSharedForCausalLM",
        "GraniteMoeSharedConfig",
        dict(MOE, num_local_experts=4, shared_intermediate_size=64, embedding_multiplier=6.0, logits_scaling=4.0),
    ),
    "granitemoe_swa": (
        "GraniteMoeSWAForCausalLM",
        "GraniteMoeSWAConfig",
        dict(
            MOE,
            num_local_experts=4,
            shared_intermediate_size=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            layer_rope_theta=[10000.0, 0.0],
            residual_multiplier=0.5,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_family_reads_its_logits_maps_back_and_loads_its_checkpoints(case, tmp_path):
    hf = hf_model(case)
    parity.check_converts_both_ways(hf, tmp_path, **EAGER)
    if case == "granitemoe_swa":  # decodes as HF ``generate`` does, a padded batch too
        parity.check_generation(hf)


def test_the_record_reads_the_parts_that_set_it_apart():
    g = config_from_hf(hf_model("granitemoe").config)
    assert (g.embedding_multiplier, g.block.residual_multiplier, g.attention.scale, g.head.logit_scale) == (
        12.0,
        0.22,
        0.015625,
        0.125,
    )
    assert config_from_hf(hf_model("granitemoeshared").config).mlp.n_shared_experts == 2


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "granitemoeshared", shared_intermediate_size=48)
    parity.check_refuses(lambda: config_from_hf(config), "GraniteMoeSharedConfig.shared_intermediate_size")


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = config_from_hf(hf_model("granitemoe").config)
    parity.check_problem("granitemoe", cfg, "model.mlp.routing.normalize_top_k", mlp__routing__normalize_top_k=False)
