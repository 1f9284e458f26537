"""Mixture of experts (``model.mlp.kind: moe``): closed-form counts against built modules and hand
formulas, active parameters against the parameters one token's forward pass reaches, the routing against
a naive per-token loop and against Hugging Face's MoE blocks (gpt-oss's router bias and clamped SwiGLU,
Llama 4's weighted expert inputs among them), the auxiliary losses against hand arithmetic, and training
under DDP (exact resume) and FSDP2 through the CLI."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from helpers.parts import short_fit
from helpers.training import cli

from archlab import build_model
from archlab.accounting import built_counts, check_build, count
from archlab.config import to_model_config
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.nn.mlp import MLPS
from archlab.nn.moe import MoE, RoutingConfig
from archlab.nn.validation import ignored, validate
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

D, V = 16, 32  # d_model and vocabulary of the tiny models


def config(n_layer: int = 3, dense: int = 0, **mlp):
    """A tiny decoder (RMSNorm, RoPE, untied head, no biases outside the MLP) with MoE fields ``mlp``, its
    first ``dense`` layers of kind ``dense``: one MLP of the experts' kind (DeepSeek's first layers)."""
    kinds = {"dense": {"mlp": {"kind": mlp.get("expert", "swiglu")}}} if dense else None
    return to_model_config(
        {
            "vocab_size": V,
            "context_length": 16,
            "n_layer": n_layer,
            "d_model": D,
            "norm": {"kind": "rmsnorm", "bias": False},
            "position": {"kind": "rope"},
            "attention": {"n_head": 2, "qkv_bias": False, "out_bias": False},
            "head": {"tied": False},
            "mlp": {"kind": "moe", "bias": False, "approximate": "none", **routed(mlp)},
            "layers": {"kinds": kinds, "first": ["dense"] * dense},
        }
    )


ROUTING = {f.name for f in dataclasses.fields(RoutingConfig)}


def routed(mlp: dict) -> dict:
    """A MoE section written flat (the tables below) with its routing fields under ``routing``."""
    return {k: v for k, v in mlp.items() if k not in ROUTING} | {
        "routing": {k: v for k, v in mlp.items() if k in ROUTING}
    }


# tiny versions of the four published layouts (REFERENCE: Mixtral, Qwen3-MoE, DeepSeek-V2-Lite, DeepSeek-V3)
FAMILIES = {
    "mixtral": dict(expert="swiglu", n_experts=8, top_k=2, expert_d_ff=24),
    "qwen3_moe": dict(expert="swiglu", n_experts=16, top_k=4, expert_d_ff=12),
    "deepseek_v2_lite": dict(
        expert="swiglu", n_experts=8, top_k=3, expert_d_ff=12, n_shared_experts=2, dense=1, d_ff=40,
        normalize_top_k=False,
    ),
    "deepseek_v3": dict(
        expert="swiglu", n_experts=16, top_k=4, expert_d_ff=12, n_shared_experts=1, dense=1, d_ff=40,
        scoring="sigmoid", n_groups=4, top_groups=2, correction_bias=True, routed_scale=2.5,
    ),
    # experts with biases, a router bias, the clamped SwiGLU (up + 1)·g·σ(1.702·g), limit 7
    "gpt_oss": dict(
        expert="swiglu", n_experts=8, top_k=2, expert_d_ff=12, bias=True, router_bias=True, swiglu_limit=7.0,
        swiglu_alpha=1.702, up_offset=1.0,
    ),
    # top-1 of sigmoid scores, the score on the expert's input, one shared expert of the routed width
    "llama4": dict(
        expert="swiglu", n_experts=4, top_k=1, expert_d_ff=12, n_shared_experts=1, scoring="sigmoid",
        normalize_top_k=False, weight_input=True,
    ),
    # one shared expert of twice the routed width, its output times sigmoid(w·x)
    "qwen3_next": dict(
        expert="swiglu", n_experts=8, top_k=3, expert_d_ff=12, n_shared_experts=2, shared_expert_gate=True,
    ),
}  # fmt: skip
# Step-3.5 (its block against Hugging Face's: tests/interop/test_step.py): sigmoid top-k with a selection bias,
# scaled; SwiGLU activations clamped, the shared expert with its own limit
STEP35 = dict(
    expert="swiglu", n_experts=8, top_k=2, expert_d_ff=12, n_shared_experts=1, scoring="sigmoid",
    correction_bias=True, routed_scale=3.0, swiglu_clamp="activation", swiglu_limit=7.0, shared_swiglu_limit=16.0,
)  # fmt: skip


def hand_mlp_params(cfg) -> tuple[int, int]:
    """Total and active MLP parameters over all layers, written from the layer shapes: a dense layer (one of
    ``layers.first``) is one SwiGLU of d_ff; a MoE layer a router E·d (+ E with its bias), E experts of 3·d·f and one shared
    SwiGLU of n_shared·f (each SwiGLU of width w with biases: + 2·w + d), its gate d where shared_expert_gate."""
    m, d = cfg.mlp, cfg.d_model

    def swiglu(width):
        return 3 * d * width + m.bias * (2 * width + d)

    total = active = 0
    for layer in range(cfg.n_layer):
        if layer < len(cfg.layers.first):
            total += swiglu(m.d_ff)
            active += swiglu(m.d_ff)
            continue
        shared = swiglu(m.n_shared_experts * m.expert_d_ff) if m.n_shared_experts else 0
        shared += d if m.shared_expert_gate else 0
        common = m.routing.n_experts * (d + m.routing.router_bias) + shared
        total += common + m.routing.n_experts * swiglu(m.expert_d_ff)
        active += common + m.routing.top_k * swiglu(m.expert_d_ff)
    return total, active


@pytest.mark.parametrize("family", FAMILIES)
def test_counts_equal_the_built_model_and_the_hand_formula(family):
    cfg = config(**FAMILIES[family])
    model = build_model(cfg, device="meta", check=False)
    check_build(cfg, model)  # every component, the built model against the closed forms
    counts, built = count(cfg), built_counts(model)
    total, active = hand_mlp_params(cfg)
    assert built["mlp"] == counts["mlp"] == total  # experts, router and shared experts attributed to "mlp"
    assert counts["total"] - counts["active"] == total - active
    for layer, (block, lc) in enumerate(zip(model.blocks, layer_configs(cfg))):
        params = sum(p.numel() for p in block.mlp.parameters())
        assert params == MLPS.get(lc.mlp.kind).num_params(lc, layer)
        assert isinstance(block.mlp, MoE) == (layer >= len(cfg.layers.first))
    # the stacked experts in Hugging Face 5.x's layout; the correction bias a float32 buffer
    moe = model.blocks[-1].mlp
    E, f = cfg.mlp.routing.n_experts, cfg.mlp.expert_d_ff
    assert moe.experts.gate_up.shape == (E, 2 * f, D) and moe.experts.down.shape == (E, D, f)
    assert ("router_bias" in dict(moe.named_buffers())) == cfg.mlp.routing.correction_bias
    assert "router_bias" not in dict(moe.named_parameters())
    assert ("router.bias" in dict(moe.named_parameters())) == cfg.mlp.routing.router_bias  # gpt-oss's, learned


def test_plain_experts_with_biases_and_the_d_ff_rules():
    """gelu experts with biases: fc [E, f, d], proj [E, d, f] and their biases; f from the expert kind's
    rules (4·d for a plain kind, the LLaMA rule for a gated one) when expert_d_ff is unset."""
    cfg = config(n_layer=2, expert="gelu", n_experts=4, top_k=2, bias=True, n_shared_experts=1, dense=1)
    model = build_model(cfg, device="meta")
    f = 4 * D
    moe = model.blocks[1].mlp
    shapes = {n: tuple(p.shape) for n, p in moe.experts.named_parameters()}
    assert shapes == {"fc": (4, f, D), "fc_bias": (4, f), "proj": (4, D, f), "proj_bias": (4, D)}
    per_expert = 2 * D * f + f + D
    router, shared = 4 * D, 2 * D * f + f + D
    assert MoE.num_params(cfg, 1) == router + 4 * per_expert + shared
    assert MoE.active_params(cfg, 1) == router + 2 * per_expert + shared
    dense = layer_configs(cfg)[0]  # the dense layer: one gelu MLP of width d_ff = 4·d
    assert sum(p.numel() for p in model.blocks[0].mlp.parameters()) == per_expert
    assert MLPS.get(dense.mlp.kind).num_params(dense) == MLPS.get(dense.mlp.kind).active_params(dense) == per_expert
    gated = config(n_layer=1, expert="swiglu", n_experts=4, top_k=1)
    assert build_model(gated, device="meta").blocks[0].mlp.experts.down.shape == (4, D, int(2 * 4 * D / 3))


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter and buffer N(0, 1) (scaled to keep activations moderate): nothing left at zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype) * 0.5)


@pytest.mark.parametrize("family", FAMILIES)
def test_active_params_are_what_one_tokens_forward_pass_reaches(family):
    """One token after a cached prefix (run without gradients): the parameters with a gradient from its
    logits are those its forward pass went through. Expected: ``active`` less the (V-1)·d embedding rows
    it does not look up, and less the router rows of the experts it was not sent to when its weights do
    not depend on their logits (softmax renormalised over the top-k, or sigmoid scores): those rows (and
    their router biases) are read to rank the experts, and count as active, but pass no gradient."""
    cfg = config(**FAMILIES[family])
    model = build_model(cfg, dtype=torch.float64)
    randomise(model, 0)
    idx = torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(1, 16)
    with torch.no_grad():
        model(idx[:, :5], cache)
    model(idx[:, 5:], cache).sum().backward()
    # float64: where the gradient cancels exactly in theory (the renormalised softmax), rounding leaves ~1e-16
    reached = sum(
        int((p.grad.abs() > 1e-9 * p.grad.abs().max()).sum()) for p in model.parameters() if p.grad is not None
    )
    m = cfg.mlp
    blind = m.routing.scoring == "sigmoid" or m.routing.normalize_top_k
    moe_layers = cfg.n_layer - len(cfg.layers.first)
    unread_router_rows = (
        moe_layers * (m.routing.n_experts - m.routing.top_k) * (D + m.routing.router_bias) if blind else 0
    )
    assert reached == count(cfg)["active"] - (V - 1) * D - unread_router_rows


# ---- routing against a naive per-token loop ----


def negative_choices(moe: MoE) -> None:
    """A correction bias below -1, so every biased sigmoid score is negative: groups left out must then
    be ranked below every kept expert (-inf, as DeepSeek-V3), not merely set to zero."""
    if moe.router_bias is not None:
        with torch.no_grad():
            moe.router_bias.sub_(2.0)


def naive_moe(moe: MoE, cfg, x: torch.Tensor) -> torch.Tensor:
    """The MoE output token by token, written from the definitions with Python sorting (float64): the
    router's logits W·v + b, SwiGLU's gate g·σ(α·g) with gate and up clamped and up offset, the weight
    on each expert's output, or with weight_input on its input."""
    m = cfg.mlp
    E, k, L = m.routing.n_experts, m.routing.top_k, m.swiglu_limit
    gated = m.expert in ("swiglu", "geglu")
    act = {
        "swiglu": lambda g: g * torch.sigmoid(m.swiglu_alpha * g),
        "geglu": lambda h: torch.nn.functional.gelu(h, approximate=m.approximate),
        "gelu": lambda h: torch.nn.functional.gelu(h, approximate=m.approximate),
        "relu": torch.relu,
        "relu2": lambda h: torch.relu(h) ** 2,
    }[m.expert]
    names = ("gate_up", "down") if gated else ("fc", "proj")
    w_in, w_out = (getattr(moe.experts, n) for n in names)
    b_in, b_out = (getattr(moe.experts, f"{n}_bias") for n in names)
    bias = moe.router_bias if moe.router_bias is not None else torch.zeros(E, dtype=x.dtype)

    def expert(e, v):
        h = w_in[e] @ v + (b_in[e] if b_in is not None else 0)
        if gated:
            gate, up = h[: h.shape[0] // 2], h[h.shape[0] // 2 :]
            if m.expert == "swiglu" and L is not None:
                up = torch.clamp(up, -L, L)
                gate = torch.minimum(gate, torch.tensor(L)) if m.swiglu_clamp == "gate" else gate
                h = torch.minimum(act(gate), torch.tensor(L)) if m.swiglu_clamp == "activation" else act(gate)
            else:
                h = act(gate)
            h = h * (up + (m.up_offset if m.expert == "swiglu" else 0.0))
        else:
            h = act(h)
        return w_out[e] @ h + (b_out[e] if b_out is not None else 0)

    out = []
    for v in x:
        logits = moe.router.weight @ v + (moe.router.bias if m.routing.router_bias else 0)
        scores = torch.softmax(logits, 0) if m.routing.scoring == "softmax" else torch.sigmoid(logits)
        choice = [float(s + b) for s, b in zip(scores, bias)]
        candidates = list(range(E))
        if m.routing.n_groups > 1:
            size = E // m.routing.n_groups
            group_score = [sum(sorted(choice[g * size : (g + 1) * size])[-2:]) for g in range(m.routing.n_groups)]
            kept = sorted(range(m.routing.n_groups), key=lambda g: -group_score[g])[: m.routing.top_groups]
            candidates = [e for e in range(E) if e // size in kept]
        chosen = sorted(candidates, key=lambda e: -choice[e])[:k]
        weights = [float(scores[e]) for e in chosen]
        if m.routing.normalize_top_k:
            weights = [w / sum(weights) for w in weights]
        if m.routing.weight_input:
            y = sum(expert(e, m.routing.routed_scale * w * v) for w, e in zip(weights, chosen))
        else:
            y = sum(m.routing.routed_scale * w * expert(e, v) for w, e in zip(weights, chosen))
        if moe.shared is not None:
            shared = moe.shared(v[None])[0]  # the dense MLP of mlp.py, itself tested against HF's
            gate = 1 / (1 + math.exp(-float(moe.shared_gate.weight[0] @ v))) if m.shared_expert_gate else 1.0
            y = y + gate * shared
        out.append(y)
    return torch.stack(out)


ROUTINGS = {
    "softmax_renormalised": dict(n_experts=8, top_k=2),
    "softmax_raw": dict(n_experts=8, top_k=3, normalize_top_k=False),
    "sigmoid_grouped_bias_scaled": dict(
        n_experts=12, top_k=3, scoring="sigmoid", n_groups=4, top_groups=2, correction_bias=True, routed_scale=2.5
    ),
    "softmax_grouped_shared": dict(n_experts=8, top_k=2, n_groups=2, top_groups=1, n_shared_experts=2),
    "geglu_tanh_bias": dict(expert="geglu", approximate="tanh", n_experts=6, top_k=2, bias=True, n_shared_experts=1),
    "gelu_bias_sigmoid_raw": dict(expert="gelu", n_experts=6, top_k=2, scoring="sigmoid", normalize_top_k=False, bias=True),
    "relu_top1": dict(expert="relu", n_experts=4, top_k=1, routed_scale=0.5),
    "relu2_bias_shared": dict(expert="relu2", n_experts=6, top_k=2, bias=True, n_shared_experts=1),
    # limits small enough that random weights cross them (the test fails if a clamp is skipped)
    "gpt_oss_clamp_router_bias": dict(
        n_experts=6, top_k=2, bias=True, router_bias=True, swiglu_limit=1.0, swiglu_alpha=1.702, up_offset=1.0,
    ),
    "step_clamp_activation_shared": dict(
        n_experts=6, top_k=2, scoring="sigmoid", swiglu_limit=0.5, swiglu_clamp="activation", n_shared_experts=1,
        routed_scale=2.0,
    ),
    "llama4_weight_input": dict(
        n_experts=4, top_k=1, scoring="sigmoid", normalize_top_k=False, weight_input=True, n_shared_experts=1,
    ),
    "weight_input_biases_top2": dict(n_experts=6, top_k=2, weight_input=True, bias=True, routed_scale=1.5),
    "gated_shared_bias": dict(n_experts=6, top_k=2, bias=True, n_shared_experts=2, shared_expert_gate=True),
}  # fmt: skip


@pytest.mark.parametrize("name", ROUTINGS)
def test_routing_equals_a_naive_per_token_loop(name):
    cfg = config(n_layer=1, expert_d_ff=8, **{"expert": "swiglu", **ROUTINGS[name]})
    validate(cfg)
    moe = MoE(cfg).double()
    randomise(moe, 3)
    negative_choices(moe)
    x = torch.randn(2, 20, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        expected = naive_moe(moe, cfg, x.flatten(0, 1)).view(2, 20, D)
        torch.testing.assert_close(moe(x), expected, rtol=1e-12, atol=1e-12)


# ---- against Hugging Face's MoE blocks ----


def _hf_block(family: str, cfg):
    """Hugging Face's MoE block for ``cfg``'s MoE layer, with archlab's ``MoE`` whose weights it copies."""
    import transformers as tf

    m = cfg.mlp
    common = dict(hidden_size=D, num_attention_heads=2, num_experts_per_tok=m.routing.top_k, hidden_act="silu")
    if family == "mixtral":
        hf_cfg = tf.MixtralConfig(num_local_experts=m.routing.n_experts, intermediate_size=m.expert_d_ff, **common)
        block_cls = tf.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock
    elif family == "qwen3_moe":
        hf_cfg = tf.Qwen3MoeConfig(
            num_experts=m.routing.n_experts, moe_intermediate_size=m.expert_d_ff, norm_topk_prob=True, **common
        )
        block_cls = tf.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock
    elif family in ("gpt_oss", "llama4", "qwen3_next"):
        return _hf_block_2025(family, cfg)
    elif family == "deepseek_v2_lite":
        hf_cfg = tf.DeepseekV2Config(
            n_routed_experts=m.routing.n_experts, moe_intermediate_size=m.expert_d_ff, n_shared_experts=m.n_shared_experts,
            topk_method="greedy", routed_scaling_factor=m.routing.routed_scale, **common,
        )  # fmt: skip
        block_cls = tf.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2Moe
    else:
        hf_cfg = tf.DeepseekV3Config(
            n_routed_experts=m.routing.n_experts, moe_intermediate_size=m.expert_d_ff, n_shared_experts=m.n_shared_experts,
            n_group=m.routing.n_groups, topk_group=m.routing.top_groups, norm_topk_prob=m.routing.normalize_top_k,
            routed_scaling_factor=m.routing.routed_scale, **common,
        )  # fmt: skip
        block_cls = tf.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE
    hf_cfg._experts_implementation = "eager"
    hf = block_cls(hf_cfg).float()
    ours = MoE(cfg, layer=cfg.n_layer - 1)
    randomise(ours, 5)
    negative_choices(ours)
    with torch.no_grad():
        hf.gate.weight.copy_(ours.router.weight)
        hf.experts.gate_up_proj.copy_(ours.experts.gate_up)
        hf.experts.down_proj.copy_(ours.experts.down)
        if ours.router_bias is not None:
            hf.gate.e_score_correction_bias.copy_(ours.router_bias)
        if ours.shared is not None:
            f = ours.shared.down.in_features
            hf.shared_experts.gate_proj.weight.copy_(ours.shared.gate_up.weight[:f])
            hf.shared_experts.up_proj.weight.copy_(ours.shared.gate_up.weight[f:])
            hf.shared_experts.down_proj.weight.copy_(ours.shared.down.weight)
    return hf, ours


def _hf_block_2025(family: str, cfg):
    """gpt-oss's MoE MLP (router with a bias; experts [E, d, 2f] with gate and up interleaved along the
    last dim, biases, the clamped SwiGLU) or Llama 4's (top-1 sigmoid router, the score on the expert's
    input, a shared SwiGLU) or Qwen3-Next's (softmax top-k, a shared SwiGLU times sigmoid of its own gate
    Linear), with archlab's ``MoE`` whose weights it copies."""
    import transformers as tf

    m = cfg.mlp
    common = dict(
        hidden_size=D, num_attention_heads=2, num_local_experts=m.routing.n_experts, num_experts_per_tok=m.routing.top_k,
        intermediate_size=m.expert_d_ff,
    )  # fmt: skip
    if family == "qwen3_next":
        hf_cfg = tf.Qwen3NextConfig(
            hidden_size=D, num_attention_heads=2, num_experts=m.routing.n_experts, num_experts_per_tok=m.routing.top_k,
            moe_intermediate_size=m.expert_d_ff, shared_expert_intermediate_size=m.n_shared_experts * m.expert_d_ff,
            norm_topk_prob=m.routing.normalize_top_k, hidden_act="silu",
        )  # fmt: skip
        hf_cfg._experts_implementation = "eager"
        hf = tf.models.qwen3_next.modeling_qwen3_next.Qwen3NextSparseMoeBlock(hf_cfg).float()
        ours = MoE(cfg, layer=cfg.n_layer - 1)
        randomise(ours, 5)
        f = ours.shared.down.in_features
        with torch.no_grad():
            hf.gate.weight.copy_(ours.router.weight)
            hf.experts.gate_up_proj.copy_(ours.experts.gate_up)
            hf.experts.down_proj.copy_(ours.experts.down)
            hf.shared_expert.gate_proj.weight.copy_(ours.shared.gate_up.weight[:f])
            hf.shared_expert.up_proj.weight.copy_(ours.shared.gate_up.weight[f:])
            hf.shared_expert.down_proj.weight.copy_(ours.shared.down.weight)
            hf.shared_expert_gate.weight.copy_(ours.shared_gate.weight)
        return hf, ours
    if family == "gpt_oss":
        hf_cfg = tf.GptOssConfig(swiglu_limit=m.swiglu_limit, **common)
        hf_cfg.swiglu_alpha = m.swiglu_alpha
        block_cls = tf.models.gpt_oss.modeling_gpt_oss.GptOssMLP
    else:
        hf_cfg = tf.Llama4TextConfig(hidden_act="silu", **common)
        block_cls = tf.models.llama4.modeling_llama4.Llama4TextMoe
    hf_cfg._experts_implementation = "eager"
    hf = block_cls(hf_cfg).float()
    ours = MoE(cfg, layer=cfg.n_layer - 1)
    randomise(ours, 5)
    f = m.expert_d_ff
    w_in = ours.experts.gate_up.transpose(1, 2)  # [E, d, 2f]: the gate columns, then the up columns
    with torch.no_grad():
        hf.router.weight.copy_(ours.router.weight)
        hf.experts.down_proj.copy_(ours.experts.down.transpose(1, 2))
        if family == "gpt_oss":
            hf.router.bias.copy_(ours.router.bias + 1.0)  # far from 0
            ours.router.bias.add_(1.0)
            hf.experts.gate_up_proj[..., 0::2].copy_(w_in[..., :f])
            hf.experts.gate_up_proj[..., 1::2].copy_(w_in[..., f:])
            hf.experts.gate_up_proj_bias[:, 0::2].copy_(ours.experts.gate_up_bias[:, :f])
            hf.experts.gate_up_proj_bias[:, 1::2].copy_(ours.experts.gate_up_bias[:, f:])
            hf.experts.down_proj_bias.copy_(ours.experts.down_bias)
        else:
            hf.experts.gate_up_proj.copy_(w_in)
            shared = hf.shared_expert
            shared.gate_proj.weight.copy_(ours.shared.gate_up.weight[:f])
            shared.up_proj.weight.copy_(ours.shared.gate_up.weight[f:])
            shared.down_proj.weight.copy_(ours.shared.down.weight)
    return hf, ours


def _hf_route(family: str, hf, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's routing weights [N, k] and expert indices [N, k] of tokens ``x``."""
    if family == "llama4":  # scores [N, E]: σ(logit) of the chosen experts, 0 elsewhere
        scores, _ = hf.router(x)
        weights, indices = scores.topk(hf.top_k, dim=-1)
        return weights, indices
    _, weights, indices = (hf.router if family == "gpt_oss" else hf.gate)(x)
    return weights, indices


@pytest.mark.parametrize("family", FAMILIES)
def test_block_and_router_equal_hugging_face(family):
    """Routing and output equal HF's block; gpt-oss's inputs are scaled so that its clamp acts (the
    output without the clamp differs)."""
    pytest.importorskip("transformers")
    cfg = config(**FAMILIES[family])
    hf, ours = _hf_block(family, cfg)
    x = torch.randn(3, 24, D, generator=torch.Generator().manual_seed(6)) * (4.0 if family == "gpt_oss" else 1.0)
    with torch.no_grad():
        hf_weights, hf_indices = _hf_route(family, hf, x.flatten(0, 1))
        _, weights, indices = ours.route(x.flatten(0, 1))
        # the same experts for every token (HF's V2/V3 top-k is unsorted: compare in index order)
        hf_sorted, order = hf_indices.sort(dim=-1)
        ours_sorted, ours_order = indices.sort(dim=-1)
        assert torch.equal(ours_sorted, hf_sorted)
        torch.testing.assert_close(weights.gather(-1, ours_order), hf_weights.gather(-1, order), rtol=0, atol=1e-6)
        out = hf(x)
        out = (out[0] if isinstance(out, tuple) else out).view_as(x)  # gpt-oss, Llama 4: (output, router)
        torch.testing.assert_close(ours(x), out, rtol=1e-6, atol=1e-5)  # gpt-oss: outputs near 100
        if cfg.mlp.swiglu_limit is not None:
            ours.experts.activation = dataclasses.replace(ours.experts.activation, limit=None)
            assert (ours(x) - out).abs().max() > 1e-2


# ---- auxiliary losses ----


def test_aux_losses_equal_hand_arithmetic_and_hugging_face():
    """Router = identity, so the logits are the inputs: three tokens, four experts, top-2."""
    cfg = config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=4, aux_loss_weight=0.5, z_loss_weight=0.25)
    moe = MoE(cfg)
    randomise(moe, 7)
    rows = [[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 1.0, 0.0], [1.0, 0.0, 0.0, 2.0]]
    x = torch.zeros(1, 3, D)
    x[0, :, :4] = torch.tensor(rows)
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(4, D))
    moe.train()
    moe(x)
    # hand: softmax per token, top-2 per token = {0, 1}, {1, 2}, {3, 0}
    probs = [[math.exp(v) / sum(math.exp(u) for u in r) for v in r] for r in rows]
    f = [2 / 3, 2 / 3, 1 / 3, 1 / 3]  # fraction of the tokens that chose each expert
    P = [sum(p[i] for p in probs) / 3 for i in range(4)]
    balance = 4 * sum(fi * pi for fi, pi in zip(f, P))
    z = sum(math.log(sum(math.exp(v) for v in r)) ** 2 for r in rows) / 3
    (wb, got_balance), (wz, got_z) = moe.aux_losses["moe_balance"], moe.aux_losses["router_z"]
    assert (wb, wz) == (0.5, 0.25)
    assert got_balance.item() == pytest.approx(balance, rel=1e-6) and got_z.item() == pytest.approx(z, rel=1e-6)
    transformers = pytest.importorskip("transformers")
    hf_loss = transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func(
        (torch.tensor(rows),), num_experts=4, top_k=2
    )
    assert got_balance.item() == pytest.approx(hf_loss.item(), rel=1e-6)
    # sigmoid scores: P is the scores normalised to sum 1 per token
    sig = MoE(config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=4, scoring="sigmoid", aux_loss_weight=1.0))
    with torch.no_grad():
        sig.router.weight.copy_(torch.eye(4, D))
    sig.train()
    sig(x)
    s = [[1 / (1 + math.exp(-v)) for v in r] for r in rows]
    P = [sum(si[i] / sum(si) for si in s) / 3 for i in range(4)]
    assert sig.aux_losses["moe_balance"][1].item() == pytest.approx(4 * sum(fi * pi for fi, pi in zip(f, P)), rel=1e-6)
    # none in eval mode, and none whose weight is zero
    moe.eval()
    moe(x)
    assert moe.aux_losses == {}
    quiet = MoE(config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=4)).train()
    quiet(x)
    assert quiet.aux_losses == {}


