"""Beam's attention parts (issue 46): a learned bias per head on the output gate's logits
(``attention.gate_head_bias``) and the power-law query scale (1 + (p + offset)/length)^β
(``query_scale_form: power``) by each row's position on layers without RoPE (``position.kind: none`` hands
attention its positions). Held to transformers' ``BeamAttention`` and ``compute_attention_scaling`` on the
same random weights, counted in closed form, refused where they cannot apply, held by Beam alone."""

from __future__ import annotations

import pytest
import torch
from helpers import hf as parity
from helpers import parts
from helpers.parts import inputs, randomise

from archlab import ConfigError, count_params
from archlab.nn.mixers.attention import query_scales_at
from archlab.nn.positions import PositionsOnly
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")

SCALE = dict(query_scale_beta=0.1, query_scale_length=2048, query_scale_offset=1, query_scale_by="position")
BEAM = dict(n_head=4, n_kv_head=2, qkv_bias=False, out_bias=False, qk_norm="head", gate="elementwise")
BEAM |= dict(gate_head_bias=True, query_scale_form="power", **SCALE)


def tiny(**overrides):
    return validate(parts.tiny(**overrides))


def test_the_power_scale_is_transformers_compute_attention_scaling():
    from transformers.models.beam.modeling_beam import compute_attention_scaling

    p = torch.arange(0, 7 * 5000, 7).view(2, -1)
    torch.testing.assert_close(query_scales_at(p, 0.1, 2048, 1, "power"), compute_attention_scaling(p), rtol=0, atol=0)


def test_a_nope_layer_equals_transformers_beam_attention_at_each_row_s_positions():
    """Gate σ(W·x + b_head), per-head QK-norm, queries times (1 + (p + 1)/2048)^0.1 at positions near 5000
    (the scale ≈ 1.13), each row its own: archlab's attention equals BeamAttention on a full (NoPE) layer."""
    import transformers as tf
    from transformers.models.beam.modeling_beam import BeamAttention, compute_attention_scaling

    hf_cfg = tf.BeamConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-3,
        num_hidden_layers=1, layer_types=["full_attention"], mlp_layer_types=["dense"], attention_bias=False,
    )  # fmt: skip
    hf_cfg._attn_implementation = "eager"
    hf = randomise(BeamAttention(hf_cfg, 0)).eval()
    ours = parts.build(tiny(attention=BEAM)).float().blocks[0].attn
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat((hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight)))
        for mine, theirs in ((ours.proj, hf.o_proj), (ours.gate, hf.gate_proj), (ours.q_norm, hf.q_norm)):
            mine.weight.copy_(theirs.weight)
        ours.k_norm.weight.copy_(hf.k_norm.weight)
        ours.gate_head_bias.copy_(hf.gate_bias)
        x, T = inputs(dtype=torch.float32), 9
        pos = torch.stack((torch.arange(5000, 5000 + T), torch.arange(4000, 4000 + T)))
        causal = torch.full((T, T), float("-inf")).triu(1).view(1, 1, T, T)
        want, _ = hf(x, None, causal, attention_scaling=compute_attention_scaling(pos))
        got = ours(x, PositionsOnly(pos), None)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        plain = ours(x, PositionsOnly(torch.zeros_like(pos)), None)
        assert (got - plain).abs().max() > 1e-2  # the scale matters at these positions


def test_the_gate_head_bias_counts_one_per_head_and_is_read_with_a_gate():
    gated = dict(n_head=4, n_kv_head=2, gate="head")
    plain, biased = tiny(attention=gated), tiny(attention=dict(gated, gate_head_bias=True))
    assert count_params(biased)["attention"] - count_params(plain)["attention"] == 2 * 4
    assert ignored(biased) == []


@pytest.mark.parametrize(
    "attention, field",
    [
        (dict(gate_head_bias=True), "model.attention.gate_head_bias"),  # no gate
        (dict(SCALE, query_scale_form="power"), None),  # position none hands the positions: accepted
    ],
)
def test_what_cannot_apply_is_refused(attention, field):
    if field is None:
        validate(parts.tiny(attention=dict(n_head=4, n_kv_head=2, **attention)))
        return
    with pytest.raises(ConfigError) as err:
        tiny(attention=dict(n_head=4, n_kv_head=2, **attention))
    assert err.value.field == field


@pytest.mark.parametrize("field", ["model.attention.gate_head_bias", "model.attention.query_scale_form"])
def test_only_beam_holds_them(field):
    """Every other family names the field it cannot hold."""
    assert parity.families_holding(tiny(position={"kind": "rope"}, attention=BEAM), {field}) == {"beam"}
