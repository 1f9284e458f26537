"""Mamba-1's selective scan mixer (archlab/nn/mixers/mamba.py, ops/selective_scan.py): one layer against its
recurrence written out token by token in float64, plain, with FalconMamba's B/C/Δ norm and with Jamba's
(a learned scale on each), at chunk sizes that do and do not divide the length; against transformers'
``MambaMixer``, ``FalconMambaMixer`` and ``JambaMambaMixer`` (their torch paths) with every weight randomised; its count by hand; the refusals. Registering it gives it
tests/test_mixer_contract.py's tests (cached decoding, left padding, gradients, a hybrid)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import mixer_config, randomise

from archlab import ConfigError, count_params
from archlab.config import to_model_config
from archlab.nn.mixers.mamba import Mamba
from archlab.nn.mixers.ops import selective_scan
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

D, W, N, R, K, T = 8, 12, 5, 2, 4, 11  # width, inner channels, state, Δ rank, conv kernel, length


def layer(
    chunk: int = 4, bias: bool = True, norm: bool = False, scale: bool = False, inner: int = W, heads: int = 1
) -> Mamba:
    attention = {"kind": "mamba", "inner": inner, "state_size": N, "dt_rank": R, "conv_kernel": K, "heads": heads}
    attention |= {"scan_chunk": chunk, "bias": bias, "bc_dt_norm": norm, "bc_dt_norm_scale": scale}
    return randomise(Mamba(mixer_config("mamba", d_model=D, attention=attention)).double(), seed=1)


def by_hand(m: Mamba, x: torch.Tensor, norm: bool, heads: int = 1) -> torch.Tensor:
    """The layer token by token: in_proj, the causal convolution and SiLU, x_proj (normed without a scale
    for FalconMamba, times a learned one for Jamba), Δ = softplus(dt_proj), h_t = exp(Δ·A)·h_{t−1} + Δ·B_t·x_t,
    y = h·C + D·x, times silu(z); with ``heads``, each head's channels through its own rows of x_proj (its
    own Δ's low-rank input, B and C) and dt_proj."""

    def rms(v, scale):
        v = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) if norm else v
        return v if scale is None else v * scale

    proj = F.linear(x, m.in_proj.weight, m.in_proj.bias)
    xs, z = proj[..., :W], proj[..., W:]
    w = m.conv_weight[:, 0]  # [W, K]
    bias = m.conv_bias if m.conv_bias is not None else 0
    A = -m.A_log.exp()
    h = torch.zeros(x.shape[0], W, N, dtype=x.dtype)
    out = []
    for t in range(x.shape[1]):
        conv = sum(w[:, j] * xs[:, t - K + 1 + j] for j in range(K) if t - K + 1 + j >= 0) + bias
        u = F.silu(conv)  # [b, W]
        ys, hs, c = [], [], W // heads
        for g in range(heads):  # each head's channels c·g .. c·(g + 1)
            part = slice(g * c, (g + 1) * c)
            sel = u[:, part] @ m.x_proj.weight[g * (R + 2 * N) : (g + 1) * (R + 2 * N)].T
            low = rms(sel[:, :R], m.dt_norm_weight)
            B, C = rms(sel[:, R : R + N], m.b_norm_weight), rms(sel[:, R + N :], m.c_norm_weight)
            dt = F.softplus(low @ m.dt_proj.weight[part].T + m.dt_proj.bias[part])  # [b, c]
            hg = torch.exp(dt[..., None] * A[part]) * h[:, part] + (dt * u[:, part])[..., None] * B[:, None, :]
            hs.append(hg)
            ys.append((hg * C[:, None, :]).sum(-1) + m.D[part] * u[:, part])
        h, y = torch.cat(hs, 1), torch.cat(ys, 1)
        out.append(F.linear(y * F.silu(z[:, t]), m.out_proj.weight, m.out_proj.bias))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("chunk", [None, 1, 4, 16])
@pytest.mark.parametrize(("norm", "scale"), [(False, False), (True, False), (True, True)])
def test_a_layer_is_its_recurrence_token_by_token(chunk, norm, scale, monkeypatch):
    """The position-by-position scan (chunk None, the CPU's) and the chunked parallel one (chunks of 4 over
    11 positions: a padded tail; of 16: one chunk) equal the recurrence written out, within 1e-12 in float64
    (the norms' scales drawn far from 1)."""
    m = layer(chunk or 4, norm=norm, scale=scale)
    assert (m.b_norm_weight is not None) == scale
    if chunk is not None:
        monkeypatch.setattr(selective_scan, "SEQUENTIAL_DEVICES", set())
    x = torch.randn(2, T, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), by_hand(m, x, norm), rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk", [None, 4])
@pytest.mark.parametrize("heads", [2, 3])
def test_a_layer_in_heads_is_each_heads_recurrence(chunk, heads, monkeypatch):
    """Zamba's heads: each head's channels scanned with its own Δ, B and C (its rows of x_proj and dt_proj),
    within 1e-12 of the recurrence written out; the count is the one-head count (x_proj's rows per head
    read that head's channels alone)."""
    m = layer(chunk or 4, heads=heads)
    if chunk is not None:
        monkeypatch.setattr(selective_scan, "SEQUENTIAL_DEVICES", set())
    x = torch.randn(2, T, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), by_hand(m, x, False, heads), rtol=0, atol=1e-12)
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in layer().parameters())


