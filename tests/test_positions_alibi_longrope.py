"""ALiBi's slope multiplier and bfloat16 rounding (Falcon-RW) and RoPE's LongRoPE scaling (Phi-3): each
against an independent float64 formula and transformers' own code, their validation and ``reads``, the
Hugging Face families' refusals, KV-cache decoding across LongRoPE's switch, and a short fit."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from helpers.hf import families_of_its_mixers
from helpers.parts import short_fit

from archlab import build_model, compose_model
from archlab.config import POSITION_OPTIONS, to_model_config
from archlab.errors import ConfigError
from archlab.generate import generate
from archlab.nn.positions import ALiBi
from archlab.nn.rope import RoPE, attention_factor, inverse_frequencies
from archlab.nn.validation import ignored

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
SHORT = [1.0 + 0.1 * i for i in range(8)]  # 8 pairs: head_dim 16 rotated whole
LONG = [1.0 + 0.7 * i for i in range(8)]
LONGROPE = dict(scaling=dict(kind="longrope", short_factor=SHORT, long_factor=LONG, original_context=16, factor=4.0))


def longrope(**scaling) -> dict:
    """LONGROPE with these fields of its scaling changed."""
    return {"scaling": {**LONGROPE["scaling"], **scaling}}


FALCON_RW = dict(alibi_scale=0.25, alibi_rounding="bf16")  # 1/sqrt(head_dim) for heads of 16


@functools.cache
def _nano():
    return compose_model(["model=nano", "model.n_layer=2", "model.d_model=64", "model.attention.n_head=4",
                          "model.context_length=32", "model.vocab_size=64"])  # fmt: skip


def tiny(kind: str, n_head: int = 4, **position):
    """nano with 2 layers, ``n_head`` heads of 16, context 32, vocab 64, and this position scheme."""
    cfg = _nano()
    attention = dataclasses.replace(cfg.attention, n_head=n_head)
    return dataclasses.replace(cfg, d_model=16 * n_head, attention=attention,
                               position=POSITION_OPTIONS.make(kind=kind, **position))  # fmt: skip


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
    plain = ALiBi(tiny("alibi")).bias(q, k)
    scaled = ALiBi(tiny("alibi", alibi_scale=0.125)).bias(q, k)
    torch.testing.assert_close(plain.double(), expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(scaled.double(), 0.125 * expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("n_head", [4, 6, 32])
def test_alibi_bf16_is_falcon_rw(n_head):
    """Falcon-RW's bias: transformers' ``build_alibi_tensor`` (bf16 slope × key position in bf16) over
    sqrt(head_dim) = 4, exactly, on one row and on a left-padded batch (per query, the distance form shifted);
    each bias within bf16's rounding (2^-7 relative, slope and product rounded) of the float64 one."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    alibi = ALiBi(tiny("alibi", n_head, **FALCON_RW))
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
        build_model(tiny("alibi", alibi_scale=0.0))
    with pytest.raises(ConfigError, match="model.position.alibi_rounding.*bf16"):
        build_model(tiny("alibi", alibi_rounding="fp8"))
    assert ignored(tiny("alibi", **FALCON_RW)) == []
    # each scheme's own fields: another's is refused naming the scheme and its fields
    with pytest.raises(ConfigError, match=r"model.position.alibi_scale=0.5 .*a field of position rope: kind, theta, "):
        tiny("rope", alibi_scale=0.5)
    with pytest.raises(ConfigError, match=r"model.position.scaling=.*a field of position alibi: kind, alibi_scale, "):
        tiny("alibi", **LONGROPE)


def hf_longrope(seq_len):
    """transformers' inverse frequencies and attention factor for LONGROPE's settings (Phi-3's config)."""
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import _compute_longrope_parameters

    c = Phi3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                   original_max_position_embeddings=16, rope_parameters={"rope_type": "longrope",
                   "rope_theta": 10000.0, "short_factor": SHORT, "long_factor": LONG})  # fmt: skip
    return c, _compute_longrope_parameters(c, None, seq_len=seq_len)


