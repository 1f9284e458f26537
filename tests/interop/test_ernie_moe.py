"""Hugging Face parity of ERNIE 4.5 MoE (archlab/interop/families/ernie_moe.py, model_type ernie4_5_moe): ERNIE
4.5's RoPE pairing adjacent dims over a softmax-routed mixture of experts with a correction bias, two shared
experts and a dense first layer.

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
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "ernie4_5_moe": (
        "Ernie4_5_MoeForCausalLM",
        "Ernie4_5_MoeConfig",
        dict(
            SMALL,
            intermediate_size=48,
            moe_intermediate_size=32,
            moe_num_experts=4,
            moe_k=2,
            moe_num_shared_experts=2,
            moe_layer_start_index=1,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def test_family_reads_its_logits_maps_back_and_loads_its_checkpoints(tmp_path):
    hf = hf_model("ernie4_5_moe")
    parity.check_converts_both_ways(hf, tmp_path, **EAGER)
    parity.check_generation(hf)  # decodes as HF ``generate`` does, a padded batch too


def test_the_record_reads_the_parts_that_set_it_apart():
    e = config_from_hf(hf_model("ernie4_5_moe").config)
    assert (e.position.pairing, e.mlp.routing.correction_bias, e.mlp.n_shared_experts, e.layers.first) == (
        "interleaved",
        True,
        2,
        ["dense"],
    )


@pytest.mark.parametrize(
    "keys, field",
    [
        (dict(use_bias=True), "Ernie4_5_MoeConfig.use_bias"),
        (dict(moe_layer_interval=2), "Ernie4_5_MoeConfig.moe_layer_interval"),
    ],
)
def test_from_hf_refuses_what_the_record_cannot_hold(keys, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "ernie4_5_moe", **keys)), field)


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = config_from_hf(hf_model("ernie4_5_moe").config)
    parity.check_problem("ernie4_5_moe", cfg, "model.mlp.routing.correction_bias", mlp__routing__correction_bias=False)