def test_router_learns_through_the_weights_and_the_aux_losses():
    cfg = config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=4, aux_loss_weight=0.1, z_loss_weight=0.1)
    moe = MoE(cfg)
    randomise(moe, 8)
    moe.train()
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(9))
    for source in ("output", "moe_balance", "router_z"):
        moe.router.weight.grad = None
        y = moe(x)
        loss = y.square().sum() if source == "output" else moe.aux_losses[source][1]
        loss.backward()
        assert moe.router.weight.grad.abs().sum() > 0, source


LIMITS = {"gpt_oss": {"swiglu_limit": 0.1}, "step35": {"swiglu_limit": 0.1, "shared_swiglu_limit": 0.05}}


@pytest.mark.parametrize("family", ["gpt_oss", "llama4", "step35"])
def test_gpt_oss_llama4_and_step35_parts_train(family):
    """A few AdamW steps on one repeated batch lower the loss, and every parameter gets a gradient: the
    router bias, the clamped SwiGLU (gpt-oss: a limit of 0.1, which about a fifth of the pre-activations
    cross at init: the clamp passes them no gradient, the rest learn; Step-3.5: limits 0.1 and the shared
    expert's 0.05, which 15-50% of the up projections and up to 15% of the activated gates cross at init),
    the weighted expert inputs."""
    mlp = (STEP35 if family == "step35" else FAMILIES[family]) | LIMITS.get(family, {})
    cfg = config(n_layer=2, **mlp)
    torch.manual_seed(0)
    model = build_model(cfg)
    losses = short_fit(model, V, 16, steps=20, lr=1e-2)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert losses[-1] < 0.8 * losses[0]