@pytest.mark.parametrize(("falcon", "bias"), [(False, False), (False, True), (True, False)])
def test_a_layer_equals_transformers_mamba_mixer(falcon, bias):
    """transformers' ``MambaMixer`` (``FalconMambaMixer`` with FalconMamba's norm) on its torch path with
    the same randomised weights gives the same output, within 1e-6 (it computes A, B and the scan in float32
    even in a float64 model; the recurrence above is the exact check)."""
    transformers = pytest.importorskip("transformers")
    if falcon:
        from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaMixer as Mixer

        config = transformers.FalconMambaConfig
    else:
        from transformers.models.mamba.modeling_mamba import MambaMixer as Mixer

        config = transformers.MambaConfig
    m = layer(bias=bias, norm=falcon)
    c = config(hidden_size=D, intermediate_size=W, state_size=N, time_step_rank=R, conv_kernel=K,
               use_bias=bias, use_conv_bias=True, num_hidden_layers=1, use_mambapy=False)  # fmt: skip
    hf = Mixer(c, 0, initialize_mixer_weights=False).double()  # FalconMamba's init runs before its norms exist
    with torch.no_grad():
        for ours, theirs in ((m.in_proj, hf.in_proj), (m.x_proj, hf.x_proj), (m.dt_proj, hf.dt_proj),
                             (m.out_proj, hf.out_proj)):  # fmt: skip
            theirs.weight.copy_(ours.weight)
            if ours.bias is not None:
                theirs.bias.copy_(ours.bias)
        hf.conv1d.weight.copy_(m.conv_weight)
        hf.conv1d.bias.copy_(m.conv_bias)
        hf.A_log.copy_(m.A_log)
        hf.D.copy_(m.D)
        x = torch.randn(2, T, D, dtype=torch.float64)
        torch.testing.assert_close(m(x), hf(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_a_layer_with_learned_norm_scales_equals_transformers_jamba_mixer(bias):
    """transformers' ``JambaMambaMixer`` (its dt, B and C RMSNorms with learned scales, drawn far from 1
    here) on its torch path with the same weights gives the same output, within 1e-6 (its norms compute in
    float32 even in a float64 model); inner 2·d, as Jamba's mamba_expand is an integer."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.jamba.modeling_jamba import JambaMambaMixer

    m = layer(bias=bias, norm=True, scale=True, inner=2 * D)
    c = transformers.JambaConfig(hidden_size=D, mamba_expand=2, mamba_d_state=N, mamba_dt_rank=R, mamba_d_conv=K,
                                 mamba_proj_bias=bias, mamba_conv_bias=True, num_hidden_layers=1, rms_norm_eps=1e-6)  # fmt: skip
    hf = JambaMambaMixer(c, 0).double()
    with torch.no_grad():
        for ours, theirs in ((m.in_proj, hf.in_proj), (m.x_proj, hf.x_proj), (m.dt_proj, hf.dt_proj),
                             (m.out_proj, hf.out_proj)):  # fmt: skip
            theirs.weight.copy_(ours.weight)
            if ours.bias is not None:
                theirs.bias.copy_(ours.bias)
        hf.conv1d.weight.copy_(m.conv_weight)
        hf.conv1d.bias.copy_(m.conv_bias)
        for name in ("A_log", "D"):
            getattr(hf, name).copy_(getattr(m, name))
        for name in ("dt", "b", "c"):
            getattr(hf, f"{name}_layernorm").weight.copy_(getattr(m, f"{name}_norm_weight"))
        x = torch.randn(2, T, D, dtype=torch.float64)
        torch.testing.assert_close(m(x), hf(x), rtol=1e-6, atol=1e-6)


def test_its_count_by_hand():
    """d 16, inner 32 (expand 2), state 4, Δ rank ceil(16/16) = 1, conv 4 with a bias: in_proj 16·64, conv
    32·5, x_proj 32·(1 + 8), dt_proj 2·32, A_log 32·4, D 32, out_proj 32·16 = 2208 per layer."""
    cfg = to_model_config({"vocab_size": 8, "n_layer": 1, "d_model": 16, "position": {"kind": "none"},
                           "attention": {"kind": "mamba", "state_size": 4}, "mlp": {"kind": "none"}})  # fmt: skip
    assert count_params(cfg)["attention"] == 16 * 64 + 32 * 5 + 32 * 9 + 2 * 32 + 32 * 4 + 32 + 32 * 16 == 2208
    assert Mamba.kv_cache_values(cfg, 1000, 0) == 32 * (3 + 4)  # conv inputs and states, at any length
    assert math.isclose(Mamba.extra_flops(cfg, 1000, 0), 18 * 32 * 4)
    cfg.attention.bc_dt_norm = True
    assert count_params(cfg)["attention"] == 2208  # FalconMamba's norm holds nothing
    cfg.attention.bc_dt_norm_scale = True
    assert count_params(cfg)["attention"] == 2208 + 1 + 4 + 4  # Jamba's: a scale over Δ's rank, B's and C's state


@pytest.mark.parametrize(
    ("attention", "field"),
    [
        ({"kind": "mamba", "state_size": 0}, "model.attention.state_size"),
        ({"kind": "mamba", "inner": 0}, "model.attention.inner"),
        ({"kind": "mamba", "dt_min": 0.5, "dt_max": 0.1}, "model.attention.dt_max"),
        ({"kind": "mamba", "dt_init": "xavier"}, "model.attention.dt_init"),
        ({"kind": "mamba", "n_kv_head": 2}, "model.attention.n_kv_head"),  # attention's, not its own
        ({"kind": "mamba", "heads": 5}, "model.attention.heads"),  # not dividing inner = 2·8
    ],
)
def test_bad_settings_name_their_field(attention, field):
    with pytest.raises(ConfigError) as err:
        validate(to_model_config({"d_model": D, "attention": attention}))
    assert err.value.field == field
