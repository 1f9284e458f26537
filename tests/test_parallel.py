"""Attention and Mamba-2 side by side (``parallel``, Falcon-H1's layer) and Mamba-2's ``gate_norm``, each
against an independent expectation: the two parts run apart as the mixers they are and summed by the
multipliers, transformers' ``FalconH1Mixer`` for each gated norm, hand-written counts, FLOPs and cache
sizes, the cache's tensors, and the refusals. What every mixer passes (cached decoding, a left-padded batch,
packed documents, gradients, counts, μP roles, a hybrid layout) is test_mixer_contract.py's, at its
``TINY`` line."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import BASE, randomise
from omegaconf import OmegaConf

from archlab import build_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.config import to_model_config
from archlab.errors import ConfigError
from archlab.nn.mixers.attention import CausalSelfAttention
from archlab.nn.mixers.base import Tokens
from archlab.nn.mixers.mamba2 import Mamba2
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")

ATTENTION = {"kind": "causal", "n_head": 4, "n_kv_head": 2}  # 4 heads of 8 over 2 key/value heads, both biases
# 3 heads of 8 channels, B and C of 6, conv 4 with its bias, chunks of 5, an in-projection bias, norm before gate
SSM = {"kind": "mamba2", "n_head": 3, "head_dim": 8, "state_size": 6, "scan_chunk": 5, "qkv_bias": True}
SSM |= {"gate_norm": "before"}
MULTIPLIERS = {"attention_in_multiplier": 0.75, "attention_out_multiplier": 1.5}
MULTIPLIERS |= {"ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.5}
PARALLEL = {"kind": "parallel", "n_head": 4, "attention": {"n_kv_head": 2}, "ssm": SSM, **MULTIPLIERS}


def model_cfg(attention: dict, **overrides):
    return to_model_config(OmegaConf.merge(BASE, {"attention": attention}, overrides))


# ---- the layer is its two parts, summed ----


@pytest.mark.parametrize("masked", [False, True])
def test_the_layer_is_its_two_parts_run_apart_and_summed(masked):
    """In float64 with every weight random and RoPE: the mixer equals 1.5·attention(0.75·x) + 0.5·Mamba-2(1.25·x),
    each part a mixer built alone from its own config with the same weights; with a padding and a document
    start too (the attention its boolean mask, Mamba-2 its Tokens)."""
    model = randomise(build_model(model_cfg(PARALLEL), dtype=torch.float64), 3)
    mixer = model.blocks[0].attn
    attention = CausalSelfAttention(model_cfg(ATTENTION)).double()
    ssm = Mamba2(model_cfg(SSM)).double()
    attention.load_state_dict(mixer.attention.state_dict())
    ssm.load_state_dict(mixer.ssm.state_dict())
    T = 9
    x = torch.randn(2, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rotary = model.position.rotary(torch.arange(T), torch.float64)
    scores, tokens = None, None
    if masked:
        present = torch.ones(2, T, dtype=torch.bool)
        present[0, :3] = False
        starts = torch.zeros(2, T, dtype=torch.bool)
        starts[1, 5] = True
        scores = torch.ones(T, T, dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)
        scores[0, :, :, :3] = False
        scores[1, :, 5:, :5] = False
        scores |= torch.eye(T, dtype=torch.bool)
        tokens = Tokens(present, starts)
    with torch.no_grad():
        got = mixer(x, rotary, mixer.mask_of(scores, tokens))
        expected = 1.5 * attention(0.75 * x, rotary, scores) + 0.5 * ssm(1.25 * x, None, tokens)
    assert expected.abs().max() > 1
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


# ---- Mamba-2's gated norm: Falcon-H1's three forms ----


def falcon_h1_mixer(rms_norm: bool, before_gate: bool):
    """transformers' FalconH1Mixer (its PyTorch path), 4 heads of 8, B and C of 6 in 2 groups, the
    in-projection's parts unscaled (``mup_vector`` ones: Falcon-H1's ``ssm_multipliers`` are the record's)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer

    config = transformers.FalconH1Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, mamba_d_ssm=32, mamba_n_heads=4,
        mamba_d_head=8, mamba_n_groups=2, mamba_d_state=6, mamba_d_conv=4, mamba_chunk_size=5,
        mamba_rms_norm=rms_norm, mamba_norm_before_gate=before_gate, rms_norm_eps=1e-5,
    )  # fmt: skip
    mixer = FalconH1Mixer(config, 0)
    mixer.register_buffer("mup_vector", torch.ones(1, 1, 32 + 32 + 2 * 2 * 6 + 4))
    return mixer.eval()


