"""The MLPs (archlab/nn/mlp.py): the squared-ReLU MLP (Primer; Arcee AFM, Nemotron, Jais 2, Persimmon,
nanochat), as a dense MLP and as the experts of a MoE (Nemotron-H's). Each is compared with its formula and
with transformers' own module on the same random weights, counted in closed form, refused by every Hugging
Face family but those that hold it, validated, read (never reported as ignored), described and trained a
few steps."""

from __future__ import annotations

import pytest
import torch
from helpers import hf as parity
from helpers import parts
from helpers.parts import F64, inputs, randomise

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.mlp import d_ff, relu_squared
from archlab.nn.validation import entries, ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(**overrides):
    """helpers.parts' tiny config, validated (the refusals below are validation's)."""
    return validate(parts.tiny(**overrides))


def build(cfg, seed=0):
    return randomise(build_model(cfg, dtype=F64).eval(), seed)


# ---------------------------------------------------------------- squared ReLU


def test_relu2_mlp_equals_its_formula_and_hugging_faces_relu2():
    """proj(relu(fc(x))²) with the plain width 4·d; transformers' ACT2FN["relu2"] is the same function."""
    from transformers.activations import ACT2FN

    cfg = tiny(mlp={"kind": "relu2"})
    m = build(cfg).blocks[0].mlp
    assert d_ff(cfg) == 4 * 32 and m.fc.out_features == 128
    x = inputs()
    with torch.no_grad():
        h = m.fc(x)
        assert (h < 0).any() and (h > 0).any()
        torch.testing.assert_close(m(x), m.proj(torch.where(h > 0, h * h, torch.zeros_like(h))))
    z = torch.linspace(-3, 3, 61, dtype=F64)
    torch.testing.assert_close(relu_squared(z), ACT2FN["relu2"](z), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["arcee", "nemotron"])
@pytest.mark.parametrize("bias", [False, True])
def test_relu2_mlp_equals_hugging_faces_mlp(family, bias):
    """Arcee AFM's and Nemotron's MLP, down(relu2(up(x))), on the same random weights."""
    import transformers as tf

    hf_cfg = {"arcee": tf.ArceeConfig, "nemotron": tf.NemotronConfig}[family](
        hidden_size=32, intermediate_size=48, num_attention_heads=4, mlp_bias=bias
    )
    assert hf_cfg.hidden_act == "relu2"
    module = {
        "arcee": tf.models.arcee.modeling_arcee.ArceeMLP,
        "nemotron": tf.models.nemotron.modeling_nemotron.NemotronMLP,
    }
    hf = randomise(module[family](hf_cfg).double())
    ours = build(tiny(mlp={"kind": "relu2", "d_ff": 48, "bias": bias})).blocks[0].mlp
    with torch.no_grad():
        ours.fc.load_state_dict(hf.up_proj.state_dict())
        ours.proj.load_state_dict(hf.down_proj.state_dict())
        x = inputs()
        torch.testing.assert_close(ours(x), hf(x))
    assert (
        sum(p.numel() for p in hf.parameters())
        == count_params(tiny(mlp={"kind": "relu2", "d_ff": 48, "bias": bias}))["mlp"] // 2
    )


def test_relu2_counts_as_a_plain_mlp():
    """Same count as relu, 2·d·f + f + d per layer with biases."""
    plain, relu = count_params(tiny(mlp={"kind": "relu2"})), count_params(tiny(mlp={"kind": "relu"}))
    assert plain["mlp"] == relu["mlp"] == 2 * (2 * 32 * 128 + 128 + 32)


def test_relu2_experts_equal_hugging_faces_nemotron_h_experts():
    """Nemotron-H's routed experts, down(relu2(up(x))) stacked [E, out, in] as archlab's fc and proj, on
    the same random weights and routing: archlab's routed sum equals NemotronHExperts'."""
    import transformers as tf
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHExperts

    hf_cfg = tf.NemotronHConfig(hidden_size=32, n_routed_experts=4, moe_intermediate_size=8, num_attention_heads=4)
    assert hf_cfg.mlp_hidden_act == "relu2" and hf_cfg.moe_latent_size is None
    hf = randomise(NemotronHExperts(hf_cfg).double())
    mlp = {"kind": "moe", "expert": "relu2", "routing": {"n_experts": 4, "top_k": 2}, "expert_d_ff": 8, "bias": False}
    moe = build(tiny(mlp=mlp)).blocks[0].mlp
    with torch.no_grad():
        moe.experts.fc.copy_(hf.up_proj)
        moe.experts.proj.copy_(hf.down_proj)
        x = inputs().flatten(0, 1)
        _, weights, indices = moe.route(x)
        assert len(indices.unique()) == 4  # every expert gets tokens
        torch.testing.assert_close(moe.routed(x, weights, indices), hf(x, indices, weights))


