"""The ``normed_skip`` block (archlab/nn/normed_skip.py, MiniMax-01's wiring) against the block written out here
from transformers' ``MiniMaxDecoderLayer``, its count, what it reads, its refusals and a short fit."""

import pytest
import torch
import torch.nn.functional as F
from helpers.parts import F64, build, check_trains, plain, reference_attention, rms

from archlab import ConfigError, count_params
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")

SCALES = {"attn_alpha": 3.5, "attn_beta": 0.7, "mlp_alpha": 1.9, "mlp_beta": 0.4}


@pytest.mark.parametrize("mlp", ["swiglu", "none"])
def test_the_block_is_its_formula(mlp):
    """h = 3.5·n1(x) + 0.7·attn(n1(x)); out = 1.9·n2(h) + 0.4·mlp(n2(h)) (without an MLP: h); the skip is
    the normed input, so the block's output does not carry x itself."""
    cfg = plain(
        block={"kind": "normed_skip", **SCALES}, mlp={"kind": mlp, "bias": False} if mlp != "none" else {"kind": mlp}
    )
    block = build(cfg).blocks[0]
    eps = cfg.norm.eps
    x = torch.randn(2, 5, 32, dtype=F64) * 3
    with torch.no_grad():
        u = rms(x, block.attn_norm.weight, eps)
        h = 3.5 * u + 0.7 * reference_attention(block.attn, u, eps)
        if mlp == "none":
            expected = h
        else:
            w = rms(h, block.mlp_norm.weight, eps)
            gate, up = (w @ block.mlp.gate_up.weight.T).chunk(2, dim=-1)
            expected = 1.9 * w + 0.4 * (F.silu(gate) * up) @ block.mlp.down.weight.T
        torch.testing.assert_close(block(x), expected)
    norms = 2 if mlp != "none" else 1
    assert count_params(cfg)["norms"] == cfg.n_layer * norms * 32  # the pre-norm block's norms, no more
    assert count_params(cfg)["final_norm"] == 32


def test_it_reads_its_multipliers_and_pre_ignores_them():
    """Set on normed_skip nothing is ignored but residual_multiplier; set on pre each multiplier is reported."""
    assert ignored(plain(block={"kind": "normed_skip", **SCALES})) == []
    names = {i.field for i in ignored(plain(block={"kind": "normed_skip", "residual_multiplier": 2.0}))}
    assert names == {"model.block.residual_multiplier"}
    names = {i.field for i in ignored(plain(block={"kind": "pre", **SCALES}))}
    assert names == {f"model.block.{name}" for name in SCALES}


@pytest.mark.parametrize("field", list(SCALES))
def test_a_multiplier_not_positive_is_refused(field):
    with pytest.raises(ConfigError) as error:
        validate(plain(block={"kind": "normed_skip", field: 0.0}))
    assert error.value.field == f"model.block.{field}"


def test_it_trains():
    """A few AdamW steps on one repeated batch lower the loss: gradients reach every part."""
    check_trains(["model/block=normed_skip", "model.block.attn_alpha=2.0"], n_layer=2, length=32, steps=25)
