"""Shared blocks (``model.layers.shared``, Zamba's): a use computes, from the weights, what the block written out
by hand does ([x, e] normed, attention with heads of 2·d/H scaled as heads of d/H, RoPE, the use's low-rank
adapters, a gated MLP, the use's linear) and adds it to the layer's input before its norm, not to the residual;
cached decoding (each use its own keys and values) and a left-padded row equal the full forward of the row
alone; the counts by hand (each block once, each use's own, FLOPs and cache per use); a short fit reaches every
weight; each bad value one ConfigError naming the field; the fields unread without a use reported."""

from __future__ import annotations

import math
from typing import cast

import pytest
import torch
import torch.nn.functional as F
from helpers.parts import attention, build, check_fits, rms, tokens
from omegaconf import OmegaConf

from archlab import build_model, count_params
from archlab.accounting import check_build, kv_cache_bytes
from archlab.cli.check import _layout
from archlab.config import to_model_config
from archlab.errors import ConfigError
from archlab.nn.block import Block
from archlab.nn.validation import ignored, validate
from archlab.training.parametrization import roles

pytestmark = pytest.mark.usefixtures("single_thread")

EPS = 1e-3
SHARED = dict(layers=[1], n_head=4, n_kv_head=2, d_ff=24, adapter_rank=2, attention_adapters=True, rope=True)


def config(n_layer: int = 2, shared=SHARED, **overrides):
    """d_model 16, causal attention of 2 heads, RMSNorm (eps 1e-3), no positions, vocab 48; the shared block's
    fields ``shared``."""
    base = dict(vocab_size=48, context_length=16, n_layer=n_layer, d_model=16, norm={"kind": "rmsnorm", "eps": EPS})
    base |= dict(position={"kind": "none"}, attention={"n_head": 2}, layers={"shared": shared})
    return to_model_config(OmegaConf.merge(base, overrides))