def test_building_and_running_a_moe_model_imports_no_dynamo():
    """torch.compiler.disable on the routed experts is applied when a block is compiled, not at import: a
    fresh process that builds and runs a MoE model never loads torch._dynamo (about a second)."""
    import subprocess
    import sys

    code = (
        "import sys, torch; from archlab import build_model, compose_model; "
        "m = build_model(compose_model(['model=nano', 'model/mlp=moe', 'model.n_layer=1'])); "
        "m(torch.randint(0, 256, (1, 8))); print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_decoder_averages_aux_losses_over_moe_layers_with_checkpointing_and_compile():
    """Decoder.auxiliary_losses: the mean over MoE layers (dense layers hold none). Activation
    checkpointing (the forward re-run in backward) gives the same gradients, and so does each block
    under ``torch.compile`` as ``compile_blocks`` does it (the aot_eager backend: dynamo and AOT autograd
    trace it without inductor's minutes of C++; the expert dispatch runs eagerly)."""
    cfg = config(n_layer=3, n_experts=4, top_k=2, expert_d_ff=8, dense=1, aux_loss_weight=0.1, z_loss_weight=0.01)
    idx = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(10))

    def step(checkpointing=False, compiled=False):
        torch.manual_seed(0)
        model = build_model(cfg).train()
        model.activation_checkpointing = checkpointing
        if compiled:
            for block in model.blocks:
                block.compile(backend="aot_eager")
        loss = model(idx).square().mean()
        aux = model.auxiliary_losses()
        for weight, value in aux.values():
            loss = loss + weight * value
        loss.backward()
        return model, aux, {n: p.grad.clone() for n, p in model.named_parameters()}

    model, aux, grads = step()
    layers = [b.mlp.aux_losses for b in model.blocks[1:]]
    assert model.blocks[0].mlp.__class__.__name__ == "SwiGLU"
    for name, weight in (("moe_balance", 0.1), ("router_z", 0.01)):
        assert aux[name][0] == weight
        assert aux[name][1].item() == pytest.approx(sum(layer[name][1].item() for layer in layers) / 2)
    for variant in (dict(checkpointing=True), dict(compiled=True)):
        _, other_aux, other = step(**variant)
        assert {k: v[1].item() for k, v in other_aux.items()} == pytest.approx({k: v[1].item() for k, v in aux.items()})
        for n in grads:
            torch.testing.assert_close(other[n], grads[n], rtol=1e-5, atol=1e-7, msg=f"{variant} {n}")


