"""Differential attention (archlab/nn/mixers/differential.py): one layer against the paper's formula written
out per head pair, λ_init by hand, the refusals; and DiffLlama both ways (transformers' DiffLlamaForCausalLM,
every weight randomised): logits, greedy generation, and the round trips bit for bit."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import torch
from helpers import hf as parity
from helpers.hf import HF_SIZES, NO_TOKENS, TOL, hf_case, logits, max_diff, randomize

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.config import to_model_config
from archlab.interop.hf import config_to_hf, from_hf, hf_family
from archlab.nn.mixers.differential import lambda_init

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("single_thread")

DIFF = {"num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 80, "rms_norm_eps": 1e-5}
HF_CASES = {
    "gqa": ("DiffLlamaForCausalLM", "DiffLlamaConfig", HF_SIZES | DIFF | NO_TOKENS | {"num_key_value_heads": 2}),
    "biases-tied": (
        "DiffLlamaForCausalLM",
        "DiffLlamaConfig",
        HF_SIZES | DIFF | NO_TOKENS | {"num_key_value_heads": 4, "attention_bias": True, "tie_word_embeddings": True},
    ),
}


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_from_hf_gives_hf_logits_and_back_bit_for_bit(case):
    hf = hf_case(HF_CASES, case, attn_implementation="eager")
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == "diffllama"
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)
    parity.check_back_and_again(hf, model, attn_implementation="eager")


def test_an_archlab_layout_converts_to_hf_and_back():
    """LLaMA's preset shrunk, its attention made differential: DiffLlamaForCausalLM, the same logits, back
    bit for bit."""
    cfg = compose_model(
        ["model=llama2-7b", "model.n_layer=2", "model.d_model=64", "model.attention.n_head=4"]
        + ["model.vocab_size=96", "model.context_length=64", "model.mlp.d_ff=80", "model/attention=differential"]
    )
    model = randomize(build_model(cfg), seed=3)
    parity.check_to_hf_and_back(model, "DiffLlamaForCausalLM", attn_implementation="eager")


def test_a_scale_diffllama_does_not_have_is_refused_naming_it():
    """The layout above with a scale of its own (as μP sets it): converting names model.attention.scale, the
    field DiffLlama cannot hold, not the mixer kind."""
    cfg = compose_model(
        ["model=llama2-7b", "model.n_layer=2", "model.d_model=64", "model.attention.n_head=4"]
        + ["model/attention=differential", "model.attention.scale=0.05"]
    )
    assert hf_family(cfg) == "diffllama"
    parity.check_refuses(lambda: config_to_hf(cfg), "model.attention.scale", "DiffLlama")


def _reference(layer: torch.nn.Module, x: torch.Tensor, layer_index: int, eps: float) -> torch.Tensor:
    """The paper's layer written out, no RoPE: pair p of heads p and p + H/2 reads the values of key/value
    heads j = p·KV/H (first half) and KV/2 + j mod KV/2 side by side; softmax maps by explicit scores with
    a causal mask, their difference by λ, an RMSNorm without weight, times 1 − λ_init, the projection."""
    H, KV, hd = layer.n_head, layer.n_kv_head, layer.head_dim
    B, T, _ = x.shape
    q, k, v = layer.qkv(x).unflatten(-1, (H + 2 * KV, hd)).split((H, KV, KV), dim=2)
    lam = (
        math.exp(float(layer.lambda_q1 @ layer.lambda_k1))
        - math.exp(float(layer.lambda_q2 @ layer.lambda_k2))
        + lambda_init(layer_index)
    )
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    outputs = []
    for h in range(H):
        kv = h * KV // H
        scores = (q[:, :, h] @ k[:, :, kv].transpose(1, 2)) / math.sqrt(hd)
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        values = torch.cat((v[:, :, kv % (KV // 2)], v[:, :, KV // 2 + kv % (KV // 2)]), dim=-1)
        outputs.append(weights @ values)  # [B, T, 2·hd]
    pairs = []
    for p in range(H // 2):
        d = outputs[p] - lam * outputs[p + H // 2]
        pairs.append(d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + eps) * (1 - lambda_init(layer_index)))
    return layer.proj(torch.cat(pairs, dim=-1))


@pytest.mark.parametrize("n_kv_head", [2, 4])
def test_a_layer_is_the_papers_formula_per_head_pair(n_kv_head):
    cfg = to_model_config(
        {
            "vocab_size": 32,
            "context_length": 16,
            "n_layer": 2,
            "d_model": 32,
            "norm": {"kind": "rmsnorm", "eps": 1e-5},
            "position": {"kind": "none"},
            "attention": {"kind": "differential", "n_head": 4, "n_kv_head": n_kv_head, "qkv_bias": True},
        }
    )
    model = randomize(build_model(cfg, dtype=torch.float64), seed=5)
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for i, block in enumerate(model.blocks):
        with torch.no_grad():
            torch.testing.assert_close(block.attn(x, layer=i), _reference(block.attn, x, i, 1e-5))
    assert count_params(cfg)["attention"] == 2 * (
        32 * (4 + 2 * n_kv_head) * 8 + (4 + 2 * n_kv_head) * 8 + 32 * 32 + 4 * 8
    )


def test_lambda_init_by_hand():
    assert lambda_init(0) == pytest.approx(0.2)
    assert lambda_init(1) == pytest.approx(0.8 - 0.6 * 0.7408182206817179)
    assert lambda_init(30) == pytest.approx(0.8, abs=1e-4)


@pytest.mark.parametrize(
    "attention, field",
    [
        ({"n_head": 3, "head_dim": 8}, "model.attention.n_head"),
        ({"n_head": 4, "n_kv_head": 1}, "model.attention.n_kv_head"),
        ({"n_head": 6, "n_kv_head": 4}, "model.attention.n_kv_head"),
        ({"n_head": 4, "window": 8}, "model.attention.window"),  # a field of the causal kind, not of this mixer
    ],
)
def test_a_layout_it_cannot_compute_is_refused_naming_the_field(attention, field):
    from archlab.nn.validation import validate

    with pytest.raises(ConfigError) as refused:
        validate(to_model_config({"d_model": 24, "attention": {"kind": "differential", **attention}}))
    assert refused.value.field == field


def _scale(cfg) -> float:
    """The first layer's score multiplier, as built."""
    return cast(Any, build_model(cfg, device="meta").blocks[0]).attn.scale