@pytest.mark.parametrize("gate_norm,rms_norm,before_gate", [("after", True, False), ("before", True, True)])
@pytest.mark.parametrize("gate_norm_none", [False, True])
def test_each_gate_norm_equals_falcon_h1s_mixer(gate_norm, rms_norm, before_gate, gate_norm_none):
    """norm(y·silu(z)), norm(y)·silu(z) and, without a norm, y·silu(z), in 2 groups: the layer's output and
    its parameter count equal transformers' ``FalconH1Mixer`` with the same random weights."""
    if gate_norm_none:
        gate_norm, rms_norm = "none", False
    hf = falcon_h1_mixer(rms_norm, before_gate)
    randomise(hf, 2)
    hf.mup_vector.fill_(1.0)  # randomise draws buffers too
    attention = {"kind": "mamba2", "n_head": 4, "head_dim": 8, "state_size": 6, "groups": 2, "scan_chunk": 5}
    cfg = model_cfg(attention | {"gate_norm": gate_norm})
    validate(cfg)
    ours = Mamba2(cfg)
    with torch.no_grad():
        ours.in_proj.weight.copy_(hf.in_proj.weight)
        ours.conv_weight.copy_(hf.conv1d.weight)
        assert ours.conv_bias is not None
        ours.conv_bias.copy_(hf.conv1d.bias)
        for name in ("dt_bias", "A_log", "D"):
            getattr(ours, name).copy_(getattr(hf, name))
        if ours.norm_weight is not None:
            ours.norm_weight.copy_(hf.norm.weight)
        ours.proj.weight.copy_(hf.out_proj.weight)
    assert (
        sum(p.numel() for p in hf.parameters()) == Mamba2.num_params(cfg) == sum(p.numel() for p in ours.parameters())
    )
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = hf(x), ours(x)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# ---- counts, FLOPs and the cache ----

# per layer, by hand: attention d·(H + 2·KV)·hd + (H + 2·KV)·hd biases + H·hd·d + d = 2048 + 64 + 1024 + 32;
# Mamba-2 (I = 24, channels 24 + 2·6 = 36): (32 + 1)·(24 + 36 + 3) + 36·(4 + 1) + 3·3 + 24 + 24·32
ATTENTION_PARAMS, SSM_PARAMS = 3168, 2079 + 180 + 9 + 24 + 768


def test_counts_flops_and_cache_by_hand():
    """Two layers: parameters of both parts, FLOPs beyond the weights 12·H·hd per key seen plus 12·H·P·N,
    the cache 2·KV·hd per position plus Mamba-2's constant 36·3 + 3·8·6, the built model agreeing."""
    cfg = model_cfg(PARALLEL)
    counts = count_params(cfg)
    assert counts["attention"] == 2 * (ATTENTION_PARAMS + SSM_PARAMS)
    model = build_model(cfg)
    assert sum(p.numel() for n, p in model.named_parameters() if ".attn." in n) == counts["attention"]
    scores = 12 * 4 * 8 * 12  # every key of the 12-token context
    assert counts["flops_per_token"] == 6 * counts["non_embedding"] + 2 * (scores + 12 * 3 * 8 * 6)
    for length in (1, 7, 12):
        assert kv_cache_bytes(cfg, length) == 4 * 2 * (2 * 2 * 8 * length + 36 * 3 + 3 * 8 * 6)


def test_the_cache_holds_keys_values_and_the_state_in_the_layers_slots():
    """After a 5-token prefill every layer's slots hold its keys and values [B, KV, max_len, hd], its
    convolution's last 3 inputs [B, 36, 3] and its states [B, 3, 8, 6]."""
    model = build_model(model_cfg(PARALLEL)).eval()
    cache = model.new_cache(2, 12)
    with torch.no_grad():
        model(torch.randint(0, 48, (2, 5), generator=torch.Generator().manual_seed(0)), cache)
    for layer in range(2):
        k, v, conv, state = (t[layer] for t in (cache.k, cache.v, cache.conv_state, cache.recurrent_state))
        assert k is not None and v is not None and conv is not None and state is not None
        assert k.shape == v.shape == (2, 2, 12, 8)
        assert conv.shape == (2, 36, 3) and state.shape == (2, 3, 8, 6)


def test_describe_names_both_parts_and_the_multipliers():
    from archlab.nn.mixers.parallel import ParallelMixer

    assert ParallelMixer.describe(model_cfg(PARALLEL)) == (
        "parallel: 4q/2kv x 8 + mamba2 3h x 8, state 6, 1 groups, conv 4, norm before gate, "
        "attention_in ×0.75, attention_out ×1.5, ssm_in ×1.25, ssm_out ×0.5"
    )


# ---- refusals ----


@pytest.mark.parametrize(
    "change,field",
    [
        ({"attention": {"kind": "mla"}}, "model.attention.attention.kind"),
        ({"ssm": {"kind": "causal"}}, "model.attention.ssm.kind"),
        ({"attention": {"window": 4}}, "model.attention.attention.window"),
        ({"attention": {"chunk": 4}}, "model.attention.attention.chunk"),
        ({"ssm_out_multiplier": 0.0}, "model.attention.ssm_out_multiplier"),
        ({"attention": {"n_kv_head": 3}}, "model.attention.attention.n_kv_head"),
        ({"ssm": {"groups": 2}}, "model.attention.ssm.groups"),  # 3 heads
        ({"ssm": {"gate_norm": "never"}}, "model.attention.ssm.gate_norm"),
        ({"n_head": 5}, "model.attention.n_head"),  # the attention's heads: d_model 32
    ],
)
def test_refusals_name_the_field_under_its_part(change, field):
    with pytest.raises(ConfigError) as err:
        validate(model_cfg(OmegaConf.to_container(OmegaConf.merge(PARALLEL, change))))
    assert err.value.field == field


def test_the_attention_parts_own_n_head_is_reported_unread():
    """The attention's heads are the mixer's n_head: a sub-config n_head set is ignored, out loud."""
    assert ignored(model_cfg(PARALLEL)) == []
    (item,) = ignored(model_cfg(OmegaConf.to_container(OmegaConf.merge(PARALLEL, {"attention": {"n_head": 7}}))))
    assert item.field == "model.attention.attention.n_head"
