"""The position schemes of archlab/nn/positions.py: ALiBi's slope multiplier and bfloat16 rounding
(Falcon-RW), each against an independent float64 formula and transformers' own ``build_alibi_tensor``, their
validation and ``reads``, the Hugging Face families' refusals and a short fit (RoPE's: tests/test_rope.py)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.hf import families_of_its_mixers
from helpers.parts import F64, LONGROPE, check_fits, nano

from archlab import build_model
from archlab.errors import ConfigError
from archlab.nn.positions import ALiBi
from archlab.nn.validation import ignored

pytestmark = pytest.mark.usefixtures("single_thread")

FALCON_RW = dict(alibi_scale=0.25, alibi_rounding="bf16")  # 1/sqrt(head_dim) for heads of 16


def slopes64(n_head: int) -> torch.Tensor:
    """Press et al.'s slopes 2^(-8k/n), k = 1..n, for a power of two n; else those of the power of two
    below, then every other one of twice it (k = 1, 3, ...) (written out, not archlab's)."""
    n = 2 ** math.floor(math.log2(n_head))
    extra = [2.0 ** (-8.0 * k / (2 * n)) for k in range(1, 2 * (n_head - n), 2)]
    return torch.tensor([2.0 ** (-8.0 * k / n) for k in range(1, n + 1)] + extra, dtype=F64)


def test_alibi_scale_multiplies_every_slope():
    """bias[h, q, k] = scale · slope_h · (k − q); the default scale leaves today's ALiBi bit for bit."""
    q, k = torch.arange(5, 9), torch.arange(9)
    expected = slopes64(4)[:, None, None] * (k[None, :] - q[:, None]).to(F64)
    plain = ALiBi(nano("alibi")).bias(q, k)
    scaled = ALiBi(nano("alibi", alibi_scale=0.125)).bias(q, k)
    torch.testing.assert_close(plain.double(), expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(scaled.double(), 0.125 * expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("n_head", [4, 6, 32])
def test_alibi_bf16_is_falcon_rw(n_head):
    """Falcon-RW's bias: transformers' ``build_alibi_tensor`` (bf16 slope × key position in bf16) over
    sqrt(head_dim) = 4, exactly, on one row and on a left-padded batch (per query, the distance form shifted);
    each bias within bf16's rounding (2^-7 relative, slope and product rounded) of the float64 one."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    alibi = ALiBi(nano("alibi", n_head, **FALCON_RW))
    T = 600
    ref = build_alibi_tensor(torch.ones(1, T, dtype=torch.long), n_head, torch.float32).view(n_head, T) / 4
    got = alibi.bias(torch.arange(T - 3, T), torch.arange(T))
    assert torch.equal(got, ref[:, None, :].expand_as(got))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ref_padded = build_alibi_tensor(mask, n_head, torch.float32).view(2, n_head, 1, 6) / 4
    got_padded = alibi.bias(positions, positions)
    assert torch.equal(got_padded * mask[:, None, None, :], ref_padded.expand_as(got_padded))
    exact = 0.25 * slopes64(n_head)[:, None] * torch.arange(T, dtype=F64)
    assert ((got[:, 0].double() - exact).abs() <= exact * 2**-7).all()
    assert (got[:, 0].double() - exact).abs().max() > 1e-3  # rounded: at key 599, to a step of 2^-8 of it


def test_alibi_validation_and_reads():
    with pytest.raises(ConfigError, match="model.position.alibi_scale"):
        build_model(nano("alibi", alibi_scale=0.0))
    with pytest.raises(ConfigError, match="model.position.alibi_rounding.*bf16"):
        build_model(nano("alibi", alibi_rounding="fp8"))
    assert ignored(nano("alibi", **FALCON_RW)) == []
    # each scheme's own fields: another's is refused naming the scheme and its fields
    with pytest.raises(ConfigError, match=r"model.position.alibi_scale=0.5 .*a field of position rope: kind, theta, "):
        nano("rope", alibi_scale=0.5)
    with pytest.raises(ConfigError, match=r"model.position.scaling=.*a field of position alibi: kind, alibi_scale, "):
        nano("alibi", **LONGROPE)


def test_every_hf_family_refuses_falcon_alibi():
    """No family but Falcon converts ALiBi's multiplier or rounding: each names the field."""
    falcon_rw = nano("alibi", **FALCON_RW)
    alibi = {"model.position.alibi_scale", "model.position.alibi_rounding"}
    for name, family in families_of_its_mixers(falcon_rw).items():
        fields = {p.field for p in family.problems(falcon_rw)}
        assert alibi.isdisjoint(fields) if name == "falcon" else alibi <= fields, name


def test_falcon_rw_alibi_trains():
    """A few AdamW steps on one repeated batch of 32 tokens lower the loss."""
    check_fits(nano("alibi", **FALCON_RW), 32)
