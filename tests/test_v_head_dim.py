"""Value heads narrower (or wider) than the query/key heads in causal attention
(``model.attention.v_head_dim``, MiMo-V2-Flash's 128 beside 192): the sublayer equals transformers'
``MiMoV2FlashAttention`` with the same weights, and the attention written out here with sinks, a gate per value
dim and soft-capping; cached decoding equals the full forward; parameters, FLOPs and the KV cache's bytes
follow their closed forms (the bytes those of the tensors the cache holds); every family but MiMo-V2-Flash
refuses it; a bad width is refused."""

import math
from typing import cast

import pytest
import torch
from helpers.hf import families_holding
from helpers.parts import F64, build, tiny

from archlab import ConfigError, count_params
from archlab.accounting import kv_cache_bytes
from archlab.nn.mixers.attention import CausalSelfAttention
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

H, KV, HD, VD = 4, 2, 8, 4  # tiny's heads (d_model 32), values half as wide


def layer(cfg) -> CausalSelfAttention:
    """The first layer's attention of a float64 model of ``cfg``."""
    return cast(CausalSelfAttention, build(cfg).get_submodule("blocks.0.attn"))


def reference(attn, x, a):
    """Project, attend with each head's sink in the denominator and scores soft-capped, gate each value dim
    by sigmoid(x·Wᵀ), project back; values of width VD."""
    B, T, _ = x.shape
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split((H * HD, KV * HD, KV * VD), dim=-1)
    q, k, v = (t.view(B, T, -1, w).transpose(1, 2) for t, w in ((q, HD), (k, HD), (v, VD)))
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    s = q @ k.transpose(-2, -1) / math.sqrt(HD)
    if a.get("softcap"):
        s = a["softcap"] * torch.tanh(s / a["softcap"])
    e = torch.exp(s).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), 0.0)
    denominator = e.sum(-1, keepdim=True) + (torch.exp(attn.sinks).view(1, H, 1, 1) if a.get("sinks") else 0)
    y = ((e / denominator) @ v).transpose(1, 2)  # [B, T, H, VD]
    if a.get("gate"):
        y = y * torch.sigmoid(x @ attn.gate.weight.T + attn.gate.bias).view(B, T, H, VD)
    return y.reshape(B, T, H * VD) @ attn.proj.weight.T + attn.proj.bias


PARTS = {"plain": {}, "sinks-softcap": {"sinks": True, "softcap": 3.0}, "gate-elementwise": {"gate": "elementwise"}}


@pytest.mark.parametrize("a", PARTS.values(), ids=PARTS.keys())
def test_the_sublayer_equals_the_attention_written_out(a):
    attn = layer(tiny(attention={"v_head_dim": VD, **a}))
    assert attn.get_parameter("proj.weight").shape == (32, H * VD)
    x = torch.randn(2, 9, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference(attn, x, a))


def test_the_sublayer_equals_mimo_v2_flash_s_attention():
    """A full-attention layer of transformers' MiMo-V2-Flash (no sinks, values unscaled) with archlab's
    weights, RoPE's identity rotation and a causal mask: the same output in float64."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.mimo_v2_flash.modeling_mimo_v2_flash import MiMoV2FlashAttention

    attn = layer(tiny(attention={"v_head_dim": VD, "qkv_bias": False, "out_bias": False}))
    config = transformers.MiMoV2FlashConfig(
        hidden_size=32, num_attention_heads=H, num_key_value_heads=KV, head_dim=HD, v_head_dim=VD,
        num_hidden_layers=1, layer_types=["full_attention"], attention_value_scale=None,
    )  # fmt: skip
    config._attn_implementation = "eager"
    hf = MiMoV2FlashAttention(config, 0).double().eval()
    with torch.no_grad():
        q, k, v = attn.get_parameter("qkv.weight").split((H * HD, KV * HD, KV * VD))
        for name, w in (("q_proj", q), ("k_proj", k), ("v_proj", v), ("o_proj", attn.get_parameter("proj.weight"))):
            hf.get_parameter(f"{name}.weight").copy_(w)
        x = torch.randn(2, 9, 32, dtype=F64, generator=torch.Generator().manual_seed(2))
        identity = (torch.ones(1, 9, HD, dtype=F64), torch.zeros(1, 9, HD, dtype=F64))
        mask = torch.full((9, 9), float("-inf"), dtype=F64).triu(1).view(1, 1, 9, 9)
        torch.testing.assert_close(attn(x), hf(x, identity, mask)[0])


def test_cached_decoding_equals_the_full_forward():
    model = build(tiny(position={"kind": "rope"}, attention={"v_head_dim": VD, "sinks": True, "window": 4}))
    x = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, cache = model(x), model.new_cache(2, 12)
        steps = [model(x[:, :5], cache), *(model(x[:, t : t + 1], cache) for t in range(5, 12))]
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_parameters_flops_and_kv_cache_bytes_follow_their_closed_forms():
    """Against the same model with values as wide as the keys: per layer d·KV·(hd − vd) fewer q/k/v weights
    (and KV·(hd − vd) biases), H·(hd − vd)·d fewer output ones; 6·H·(hd − vd) fewer FLOPs per key seen; the
    cache KV·(hd − vd) values per position and layer smaller, the bytes of the tensors it holds."""
    narrow, wide = tiny(attention={"v_head_dim": VD}), tiny()
    n, w = count_params(narrow), count_params(wide)
    d, L, T = 32, 2, 24
    assert w["total"] - n["total"] == L * ((d + 1) * KV * (HD - VD) + H * (HD - VD) * d)
    assert w["flops_per_token"] - n["flops_per_token"] == 6 * (w["total"] - n["total"]) + L * 6 * H * (HD - VD) * T
    assert kv_cache_bytes(wide, T) - kv_cache_bytes(narrow, T) == 4 * L * KV * (HD - VD) * T
    model = build(narrow).float()
    cache = model.new_cache(1, T)
    with torch.no_grad():
        model(torch.zeros(1, T, dtype=torch.long), cache)
    held = sum(t.numel() * t.element_size() for t in (*cache.k, *cache.v) if t is not None)
    assert held == kv_cache_bytes(narrow, T)


def test_every_family_but_mimo_v2_flash_refuses_it():
    cfg = tiny(position={"kind": "rope"}, attention={"v_head_dim": VD})
    assert families_holding(cfg, {"model.attention.v_head_dim"}) == {"mimo_v2_flash"}


@pytest.mark.parametrize("value", [0, -4])
def test_a_bad_width_is_refused(value):
    with pytest.raises(ConfigError) as err:
        validate(tiny(attention={"v_head_dim": value}))
    assert err.value.field == "model.attention.v_head_dim"