def test_bf16_autocast_routes_in_float32():
    cfg = config(n_layer=2, n_experts=4, top_k=2, expert_d_ff=8, n_shared_experts=1, aux_loss_weight=0.1)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    idx = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(11))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
        moe = model.blocks[1].mlp
        router_logits, weights, _ = moe.route(torch.randn(5, D))
    assert router_logits.dtype == weights.dtype == torch.float32
    loss = logits.float().square().mean() + model.auxiliary_losses()["moe_balance"][1]
    loss.backward()
    assert torch.isfinite(moe.experts.gate_up.grad).all() and moe.experts.gate_up.grad.abs().sum() > 0


# ---- validation ----

BAD = [
    (dict(n_experts=0), "model.mlp.routing.n_experts"),
    (dict(top_k=0), "model.mlp.routing.top_k"),
    (dict(n_experts=4, top_k=5), "model.mlp.routing.top_k"),
    (dict(n_experts=8, n_groups=3), "model.mlp.routing.n_groups"),
    (dict(n_experts=8, n_groups=8, top_groups=1), "model.mlp.routing.n_groups"),  # one expert per group: no top-2
    (dict(n_experts=8, n_groups=4, top_groups=5), "model.mlp.routing.top_groups"),
    (dict(n_experts=8, n_groups=4, top_groups=0), "model.mlp.routing.top_groups"),
    (dict(n_experts=8, top_k=5, n_groups=4, top_groups=2), "model.mlp.routing.top_k"),  # 2 groups of 2 hold 4
    (dict(expert_d_ff=0), "model.mlp.expert_d_ff"),
    (dict(n_shared_experts=-1), "model.mlp.n_shared_experts"),
    (dict(shared_expert_gate=True), "model.mlp.shared_expert_gate"),  # no shared experts to gate
    (dict(dense=4), "model.layers.first"),  # more dense layers than the model's 3
    (dict(routed_scale=0.0), "model.mlp.routing.routed_scale"),
    (dict(aux_loss_weight=-0.1), "model.mlp.routing.aux_loss_weight"),
    (dict(z_loss_weight=float("nan")), "model.mlp.routing.z_loss_weight"),
    (dict(aux_loss_weight=float("inf")), "model.mlp.routing.aux_loss_weight"),
    (dict(correction_bias=True, bias_update_speed=-0.001), "model.mlp.routing.bias_update_speed"),
    (dict(bias_update_speed=0.001), "model.mlp.routing.bias_update_speed"),  # no correction bias to move
    (dict(expert="swiglu", approximate="tanh"), "model.mlp.approximate"),  # the expert kind's own rule
    (dict(expert="relu", approximate="tanh"), "model.mlp.approximate"),
    (dict(expert="relu2", approximate="tanh"), "model.mlp.approximate"),
    (dict(expert="moe"), "model.mlp.expert"),
    (dict(scoring="cosine"), "model.mlp.routing.scoring"),
    (dict(swiglu_limit=0.0), "model.mlp.swiglu_limit"),  # the swiglu experts' own rules
    (dict(swiglu_limit=float("inf")), "model.mlp.swiglu_limit"),
    (dict(swiglu_limit=7.0, swiglu_clamp="up"), "model.mlp.swiglu_clamp"),
    (dict(swiglu_alpha=-1.702), "model.mlp.swiglu_alpha"),
    (dict(up_offset=float("nan")), "model.mlp.up_offset"),
    (dict(zero_experts=-1), "model.mlp.routing.zero_experts"),
    (dict(n_experts=4, zero_experts=2, top_k=7), "model.mlp.routing.top_k"),  # 6 choices
    (dict(zero_experts=2, n_groups=2), "model.mlp.routing.n_groups"),
]


