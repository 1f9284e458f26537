"""Residual streams (``model.stream``): mhc's connection and merge against DeepSeek-V4's modules in
transformers (every weight randomised); hyper-connections against the paper's equations written out
stream by stream, and at their init against the plain stream; the closed-form counts by hand; models that
train and decode in pieces as they run whole; the refusals."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import check_trains_then_decodes_in_pieces, decode_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.streams.hyper import HyperConnection
from archlab.nn.streams.mhc import MHC, MHCConnection

pytestmark = pytest.mark.usefixtures("single_thread")

D, N = 32, 4
TINY = ["model=nano", "model.d_model=32", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]
MHC_MODEL = [*TINY, "model/stream=mhc", "model/norm=rmsnorm", "model.norm.eps=1e-6"]


def _hf_config():
    transformers = pytest.importorskip("transformers")
    return transformers.DeepseekV4Config(
        hidden_size=D, hc_mult=N, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6, num_attention_heads=4
    )


def _copy(ours: torch.nn.Module, theirs: torch.nn.Module, names: dict[str, str]) -> None:
    with torch.no_grad():
        for mine, hf in names.items():
            getattr(theirs, hf).copy_(getattr(ours, mine))


def test_the_connection_is_deepseek_v4s_hyper_connection():
    """Streams [B, T, n, d] through one sublayer: archlab's connection against transformers'
    ``DeepseekV4HyperConnection`` (its pre, post and comb weights) combined as ``DeepseekV4DecoderLayer``
    combines them, ``post ⊗ F(collapsed) + combᵀ H``; randomised weights, float32."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    cfg = compose_model(MHC_MODEL)
    ours = randomise(MHCConnection(cfg), seed=1)
    theirs = DeepseekV4HyperConnection(_hf_config())
    _copy(ours, theirs, {"fn": "fn", "base": "base", "scale": "scale"})
    h = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(2))
    w = torch.randn(D, D, generator=torch.Generator().manual_seed(3)) / D**0.5

    def sublayer(x):
        return torch.tanh(x @ w)

    post, comb, collapsed = theirs(h)
    expected = post.unsqueeze(-1) * sublayer(collapsed).unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), h)
    torch.testing.assert_close(ours(h, sublayer), expected, rtol=1e-5, atol=1e-6)
    pre, _, mixing = ours.weights(h)
    assert (pre > 0).all()
    # doubly stochastic: the columns normalised last, the rows within Sinkhorn's 20 iterations' reach
    torch.testing.assert_close(mixing.sum(-2), torch.ones(2, 5, N), rtol=0, atol=1e-5)
    torch.testing.assert_close(mixing.sum(-1), torch.ones(2, 5, N), rtol=0, atol=1e-2)