def test_longrope_frequencies_and_attention_factor():
    """Short and long inverse frequencies equal transformers' exactly and 1 / (factor_i · θ^(2i/d)) in
    float64; the attention factor is sqrt(1 + ln 4 / ln 16) (factor = 64 / 16, Phi-3's default)."""
    p = tiny("rope", **LONGROPE).position
    for long, seq_len, factors in ((False, 16, SHORT), (True, 17, LONG)):
        _, (hf_inv, hf_factor) = hf_longrope(seq_len)
        got = inverse_frequencies(p, 16, long=long)
        assert torch.equal(got, hf_inv)
        hand = torch.tensor([1 / (f * 10000.0 ** (2 * i / 16)) for i, f in enumerate(factors)], dtype=F64)
        torch.testing.assert_close(got.double(), hand, rtol=1e-6, atol=0)
        assert attention_factor(p.scaling) == pytest.approx(hf_factor, rel=1e-15)
    assert attention_factor(p.scaling) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))


def test_longrope_picks_factors_per_forward_as_transformers():
    """cos and sin for 16 positions (the short factors) and for 17 (the long ones, every position) equal
    Phi-3's rotary embedding's; in a padded batch each row picks by its own highest position."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    c, _ = hf_longrope(None)
    hf, rope = Phi3RotaryEmbedding(c), RoPE(tiny("rope", **LONGROPE))
    x = torch.zeros(1, dtype=torch.float32)
    for T in (16, 17, 30):
        cos, sin = hf(x, torch.arange(T)[None])
        r = rope.rotary(torch.arange(T), torch.float32)
        torch.testing.assert_close(r.cos[:, 0], cos[0, :, :8], rtol=0, atol=2e-7)
        torch.testing.assert_close(r.sin[:, 0], sin[0, :, :8], rtol=0, atol=2e-7)
    rows = torch.stack((torch.arange(20).clamp(max=15), torch.arange(20)))  # highest 15 and 19
    both = rope.rotary(rows, torch.float32)
    for row in range(2):
        alone = rope.rotary(torch.arange(int(rows[row].max()) + 1), torch.float32)
        torch.testing.assert_close(both.cos[row, :16], alone.cos[:16], rtol=0, atol=0)


def test_longrope_validation_and_reads():
    with pytest.raises(ConfigError, match=r"model.position.scaling.short_factor.*a list of 8 positive numbers.*16 / 2"):
        build_model(tiny("rope", **longrope(short_factor=[1.0, 2.0])))
    with pytest.raises(ConfigError, match="model.position.scaling.long_factor"):
        build_model(tiny("rope", **longrope(long_factor=[0.0, *LONG[1:]])))
    with pytest.raises(ConfigError, match="model.position.scaling.original_context"):
        build_model(tiny("rope", **longrope(original_context=None)))
    with pytest.raises(ConfigError, match="model.position.scaling.factor"):
        build_model(tiny("rope", **longrope(factor=0.5)))
    with pytest.raises(ConfigError, match=r"model.position.scaling.long_factor.*a list of 4 "):
        build_model(tiny("rope", rotary_dim=8, **longrope(short_factor=[1, 2, 3, 4])))  # 4 pairs when 8 dims rotate
    assert ignored(tiny("rope", **LONGROPE)) == []
    names = [i.field for i in ignored(tiny("rope", scaling=dict(kind="linear", short_factor=SHORT, long_factor=LONG)))]
    assert names == ["model.position.scaling.short_factor", "model.position.scaling.long_factor"]


def test_longrope_kv_cache_decoding_equals_the_full_forward_across_the_switch():
    """Greedy decoding with the cache from a 12-token prompt past original_context = 16: at every step
    the logits equal the full forward over the sequence so far (short factors up to 16 tokens, long after,
    the cache re-encoded once); without that re-encoding they would not."""
    torch.manual_seed(0)
    model = build_model(tiny("rope", **LONGROPE), dtype=F64).eval()
    seen = []
    hook = model.head.register_forward_hook(lambda m, i, out: seen.append(out[:, -1]))
    prompt = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    ids = generate(model, prompt, 10)
    hook.remove()
    assert len(seen) == 10  # prefill, 8 cached steps, one re-encoding at 16 -> 17 tokens
    with torch.no_grad():
        for step, logits in enumerate(seen):
            torch.testing.assert_close(logits, model(ids[:, : 12 + step])[:, -1], rtol=0, atol=1e-12)
        cache = model.new_cache(2, 32)
        model(ids[:, :16], cache)
        stale = model(ids[:, 16:17], cache)[:, -1]
    assert (stale - seen[5]).abs().max() > 1e-5  # short-rotated keys under long-rotated queries: far past rounding


def test_every_hf_family_refuses_longrope_and_falcon_alibi():
    """No family with RoPE but Phi-3 and MiniCPM3 converts longrope, and none but Falcon ALiBi's multiplier
    or rounding: each names the field."""
    cfg = tiny("rope", **LONGROPE)
    longrope = {
        "model.position.scaling.kind",
        "model.position.scaling.short_factor",
        "model.position.scaling.long_factor",
    }
    for name, family in families_of_its_mixers(cfg).items():
        fields = {p.field for p in family.problems(cfg)}
        holds_longrope = name in ("phi3", "minicpm3")
        assert longrope.isdisjoint(fields) if holds_longrope else longrope <= fields, name
    falcon_rw = tiny("alibi", **FALCON_RW)
    alibi = {"model.position.alibi_scale", "model.position.alibi_rounding"}
    for name, family in families_of_its_mixers(falcon_rw).items():
        fields = {p.field for p in family.problems(falcon_rw)}
        assert alibi.isdisjoint(fields) if name == "falcon" else alibi <= fields, name


@pytest.mark.parametrize(
    ("kind", "position"),
    [("alibi", FALCON_RW), ("rope", LONGROPE)],
    ids=["alibi-falcon-rw", "longrope"],
)
def test_each_part_trains(kind, position):
    """A few AdamW steps on one repeated batch of 32 tokens (past longrope's 16) lower the loss."""
    cfg = tiny(kind, **position)
    torch.manual_seed(0)
    model = build_model(cfg)
    losses = short_fit(model, cfg.vocab_size, 32)
    assert losses[-1] < 0.9 * losses[0]


def test_longrope_fits_its_lists_to_no_recurrent_mixer():
    """LongRoPE's lists hold one factor per rotated pair of the layers that rotate. A mamba2 layer kind among
    causal heads of 16 (its state of 6 is no head: no rotation reaches it) leaves them at 8 pairs, where it
    asked for 3; a model whose own mixer is mamba2 rotates nothing, its lists need only agree in length,
    and it runs past original_context (the long factors); lists that disagree are still refused."""
    nano = ["model=nano", "model.n_layer=4", "model.d_model=64", "model.attention.n_head=4"]
    nano += ["model.context_length=32", "model.vocab_size=64", "model/layers=mamba2_3_1"]
    hybrid = compose_model([*nano, "+model.layers.kinds.mamba2.attention.state_size=6"])
    hybrid = dataclasses.replace(hybrid, position=POSITION_OPTIONS.make(kind="rope", **LONGROPE))
    idx = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(build_model(hybrid).eval()(idx)).all()

    mamba2 = {"kind": "mamba2", "n_head": 2, "state_size": 6, "qkv_bias": False}
    pure = {"vocab_size": 64, "context_length": 32, "n_layer": 2, "d_model": 16, "mlp": {"kind": "none"}}
    pure |= {"attention": mamba2 | {"out_bias": False}}
    lists = longrope(short_factor=[1.0, 1.5], long_factor=[2.0, 3.0])
    cfg = to_model_config(pure | {"position": {"kind": "rope", **lists}})
    with torch.no_grad():
        assert torch.isfinite(build_model(cfg).eval()(idx)).all()
    refused = to_model_config(
        pure | {"position": {"kind": "rope", **longrope(short_factor=[1.0, 1.5], long_factor=[2.0])}}
    )
    with pytest.raises(ConfigError, match=r"model.position.scaling.long_factor.*long_factor as long as short_factor"):
        build_model(refused)
