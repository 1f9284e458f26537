"""Lightning attention (archlab/nn/mixers/lightning.py), each against an independent expectation: the layer
written out per head and token in float64 from MiniMax-01's equations (its blockwise form at blocks that do
and do not divide the length, its recurrent form token by token through the cache, a document start within
a block), transformers' ``MiniMaxLightningAttention`` with every weight randomised, the slopes, counts,
FLOPs and cache by hand, and the refusals. What every mixer passes (cached decoding, a left-padded batch,
packed documents, gradients, counts, μP roles, a hybrid layout) is test_mixer_contract.py's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import mixer_config, randomise

from archlab import build_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.errors import ConfigError
from archlab.nn.mixers.base import KVCache, Tokens
from archlab.nn.mixers.lightning import Lightning, slopes
from archlab.nn.validation import validate
from tests.helpers.parts import tiny

pytestmark = pytest.mark.usefixtures("single_thread")

D, H, P, L, T = 16, 4, 6, 5, 13  # width of the model, heads, head_dim, layers, length
LIGHTNING = {"kind": "lightning", "n_head": H, "head_dim": P}


def layer(block: int = 4, index: int = 1, dtype=torch.float64) -> Lightning:
    cfg = mixer_config("lightning", d_model=D, n_layer=L, attention=LIGHTNING | {"block_size": block})
    return randomise(Lightning(cfg, index).to(dtype), seed=1).eval()


def by_hand(m: Lightning, x: torch.Tensor, index: int, starts=()) -> torch.Tensor:
    """Per head h and token t, in float64: [q | k | v] = silu(W x) per head; S = exp(−s_h)·S + k·vᵀ (S = 0 at
    a document start); o = qᵀ·S; the heads' outputs RMS-normed together (eps 1e-6) and scaled, times
    sigmoid(W_g x), projected. s_h = 2^(−8(h+1)/H)·(1 − l/(L − 1 + 1e-5) + 1e-5), written here per head."""
    x = x.double()
    qkv = F.silu(x @ m.qkv_proj.weight.double().T).view(x.shape[0], x.shape[1], H, 3 * P)
    s = [2 ** (-8 * (h + 1) / H) * (1 - index / (L - 1 + 1e-5) + 1e-5) for h in range(H)]
    out = torch.zeros(x.shape[0], x.shape[1], H, P, dtype=torch.float64)
    for i in range(x.shape[0]):
        for h in range(H):
            S = torch.zeros(P, P, dtype=torch.float64)
            for t in range(x.shape[1]):
                q, k, v = qkv[i, t, h, :P], qkv[i, t, h, P : 2 * P], qkv[i, t, h, 2 * P :]
                S = (0.0 if t in starts else math.exp(-s[h])) * S + torch.outer(k, v)
                out[i, t, h] = q @ S
    y = out.flatten(2)
    y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * m.norm_weight.double()
    y = y * torch.sigmoid(x @ m.output_gate.weight.double().T)
    return y @ m.proj.weight.double().T


def test_the_slopes_by_hand():
    """4 heads: 2^−2, 2^−4, 2^−6, 2^−8; layer 0 of 5 × (1 + 1e-5), the last × ~2e-5 (it barely decays)."""
    quarters = torch.tensor([4.0**-i for i in (1, 2, 3, 4)], dtype=torch.float64)
    torch.testing.assert_close(slopes(4, 0, 5, torch.float64), quarters * 1.00001)
    last = 1 - 4 / (4 + 1e-5) + 1e-5
    torch.testing.assert_close(slopes(4, 4, 5, torch.float64), quarters * last)


@pytest.mark.parametrize("block", [1, 4, 5, 13, 32])
def test_the_blockwise_form_is_the_recurrence_token_by_token(block):
    """Blocks of 4 and 5 (not dividing 13), 1, 13 and 32 (one block, shorter than it); layer 1 of 5."""
    m = layer(block)
    x = torch.randn(2, T, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), by_hand(m, x, 1), rtol=0, atol=1e-12)


def test_the_recurrent_form_through_the_cache_is_the_recurrence():
    """A prefill of 6 (blockwise, blocks of 4), then the other 7 tokens one by one (the recurrent form from
    the cached state): the per-token reference of the whole sequence."""
    m = layer(4, index=3)
    cfg = mixer_config("lightning", d_model=D, n_layer=L, attention=LIGHTNING | {"block_size": 4})
    cache = KVCache(cfg, 2, T, torch.float64)
    x = torch.randn(2, T, D, dtype=torch.float64)
    with torch.no_grad():
        out = [m(x[:, :6], cache=cache, layer=3)]
        out += [m(x[:, t : t + 1], cache=cache, layer=3) for t in range(6, T)]
        torch.testing.assert_close(torch.cat(out, dim=1), by_hand(m, x, 3), rtol=0, atol=1e-12)
    assert cache.recurrent_state[3].shape == (2, H, P, P)


def test_a_document_start_within_a_block_empties_the_state():
    """Documents starting at 0, 3 and 9 of 13 (blocks of 5: one start inside a block, one inside the next)."""
    m = layer(5)
    x = torch.randn(1, T, D, dtype=torch.float64)
    starts = torch.zeros(1, T, dtype=torch.bool)
    starts[0, [0, 3, 9]] = True
    with torch.no_grad():
        torch.testing.assert_close(m(x, mask=Tokens(None, starts)), by_hand(m, x, 1, {3, 9}), rtol=0, atol=1e-12)


def hf_layer(block: int, index: int):
    """transformers' MiniMaxLightningAttention (layer ``index`` of L) at D, H, P, with its weights randomised;
    its decay buffers are the config's, not drawn."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    config = transformers.MiniMaxConfig(hidden_size=D, num_attention_heads=H, head_dim=P, num_hidden_layers=L,
                                        block_size=block)  # fmt: skip
    hf = MiniMaxLightningAttention(config, index).eval()
    torch.manual_seed(2)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.rand_like(p) * 2 + 0.3 if p.ndim == 1 else torch.randn_like(p) * 0.3)
    return hf