def test_the_merge_is_deepseek_v4s_hyper_head():
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperHead

    cfg = compose_model(MHC_MODEL)
    ours = randomise(MHC(cfg), seed=4)
    theirs = DeepseekV4HyperHead(_hf_config())
    _copy(ours, theirs, {"hc_fn": "hc_fn", "hc_base": "hc_base", "hc_scale": "hc_scale"})
    h = torch.randn(3, 4, N, D, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(ours.merge(h), theirs(h), rtol=1e-5, atol=1e-6)
    assert torch.equal(ours.widen(h[:, :, 0]), h[:, :, :1].expand(-1, -1, N, -1))


def test_the_count_is_the_closed_form_worked_by_hand():
    """d 32, n 4: a connection holds fn 24 × 128, base 24 and 3 scales, 3,099; two per layer (attention,
    MLP) over 2 layers, and the merge's 4 × 128 + 4 + 1 = 517: 12,913 beside the plain model's parameters."""
    plain, mhc = count_params(compose_model(TINY)), count_params(compose_model([*TINY, "model/stream=mhc"]))
    assert mhc["streams"] == 2 * 2 * (24 * 128 + 24 + 3) + (4 * 128 + 4 + 1) == 12_913
    assert mhc["total"] - plain["total"] == 12_913 and plain["streams"] == 0
    assert mhc["per_block"] - plain["per_block"] == 2 * 3_099
    # FLOPs: 6 per added weight, and per token 6·d·(n² + 2n) for each of the 4 connections, 6·d·n to merge
    assert mhc["flops_per_token"] - plain["flops_per_token"] == 6 * 12_913 + 6 * 32 * (4 * 24 + 4)
    n2 = count_params(compose_model([*TINY, "model/stream=mhc", "model.stream.n=2", "model/mlp=none"]))
    assert n2["streams"] == 2 * (8 * 64 + 8 + 3) + (2 * 64 + 2 + 1)  # one connection per layer: no MLP


def test_the_hyper_counts_are_the_closed_form_worked_by_hand():
    """n 4, d 32, 4 connections: static A_m and A_r 4 × 5 and B 4, 24 each; dynamic also W_m and W_r
    32 × 5, W_β 32, two scales and a LayerNorm of 64: 24 + 160 + 32 + 2 + 64 = 282 each; no merge weights.
    FLOPs add 6·d·((1 + n)·n + n) per connection."""
    plain = count_params(compose_model(TINY))
    static = count_params(compose_model([*TINY, "model/stream=hyper", "model.stream.dynamic=false"]))
    dynamic = count_params(compose_model([*TINY, "model/stream=hyper"]))
    assert static["streams"] == 4 * 24 and dynamic["streams"] == 4 * 282
    assert static["flops_per_token"] - plain["flops_per_token"] == 6 * 96 + 4 * 6 * 32 * 24


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_hyper_connection_is_the_papers_equations(dynamic):
    """Zhu et al.'s HC, written out per stream: the sublayer reads Σᵢ A_m[i]·Hᵢ, stream j becomes
    B[j]·F(that) + Σᵢ A_r[i, j]·Hᵢ; dynamic, A_m[i] += s_α·tanh(H̄ᵢ·W_m), A_r[i, j] += s_α·tanh(H̄ᵢ·W_r[:, j]),
    B[j] += s_β·tanh(H̄ⱼ·W_β), H̄ each stream layer-normed; every weight random."""
    cfg = compose_model([*TINY, "model/stream=hyper", "model.stream.n=3", f"model.stream.dynamic={dynamic}"])
    hc = randomise(HyperConnection(cfg, 0), seed=7)
    h = torch.randn(2, 3, 3, D, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    hc = hc.double()
    w = torch.randn(D, D, generator=torch.Generator().manual_seed(9), dtype=torch.float64) / D**0.5

    def sublayer(x):
        return torch.tanh(x @ w)

    expected = torch.empty_like(h)
    for b in range(2):
        for t in range(3):
            a_m = hc.static_alpha[:, 0].clone()
            a_r = hc.static_alpha[:, 1:].clone()
            beta = hc.static_beta.clone()
            if dynamic:
                ln = hc.norm
                bar = [
                    (h[b, t, i] - h[b, t, i].mean()) / (h[b, t, i].var(unbiased=False) + ln.eps).sqrt()
                    for i in range(3)
                ]
                bar = [x * ln.weight + ln.bias for x in bar]
                for i in range(3):
                    a_m[i] += hc.alpha_scale * torch.tanh(bar[i] @ hc.dynamic_alpha[:, 0])
                    beta[i] += hc.beta_scale * torch.tanh(bar[i] @ hc.dynamic_beta)
                    for j in range(3):
                        a_r[i, j] += hc.alpha_scale * torch.tanh(bar[i] @ hc.dynamic_alpha[:, 1 + j])
            y = sublayer(sum(a_m[i] * h[b, t, i] for i in range(3)))
            for j in range(3):
                expected[b, t, j] = beta[j] * y + sum(a_r[i, j] * h[b, t, i] for i in range(3))
    torch.testing.assert_close(hc(h, sublayer), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_hyper_model_starts_as_its_plain_twin(dynamic):
    """At init (A_m one-hot, A_r = I, B = 1, the dynamic matrices 0) every stream is the plain residual
    stream, and the final LayerNorm of their sum is that of one (its eps made negligible): the same logits
    from the same weights."""
    exact = [*TINY, "model.norm.eps=1e-12"]
    torch.manual_seed(0)
    plain = build_model(compose_model(exact))
    torch.manual_seed(0)
    hyper = build_model(compose_model([*exact, "model/stream=hyper", f"model.stream.dynamic={dynamic}"]))
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hyper(idx), plain(idx), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stream", [["model/stream=mhc"], ["model/stream=hyper"]])
def test_a_model_of_several_streams_trains_and_decodes_in_pieces_as_whole(stream):
    """A few AdamW steps lower the loss on a fixed batch; with every weight randomised, logits decoded
    through the cache in pieces (a prefill, then single tokens) equal the whole sequence's."""
    torch.manual_seed(0)
    model = build_model(compose_model([*MHC_MODEL, *stream]))
    idx = torch.randint(0, 64, (4, 24))
    check_trains_then_decodes_in_pieces(model, idx, [10, 11, 12, 24])


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model/block=post"], "model.block.kind"),
        (["model.stream.n=0"], "model.stream.n"),
        (["model.stream.sinkhorn_iters=0"], "model.stream.sinkhorn_iters"),
        (["model/layers=dense_first", "+model.layers.kinds.dense.stream.n=2"], "model.layers.kinds.dense.stream.n"),
        (["model.stream.kind=hyper", "model/block=parallel"], "model.block.kind"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model([*TINY, "model/stream=mhc", *overrides])
    assert err.value.field == field


HY_MHC = [*MHC_MODEL, "model.stream.mix=none", "model.stream.post_scale=1.5", "model.stream.post_eps=true"]


def _hy_config():
    transformers = pytest.importorskip("transformers")
    return transformers.HYV4Config(
        hidden_size=D, hc_mult=N, hc_eps=1e-6, hc_magnitude=1.5, rms_norm_eps=1e-6, num_attention_heads=4
    )


def test_the_unmixed_connection_is_hy_v4s_hyper_connection():
    """``mix: none`` (post scale 1.5, eps on post): archlab's connection against transformers'
    ``HYV4HyperConnection`` combined as ``HYV4DecoderLayer`` combines it, ``post ⊗ F(collapsed) + H``."""
    from transformers.models.hy_v4.modeling_hy_v4 import HYV4HyperConnection

    cfg = compose_model(HY_MHC)
    ours = randomise(MHCConnection(cfg), seed=11)
    theirs = HYV4HyperConnection(_hy_config())
    _copy(ours, theirs, {"fn": "fn", "base": "base", "scale": "scale"})
    h = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(12))
    w = torch.randn(D, D, generator=torch.Generator().manual_seed(13)) / D**0.5

    def sublayer(x):
        return torch.tanh(x @ w)

    post, collapsed = theirs(h)
    expected = post.unsqueeze(-1) * sublayer(collapsed).unsqueeze(-2) + h
    torch.testing.assert_close(ours(h, sublayer), expected, rtol=1e-5, atol=1e-6)
    assert ours.fn.shape == (2 * N, N * D) and ours.scale.shape == (2,)


def test_the_unmixed_merge_is_hy_v4s_hyper_head():
    from transformers.models.hy_v4.modeling_hy_v4 import HYV4HyperHead

    ours = randomise(MHC(compose_model(HY_MHC)), seed=14)
    theirs = HYV4HyperHead(_hy_config())
    _copy(ours, theirs, {"hc_fn": "hc_fn", "hc_base": "hc_base", "hc_scale": "hc_scale"})
    h = torch.randn(3, 4, N, D, generator=torch.Generator().manual_seed(15))
    torch.testing.assert_close(ours.merge(h), theirs(h), rtol=1e-5, atol=1e-6)


def test_the_unmixed_count_is_the_closed_form_worked_by_hand():
    """d 32, n 4, mix none: a connection holds fn 8 × 128, base 8 and 2 scales, 1,034; four over 2 layers and
    the merge's 517: 4,653 beside the plain model's; FLOPs 6·d·2n per connection, no mix."""
    plain = count_params(compose_model([*TINY, "model/norm=rmsnorm"]))
    hy = count_params(compose_model(HY_MHC))
    assert hy["streams"] == 4 * (8 * 128 + 8 + 2) + 517 == 4_653
    assert hy["total"] - plain["total"] == 4_653
    assert hy["flops_per_token"] - plain["flops_per_token"] == 6 * 4_653 + 6 * 32 * (4 * 8 + 4)
    assert build_model(compose_model(HY_MHC), device="meta") is not None


def test_an_unmixed_model_decodes_in_pieces_as_it_runs_whole():
    """The connection's weights are float32 (as transformers'): 1e-6, not float64's 1e-10."""
    model = randomise(build_model(compose_model(HY_MHC), dtype=torch.float64), seed=16).eval()
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(17))
    with torch.no_grad():
        whole = model(idx)
    torch.testing.assert_close(decode_in_pieces(model, idx, [4, 5, 9]), whole, rtol=1e-6, atol=1e-6)
