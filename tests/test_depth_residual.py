"""``model.block.residual_rule: depth`` (archlab/nn/block.py's ``residual_add``): the i-th residual add of the
stack is x·√((i−1)/i) + f(x)/√i, i = 2·layer + 2 + sublayer. Held to transformers' ``BeamDecoderLayer`` with
archlab's own attention and MLP inside it, to the formula for the other wirings, its count and its refusals."""

import math

import pytest
import torch
from helpers.hf import check_routed_family_refuses, layout
from helpers.parts import F64, build, plain
from torch import nn

from archlab import ConfigError, count_params
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")


class _Attention(nn.Module):
    """archlab's attention of ``layer`` in the place of ``BeamAttention`` (its call and its (output, weights))."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, hidden_states, **_):
        return self.block.attn(hidden_states, None, None, None, self.block.layer), None


def test_a_sandwich_block_adds_as_beams_decoder_layer():
    """Each layer of a 2-layer sandwich model equals transformers' BeamDecoderLayer of its index (adds 2, 3
    then 4, 5) wrapped around the same attention and MLP, its four norms given archlab's scales."""
    from transformers.models.beam.configuration_beam import BeamConfig
    from transformers.models.beam.modeling_beam import BeamDecoderLayer

    cfg = plain(block={"kind": "sandwich", "residual_rule": "depth"}, mlp={"kind": "swiglu", "bias": False})
    model = build(cfg).float()  # BeamRMSNorm computes in float32 whatever its input
    hf_cfg = BeamConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
        intermediate_size=64, mlp_layer_types=["dense", "dense"], rms_norm_eps=cfg.norm.eps,
    )  # fmt: skip
    x = torch.randn(2, 5, 32) * 2
    for layer, block in enumerate(model.blocks):
        hf = BeamDecoderLayer(hf_cfg, layer)
        hf.self_attn, hf.mlp = _Attention(block), block.mlp
        names = ("attn_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm")
        theirs = (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        )
        with torch.no_grad():
            for ours, their in zip(names, theirs):
                getattr(hf, their).weight.copy_(getattr(block, ours).weight)
            torch.testing.assert_close(block(x), hf(x, position_embeddings=None), rtol=0, atol=1e-5)
            block.depth_scaled = False  # the constant rule, x + f(x), is another layer
            assert (block(x) - hf(x, position_embeddings=None)).abs().max() > 0.1


@pytest.mark.parametrize("kind", ["pre", "post", "post_sublayer"])
def test_the_other_wirings_scale_each_add(kind):
    """pre, post and post_sublayer with depth: layer 1's attention is add 4, its MLP add 5, over the
    block's own sublayers (residual_multiplier 0.5 on f as before)."""
    cfg = plain(block={"kind": kind, "residual_rule": "depth", "residual_multiplier": 0.5}, mlp={"kind": "gelu"})
    block = build(cfg).blocks[1]
    x = torch.randn(2, 5, 32, dtype=F64)

    def add(h, f, i):
        return h * math.sqrt((i - 1) / i) + 0.5 * f / math.sqrt(i)

    with torch.no_grad():
        attn = lambda h: block.attn(h, None, None, None, 1)  # noqa: E731
        if kind == "pre":
            h = add(x, attn(block.attn_norm(x)), 4)
            expected = add(h, block.mlp(block.mlp_norm(h)), 5)
        elif kind == "post":
            h = block.attn_norm(add(x, attn(x), 4))
            expected = block.mlp_norm(add(h, block.mlp(h), 5))
        else:
            h = add(x, block.attn_out_norm(attn(x)), 4)
            expected = add(h, block.mlp_out_norm(block.mlp(h)), 5)
        torch.testing.assert_close(block(x), expected)


def test_it_has_no_parameters_and_is_read():
    """The same count as the constant rule; set on a wiring that honours it nothing is reported ignored."""
    depth = plain(block={"kind": "sandwich", "residual_rule": "depth"})
    assert count_params(depth) == count_params(plain(block={"kind": "sandwich"}))
    assert ignored(depth) == []


@pytest.mark.parametrize(
    "overrides",
    [{"block": {"kind": "parallel"}}, {"block": {"kind": "normed_skip"}}, {"stream": {"kind": "hyper"}}],
    ids=["parallel", "normed_skip", "hyper"],
)
def test_wirings_without_an_add_per_sublayer_refuse_it(overrides):
    """parallel (one add for both sublayers), normed_skip (its own alphas) and several streams refuse it."""
    block = {"residual_rule": "depth", **overrides.get("block", {})}
    with pytest.raises(ConfigError) as error:
        validate(plain(**{**overrides, "block": block}))
    assert error.value.field == "model.block.residual_rule"


LLAMA = ("model/norm=rmsnorm", "model/mlp=swiglu", "model.attention.qkv_bias=false", "model.attention.out_bias=false")


@pytest.mark.parametrize(("family", "overrides"), [("gpt_neox", ()), ("llama", (*LLAMA, "model.mlp.bias=false"))])
def test_families_refuse_it(family, overrides):
    """A layout a record holds is refused by it once its adds are depth-scaled: no record holds them (Beam,
    the family that has them, lacks other parts)."""
    check_routed_family_refuses(
        family, layout(*overrides, "model.block.residual_rule=depth"), "model.block.residual_rule"
    )
