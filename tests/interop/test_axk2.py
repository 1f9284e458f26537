"""Hugging Face parity of A.X K2 (archlab/interop/families/axk2.py, model_type axk2): DeepSeek-V3.2's layout
(dsa, its indexer rotating halves) with queries and an elementwise output gate from [norm(q latent), q latent]
(mla's ``q_latent`` both, ``gate_input`` q_latent) and its block norms gated by a low-rank sigmoid MLP (every
layer's attention norm, the MoE layers' MLP norm: ``model.block.attn_norm_gate``, ``mlp_norm_gate``).

A tiny random model (every parameter and buffer redrawn: the gates' matrices, the norms' scales, the indexer's
LayerNorm, the correction biases) with YaRN gives HF eager's float32 logits in archlab, maps back to A.X K2,
round-trips bit for bit, generates as HF does (left-padded too) and goes through save_pretrained directories;
the gated norm equals transformers' AXK2GatedRMSNorm; the default config's count is transformers'; what
archlab cannot hold is refused both ways, naming the field."""

from typing import Any

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS
from helpers.mixers import randomise

from archlab import build_model, count_params
from archlab.accounting import check_build
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, **NO_TOKENS)
MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)
# 16 indexer heads of 16 keeping 4 keys (8 heads tie at the top-4 boundary: tests/interop/test_deepseek_v32.py)
INDEXER = dict(index_n_heads=16, index_head_dim=16, index_topk=4)
MOE = dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3)
MOE |= dict(n_shared_experts=1, mlp_layer_types=["dense", "sparse", "sparse"], routed_scaling_factor=2.5)
YARN = dict(rope_type="yarn", rope_theta=100.0, factor=4.0, original_max_position_embeddings=16, beta_fast=4.0)
YARN |= dict(beta_slow=0.25, mscale=1.0, mscale_all_dim=0.8)
KEYS = dict(SMALL, **MLA, **INDEXER, **MOE, gated_norm_rank=8, rope_parameters=YARN)
# case -> (transformers model class, config class, config keys)
HF_CASES = {"axk2": ("AXK2ForCausalLM", "AXK2Config", KEYS)}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "axk2", seed, **EAGER)


globals().update(parity.family_tests(hf_model, impl=EAGER, only=parity.MAPPED_TESTS))


def test_from_hf_reads_the_gates_and_the_queries():
    cfg = from_hf(hf_model()).cfg
    a = cfg.attention
    assert (a.kind, a.q_latent, a.gate, a.gate_input, a.index_pairing) == (
        "dsa",
        "both",
        "elementwise",
        "q_latent",
        "half",
    )
    gates = [(lc.block.attn_norm_gate, lc.block.mlp_norm_gate) for lc in layer_configs(cfg)]
    assert gates == [(8, None), (8, 8), (8, 8)]


def test_the_gated_norm_equals_axk2s():
    """archlab's block norm and its gate (float32) equal transformers' AXK2GatedRMSNorm, weights copied."""
    from transformers.models.axk2.modeling_axk2 import AXK2GatedRMSNorm

    from archlab.nn.norm_gate import NormGate
    from archlab.nn.norms import build_norm

    hf: Any = AXK2GatedRMSNorm(transformers.AXK2Config(**KEYS))
    randomise(hf)
    norm, gate = build_norm(from_hf(hf_model()).cfg), NormGate(64, 8)
    norm.load_state_dict({"weight": hf.norm.weight})
    gate.load_state_dict({"down.weight": hf.mlp.fc1.weight, "up.weight": hf.mlp.fc2.weight})
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(gate(norm(x)), hf(x), rtol=1e-6, atol=1e-6)


def test_the_gates_move_the_logits_and_count_two_matrices_each():
    """Without the MoE layers' MLP-norm gates (their weights left out) the logits change; each gate is 2·d·rank
    parameters, the closed form equals the meta build."""
    model = from_hf(hf_model()).eval()
    cfg = model.cfg
    ungated = parity.changed_cfg(cfg, block__mlp_norm_gate=None)
    other = build_model(ungated)
    other.load_state_dict({k: v for k, v in model.state_dict().items() if "mlp_norm_gate" not in k})
    assert parity.max_diff(parity.logits(other.eval()), parity.logits(model)) > 1e-3
    assert count_params(cfg)["total"] - count_params(ungated)["total"] == 2 * 2 * 64 * 8
    check_build(cfg, build_model(cfg, device="meta"))


def test_the_closed_form_count_is_transformers_count_on_the_default_config():
    """The default AXK2Config (A.X K2-Light's sizes: 48 layers, 128 experts): archlab's closed form equals
    transformers' meta build, 20,314,494,976 parameters."""
    config = transformers.AXK2Config()
    with torch.device("meta"):
        hf = transformers.AXK2ForCausalLM(config)
    total = sum(p.numel() for p in hf.parameters())
    assert total == count_params(config_from_hf(config))["total"] == 20_314_494_976


def test_other_families_refuse_the_gates_and_the_queries():
    """DeepSeek-V3.2, which holds A.X K2's layout but those parts, lists each among its problems."""
    cfg = from_hf(hf_model()).cfg
    found = {p.field for p in FAMILIES["deepseek_v32"].problems(cfg)}
    assert {"model.attention.q_latent", "model.attention.gate", "model.block.attn_norm_gate"} <= found


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(n_group=2, topk_group=1), "AXK2Config.n_group"),
        (dict(attention_bias=True), "AXK2Config.attention_bias"),
        (dict(mlp_layer_types=["sparse", "dense", "sparse"]), "AXK2Config.mlp_layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "axk2", **changes)), field)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(block__mlp_norm_gate=4), "model.block.mlp_norm_gate"),
        (dict(block__attn_norm_gate=None, block__mlp_norm_gate=None), "model.block.attn_norm_gate"),
        (dict(kinds__dense__block__mlp_norm_gate=8), "model.layers.kinds.dense.block.mlp_norm_gate"),
        (dict(attention__q_latent="normed"), "model.attention.q_latent"),
        (dict(attention__gate_input="x"), "model.attention.gate_input"),
        (dict(mlp__routing__n_groups=2, mlp__routing__top_groups=1), "model.mlp.routing.n_groups"),
    ],
)
def test_the_record_refuses_what_the_class_cannot_hold(change, field):
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, **change)
    assert field in {p.field for p in FAMILIES["axk2"].problems(cfg)}


@pytest.mark.parametrize(
    "block, field",
    [
        (dict(kind="post", attn_norm_gate=8), "model.block.attn_norm_gate"),
        (dict(attn_norm=False, attn_norm_gate=8), "model.block.attn_norm_gate"),
        (dict(mlp_norm_gate=0), "model.block.mlp_norm_gate"),
    ],
)
def test_a_gate_it_cannot_build_is_refused(block, field):
    from helpers.parts import plain

    from archlab.nn.validation import validate

    with pytest.raises(ConfigError) as err:
        validate(plain(block=block))
    assert err.value.field == field


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """An archlab model of the layout read, every weight redrawn by archlab: to AXK2ForCausalLM with the same
    logits, and back with every tensor bit for bit."""
    parity.check_exports(from_hf(hf_model()).cfg, "AXK2ForCausalLM", family="axk2", **EAGER)
