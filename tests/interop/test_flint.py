"""Hugging Face parity of Flint (archlab/interop/families/flint.py): a MoE family whose sliding layers rotate and
whose full layers have no positions, with a per-head QK-norm, attention sinks, sigmoid routing, a shared
expert and a dense first layer (``mlp_only_layers``).

A tiny random model (every parameter redrawn; GQA; a window of 4 under 12 tokens) gives HF eager's float32
logits in archlab, exports to its own family and back bit for bit, loads from a save_pretrained directory,
whose names (``self_attn.softmax_offset``, each expert apart) transformers renames on loading, and decodes
as HF ``generate`` does. What the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "flint": (
        "FlintForCausalLM",
        "FlintConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            **NO_TOKENS,
            head_dim=16,
            attention_bias=True,
            shared_expert_intermediate_size=64,
            mlp_only_layers=[0],
            norm_topk_prob=False,
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "flint", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF's logits, its dense layer where HF builds a dense MLP; archlab -> HF -> archlab bit for bit; a
    save_pretrained directory loads and saves again."""
    hf = hf_model()
    model = parity.check_from_hf(hf)
    parity.check_dense_layers_as_hf(hf, model)
    parity.check_back_and_again(hf, model, **EAGER)
    parity.check_directory_round_trip(hf, tmp_path, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_generation_matches_hf_generate",)))


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(shared_expert_intermediate_size=48), "FlintConfig.shared_expert_intermediate_size"),
        (dict(decoder_sparse_step=0), "FlintConfig.decoder_sparse_step"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "flint", **changes)), field)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(attention__sinks=False), "model.attention.sinks"),
        (dict(mlp__routing__routed_scale=2.0), "model.mlp.routing.routed_scale"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, **fields)
    parity.check_family_refuses("flint", cfg, field)