def rotated(x, pos, theta=10000.0):
    """RoPE on whole heads ``[B, H, T, hd]``, pairing dim i with i + hd/2 (transformers' rotate_half), its
    cos and sin in float32 as transformers computes them."""
    hd = x.shape[-1]
    angle = pos[:, None].float() * (1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    cos, sin = (torch.cat((t, t), -1).double() for t in (angle.cos(), angle.sin()))
    return x * cos + torch.cat((-x[..., hd // 2 :], x[..., : hd // 2]), -1) * sin


def lora(x, shared, adapter):
    return x @ shared.weight.T + x @ adapter.down.weight.T @ adapter.up.weight.T


def use_by_hand(model, x, e):
    """The one use's output, written out from the shared block's and the use's weights."""
    block, use = model.shared.blocks[0], model.shared.uses[0]
    B, T, d = x.shape
    H, KV, hd = 4, 2, 2 * d // 4
    h = rms(torch.cat((x, e), -1), block.attn_norm.weight, EPS)
    q, k, v = (lora(h, getattr(block, n), getattr(use, n)).view(B, T, -1, hd).transpose(1, 2) for n in "qkv")
    pos = torch.arange(T)
    q, k = rotated(q, pos), rotated(k, pos)
    k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
    y = attention(q, k, v, 1 / math.sqrt(hd / 2)).transpose(1, 2).reshape(B, T, H * hd) @ block.proj.weight.T
    h = rms(y, block.mlp_norm.weight, EPS)
    gate, up = lora(h, block.gate_up, use.gate_up).chunk(2, -1)
    return (F.gelu(gate) * up) @ block.down.weight.T @ use.out.weight.T


def test_a_use_joins_the_layers_input_before_its_norm_not_the_residual():
    model = build(config())
    idx = tokens(model.cfg, 9)
    with torch.no_grad():
        e = model.tok_emb(idx)
        first, b = cast("list[Block]", list(model.blocks))
        x = first(e)
        assert b.attn_norm is not None and b.mlp is not None and b.mlp_norm is not None and model.final_norm is not None
        x = x + b.attn(b.attn_norm(x + use_by_hand(model, x, e)))  # the residual is x, not x + the use's output
        x = x + b.mlp(b.mlp_norm(x))
        torch.testing.assert_close(model(idx), model.head(model.final_norm(x)), rtol=1e-10, atol=1e-10)


def mamba_config(**shared):
    """4 Mamba-2 layers (no MLP), two shared blocks used before layers 0, 2 and 3."""
    fields = dict(SHARED, layers=[0, 2, 3], blocks=2, **shared)
    mamba = {"kind": "mamba2", "n_head": 2, "state_size": 4, "scan_chunk": 4}
    return config(4, fields, attention=mamba, mlp={"kind": "none"})


def test_cached_decoding_and_left_padding_equal_the_full_forward():
    model = build(mamba_config())
    idx = tokens(model.cfg, 10)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 10)
        pieces = [model(idx[:, :6], cache), *(model(idx[:, t : t + 1], cache) for t in range(6, 10))]
        torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-9, atol=1e-9)
        n = model.cfg.n_layer
        assert [None if t is None else tuple(t.shape) for t in cache.k[n:]] == [(2, 2, 10, 8)] * 3  # each use's keys
        padded = torch.cat((torch.zeros(2, 3, dtype=torch.long), idx[:, :7]), 1)
        mask = torch.cat((torch.zeros(2, 3), torch.ones(2, 7)), 1).long()
        torch.testing.assert_close(model(padded, attention_mask=mask)[:, 3:], full[:, :7], rtol=1e-9, atol=1e-9)


def test_counts_by_hand():
    """d 16, heads 4 of 8 (2 key/value), d_ff 24, rank 2, two uses of one block: a block 2d + d (norms) +
    2d·(4 + 2·2)·8 (q, k, v) + 32·d (out) + 3·d·24 (MLP) = 3760; a use 2·(d + 48) + 2·(2d + 32) + 2·2·(2d + 16)
    (adapters) + d·d = 704."""
    cfg = config(3, dict(SHARED, layers=[0, 2]))
    plain = config(3, {"layers": []})
    counts, without = count_params(cfg), count_params(plain)
    assert counts["shared"] == 3760 + 2 * 704
    assert counts["total"] - without["total"] == 3760 + 2 * 704
    check_build(cfg, build_model(cfg))
    T = cfg.context_length
    extra = 6 * (3760 + 2 * 704 + 3760) + 12 * 2 * 4 * 8 * T  # the block's weights and scores again per use
    assert counts["flops_per_token"] - without["flops_per_token"] == extra
    assert kv_cache_bytes(cfg) - kv_cache_bytes(plain) == 4 * 2 * 2 * 2 * 8 * T  # keys and values per use


def test_training_reaches_every_weight():
    check_fits(mamba_config(), 12, steps=10, every_grad=True)


def test_every_parameter_has_a_mup_role():
    model = build_model(mamba_config())
    assert set(roles(model)) == {id(p) for p in model.parameters()}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"layers": [1, 1]}, "model.layers.shared.layers"),
        ({"layers": [2]}, "model.layers.shared.layers"),
        ({"blocks": 2}, "model.layers.shared.blocks"),
        ({"n_head": 3}, "model.layers.shared.n_head"),
        ({"n_kv_head": 3}, "model.layers.shared.n_kv_head"),
        ({"adapter_rank": 0}, "model.layers.shared.attention_adapters"),
        ({"d_ff": 0}, "model.layers.shared.d_ff"),
    ],
)
def test_a_bad_value_is_one_config_error_naming_it(changes, field):
    with pytest.raises(ConfigError) as err:
        validate(config(shared=dict(SHARED, **changes)))
    assert err.value.field == field


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"block": {"kind": "post"}}, "model.block.kind"),
        ({"layers": {"loop": {"passes": 2}}}, "model.layers.loop.passes"),
    ],
)
def test_a_wiring_a_use_cannot_join_is_refused(overrides, field):
    with pytest.raises(ConfigError) as err:
        validate(config(**overrides))
    assert err.value.field == field


def test_fields_unread_without_a_use_or_rope_are_reported():
    found = ignored(config(shared={"layers": [], "adapter_rank": 4}))
    assert [(i.field, i.value) for i in found] == [("model.layers.shared.adapter_rank", 4)]
    found = ignored(config(shared=dict(SHARED, rope=False, rope_theta=500.0)))
    assert [(i.field, i.value) for i in found] == [("model.layers.shared.rope_theta", 500.0)]


def test_archlab_check_says_the_uses():
    assert "shared=2 blocks before layers 0,2,3, rank-2 adapters" in _layout(mamba_config())
