"""What the attention (archlab/nn/mixers/attention.py) does to q and k before the scores: the QK-norm's
shift, ``model.attention.qk_norm_bias`` (StableLM 2's per-head LayerNorms have none), against transformers'
StableLmLayerNormPerHead, in the closed-form count, its refusals, what the model reads and a short fit."""

from typing import cast

import pytest
import torch
from helpers import hf as parity
from helpers.hf import layout, logits, max_diff, randomize
from helpers.parts import short_fit

from archlab import ConfigError, build_model, count_params
from archlab.nn.mixers.attention import CausalSelfAttention
from archlab.nn.norms import LayerNorm
from archlab.nn.validation import entries, ignored

pytestmark = pytest.mark.usefixtures("single_thread")

# ---------------------------------------------------------------- model.attention.qk_norm_bias

QK = ["model.attention.qk_norm=head", "model.attention.qk_norm_per_head_scale=true", "model/position=rope"]


def test_qk_norm_bias_false_drops_the_qk_norms_shift_alone():
    """qk_norm_bias=false: the QK-norms have no bias while every other LayerNorm keeps its own; H·hd + KV·hd
    fewer parameters per layer (per-head scale) or 2·hd (shared), in the closed form and the model built."""
    for per_head, removed in ((True, (4 + 2) * 16), (False, 2 * 16)):
        base = ["model.attention.n_kv_head=2", "model.attention.qk_norm=head"]
        base += [f"model.attention.qk_norm_per_head_scale={str(per_head).lower()}"]
        cfg, without = layout(*base), layout(*base, "model.attention.qk_norm_bias=false")
        model = build_model(without, device="meta")
        attn = cast(CausalSelfAttention, model.blocks[0].attn)
        q_norm, k_norm = cast(LayerNorm, attn.q_norm), cast(LayerNorm, attn.k_norm)
        assert (
            q_norm.bias is None and k_norm.bias is None and cast(LayerNorm, model.blocks[0].attn_norm).bias is not None
        )
        assert count_params(cfg)["total"] - count_params(without)["total"] == 2 * removed
        assert count_params(without)["total"] == sum(p.numel() for p in model.parameters())
        kept = layout(*base, "model.attention.qk_norm_bias=true")  # as model.norm.bias: the same count
        assert count_params(kept)["total"] == count_params(cfg)["total"]


def test_qk_norm_bias_equals_stablelm_s_per_head_layernorms():
    """The attention's QK-norm with qk_norm_bias=false equals transformers' StableLmLayerNormPerHead
    (bias=False, as StableLM 2 builds it) on every head; with the bias kept (null, beside model.norm.bias)
    it adds the shift, and the output moves."""
    pytest.importorskip("transformers")
    from transformers.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead

    cfg = layout(*QK, "model.attention.qk_norm_bias=false")
    model = build_model(cfg)
    randomize(model, seed=5)
    q_norm = cast(LayerNorm, cast(CausalSelfAttention, model.blocks[0].attn).q_norm)
    hf = StableLmLayerNormPerHead(16, 4, eps=cfg.norm.eps)
    with torch.no_grad():
        for h, norm in enumerate(hf.norms):
            cast(torch.nn.LayerNorm, norm).weight.copy_(cast(torch.nn.LayerNorm, q_norm).weight.view(4, 16)[h])
    x = torch.randn(2, 4, 7, 16, generator=torch.Generator().manual_seed(0))  # [B, H, T, hd], as StableLM's
    torch.testing.assert_close(q_norm.per_head(x.transpose(1, 2)).transpose(1, 2), hf(x))
    with_bias = randomize(build_model(layout(*QK)), seed=5)
    without = build_model(cfg, device="meta")
    state = {k: v for k, v in with_bias.state_dict().items() if not k.endswith(("q_norm.bias", "k_norm.bias"))}
    without.load_state_dict(state, assign=True)
    assert max_diff(logits(with_bias), logits(without.eval())) > 1e-3


@pytest.mark.parametrize(
    "overrides, allowed",
    [
        (["model.attention.qk_norm_bias=false"], "null unless model.attention.qk_norm is head or full"),
        (["model.attention.qk_norm=l2", "model.attention.qk_norm_bias=false"], "qk_norm=l2"),
        (["model.attention.qk_norm=head", "model/norm=rmsnorm", "model.attention.qk_norm_bias=false"], "rmsnorm"),
    ],
)
def test_qk_norm_bias_refusals_name_the_field(overrides, allowed):
    with pytest.raises(ConfigError) as err:
        layout(*overrides)
    assert err.value.field == "model.attention.qk_norm_bias" and allowed in str(err.value)


def test_qk_norm_bias_is_read_described_and_trains():
    cfg = layout(*QK, "model.attention.qk_norm_bias=false")
    assert ignored(cfg) == []
    assert "qk-norm bias false" in entries(cfg).attention.describe(cfg)
    torch.manual_seed(0)
    model = build_model(parity.changed_cfg(cfg, n_layer=1, context_length=16))
    losses = short_fit(model, cfg.vocab_size, 16)
    assert losses[-1] < 0.9 * losses[0]
