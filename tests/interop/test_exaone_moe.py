"""Hugging Face parity of EXAONE MoE (archlab/interop/families/exaone_moe.py): a MoE family whose sliding layers
rotate and whose full layers have no positions, with a per-head QK-norm, sigmoid routing with a correction
bias, shared experts and dense layers where ``mlp_layer_types`` puts them.

A tiny random model (every parameter and correction bias redrawn; GQA; a window of 4 under 12 tokens; a
dense layer after a MoE one) gives HF eager's float32 logits in archlab, exports to its own family and back
bit for bit, and loads from a save_pretrained directory, whose names (``mlp.e_score_correction_bias``, each
expert apart) transformers renames on loading, and whose ``mtp.*`` tensors it leaves out. What the record
cannot hold is refused both ways, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW
from safetensors.torch import load_file, save_file

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "exaone_moe": (
        "ExaoneMoeForCausalLM",
        "ExaoneMoeConfig",
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
            head_dim=32,  # not d_model / n_head: an extra key its attention reads
            mlp_layer_types=["sparse", "dense", "sparse"],
            num_shared_experts=2,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.5,
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "exaone_moe", seed, **EAGER)


def _add_mtp(path):
    """A multi-token-prediction tensor beside the causal LM's, as K-EXAONE's checkpoints hold (left out)."""
    state = load_file(path / "model.safetensors")
    state["mtp.layers.0.eh_proj.weight"] = torch.zeros(4, 4)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF's logits, its dense layer (between MoE ones) where HF builds a dense MLP; archlab -> HF ->
    archlab bit for bit; a save_pretrained directory with an mtp tensor loads and saves again."""
    hf = hf_model()
    model = parity.check_from_hf(hf)
    parity.check_dense_layers_as_hf(hf, model)
    parity.check_back_and_again(hf, model, **EAGER)
    parity.check_directory_round_trip(hf, tmp_path, edit=_add_mtp, **EAGER)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(num_shared_experts=0), "ExaoneMoeConfig.num_shared_experts"),
        (dict(num_experts=0), "ExaoneMoeConfig.num_experts"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "exaone_moe", **changes)), field)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(mlp__routing__correction_bias=False), "model.mlp.routing.correction_bias"),
        (dict(kinds__full_dense__position__kind="rope"), "model.layers.kinds.full_dense.position.kind"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, **fields)
    parity.check_family_refuses("exaone_moe", cfg, field)