# ---- families, validation, reads, training


@pytest.mark.parametrize(
    "settings, fields, holders",
    [
        (
            {"mlp": {"kind": "relu2"}},
            {"model.mlp.kind"},
            {"arcee", "nemotron", "jais2", "persimmon", "nanochat", "nemotron_h"},
        ),
        # a dense family refuses the moe kind, a MoE family the experts' kind, but Nemotron-H's (Nemotron 3)
        ({"mlp": {"kind": "moe", "expert": "relu2"}}, {"model.mlp.kind", "model.mlp.expert"}, {"nemotron_h"}),
    ],
    ids=["relu2", "relu2-experts"],
)
def test_only_the_hugging_face_families_with_them_hold_them(settings, fields, holders):
    """Every other family names the field it cannot hold."""
    assert parity.families_holding(tiny(position={"kind": "rope"}, **settings), fields) == holders


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        (["model/mlp=moe", "model.mlp.expert=relu2", "model.mlp.approximate=tanh"], "model.mlp.approximate", "relu2"),
        (["model/mlp=moe", "model.mlp.expert=relu3"], "model.mlp.expert", "'relu2'"),
    ],
)
def test_bad_settings_name_their_field(overrides, field, allowed):
    with pytest.raises(ConfigError) as err:
        compose_model(["model=nano", *overrides])
    assert err.value.field == field and allowed in str(err.value)


@pytest.mark.parametrize("overrides", [["model/mlp=relu2"], ["model/mlp=moe", "model.mlp.expert=relu2"]])
def test_the_parts_are_read_not_ignored(overrides):
    """Each field set is one the chosen variant reads (so no run calls it ignored); a preset's tanh goes
    with GELU (relu2 has no such field; the moe option file resets it)."""
    cfg = compose_model(["model=gpt2", "model.n_layer=2", *overrides])
    assert ignored(cfg) == []
    assert getattr(cfg.mlp, "approximate", "none") == "none"


def test_layout_line_names_the_parts():
    a = {"clip_qkv": 8.0, "qk_norm": "head", "qk_norm_per_head_scale": True, "qk_norm_after_rope": True}
    cfg = tiny(attention=a, mlp={"kind": "moe", "expert": "relu2"})
    assert "relu2 experts" in entries(cfg).mlp.describe(cfg)
    assert (
        tiny(mlp={"kind": "relu2"}).mlp.kind == "relu2"
        and entries(tiny(mlp={"kind": "relu2"})).mlp.describe(tiny(mlp={"kind": "relu2"})) == "relu2 d_ff=128"
    )


@pytest.mark.parametrize(
    "overrides",
    [["model/mlp=relu2"], ["model/mlp=moe", "model.mlp.expert=relu2", "model.mlp.routing.n_experts=4"]],
    ids=["relu2", "relu2-experts"],
)
def test_each_part_trains(overrides):
    """A few AdamW steps on one repeated batch lower the loss, every parameter reached by a gradient."""
    parts.check_trains(overrides, n_layer=1, length=16, steps=15)


# ---------------------------------------------------------------- xIELU


def test_xielu_mlp_is_counted_by_hand_and_trains():
    """d 32 (tiny), d_ff 48, biases: 2·32·48 + 48 + 32 + 2 scalars per layer; a few AdamW steps on one batch
    lower the loss and move α_p and α_n (μP: vectors)."""
    from archlab.training.parametrization import roles

    cfg = tiny(mlp={"kind": "xielu", "d_ff": 48})
    assert entries(cfg).mlp.num_params(cfg) == 2 * 32 * 48 + 48 + 32 + 2
    model = build_model(cfg)
    act = model.blocks[0].mlp.act
    assert {roles(model)[id(p)].value for p in (act.alpha_p, act.alpha_n)} == {"vector"}
    before = (act.alpha_p.item(), act.alpha_n.item())
    idx = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(6):
        loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and (act.alpha_p.item(), act.alpha_n.item()) != before


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"alpha_n_init": 0.5}, "model.mlp.alpha_n_init"),  # α_n − β must be positive: softplus's range
        ({"alpha_p_init": 0.0}, "model.mlp.alpha_p_init"),
        ({"eps": 1e-3}, "model.mlp.eps"),
    ],
)
def test_xielu_refuses_settings_it_cannot_hold(fields, field):
    with pytest.raises(ConfigError) as err:
        tiny(mlp={"kind": "xielu", **fields})
    assert err.value.field == field
