"""Every preset reproduces its published parameter count three ways: the closed-form count, the
archlab model built on the meta device, and the Hugging Face model of the config that
``config_to_hf`` writes, built by transformers on the meta device (the independent reference)."""

import pytest
import torch
from published import PUBLISHED

from archlab import build_model, compose_model, count_params
from archlab.interop.hf import config_to_hf

transformers = pytest.importorskip("transformers")


def gpt2_closed_form(V, ctx, d, L, f):
    """REFERENCE.md: (V + ctx)·d + L·(4d² + 2df + 9d + f) + 2d."""
    return (V + ctx) * d + L * (4 * d * d + 2 * d * f + 9 * d + f) + 2 * d


def llama_closed_form(V, d, L, H, KV, hd, f):
    """REFERENCE.md: 2V·d + L·(2d·H·hd + 2d·KV·hd + 3d·f + 2d) + d."""
    return 2 * V * d + L * (2 * d * H * hd + 2 * d * KV * hd + 3 * d * f + 2 * d) + d


def hf_meta_count(cfg) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config_to_hf(cfg))
    return sum(p.numel() for p in model.parameters())  # a tied tensor is listed once


@pytest.mark.parametrize("preset", list(PUBLISHED))
def test_preset_reproduces_published_count(preset):
    cfg = compose_model([f"model={preset}"])
    assert count_params(cfg)["total"] == PUBLISHED[preset]
    assert sum(p.numel() for p in build_model(cfg, device="meta").parameters()) == PUBLISHED[preset]
    assert hf_meta_count(cfg) == PUBLISHED[preset]


def test_nano_matches_gpt2_closed_form_and_hf():
    cfg = compose_model(["model=nano"])
    expected = gpt2_closed_form(V=256, ctx=256, d=128, L=4, f=512)
    assert count_params(cfg)["total"] == expected == 858_880
    assert hf_meta_count(cfg) == expected


def test_every_shipped_preset_has_a_reference():
    from archlab.cli.check import REFERENCE_COUNTS, presets

    assert set(presets()) == set(PUBLISHED) | {"nano"}
    assert {k: v for k, v in REFERENCE_COUNTS.items() if k != "nano"} == PUBLISHED


def test_preset_with_fewer_layers_follows_closed_form():
    # llama2-70b: d 8192, 64 heads, 8 KV heads of 128, f = 28672 (REFERENCE.md), two layers.
    cfg = compose_model(["model=llama2-70b", "model.n_layer=2"])
    expected = llama_closed_form(V=32000, d=8192, L=2, H=64, KV=8, hd=128, f=28672)
    assert count_params(cfg)["total"] == expected
    assert hf_meta_count(cfg) == expected


def test_gpt2_with_rope_drops_only_the_position_table():
    cfg = compose_model(["model=gpt2", "model/position=rope"])
    assert (cfg.n_layer, cfg.d_model, cfg.attention.n_head, cfg.head.tied) == (12, 768, 12, True)  # sizes kept
    assert count_params(cfg)["total"] == PUBLISHED["gpt2"] - 1024 * 768
    assert sum(p.numel() for p in build_model(cfg, device="meta").parameters()) == PUBLISHED["gpt2"] - 1024 * 768
