"""DeepSeek-V4's router scores (``model.mlp.routing.scoring: sqrtsoftplus``): sqrt(softplus(logits)),
chosen with the correction bias and weighed as sigmoid scores are. Held to transformers'
``DeepseekV4TopKRouter`` (weight and correction bias randomised); the balance loss normalises the scores
as for sigmoid; every family but none holds it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_moe import config

from archlab.nn.moe import MoE
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

V4: dict[str, Any] = dict(scoring="sqrtsoftplus", n_experts=8, top_k=2, correction_bias=True, routed_scale=1.5)


def test_it_routes_as_deepseek_v4_s_top_k_router():
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

    hf: Any = DeepseekV4TopKRouter(
        DeepseekV4Config(hidden_size=16, n_routed_experts=8, num_experts_per_tok=2, routed_scaling_factor=1.5)
    )
    assert hf.score_fn.__class__.__name__ == "SqrtSoftplusActivation"  # V4's default scoring_func
    ours = MoE(validate(config(n_layer=1, **V4)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(8, 16, generator=g))
        hf.e_score_correction_bias.copy_(torch.randn(8, generator=g))
        ours.router.weight.copy_(hf.weight)
        ours.get_buffer("router_bias").copy_(hf.e_score_correction_bias)
        x = torch.randn(64, 16, generator=g)
        hf_logits, hf_weights, hf_indices = hf(x)
        logits, weights, indices = ours.route(x)
    torch.testing.assert_close(logits, hf_logits)
    order, hf_order = indices.argsort(-1), hf_indices.argsort(-1)
    assert torch.equal(indices.gather(-1, order), hf_indices.gather(-1, hf_order))
    torch.testing.assert_close(weights.gather(-1, order), hf_weights.gather(-1, hf_order))
    # not sigmoid's choice: the same weights and bias pick other experts for some tokens
    sigmoid = (logits.sigmoid() + hf.e_score_correction_bias).topk(2, dim=-1).indices.sort(-1).values
    assert (sigmoid != indices.sort(-1).values).any(dim=-1).sum() >= 1


def test_the_balance_loss_normalises_its_scores():
    torch.manual_seed(0)
    moe = MoE(validate(config(n_layer=1, **dict(V4, correction_bias=False), aux_loss_weight=0.1))).train()
    x = torch.randn(20, 16)
    logits, _, indices = moe.route(x)
    scores = F.softplus(logits).sqrt()
    probs = scores / scores.sum(-1, keepdim=True)
    chose = torch.zeros(20, 8).scatter_(-1, indices, 1.0).mean(0)
    weight, loss = moe.auxiliary(logits, indices)["moe_balance"]
    assert weight == 0.1
    torch.testing.assert_close(loss, 8 * (chose * probs.mean(0)).sum())


def test_every_mixture_of_experts_family_refuses_it_naming_the_field():
    """Each family that holds a MoE layer (its problems do not name the MLP kind) names the scoring: Cohere2-MoE
    wrote it into its ``expert_selection_fn`` before, which has no sqrtsoftplus."""
    from helpers.hf import families_of_its_mixers

    cfg = validate(config(n_layer=1, **dict(V4, correction_bias=False)))
    problems = {name: {p.field for p in f.problems(cfg)} for name, f in families_of_its_mixers(cfg).items()}
    sparse = {name for name, fields in problems.items() if "model.mlp.kind" not in fields}
    assert {"mixtral", "qwen3_moe", "cohere2_moe"} <= sparse
    assert {name for name in sparse if "model.mlp.routing.scoring" not in problems[name]} == set()