@pytest.mark.parametrize(("mlp", "field"), BAD)
def test_validation_names_the_field(mlp, field):
    with pytest.raises(ConfigError) as err:
        validate(config(**{"n_experts": 8, "top_k": 2, **mlp}))
    assert err.value.field == field


def test_valid_edges_pass():
    validate(config(n_experts=1, top_k=1))
    validate(config(n_experts=8, top_k=4, n_groups=4, top_groups=2, dense=3, expert="geglu", approximate="tanh"))


@pytest.mark.parametrize("dense", [1, 3])
def test_a_dense_kind_leaves_no_moe_field_ignored(dense):
    """The MoE fields a dense layer kind does not read (n_experts, top_k, the routing ...) are read by the
    model's own MoE section, which the kind is built from: none is reported as ignored, whether some layers
    or all three are dense (a field read by any layer's parts, or by the model's, is read)."""
    moe = dict(n_experts=8, top_k=4, n_groups=4, top_groups=2, n_shared_experts=1, expert_d_ff=8, routed_scale=2.5)
    cfg = validate(config(dense=dense, expert="geglu", approximate="tanh", aux_loss_weight=0.1, **moe))
    assert [i for i in ignored(cfg) if i.field.startswith(("model.mlp.", "model.layers."))] == []
    assert [lc.mlp.kind for lc in layer_configs(cfg)] == ["geglu"] * dense + ["moe"] * (3 - dense)
    validate(config(n_experts=8, top_k=2, n_groups=1, top_groups=1, routed_scale=2.5, n_shared_experts=0))


