"""Per-family Hugging Face parity of EXAONE MoE and Flint: MoE families whose sliding layers rotate and
whose full layers have no positions, with a per-head QK-norm, sigmoid routing, shared experts and dense
layers where a per-layer list puts them (Flint: attention sinks too).

One tiny random model each (every parameter and correction bias redrawn; GQA; a window of 4 under 12
tokens; a dense layer after a MoE one in EXAONE MoE's) gives HF eager's float32 logits in archlab, exports to its own
family and back bit for bit, and loads from a save_pretrained directory, whose names (EXAONE MoE's
``mlp.e_score_correction_bias``, Flint's ``self_attn.softmax_offset``, each expert apart) transformers
renames on loading (and EXAONE MoE's ``mtp.*`` tensors, which it leaves out). Flint decodes as HF ``generate`` does; what a record cannot hold is refused both ways,
naming the field.
"""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, logits, max_diff
from safetensors.torch import load_file, save_file

from archlab import ConfigError
from archlab.config.layers import layer_configs
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf, hf_family

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(
    HF_SIZES,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    sliding_window=parity.WINDOW,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    **NO_TOKENS,
)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "exaone_moe": (
        "ExaoneMoeForCausalLM",
        "ExaoneMoeConfig",
        dict(
            SMALL,
            head_dim=32,  # not d_model / n_head: an extra key its attention reads
            mlp_layer_types=["sparse", "dense", "sparse"],
            num_shared_experts=2,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.5,
        ),
    ),
    "flint": (
        "FlintForCausalLM",
        "FlintConfig",
        dict(
            SMALL,
            head_dim=16,
            attention_bias=True,
            shared_expert_intermediate_size=64,
            mlp_only_layers=[0],
            norm_topk_prob=False,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_family_gives_hf_logits_and_round_trips(case, tmp_path):
    hf = hf_model(case)
    model = from_hf(hf)
    dense = [not hasattr(layer.mlp, "experts") for layer in hf.model.layers]  # EXAONE MoE's: between MoE layers
    assert [lc.mlp.kind != "moe" for lc in layer_configs(model.cfg)] == dense
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == case
    parity.check_back_and_again(hf, model, **EAGER)
    parity.check_directory_round_trip(hf, tmp_path, edit=_add_mtp if case == "exaone_moe" else None, **EAGER)


def _add_mtp(path):
    """A multi-token-prediction tensor beside the causal LM's, as K-EXAONE's checkpoints hold (left out)."""
    state = load_file(path / "model.safetensors")
    state["mtp.layers.0.eh_proj.weight"] = torch.zeros(4, 4)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})


def test_flint_generation_matches_hf_generate():
    hf = hf_model("flint", seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


def _hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("exaone_moe", dict(num_shared_experts=0), "num_shared_experts"),
        ("exaone_moe", dict(num_experts=0), "num_experts"),
        ("flint", dict(shared_expert_intermediate_size=48), "shared_expert_intermediate_size"),
        ("flint", dict(decoder_sparse_step=0), "decoder_sparse_step"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    config = _hf_config(case, **changes)
    with pytest.raises(ConfigError) as err:
        config_from_hf(config)
    assert err.value.field.startswith(f"{type(config).__name__}.{field}")


@pytest.mark.parametrize(
    "case, fields, field",
    [
        ("exaone_moe", dict(mlp__routing__correction_bias=False), "model.mlp.routing.correction_bias"),
        ("exaone_moe", dict(kinds__full_dense__position__kind="rope"), "model.layers.kinds.full_dense.position.kind"),
        ("flint", dict(attention__sinks=False), "model.attention.sinks"),
        ("flint", dict(mlp__routing__routed_scale=2.0), "model.mlp.routing.routed_scale"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(case, fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model(case)).cfg, **fields)
    with pytest.raises(ConfigError) as err:
        FAMILIES[case].check(cfg)
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)
