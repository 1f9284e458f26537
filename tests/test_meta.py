"""Published layouts: every preset counted analytically and built on the meta device (no storage)
equals the Hugging Face count, and REFERENCE.md's closed forms written out by hand agree."""

from __future__ import annotations

import pytest
from published import PUBLISHED

from archlab import build_model, compose_model, count_params
from archlab.accounting import built_counts


@pytest.mark.parametrize("preset", PUBLISHED)
def test_preset_on_meta_matches_published_count(preset):
    cfg = compose_model([f"model={preset}"])
    assert count_params(cfg)["total"] == PUBLISHED[preset]
    model = build_model(cfg, device="meta")
    assert all(p.is_meta for p in model.parameters())  # nothing allocated
    assert built_counts(model)["total"] == PUBLISHED[preset]


# REFERENCE.md's closed forms (f = d_ff), with each preset's sizes typed in from its table.


def gpt2_total(V, ctx, L, d, f):
    block = 4 * d * d + 2 * d * f + 9 * d + f  # qkv + out (4d² + 4d), MLP (2df + f + d), two LayerNorms (4d)
    return block, (V + ctx) * d + L * block + 2 * d


def gptj_total(V, L, d, f):
    block = 4 * d * d + 2 * d * f + f + 3 * d  # no attention biases; MLP biases; one shared LayerNorm
    return block, V * d + L * block + 2 * d + V * d + V  # untied head with a bias


def llama_total(V, L, d, H, KV, hd, f):
    block = 2 * d * H * hd + 2 * d * KV * hd + 3 * d * f + 2 * d  # q, o; k, v; gate, up, down; two RMSNorms
    return block, 2 * V * d + L * block + d


CLOSED_FORMS = {
    "gpt2": gpt2_total(V=50257, ctx=1024, L=12, d=768, f=3072),
    "gpt2-medium": gpt2_total(V=50257, ctx=1024, L=24, d=1024, f=4096),
    "gpt2-large": gpt2_total(V=50257, ctx=1024, L=36, d=1280, f=5120),
    "gpt2-xl": gpt2_total(V=50257, ctx=1024, L=48, d=1600, f=6400),
    "gptj-6b": gptj_total(V=50400, L=28, d=4096, f=16384),
    "llama-7b": llama_total(V=32000, L=32, d=4096, H=32, KV=32, hd=128, f=11008),
    "llama-13b": llama_total(V=32000, L=40, d=5120, H=40, KV=40, hd=128, f=13824),
    "llama-65b": llama_total(V=32000, L=80, d=8192, H=64, KV=64, hd=128, f=22016),
    "llama2-7b": llama_total(V=32000, L=32, d=4096, H=32, KV=32, hd=128, f=11008),
    "llama2-70b": llama_total(V=32000, L=80, d=8192, H=64, KV=8, hd=128, f=28672),
    "llama3-8b": llama_total(V=128256, L=32, d=4096, H=32, KV=8, hd=128, f=14336),
    "llama3-70b": llama_total(V=128256, L=80, d=8192, H=64, KV=8, hd=128, f=28672),
}


@pytest.mark.parametrize("preset", CLOSED_FORMS)
def test_closed_forms_equal_count_params(preset):
    block, total = CLOSED_FORMS[preset]
    counts = count_params(compose_model([f"model={preset}"]))
    assert counts["per_block"] == block
    assert counts["total"] == total == PUBLISHED[preset]


def test_llama2_70b_breakdown_by_hand():
    V, L, d, H, KV, hd, f = 32000, 80, 8192, 64, 8, 128, 28672
    counts = count_params(compose_model(["model=llama2-70b"]))
    assert {
        k: counts[k]
        for k in ("token_embedding", "position_embedding", "attention", "mlp", "norms", "final_norm", "head")
    } == {
        "token_embedding": V * d,
        "position_embedding": 0,  # rope has no parameters
        "attention": L * (d * H * hd + 2 * d * KV * hd + H * hd * d),
        "mlp": L * 3 * d * f,
        "norms": L * 2 * d,
        "final_norm": d,
        "head": V * d,
    }
