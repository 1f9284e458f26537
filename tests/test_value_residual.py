"""Value residual learning (``model.attention.value_residual``, ResFormer): a later layer's attention against
the formula recomputed from its own projections and the first layer's values; at λ = (0, 1) the plain model;
decoding in pieces as whole; the same gradients under activation checkpointing; the count; the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import decode_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["model=nano", "model.d_model=32", "model.n_layer=3", "model.attention.n_head=4", "model.vocab_size=64"]
TINY += ["model/position=rope", "model.attention.n_kv_head=2"]
VALUE_RESIDUAL = [*TINY, "model.attention.value_residual=true"]


def _inputs_of_attention(model, idx):
    """Each block's attention input (its normed hidden states), by hooks."""
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


def test_a_later_layer_mixes_its_values_with_the_first_layers():
    """Layer 2's output == proj(SDPA(q₂, k₂, λ₁·v₀ + λ₂·v₂)), each from that layer's own projection of its
    input, every weight random (λ too)."""
    model = randomise(build_model(compose_model(VALUE_RESIDUAL)), seed=3).eval()
    idx = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(4))
    seen = _inputs_of_attention(model, idx)
    first, last = model.blocks[0].attn, model.blocks[2].attn
    x0, rotary0, _ = seen[0]
    x2, rotary2, out2 = seen[2]
    with torch.no_grad():
        _, _, v0 = first.project(x0, rotary0)
        q, k, v2 = last.project(x2, rotary2)
        lam = last.value_mix
        v = lam[0] * v0 + lam[1] * v2
        y = F.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), is_causal=True, scale=last.scale, enable_gqa=True
        )
        expected = last.proj(y.transpose(1, 2).flatten(2))
    torch.testing.assert_close(out2, expected, rtol=1e-5, atol=1e-6)


def test_at_lambda_0_1_it_is_the_plain_model():
    torch.manual_seed(0)
    plain = randomise(build_model(compose_model(TINY)), seed=5).eval()
    residual = build_model(compose_model(VALUE_RESIDUAL)).eval()
    missing = residual.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["blocks.1.attn.value_mix", "blocks.2.attn.value_mix"]
    with torch.no_grad():
        for i in (1, 2):
            residual.blocks[i].attn.value_mix.copy_(torch.tensor([0.0, 1.0]))
        idx = torch.randint(0, 64, (2, 12))
        torch.testing.assert_close(residual(idx), plain(idx), rtol=0, atol=0)


def test_decoding_in_pieces_is_the_whole_and_checkpointing_keeps_the_gradients():
    model = randomise(build_model(compose_model(VALUE_RESIDUAL)), seed=6).eval()
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        whole = model(idx)
    torch.testing.assert_close(decode_in_pieces(model, idx, [9, 10, 11, 16]), whole, rtol=1e-5, atol=1e-5)
    grads = []
    for checkpointing in (False, True):
        model.zero_grad()
        model.train()
        model.activation_checkpointing = checkpointing
        model(idx).logsumexp(-1).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)
    assert grads[0]["blocks.1.attn.value_mix"].abs().sum() > 0 and grads[0]["blocks.0.attn.qkv.weight"].abs().sum() > 0


def test_the_count_adds_two_weights_per_layer_after_the_first():
    assert count_params(compose_model(VALUE_RESIDUAL))["total"] - count_params(compose_model(TINY))["total"] == 2 * 2


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model/layers=local_global", "model.n_layer=4"], "model.layers.kinds.local.attention"),
        (["model/attention=parallel", "model.attention.attention.value_residual=true"], None),
    ],
)
def test_what_it_cannot_hold_is_refused(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model([*VALUE_RESIDUAL, *overrides])
    assert err.value.field == (field or "model.attention.attention.value_residual")
