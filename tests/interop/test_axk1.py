"""Hugging Face parity of A.X K1 (archlab/interop/families/axk1.py, model_type axk1): DeepSeek-V3's latent
attention and sigmoid-routed experts, each MoE layer's output normed (``post_mlp_layernorm``: archlab's
``model.mlp.out_norm``), a dense first layer without that norm.

A tiny random model (every parameter, the norms' scales and the correction biases redrawn) gives HF eager's
float32 logits in archlab, maps back to A.X K1, round-trips bit for bit, generates as HF does (left-padded
too) and goes through save_pretrained directories; ``out_norm`` is held to its formula and its count, and
refused by every other family."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS
from helpers.parts import F64, build, plain, rms

from archlab import count_params
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SIZES = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, **NO_TOKENS)
MLA = dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
MOE = dict(intermediate_size=96, moe_intermediate_size=32, num_experts_per_tok=2, n_routed_experts=4)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "axk1": (
        "AXK1ForCausalLM",
        "AXK1Config",
        dict(SIZES, **MLA, **MOE, n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=1.8,
             mlp_layer_types=["dense", "sparse"], rms_norm_eps=1e-6),
    )
}  # fmt: skip


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "axk1", seed, **EAGER)


globals().update(parity.family_tests(hf_model, impl=EAGER, only=parity.MAPPED_TESTS))


def test_the_moe_layer_alone_holds_the_norm():
    """Read from HF: the MoE section has out_norm, the dense first layer's MLP (another option) has not; the
    norm's weight is HF's post_mlp_layernorm."""
    hf = hf_model()
    model = from_hf(hf)
    assert model.cfg.mlp.out_norm is True
    assert model.blocks[0].mlp.__class__.__name__ != "MoE" and not hasattr(model.blocks[0].mlp, "out_norm")
    torch.testing.assert_close(model.blocks[1].mlp.out_norm.weight, hf.model.layers[1].mlp.post_mlp_layernorm.weight)


def test_out_norm_norms_the_moe_output_and_counts_its_scale():
    """A MoE with out_norm gives rms(its output without it)·scale, the routed and the shared experts summed
    first; one d_model scale more per MoE layer."""
    moe = dict(kind="moe", expert="swiglu", n_shared_experts=1, routing=dict(n_experts=4, top_k=2))
    cfg = plain(mlp={**moe, "out_norm": True})
    mlp = build(cfg).blocks[0].mlp
    x = torch.randn(2, 5, 32, dtype=F64)
    with torch.no_grad():
        y = mlp(x)
        norm, mlp.out_norm = mlp.out_norm, None
        torch.testing.assert_close(y, rms(mlp(x), norm.weight, cfg.norm.eps))
    without = plain(mlp=moe)
    assert count_params(cfg)["total"] - count_params(without)["total"] == cfg.n_layer * 32


def test_other_families_refuse_out_norm():
    """DeepSeek-V3, which holds A.X K1's layout but the norm, refuses it naming the field."""
    cfg = from_hf(hf_model()).cfg
    parity.check_family_refuses("deepseek_v3", cfg, "model.mlp.out_norm")


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(mlp_layer_types=["sparse", "dense"]), "AXK1Config.mlp_layer_types"),
        (dict(num_key_value_heads=2), "AXK1Config.num_key_value_heads"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "axk1", **changes)), field)


def test_a_layout_without_q_lora_is_refused():
    cfg = from_hf(hf_model()).cfg
    cfg.attention.q_lora_rank = None
    parity.check_family_refuses("axk1", cfg, "model.attention.q_lora_rank")


def test_a_dense_layers_unread_norm_in_a_checkpoint_is_left_out(tmp_path):
    """The released checkpoints hold post_mlp_layernorm in the dense layers too, which transformers leaves
    unread: load_hf_dir leaves it out and gives HF's logits."""
    from safetensors.torch import load_file, save_file

    from archlab.interop.hf import load_hf_dir

    hf = hf_model()
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["model.layers.0.post_mlp_layernorm.weight"] = torch.full((64,), 3.0)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert parity.max_diff(parity.logits(load_hf_dir(tmp_path)), parity.logits(hf)) <= 1e-4