def test_mup_gives_its_scores_the_1_over_head_dim_temperature():
    """param=mup at twice the proxy's width (nano's 4 heads of 64 against 32): the logits × 1/2 as for any
    mixer, and the scores' multiplier (1/sqrt(64))·sqrt(32/64), μP's 1/head_dim attention as the causal
    kind's, as the model's mixer and as a layer kind's (it stayed at DiffLlama's 1/sqrt(64)); a proxy's tuned
    0.5 becomes 0.5·sqrt(1/2); at the proxy's width and under sp 1/sqrt(head_dim) as before; a scale that is
    not positive is refused naming the field."""
    from archlab.training.parametrization import parametrize

    param = {"kind": "mup", "base_d_model": 128, "base_n_layer": None, "base_head_dim": None}
    diff = ["model=nano", "model/attention=differential"]
    cfg = compose_model([*diff, "model.d_model=256"])
    scaled = parametrize(cfg, param)
    assert scaled.head.logit_scale == 0.5
    mup = 1 / math.sqrt(64) * math.sqrt(32 / 64)
    assert _scale(scaled) == pytest.approx(mup)
    tuned = parametrize(compose_model([*diff, "model.d_model=256", "model.attention.scale=0.5"]), param)
    assert tuned.attention.scale == pytest.approx(0.5 * math.sqrt(1 / 2))
    proxy = parametrize(compose_model([*diff, "model.d_model=128"]), param)
    assert _scale(proxy) == pytest.approx(1 / math.sqrt(32))
    assert _scale(cfg) == pytest.approx(1 / 8)
    kind = ["model=nano", "+model.layers.kinds.diff={attention: {kind: differential}}", "model.layers.pattern=[diff]"]
    layered = parametrize(compose_model([*kind, "model.d_model=256"]), param)
    assert _scale(layered) == pytest.approx(mup)
    with pytest.raises(ConfigError) as refused:
        compose_model([*diff, "model.attention.scale=0"])
    assert refused.value.field == "model.attention.scale"
