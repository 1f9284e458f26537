"""Mixture of attention heads (archlab/nn/mixers/moa.py): one layer against transformers' JetMoeAttention (its
``JetMoeMoA`` experts and shared keys/values, every weight randomised, RoPE on) on a causal and a left-padded
batch, the load-balancing loss against transformers' ``load_balancing_loss_func``, the refusals. The contract
suite (tests/test_mixer_contract.py) covers the KV cache, padding, gradients and the closed-form counts."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
from helpers.mixers import mixer_config, randomise

from archlab import ConfigError, build_model
from archlab.nn.mixers.moa import MixtureOfAttention
from archlab.nn.positions import POSITIONS

transformers = pytest.importorskip("transformers")
jetmoe: Any = pytest.importorskip("transformers.models.jetmoe.modeling_jetmoe")
pytestmark = pytest.mark.usefixtures("single_thread")

SIZES = {"n_head": 4, "head_dim": 6, "n_experts": 3, "top_k": 2}
# float64 layers, but transformers' gates (its router's `.float()`) and RoPE tables are float32: ~1e-6 apart
CLOSE = 1e-5


def _pair(seed: int = 0):
    """Our layer and transformers' JetMoeAttention of the same sizes, float64, ours randomised and copied."""
    cfg = mixer_config("moa", attention=SIZES)
    ours = cast(MixtureOfAttention, randomise(MixtureOfAttention(cfg).double(), seed).eval())
    hf_cfg = transformers.JetMoeConfig(
        hidden_size=32, num_key_value_heads=4, kv_channels=6, num_local_experts=3, num_experts_per_tok=2,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.position.theta},
    )  # fmt: skip
    hf_cfg._attn_implementation = "eager"
    theirs = jetmoe.JetMoeAttention(hf_cfg, layer_idx=0).double().eval()
    with torch.no_grad():
        theirs.experts.router.layer.weight.copy_(ours.router.weight)
        theirs.kv_proj.weight.copy_(ours.kv.weight)
        theirs.experts.input_linear.weight.copy_(ours.q_experts)
        theirs.experts.output_linear.weight.copy_(ours.o_experts)
        theirs.experts.bias.copy_(ours.bias)
    return cfg, ours, theirs, jetmoe.JetMoeRotaryEmbedding(hf_cfg)


