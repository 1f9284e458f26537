"""Hugging Face parity of Hunyuan V3 (archlab/interop/families/sigmoid_moe.py, model_type hy_v3): a
sigmoid-routed mixture of experts with two shared experts and a dense first layer (mlp_layer_types) under
LLaMA-style attention with biases; its layout is dots.llm1's, which exports it.

A tiny random model (every parameter and correction bias redrawn; GQA where the family has it) gives HF
eager's float32 logits in archlab; its layout exports to dots.llm1's family, and this record still holds it:
its own class, built from the archlab model by this record's config and tensor maps, gives the same logits and
reads back bit for bit; a save_pretrained directory loads; greedy decoding, alone and in a left-padded batch,
equals HF ``generate``; what the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
MOE_SIZES = dict(intermediate_size=96, moe_intermediate_size=32, num_experts_per_tok=2)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "hy_v3": (
        "HYV3ForCausalLM",
        "HYV3Config",
        dict(
            SMALL,
            **MOE_SIZES,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=6,
            num_shared_experts=2,
            router_scaling_factor=2.5,
            attention_bias=True,
            mlp_layer_types=["dense", "sparse"],
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "hy_v3", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "dots1", **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_generation_matches_hf_generate",)))


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(num_shared_experts=0), "HYV3Config.num_shared_experts"),
        (dict(mlp_bias=True), "HYV3Config.mlp_bias"),
        (dict(mlp_layer_types=["sparse", "dense"]), "HYV3Config.mlp_layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "hy_v3", **changes)), field)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(mlp__routing__normalize_top_k=False), "model.mlp.routing.normalize_top_k"),
        (dict(mlp__routing__n_groups=2, mlp__routing__top_groups=1), "model.mlp.routing.n_groups"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(fields, field):
    parity.check_family_refuses("hy_v3", parity.changed_cfg(from_hf(hf_model()).cfg, **fields), field)
