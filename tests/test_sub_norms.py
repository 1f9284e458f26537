"""BitNet's parts (issue 46): the squared-ReLU gated MLP (``mlp.kind: relu2_glu``), and the sub-norms, a norm
of the model's kind over the heads' output before the output projection (``attention.sub_norm``) and over a
dense MLP's hidden activations before its down projection (``mlp.sub_norm``). Each is compared with
transformers' BitNet module or with its formula on the same random weights, counted in closed form, refused
where it cannot apply, held by BitNet's record alone, read (never reported as ignored) and trained."""

from __future__ import annotations

import pytest
import torch
from helpers import hf as parity
from helpers import parts
from helpers.parts import F64, inputs, randomise, rms

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.fused import glu
from archlab.nn.validation import entries, ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(**overrides):
    return validate(parts.tiny(**overrides))


def test_the_sub_normed_relu2_glu_equals_transformers_bitnet_mlp():
    """down(rmsnorm(relu(gate(x))² · up(x))) on the same random weights as BitNetMLP (whose norm computes in
    float32); its count is HF's."""
    import transformers as tf
    from transformers.models.bitnet.modeling_bitnet import BitNetMLP

    hf_cfg = tf.BitNetConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, rms_norm_eps=1e-3)
    hf = randomise(BitNetMLP(hf_cfg).double())
    cfg = tiny(mlp={"kind": "relu2_glu", "d_ff": 48, "bias": False, "sub_norm": True})
    ours = parts.build(cfg).blocks[0].mlp
    with torch.no_grad():
        ours.gate_up.weight.copy_(torch.cat((hf.gate_proj.weight, hf.up_proj.weight)))
        ours.down.weight.copy_(hf.down_proj.weight)
        ours.sub_norm.weight.copy_(hf.ffn_sub_norm.weight)
        x = inputs()
        assert (hf.gate_proj(x) < 0).any()  # the ReLU cuts some
        torch.testing.assert_close(ours(x), hf(x), rtol=0, atol=1e-6)  # HF's RMSNorm runs in float32
    assert sum(p.numel() for p in hf.parameters()) == count_params(cfg)["mlp"] // cfg.n_layer == 3 * 32 * 48 + 48


@pytest.mark.parametrize("kind, width", [("relu2", 128), ("swiglu", 48)])
def test_a_sub_norm_norms_the_hidden_activations_of_a_plain_and_a_gated_mlp(kind, width):
    """The down projection reads rms(h)·w where h is the MLP's hidden activations without the sub-norm;
    the count grows by one scale of the hidden width (and a shift under LayerNorm)."""
    d_ff = {} if kind == "relu2" else {"d_ff": width}
    plain, normed = tiny(mlp={"kind": kind, **d_ff}), tiny(mlp={"kind": kind, "sub_norm": True, **d_ff})
    a, b = parts.build(plain).blocks[0].mlp, parts.build(normed).blocks[0].mlp
    b.load_state_dict(a.state_dict(), strict=False)
    down = "proj" if kind == "relu2" else "down"
    seen = {}
    getattr(a, down).register_forward_hook(lambda m, i, o: seen.__setitem__("a", i[0]))
    getattr(b, down).register_forward_hook(lambda m, i, o: seen.__setitem__("b", i[0]))
    with torch.no_grad():
        a(inputs())
        b(inputs())
    torch.testing.assert_close(seen["b"], rms(seen["a"], b.sub_norm.weight, 1e-3))
    assert count_params(normed)["mlp"] - count_params(plain)["mlp"] == 2 * width
    layernorm = {"norm": {"kind": "layernorm", "eps": 1e-3}}
    ln_plain, ln_normed = (
        tiny(mlp={"kind": kind, **d_ff}, **layernorm),
        tiny(mlp=dict(normed.mlp.__dict__), **layernorm),
    )
    assert count_params(ln_normed)["mlp"] - count_params(ln_plain)["mlp"] == 2 * 2 * width
    assert (
        sum(p.numel() for p in build_model(ln_normed).blocks[0].mlp.parameters()) * 2 == count_params(ln_normed)["mlp"]
    )


def test_an_attention_sub_norm_norms_the_heads_output_before_the_projection():
    """The output projection reads rms(y)·w, y the heads' output [B, T, H·hd] of the same attention without
    it; H·hd more parameters per layer."""
    plain, normed = tiny(), tiny(attention={"n_head": 4, "n_kv_head": 2, "sub_norm": True})
    a, b = parts.build(plain).blocks[0].attn, parts.build(normed).blocks[0].attn
    b.load_state_dict(a.state_dict(), strict=False)
    seen = {}
    a.proj.register_forward_hook(lambda m, i, o: seen.__setitem__("a", i[0]))
    b.proj.register_forward_hook(lambda m, i, o: seen.__setitem__("b", i[0]))
    with torch.no_grad():
        a(inputs())
        b(inputs())
    torch.testing.assert_close(seen["b"], rms(seen["a"], b.sub_norm.weight, 1e-3))
    assert count_params(normed)["attention"] - count_params(plain)["attention"] == 2 * 32


def test_the_fused_relu2_gate_s_gradient_is_the_formula_s():
    """glu's own backward for relu2 (2·relu(g)·up into the gate half, relu(g)² into the up half) equals
    autograd through relu(g)²·up."""
    h = torch.randn(3, 5, 16, dtype=F64, requires_grad=True)
    grad = torch.randn(3, 5, 8, dtype=F64)
    (fused,) = torch.autograd.grad(glu(h, "relu2"), h, grad)
    gate, up = h.chunk(2, dim=-1)
    (formula,) = torch.autograd.grad(torch.relu(gate).square() * up, h, grad)
    torch.testing.assert_close(fused, formula, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"attention": {"n_head": 4, "n_kv_head": 2, "sub_norm": True}}, "model.attention.sub_norm"),
        ({"mlp": {"kind": "swiglu", "sub_norm": True}}, "model.mlp.sub_norm"),
        ({"mlp": {"kind": "relu2_glu"}}, "model.mlp.kind"),
    ],
)
def test_only_bitnet_holds_them(settings, field):
    """Every other family names the field it cannot hold."""
    assert parity.families_holding(tiny(position={"kind": "rope"}, **settings), {field}) == {"bitnet"}


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model/mlp=moe", "model.mlp.sub_norm=true"], "model.mlp.sub_norm"),
        (["model/mlp=moe", "model.mlp.expert=relu2_glu"], "model.mlp.expert"),  # no experts of it (yet)
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model(["model=nano", *overrides])
    assert err.value.field == field


def test_the_parts_are_read_and_described():
    cfg = compose_model(
        ["model=nano", "model/mlp=relu2_glu", "model.mlp.sub_norm=true", "model.attention.sub_norm=true"]
    )
    assert ignored(cfg) == []
    assert entries(cfg).attention.describe(cfg).endswith("sub-norm")


def test_they_train():
    """A few AdamW steps on one repeated batch lower the loss, every parameter reached by a gradient."""
    overrides = ["model/mlp=relu2_glu", "model.mlp.sub_norm=true", "model.attention.sub_norm=true"]
    parts.check_trains(overrides, n_layer=1, length=16, steps=15)
