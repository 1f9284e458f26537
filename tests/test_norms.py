"""The norms (archlab/nn/norms.py): the (1 + w) scale (``model.norm.unit_offset``: Gemma's RMSNorm, in
float32 under bf16; Nemotron's LayerNorm1P, also against transformers' NemotronLayerNorm1P) against the
norm written out, its count and a short fit; ``model.norm.affine`` (OLMo's LayerNorm that learns nothing)
against transformers' OlmoLayerNorm and the normalisation written out, per head too, its count, its
validation, the families that hold it and a short fit. The QK-norms built from them:
tests/test_attention_qk.py."""

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.hf import families_of_its_mixers, max_diff, randomize
from helpers.parts import F64, build, check_trains, plain, rms, short_fit, tiny

from archlab import ConfigError, build_model, compose_model, count_params


def test_unit_offset_layernorm_is_nemotron_s_layernorm1p():
    """archlab's LayerNorm with unit_offset equals transformers' NemotronLayerNorm1P on the same w and b."""
    pytest.importorskip("transformers")
    from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P

    hf = randomize(NemotronLayerNorm1P(64, eps=1e-3), seed=5)
    model = build_model(
        compose_model(["model=nano", "model.d_model=64", "model.norm.unit_offset=true", "model.norm.eps=1e-3"])
    )
    norm = model.final_norm
    norm.load_state_dict(hf.state_dict())
    x = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(6)) * 3 + 1
    with torch.no_grad():
        assert max_diff(norm(x), hf(x)) <= 1e-6
        assert max_diff(norm(x), torch.nn.functional.layer_norm(x, (64,), hf.weight, hf.bias, 1e-3)) > 0.1


# ---------------------------------------------------------------- model.norm.affine


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_a_norm_without_affine_is_the_normalisation_alone(kind):
    """No parameters; LayerNorm is (x - mean) / sqrt(var + eps) (transformers' OlmoLayerNorm), RMSNorm
    x / sqrt(mean(x²) + eps), per head too (QK-norm); counted as 0 parameters."""
    pytest.importorskip("transformers")
    from transformers.models.olmo.modeling_olmo import OlmoLayerNorm

    cfg = tiny(norm={"kind": kind, "eps": 1e-5, "affine": False}, attention={"qk_norm": "head"})
    model = build_model(cfg)
    block: Any = model.blocks[0]
    norm = block.attn_norm
    assert list(norm.parameters()) == [] and list(block.attn.q_norm.parameters()) == []
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(0)) * 2 + 0.7
    if kind == "layernorm":
        want = OlmoLayerNorm(32)(x)
    else:
        want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), want, rtol=0, atol=1e-6)
    heads = x.unflatten(-1, (4, 8))
    torch.testing.assert_close(norm.per_head(heads), F.layer_norm(heads, (8,)) if kind == "layernorm" else
                               heads / torch.sqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-5), rtol=0, atol=1e-6)  # fmt: skip
    counts, affine = (
        count_params(cfg),
        count_params(tiny(norm={"kind": kind, "eps": 1e-5}, attention={"qk_norm": "head"})),
    )
    assert counts["norms"] == counts["final_norm"] == 0
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    per = 2 if kind == "layernorm" else 1  # scale (and shift): 2 layers of 2 norms of 32, the final one, 2 QK of 8
    assert affine["total"] - counts["total"] == per * (2 * 2 * 32 + 32 + 2 * 2 * 8)
    losses = short_fit(model, 48, 16)
    assert losses[-1] < losses[0] - 0.3


def test_norm_affine_validation():
    with pytest.raises(ConfigError) as err:
        build_model(tiny(norm={"kind": "rmsnorm", "affine": False, "unit_offset": True}))
    assert err.value.field == "model.norm.unit_offset"
    cfg = tiny()
    cfg.norm.affine = "no"  # type: ignore[assignment]
    with pytest.raises(ConfigError) as err:
        build_model(cfg)
    assert err.value.field == "model.norm.affine"
    # OPT (no elementwise affine) and nanochat (weightless RMSNorms) hold it too
    cfg = tiny(norm={"kind": "layernorm", "affine": False}, position={"kind": "rope"})
    others = [f for n, f in families_of_its_mixers(cfg).items() if n not in ("olmo", "opt", "nanochat")]
    assert all("model.norm.affine" in [p.field for p in f.problems(cfg)] for f in others)


# ---------------------------------------------------------------- model.norm.unit_offset (Gemma's, Nemotron's)


def test_unit_offset_rmsnorm_scales_by_one_plus_w():
    cfg = plain(norm={"unit_offset": True})
    fresh = build_model(cfg, dtype=F64)
    assert torch.equal(fresh.final_norm.weight, torch.zeros(32, dtype=F64))  # starts as the identity scale
    norm, x = build(cfg).final_norm, torch.randn(3, 32, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), rms(x, 1 + norm.weight, cfg.norm.eps))


def test_unit_offset_layernorm_scales_by_one_plus_w_and_keeps_its_bias():
    """Nemotron's LayerNorm1P: (x - mean) / sqrt(var + eps) · (1 + w) + b, w starting at 0; the count as
    LayerNorm's (d scales and d shifts)."""
    cfg = plain(norm={"kind": "layernorm", "unit_offset": True, "eps": 1e-3})
    fresh = build_model(cfg, dtype=F64)
    assert torch.equal(fresh.final_norm.weight, torch.zeros(32, dtype=F64))
    norm, x = build(cfg).final_norm, torch.randn(3, 32, dtype=F64)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), (x - mean) / torch.sqrt(var + 1e-3) * (1 + norm.weight) + norm.bias)
    assert count_params(cfg)["final_norm"] == 2 * 32


def test_unit_offset_rmsnorm_in_bf16_adds_the_offset_in_float32():
    """Gemma computes 1 + w in float32: in bf16 a small w would be rounded away (1 + 1e-3 is 1 in bf16)."""
    norm = build_model(plain(norm={"unit_offset": True}), dtype=torch.bfloat16).final_norm
    with torch.no_grad():
        norm.weight.copy_(torch.full((32,), 1e-3))
        x = torch.randn(4, 32).to(torch.bfloat16)
        expected = (rms(x.float(), 1 + norm.weight.float(), 1e-5)).to(torch.bfloat16)
        assert torch.equal(norm(x), expected)


@pytest.mark.parametrize(
    "overrides",
    [
        ["model/norm=rmsnorm", "model.norm.unit_offset=true", "model.scale_embedding=true"],
        ["model.norm.unit_offset=true"],
    ],
    ids=["gemma-norm-embed", "layernorm-unit-offset"],
)
def test_each_part_trains(overrides):
    """A few AdamW steps on one repeated batch lower the loss: gradients reach every part."""
    check_trains(overrides, n_layer=2, length=32, steps=25)
