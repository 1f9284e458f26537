"""Gemma 4's attention options: values RMS-normed without a scale (``v_norm``), values that are the keys'
projection (``v_from_k``) and layers that attend over an earlier layer's keys and values (``kv_shared``),
each against its formula recomputed from the projections; decoding in pieces as whole, with the shared layers
caching nothing; the same gradients under activation checkpointing; the counts by hand; the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import decode_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.accounting import kv_cache_bytes

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["model=nano", "model.d_model=32", "model.n_layer=4", "model.attention.n_head=4", "model.vocab_size=64"]
TINY += ["model/position=rope", "model.attention.n_kv_head=2", "model.context_length=32"]
# local, global (16-wide heads, one KV head, keys as values), then each shared; values normed throughout
KINDS = [
    "model.attention.v_norm=true",
    "model.layers.pattern=[local,global,local_shared,global_shared]",
    "+model.layers.kinds.local.attention.window=4",
    "+model.layers.kinds.global.attention={head_dim: 16, n_kv_head: 1, v_from_k: true}",
    "+model.layers.kinds.local_shared.attention={window: 4, kv_shared: true}",
    "+model.layers.kinds.global_shared.attention={head_dim: 16, n_kv_head: 1, kv_shared: true}",
]
SHARED = [*TINY, *KINDS]


def _attention_io(model, idx):
    """Each block's attention input, rotation and output, by hooks."""
    seen = {}
    hooks = [
        block.attn.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, (args[0], args[1], out)))
        for i, block in enumerate(model.blocks)
    ]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    return seen


def _rms(v):
    return v * (v.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt()


def test_values_from_keys_normed_and_keys_shared_are_their_formulas():
    """Layer 1 (global): values = RMS(k_raw) with k_raw its keys' projection, no value rows; layer 3 shares
    layer 1's keys and values: proj(SDPA(q₃, k₁, v₁)) with q₃ from its own projection (queries alone)."""
    model = randomise(build_model(compose_model(SHARED)), seed=3).eval()
    idx = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(4))
    seen = _attention_io(model, idx)
    glob, shared = model.blocks[1].attn, model.blocks[3].attn
    assert glob.qkv.out_features == (4 + 1) * 16 and shared.qkv.out_features == 4 * 16
    x1, rot1, _ = seen[1]
    x3, rot3, out3 = seen[3]
    with torch.no_grad():
        raw = glob.qkv(x1)[..., 64:].unflatten(-1, (1, 16))
        q1, k1, v1 = glob.project(x1, rot1)
        torch.testing.assert_close(v1, _rms(raw), rtol=1e-5, atol=1e-6)
        q3 = rot3.rotate(shared.qkv(x3).unflatten(-1, (4, 16)))
        y = F.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q3, k1, v1)), is_causal=True, scale=shared.scale, enable_gqa=True
        )
        expected = shared.proj(y.transpose(1, 2).flatten(2))
    torch.testing.assert_close(out3, expected, rtol=1e-5, atol=1e-6)


def test_decoding_in_pieces_is_the_whole_and_checkpointing_keeps_the_gradients():
    """Past the window of 4, through the shared layers' servers' caches; the shared layers cache nothing."""
    model = randomise(build_model(compose_model(SHARED)), seed=6).eval()
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        whole = model(idx)
        cache = model.new_cache(2, 32)
        model(idx[:, :5], cache)
    assert cache.k[2] is None and cache.k[3] is None and cache.k[1] is not None
    torch.testing.assert_close(decode_in_pieces(model, idx, [9, 10, 11, 16]), whole, rtol=1e-5, atol=1e-5)
    grads = []
    for checkpointing in (False, True):
        model.zero_grad()
        model.train()
        model.activation_checkpointing = checkpointing
        model(idx).logsumexp(-1).mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_counts_are_the_closed_form_worked_by_hand():
    """nano's attention has q/k/v and output biases; QK-norms none. Per layer, d = 32, H = 4:
    local (hd 8, KV 2): qkv (32 + 16 + 16)·33, proj 32·32 + 32 -> 3168; global (hd 16, KV 1, values from keys):
    qkv (64 + 16)·33, proj 64·32 + 32 -> 4720; shared: qkv 32·33 + 1056 = 2112 and 64·33 + 2080 = 4192.
    The KV cache of 32 positions: local 4 positions x 2 heads x (8 + 8), global 32 x 1 x (16 + 16), shared 0."""
    counts = count_params(compose_model(SHARED))
    assert counts["attention"] == 3168 + 4720 + 2112 + 4192
    assert kv_cache_bytes(compose_model(SHARED), 32) == 4 * (4 * 2 * 16 + 32 * 1 * 32)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.kv_shared=true"], "model.attention.kv_shared"),  # layer 0 has no server
        # a shared global layer of other heads than its server's
        ([*KINDS[:5], "+model.layers.kinds.global_shared.attention={kv_shared: true}"],
         "model.layers.kinds.global_shared.attention.kv_shared"),
        (["model.attention.v_from_k=true", "model.attention.v_head_dim=4"], "model.attention.v_head_dim"),
        ([*KINDS, "model.layers.loop.passes=2"], "model.layers.loop.passes"),
        ([*KINDS, "model.head.mtp.depth=1"], "model.head.mtp.depth"),
    ],
)  # fmt: skip
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model([*TINY, *overrides])
    assert err.value.field == field