# ---- training ----


# vocab 16 (the tiny data), two layers: a dense one, then 4 SwiGLU experts (top 2) beside a shared one
MOE_RUN = [
    "model/mlp=moe",
    "model.n_layer=2",
    "model.mlp.routing.n_experts=4",
    "model.mlp.routing.top_k=2",
    "model.mlp.expert_d_ff=16",
    "model.mlp.n_shared_experts=1",
    "model/layers=dense_first",
    "model.mlp.routing.aux_loss_weight=0.01",
    "model.mlp.routing.z_loss_weight=0.001",
    "model.mlp.routing.correction_bias=true",
    "model.mlp.routing.bias_update_speed=0.01",
    "callbacks.health.every_n_steps=3",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "data.batch_size=4",
    "callbacks.checkpoint.save_top_k=-1",
]


@pytest.fixture(scope="module")
def ddp_run(conf, tmp_path_factory):
    """Two processes under DDP for 6 steps, logging every step to CSV."""
    run = tmp_path_factory.mktemp("ddp") / "full"
    proc = cli(conf, run, [*MOE_RUN, "trainer=ddp_cpu", "logger=csv", "trainer.log_every_n_steps=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.mark.slow  # two processes (about 55 s with its fixture): -m slow
def test_ddp_trains_logs_aux_losses_and_resumes_exactly(conf, ddp_run, tmp_path):
    """Resumed from the step-3 checkpoint, the run ends with the uninterrupted run's weights (bit for
    bit, the correction bias moved by the balancing too) and validation history; the aux losses are logged
    each step; the router's load is both processes' tokens (summed before the bias update)."""
    summary = json.loads((ddp_run / "summary.json").read_text())
    assert summary["trainer"]["world_size"] == 2 and summary["steps"] == 6
    tokens_per_step = summary["throughput"]["tokens"] / 6  # both processes' (ThroughputMonitor)
    assert summary["router_load"]["steps"] == 1 and summary["router_load"]["assignments"] == tokens_per_step * 2
    assert summary["parameters"]["built"]["mlp"] == count(summary["model"])["mlp"]
    csv = next((ddp_run / "logs").rglob("metrics.csv")).read_text().splitlines()
    header = csv[0].split(",")
    for name in ("train/moe_balance", "train/router_z"):
        logged = [row.split(",")[header.index(name)] for row in csv[1:]]
        assert sum(1 for v in logged if v) == 6 and all(float(v) > 0 for v in logged if v), name
    mid = ddp_run / "checkpoints" / "step000003.ckpt"
    proc = cli(conf, tmp_path, [*MOE_RUN, "trainer=ddp_cpu", f"ckpt_path={mid}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = load_weights(ddp_run / "model.safetensors").state_dict()
    b = load_weights(tmp_path / "model.safetensors").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["blocks.1.mlp.router_bias"].abs().sum() > 0
    assert json.loads((tmp_path / "summary.json").read_text())["metrics"]["history"] == summary["metrics"]["history"]


@pytest.mark.slow  # two processes, and the DDP run it compares with: -m slow
def test_fsdp2_trains_a_moe_like_ddp(conf, ddp_run, tmp_path):
    """FSDP2 (each block sharded, then the root) over the same global batches ends where DDP ended, up
    to the order of the gradient reductions."""
    proc = cli(conf, tmp_path, [*MOE_RUN, "trainer=fsdp"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trainer"]["strategy"] == "AtomicModelParallelStrategy" and summary["steps"] == 6
    fsdp = load_weights(tmp_path / "model.safetensors").state_dict()
    ddp = load_weights(ddp_run / "model.safetensors").state_dict()
    assert fsdp["blocks.1.mlp.experts.gate_up"].shape == (4, 32, 32)
    assert max((fsdp[k] - ddp[k]).abs().max().item() for k in ddp) < 1e-5
    # per-layer health: FSDP's norms summed over the shards, the RMS averaged over the processes, as DDP's
    fsdp_health, ddp_health = (
        [json.loads(ln) for ln in (d / "health.jsonl").read_text().splitlines()] for d in (tmp_path, ddp_run)
    )
    assert [r["step"] for r in fsdp_health] == [r["step"] for r in ddp_health] == [3, 6]
    for a, b in zip(fsdp_health, ddp_health):
        for figure in ("rms", "grad_norm", "grad_norm_role", "update_ratio"):
            assert a[figure].keys() == b[figure].keys() and all(
                a[figure][k] == pytest.approx(b[figure][k], rel=1e-3) for k in a[figure]
            ), figure


# ---- SparseMixer routing (PhiMoE)


def test_sparsemixer_weights_are_each_round_s_masked_softmax():
    """Logits [3, 0, 2.9, -5] at ε 0.1: round one picks expert 0, its softmax over {0, 2} (1 is (3-0)/3 > 0.2
    below, 3 farther); round two picks 2, its softmax over {2} alone, once 0 is out: weight 1. Not renormalised."""
    logits = torch.tensor([[3.0, 0.0, 2.9, -5.0]], dtype=torch.float64)
    cfg = validate(config(n_layer=1, n_experts=4, top_k=2, normalize_top_k=False, sparsemixer_eps=0.1))
    moe = build_model(cfg, dtype=torch.float64).blocks[0].mlp
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, 0] = logits[0]
        x = torch.zeros(1, D, dtype=torch.float64)
        x[0, 0] = 1.0
        _, weights, indices = moe.route(x)
    assert indices.tolist() == [[0, 2]]
    first = math.exp(3.0) / (math.exp(3.0) + math.exp(2.9))
    torch.testing.assert_close(weights, torch.tensor([[first, 1.0]], dtype=torch.float64))
    assert "sparsemixer eps=0.1" in MoE.describe(cfg)
    assert "model.mlp.routing.sparsemixer_eps" not in {i.field for i in ignored(cfg)}


@pytest.mark.parametrize(
    "routing, why",
    [
        (dict(sparsemixer_eps=0.01), "normalize_top_k=true"),
        (dict(sparsemixer_eps=0.01, normalize_top_k=False, scoring="sigmoid"), "scoring=sigmoid"),
        (dict(sparsemixer_eps=0.01, normalize_top_k=False, correction_bias=True), "correction_bias=true"),
        (dict(sparsemixer_eps=-0.1, normalize_top_k=False), "non-negative"),
    ],
)
def test_sparsemixer_refuses_what_it_cannot_combine_with(routing, why):
    with pytest.raises(ConfigError) as err:
        validate(config(n_layer=1, n_experts=4, top_k=2, **routing))
    assert err.value.field == "model.mlp.routing.sparsemixer_eps" and why in str(err.value)


def test_sparsemixer_trains_its_router():
    """A few AdamW steps lower the loss and reach the router through the masked softmax weights."""
    torch.manual_seed(0)
    cfg = validate(config(n_layer=1, n_experts=4, top_k=2, normalize_top_k=False, sparsemixer_eps=0.01))
    model = build_model(cfg)
    losses = short_fit(model, V, 16, steps=15)
    assert losses[-1] < 0.9 * losses[0] and model.blocks[0].mlp.router.weight.grad.abs().sum() > 0


# ---- zero experts (LongCat-Flash)


def test_zero_experts_equal_transformers_longcat_flash_moe():
    """4 SwiGLU experts and 3 zero experts, top-3 of softmax scores with a correction bias, weights × 2.0 and
    not renormalised: archlab's MoE gives transformers' ``LongcatFlashMoE`` output (float32, every weight
    and the bias redrawn); tokens are routed to zero experts, and their weight·x term moves the output."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashMoE

    c = transformers.LongcatFlashConfig(hidden_size=D, n_routed_experts=4, zero_expert_num=3, moe_topk=3,
                                        expert_ffn_hidden_size=8, routed_scaling_factor=2.0, hidden_act="silu")  # fmt: skip
    hf = LongcatFlashMoE(c)
    cfg = config(n_layer=1, n_experts=4, zero_experts=3, top_k=3, expert_d_ff=8, normalize_top_k=False,
                 routed_scale=2.0, correction_bias=True)  # fmt: skip
    ours = MoE(cfg)
    randomise(hf, 0)
    with torch.no_grad():
        hf.router.e_score_correction_bias.copy_(torch.randn(7, generator=torch.Generator().manual_seed(1)) * 0.1)
        ours.router.weight.copy_(hf.router.classifier.weight)
        assert ours.router_bias is not None
        ours.router_bias.copy_(hf.router.e_score_correction_bias)
        gate_up, down = ours.experts.matrices()
        gate_up.copy_(hf.experts.gate_up_proj[:4])  # transformers keeps unused gate_up rows for the zero experts
        down.copy_(hf.experts.down_proj)
        x = torch.randn(2, 10, D, generator=torch.Generator().manual_seed(2))
        expected, got = hf(x), ours(x)
        _, weights, indices = ours.route(x.reshape(-1, D))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    zero = indices >= 4
    assert zero.any() and (~zero).any()
    identity = ((weights * zero).sum(-1, keepdim=True) * x.reshape(-1, D)).view_as(x)
    assert identity.abs().max() > 1e-2  # what the zero experts add


def test_zero_experts_have_no_parameters_but_a_router_row():
    """Closed form: Z zero experts add Z·d router weights and nothing else, in ``num_params`` and in the built
    model; ``active_params`` counts top_k experts, the most one token reaches (min(top_k, n_experts)); the
    description names them."""
    base, zero = (config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=8, zero_experts=z) for z in (0, 3))
    assert MoE.num_params(zero) - MoE.num_params(base) == 3 * D
    assert sum(p.numel() for p in MoE(zero).parameters()) == MoE.num_params(zero) == (4 + 3) * D + 4 * 3 * D * 8
    assert MoE.active_params(zero) - MoE.active_params(base) == 3 * D
    many = config(n_layer=1, n_experts=2, top_k=3, expert_d_ff=8, zero_experts=2)
    assert MoE.active_params(many) == 4 * D + 2 * 3 * D * 8
    assert "top-2 of 4 + 3 zero" in MoE.describe(zero)


def test_every_moe_family_refuses_zero_experts():
    """No family record holds zero experts (LongCat-Flash lacks its shortcut MoE): Mixtral, which holds the
    layout without them, names the field."""
    from archlab.interop.families import FAMILIES

    cfg = config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=8)
    assert FAMILIES["mixtral"].problems(cfg) == []
    zero = dataclasses.replace(
        cfg, mlp=dataclasses.replace(cfg.mlp, routing=RoutingConfig(n_experts=4, top_k=2, zero_experts=2))
    )
    assert [p.field for p in FAMILIES["mixtral"].problems(zero)] == ["model.mlp.routing.zero_experts"]


def test_out_bias_adds_one_vector_to_the_output_counted_in_closed_form():
    """``out_bias`` (JetMoE's): the output is the bias-free MoE's plus the bias, in every row; d more parameters
    per layer, all active, in the closed form as built; refused beside a dense MLP (``beside``)."""
    cfg = config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=4, out_bias=True)
    plain_cfg = config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=4)
    moe = MoE(cfg).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(generator=torch.Generator().manual_seed(p.numel()))
    plain = MoE(plain_cfg).eval()
    plain.load_state_dict({k: v for k, v in moe.state_dict().items() if k != "out_bias"})
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1))
    assert moe.out_bias is not None
    torch.testing.assert_close(moe(x), plain(x) + moe.out_bias)
    assert MoE.num_params(cfg) == MoE.num_params(plain_cfg) + D == sum(p.numel() for p in moe.parameters())
    assert MoE.active_params(cfg) == MoE.active_params(plain_cfg) + D
    with pytest.raises(ConfigError, match=r"model\.mlp\.out_bias.*beside"):
        validate(config(n_layer=1, n_experts=4, top_k=2, expert_d_ff=4, out_bias=True, beside=True))
