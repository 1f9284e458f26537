"""Hugging Face parity of Apertus (archlab/interop/families/apertus.py): LLaMA's layout with per-head QK
RMSNorms and an up/down MLP around xIELU (archlab's ``mlp.kind: xielu``), llama3 RoPE scaling.

A tiny random model (GQA; every parameter redrawn, the xIELU scalars too: matrices N(0, 0.2²), vectors
0.5 + N(0, 0.3²)) gives the same float32 logits in archlab and in transformers' eager attention; greedy
decoding (a padded batch too) equals HF ``generate``; archlab -> HF -> archlab gives back every tensor bit
for bit; a save_pretrained directory loads; what the family cannot hold is refused both ways, naming the
field. xIELU itself is checked against transformers' ``XIELUActivation`` on both branches."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import build_model, compose_model, count_params
from archlab.interop.hf import config_from_hf, from_hf, to_hf
from archlab.nn.xielu import XIELU

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "apertus": (
        "ApertusForCausalLM",
        "ApertusConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            **NO_TOKENS,
            intermediate_size=96,
            attention_bias=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "apertus", seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, impl=EAGER, only=parity.MAPPED_TESTS))


def test_xielu_is_transformers_activation_on_both_branches():
    """Random α_p and α_n (softplus-encoded), inputs spanning both branches and the eps bound."""
    from transformers.activations import XIELUActivation

    theirs = XIELUActivation(dtype=torch.float32)
    ours = XIELU(compose_model(["model=nano", "model/mlp=xielu"]))
    with torch.no_grad():
        theirs.alpha_p.copy_(torch.tensor([0.7]))
        theirs.alpha_n.copy_(torch.tensor([-0.4]))
        ours.alpha_p.copy_(theirs.alpha_p)
        ours.alpha_n.copy_(theirs.alpha_n)
    x = torch.cat((torch.linspace(-6, 6, 101), torch.tensor([0.0, -1e-7, -1e-6, -2e-6, 1e-7])))
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-6)
    fresh = XIELU(compose_model(["model=nano", "model/mlp=xielu"]))
    fresh.init_parameters(0.02, 0.02)  # transformers' init: α_p 0.8, α_n 0.8 (stored as softplus⁻¹)
    torch.testing.assert_close(fresh.alpha_p, XIELUActivation(dtype=torch.float32).alpha_p)
    torch.testing.assert_close(fresh.alpha_n, XIELUActivation(dtype=torch.float32).alpha_n)


def test_from_hf_reads_the_family_s_parts_and_counts_them():
    """The MLP: two matrices of 64 × 96 and the two scalars, per layer."""
    apertus = from_hf(hf_model()).cfg
    assert (apertus.mlp.kind, apertus.mlp.bias, apertus.attention.qk_norm, apertus.position.scaling.kind) == (
        "xielu",
        False,
        "head",
        "llama3",
    )
    assert count_params(apertus)["mlp"] == 3 * (2 * 64 * 96 + 2)
    assert count_params(apertus)["total"] == sum(p.numel() for p in hf_model().parameters())


def test_the_layout_picks_the_family():
    """LLaMA's layout with QK-norm and the xIELU MLP."""
    overrides = ["model=llama2-7b", "model.n_layer=2", "model.d_model=64", "model.attention.n_head=4"]
    overrides += ["model/mlp=xielu", "model.mlp.bias=false", "model.attention.qk_norm=head"]
    assert type(to_hf(build_model(compose_model(overrides)))).__name__ == "ApertusForCausalLM"


@pytest.mark.parametrize("change, field", [("mlp__beta", "model.mlp.beta"), ("mlp__bias", "model.mlp.bias")])
def test_config_to_hf_refuses_what_the_family_cannot_hold(change, field):
    value = {"mlp__beta": 0.4, "mlp__bias": True}[change]
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, **{change: value})
    parity.check_family_refuses("apertus", cfg, field)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "apertus", hidden_act="silu")
    parity.check_refuses(lambda: config_from_hf(config), "ApertusConfig.hidden_act")
