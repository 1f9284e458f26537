"""Hash-routed experts (``model.mlp.routing.selection: hash``): a fixed table over token ids chooses each
token's experts, the router's scores weigh them (DeepSeek-V4's ``hash_moe`` layers). Held to transformers'
``DeepseekV4SparseMoeBlock`` with every weight and the table randomised; the decoder hands the token ids to
the layer with and without a KV cache; the table adds no parameters; bad combinations are refused."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_moe import config

from archlab import build_model, count_params
from archlab.errors import ConfigError
from archlab.nn.moe import MoE
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

HASH: dict[str, Any] = dict(
    selection="hash", scoring="sqrtsoftplus", n_experts=8, top_k=2, routed_scale=1.5, expert_d_ff=8, n_shared_experts=1
)


def hash_layer_first(**mlp):
    """A 2-layer tiny decoder whose first layer is hash-routed (layer kind ``hash``), the second top-k routed;
    ``mlp``: more MoE fields."""
    cfg = config(n_layer=2, **{k: v for k, v in HASH.items() if k != "selection"}, **mlp)
    kinds = {"hash": {"mlp": {"routing": {**vars(cfg.mlp.routing), "selection": "hash"}}}}
    return validate(dataclasses.replace(cfg, layers=dataclasses.replace(cfg.layers, kinds=kinds, first=["hash"])))


def moe_of(model: Any, layer: int) -> MoE:
    """Layer ``layer``'s MoE of a built decoder."""
    mlp = model.blocks[layer].mlp
    assert isinstance(mlp, MoE)
    return mlp


def test_hash_layer_equals_deepseek_v4_s_block():
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4SparseMoeBlock

    hf_cfg = DeepseekV4Config(
        vocab_size=32,
        hidden_size=16,
        moe_intermediate_size=8,
        num_hidden_layers=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        routed_scaling_factor=1.5,
        swiglu_limit=0.5,
        mlp_layer_types=["hash_moe"],
    )
    hf: Any = DeepseekV4SparseMoeBlock(hf_cfg, 0).eval()
    assert hf.is_hash
    cfg = validate(config(n_layer=1, swiglu_limit=0.5, **HASH))
    ours = MoE(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        hf.gate.tid2eid.copy_(torch.rand(32, 8, generator=g).argsort(-1)[:, :2])
        ours.router.weight.copy_(hf.gate.weight)
        ours.get_buffer("token_experts").copy_(hf.gate.tid2eid)
        w_in, w_out = ours.experts.matrices()  # gate_up [E, 2f, d] (gate rows, then up), down [E, d, f]
        w_in.copy_(hf.experts.gate_up_proj)
        w_out.copy_(hf.experts.down_proj)
        assert ours.shared is not None
        shared = dict(ours.shared.named_parameters())
        hf_shared = hf.shared_experts
        shared["gate_up.weight"].copy_(torch.cat((hf_shared.gate_proj.weight, hf_shared.up_proj.weight)))
        shared["down.weight"].copy_(hf_shared.down_proj.weight)
    x = torch.randn(2, 5, 16, generator=g)
    ids = torch.randint(0, 32, (2, 5), generator=g)
    ours.ids = ids
    with torch.no_grad():
        _, hf_weights, hf_indices = hf.gate(x, ids)
        _, weights, indices = ours.route(x.reshape(-1, 16), ids)
        expected, got = hf(x, input_ids=ids), ours(x)
    assert torch.equal(indices, hf_indices)
    torch.testing.assert_close(weights, hf_weights)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # the table, not the scores, chose: a top-k router of the same weights picks other experts for some token
    topk = F.softplus(x.reshape(-1, 16) @ hf.gate.weight.T).topk(2, dim=-1).indices.sort(-1).values
    assert (topk != indices.sort(-1).values).any(dim=-1).sum() >= 3


def test_the_decoder_hands_each_layer_its_tokens_ids_with_and_without_a_cache():
    torch.manual_seed(0)
    model = build_model(hash_layer_first()).eval()
    hashed = moe_of(model, 0)
    assert hashed.token_experts is not None and moe_of(model, 1).token_experts is None
    idx = torch.tensor([[3, 7, 3, 9, 11, 7], [5, 5, 2, 30, 1, 0]])
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2)
        steps = [model(idx[:, :3], cache)] + [model(idx[:, t : t + 1], cache) for t in range(3, 6)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
        # token 9's experts swapped for others: the logits change from its position (3 in row 0) on, not before
        table = hashed.get_buffer("token_experts")
        table[9] = torch.tensor([e for e in range(8) if e not in table[9].tolist()][:2])
        moved = model(idx)
    assert torch.equal(moved[:, :3], full[:, :3]) and torch.equal(moved[1], full[1])
    assert (moved[0, 3:] != full[0, 3:]).any(dim=-1).all()


def test_init_draws_distinct_experts_per_token_and_adds_no_parameters():
    torch.manual_seed(0)
    cfg = validate(config(n_layer=1, **HASH))
    table = moe_of(build_model(cfg), 0).get_buffer("token_experts")
    assert table.shape == (32, 2) and table.dtype == torch.long
    assert (table[:, 0] != table[:, 1]).all() and table.min() >= 0 and table.max() < 8
    assert len(set(table[:, 0].tolist())) > 4  # drawn, not one expert for every token
    assert count_params(cfg) == count_params(config(n_layer=1, **dict(HASH, selection="scores")))
    assert "token_experts" in moe_of(build_model(cfg), 0).state_dict()  # saved with the model


def test_balance_loss_leaves_the_hash_layer_out_and_the_z_loss_does_not():
    torch.manual_seed(0)
    model = build_model(hash_layer_first(aux_loss_weight=0.01, z_loss_weight=0.001)).train()
    model(torch.randint(0, 32, (2, 6)))
    assert set(moe_of(model, 0).aux_losses) == {"router_z"}
    assert set(moe_of(model, 1).aux_losses) == {"moe_balance", "router_z"}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (dict(selection="table"), "model.mlp.routing.selection"),
        (dict(correction_bias=True), "model.mlp.routing.correction_bias"),
        (dict(n_groups=2, top_groups=2), "model.mlp.routing.n_groups"),
    ],
)
def test_bad_values_are_refused_naming_the_field(fields, field):
    with pytest.raises(ConfigError) as err:
        validate(config(n_layer=1, **dict(HASH, **fields)))
    assert err.value.field == field


def test_a_multi_token_prediction_block_may_not_be_hash_routed():
    cfg = config(n_layer=1, **HASH)
    cfg = dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, mtp=dataclasses.replace(cfg.head.mtp, depth=1)))
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.field == "model.head.mtp.layer"


def test_every_family_refuses_it_naming_the_field():
    from helpers.hf import families_holding, families_of_its_mixers

    cfg = validate(config(n_layer=1, **dict(HASH, scoring="softmax")))
    assert len(families_of_its_mixers(cfg)) >= 5
    assert families_holding(cfg, {"model.mlp.routing.selection"}) == set()


def test_activation_checkpointing_recomputes_with_the_same_tokens():
    """The recomputation inside backward routes by the ids the forward was handed: gradients as without it."""
    torch.manual_seed(0)
    model = build_model(hash_layer_first()).train()
    idx = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(3))
    grads = []
    for recompute in (False, True):
        model.zero_grad()
        model.activation_checkpointing = recompute
        model(idx).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "blocks.0.mlp.router.weight" in grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7)