def test_a_layer_equals_transformers_jetmoe_attention():
    """Causal, RoPE at positions 0..T-1: the same output (to transformers' float32 gates and tables)."""
    cfg, ours, theirs, rope = _pair()
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(9)
    mask = torch.full((9, 9), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    expected = theirs(x, attention_mask=mask, position_embeddings=rope(x, pos[None]))[0]
    got = ours(x, POSITIONS.get("rope")(cfg).rotary(pos, torch.float64))
    torch.testing.assert_close(got, expected, rtol=CLOSE, atol=CLOSE)


def test_a_left_padded_row_equals_transformers_with_its_mask():
    """Row 0 left-padded by 3 (positions counted from its first token, keys before it hidden): each row's
    tokens as transformers computes them under the same mask."""
    cfg, ours, theirs, rope = _pair(seed=2)
    x = torch.randn(2, 8, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    pos = torch.stack((torch.arange(8) - 3, torch.arange(8))).clamp(min=0)
    visible = torch.ones(8, 8, dtype=torch.bool).tril()[None].repeat(2, 1, 1)
    visible[0, :, :3] = False
    visible[0, :3, :3] = torch.eye(3, dtype=torch.bool)  # a padded query sees itself only (no empty row)
    bias = torch.zeros(2, 1, 8, 8, dtype=torch.float64).masked_fill(~visible[:, None], float("-inf"))
    expected = theirs(x, attention_mask=bias, position_embeddings=rope(x, pos))[0]
    got = ours(x, POSITIONS.get("rope")(cfg).rotary(pos, torch.float64), visible[:, None])
    torch.testing.assert_close(got[0, 3:], expected[0, 3:], rtol=CLOSE, atol=CLOSE)
    torch.testing.assert_close(got[1], expected[1], rtol=CLOSE, atol=CLOSE)


def test_the_balance_loss_equals_transformers_for_one_layer():
    """``moa_balance`` in training, times its weight, is HF's ``load_balancing_loss_func`` of the layer's
    logits; none at weight 0 or in eval."""
    cfg = mixer_config("moa", attention=SIZES | {"aux_loss_weight": 0.01})
    layer = cast(MixtureOfAttention, randomise(MixtureOfAttention(cfg).double(), 4).train())
    x = torch.randn(2, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    layer(x)
    weight, loss = layer.aux_losses["moa_balance"]
    logits = torch.nn.functional.linear(x.reshape(-1, 32), layer.router.weight.detach())
    assert weight == 0.01
    assert loss.detach().item() == pytest.approx(float(jetmoe.load_balancing_loss_func((logits,), 3, 2)), rel=1e-6)
    layer.eval()
    layer(x)
    assert layer.aux_losses == {}


def test_a_model_collects_the_balance_loss_of_its_layers():
    """The decoder's auxiliary losses hold moa_balance, the mean of its two layers'."""
    model = build_model(mixer_config("moa", attention=SIZES | {"aux_loss_weight": 0.5})).train()
    model(torch.randint(0, 48, (2, 6)))
    layers = [cast(MixtureOfAttention, block.attn).aux_losses["moa_balance"][1] for block in model.blocks]
    weight, loss = model.auxiliary_losses()["moa_balance"]
    assert weight == 0.5 and loss.item() == pytest.approx(torch.stack(layers).mean().item())


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("top_k", 4, "from 1 to model.attention.n_experts=3"),
        ("n_experts", 0, "a positive integer"),
        ("aux_loss_weight", -1.0, "non-negative"),
        ("head_dim", 0, "a positive integer, or null"),
    ],
)
def test_bad_sizes_are_refused_naming_the_field(field, value, allowed):
    with pytest.raises(ConfigError, match=rf"model\.attention\.{field}.*{allowed}"):
        build_model(mixer_config("moa", attention=SIZES | {field: value}))


def _step(checkpointing: bool = False, compiled: bool = False) -> tuple[float, dict[str, torch.Tensor]]:
    """One training step's balance loss and gradients of a 2-layer moa model (the balance loss on), with
    activation checkpointing (the forward re-run in backward) or each block under ``torch.compile``."""
    cfg = mixer_config("moa", attention=SIZES | {"aux_loss_weight": 0.1})
    idx = torch.randint(0, 48, (2, 8), generator=torch.Generator().manual_seed(10))
    torch.manual_seed(0)
    model = build_model(cfg).train()
    model.activation_checkpointing = checkpointing
    if compiled:
        for block in model.blocks:
            block.compile(backend="aot_eager")
    loss = model(idx).square().mean()
    weight, balance = model.auxiliary_losses()["moa_balance"]
    (loss + weight * balance).backward()
    return balance.item(), {n: cast(torch.Tensor, p.grad).clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "variant",
    [{"checkpointing": True}, pytest.param({"compiled": True}, marks=pytest.mark.slow)],
    ids=["checkpointing", "compiled"],
)
def test_checkpointing_and_compiled_blocks_give_the_eager_loss_and_gradients(variant):
    """Checkpointing, and compiled blocks (aot_eager: dynamo and AOT autograd, the dispatch's data-dependent
    sizes breaking the graph; slow, ~4 s), give the eager step's balance loss and gradients."""
    balance, grads = _step()
    other_balance, other = _step(**variant)
    assert other_balance == pytest.approx(balance)
    for n in grads:
        torch.testing.assert_close(other[n], grads[n], rtol=1e-5, atol=1e-7, msg=f"{variant} {n}")


def test_a_per_head_bias_reaches_every_chosen_expert_s_head():
    """A per-head bias (ALiBi's, [1, H, T, T] as the model builds it) biases head j of every chosen expert as
    key/value head j: the layer equals its experts run token by token and head by head with that bias, their
    outputs weighted by the router and summed (make explore drew such a layer of 2 heads: it raised)."""
    cfg = mixer_config("moa", attention=SIZES, position={"kind": "alibi"})
    layer = cast(MixtureOfAttention, randomise(MixtureOfAttention(cfg).double(), 3).eval())
    T, d, H, hd, k = 7, cfg.d_model, SIZES["n_head"], SIZES["head_dim"], SIZES["top_k"]
    bias = POSITIONS.get("alibi")(cfg).bias(torch.arange(T), torch.arange(T)).double()  # [H, T, T]
    mask = torch.where(torch.ones(T, T, dtype=torch.bool).tril(), bias, float("-inf"))[None]
    x = torch.randn(1, T, d, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    got = layer(x, None, mask)
    with torch.no_grad():
        keys, values = layer.kv(x[0]).view(T, 2, H, hd).unbind(1)
        _, weights, experts = layer.route(x[0])
        expected = torch.zeros(T, d, dtype=torch.float64)
        for t in range(T):
            for slot in range(k):
                e = int(experts[t, slot])
                q = (layer.q_experts[e] @ x[0, t]).view(H, hd)
                scores = torch.einsum("hd,shd->hs", q, keys[: t + 1]) * layer.scale + bias[:, t, : t + 1]
                heads = torch.einsum("hs,shd->hd", scores.softmax(-1), values[: t + 1])
                expected[t] += weights[t, slot] * (layer.o_experts[e] @ heads.flatten())
        expected += cast(torch.Tensor, layer.bias)
    torch.testing.assert_close(got[0], expected, rtol=1e-10, atol=1e-10)