@pytest.mark.parametrize("index", [0, 2, 4])
def test_the_layer_equals_transformers_lightning_attention(index):
    """Float32, 13 positions in blocks of 4 in both; layers 0, 2 and the last of 5 (their slopes); a
    left-padded batch too (HF zeroes the padded q, k, v and still decays the empty state; we keep it)."""
    hf = hf_layer(4, index)
    cfg = mixer_config("lightning", d_model=D, n_layer=L, attention=LIGHTNING | {"block_size": 4})
    ours = Lightning(cfg, index).eval()
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(hf.qkv_proj.weight)
        ours.output_gate.weight.copy_(hf.output_gate.weight)
        ours.norm_weight.copy_(hf.norm.weight)
        ours.proj.weight.copy_(hf.out_proj.weight)
    assert sum(p.numel() for p in hf.parameters()) == Lightning.num_params(cfg)
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, T, dtype=torch.bool)
    padding[0, :4] = False
    with torch.no_grad():
        expected, _ = hf(x, None, None)
        expected_padded, _ = hf(x, None, padding.long())
        got, got_padded = ours(x), ours(x, mask=Tokens(padding))
    assert expected.abs().max() > 0.1  # not a near-zero output that any layer would match
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_padded[padding], expected_padded[padding], rtol=1e-5, atol=1e-5)


def test_counts_flops_and_cache_by_hand():
    """A layer of MiniMax-Text-01 (d 6144, 64 heads of 128, I = 8192): q, k, v, gate 4·6144·8192, the norm
    8192, out 8192·6144 = 251,666,432, as transformers' module holds; its state 64·128² values at any
    length; FLOPs beyond the weights 12·64·128² per token."""
    big = tiny(d_model=6144, attention={"kind": "lightning", "n_head": 64, "head_dim": 128})
    assert Lightning.num_params(big) == 5 * 6144 * 8192 + 8192 == 251_666_432
    assert Lightning.kv_cache_values(big, 10, 0) == Lightning.kv_cache_values(big, 10**6, 0) == 64 * 128 * 128
    assert Lightning.extra_flops(big, 4096, 0) == 12 * 64 * 128 * 128
    transformers = pytest.importorskip("transformers")
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    with torch.device("meta"):
        config = transformers.MiniMaxConfig(hidden_size=6144, num_attention_heads=64, head_dim=128)
        hf = MiniMaxLightningAttention(config, 1)
    assert sum(p.numel() for p in hf.parameters()) == 5 * 6144 * 8192 + 8192


def test_a_model_of_it_counts_its_flops_and_cache():
    """Two lightning layers of 4 heads of 6 in a d 32 model: attention 2·(5·32·24 + 24), FLOPs 6 per
    non-embedding parameter plus 12·4·6² per layer, the cache 4·6² values per layer, float32, at any length;
    held by the built model's cache after a prefill."""
    cfg = tiny(attention=LIGHTNING)
    counts = count_params(cfg)
    assert counts["attention"] == 2 * (5 * 32 * 24 + 24)
    assert counts["flops_per_token"] == 6 * counts["non_embedding"] + 2 * 12 * 4 * 36
    for length in (4, 9, 24):
        assert kv_cache_bytes(cfg, length) == 2 * 4 * 4 * 36
    model = build_model(cfg).eval()
    cache = model.new_cache(1, 9)
    with torch.no_grad():
        model(torch.zeros(1, 9, dtype=torch.long), cache)
    assert [tuple(t.shape) for t in cache.recurrent_state] == [(1, 4, 6, 6)] * 2
    assert all(t is None for t in cache.conv_state)


REFUSED = [
    ({"attention": LIGHTNING | {"head_dim": 0}}, "model.attention.head_dim"),
    ({"attention": LIGHTNING | {"head_dim": None, "n_head": 5}}, "model.attention.n_head"),
    ({"attention": LIGHTNING | {"block_size": 0}}, "model.attention.block_size"),
    ({"attention": LIGHTNING | {"norm_eps": 0.0}}, "model.attention.norm_eps"),
    ({"attention": LIGHTNING | {"n_kv_head": 2}}, "model.attention.n_kv_head"),  # attention's, not its own
    ({"attention": LIGHTNING | {"state_size": 16}}, "model.attention.state_size"),  # mamba2's
]  # fmt: skip


@pytest.mark.parametrize("overrides,field", REFUSED, ids=[f"{f}-{i}" for i, (_, f) in enumerate(REFUSED)])
def test_each_refused_setting_names_its_field(overrides, field):
    with pytest.raises(ConfigError) as error:
        validate(tiny(**overrides))
    assert error.value.field == field
