"""The blocks (archlab/nn/block.py): the post-sublayer (OLMo 2) and sandwich (Gemma 2) norms against the
block written out here, their closed-form counts and a short fit. The residual multiplier in every block
kind: tests/test_model.py."""

import pytest
import torch
import torch.nn.functional as F
from helpers.parts import F64, build, check_trains, plain, reference_attention, rms

from archlab import count_params

pytestmark = pytest.mark.usefixtures("single_thread")


def test_post_sublayer_and_sandwich_blocks_equal_their_formulas():
    x = torch.randn(2, 5, 32, dtype=F64)
    for kind in ("post_sublayer", "sandwich"):
        cfg = plain(block={"kind": kind}, mlp={"kind": "swiglu", "bias": False})
        block = build(cfg).blocks[0]
        eps = cfg.norm.eps
        with torch.no_grad():
            h = x if kind == "post_sublayer" else rms(x, block.attn_norm.weight, eps)
            h = x + rms(reference_attention(block.attn, h, eps), block.attn_out_norm.weight, eps)
            m = h if kind == "post_sublayer" else rms(h, block.mlp_norm.weight, eps)
            gate, up = (m @ block.mlp.gate_up.weight.T).chunk(2, dim=-1)
            expected = h + rms((F.silu(gate) * up) @ block.mlp.down.weight.T, block.mlp_out_norm.weight, eps)
            torch.testing.assert_close(block(x), expected)
        norms = {"post_sublayer": 2, "sandwich": 4}[kind]
        assert count_params(cfg)["norms"] == cfg.n_layer * norms * 32  # RMSNorm: d scales each
        assert count_params(cfg)["final_norm"] == 32


@pytest.mark.parametrize(
    "overrides",
    [["model/block=post_sublayer"], ["model/block=sandwich", "model/mlp=geglu", "model.mlp.approximate=tanh"]],
    ids=["post-sublayer", "sandwich"],
)
def test_each_part_trains(overrides):
    """A few AdamW steps on one repeated batch lower the loss: gradients reach every part."""
    check_trains(overrides, n_layer=2, length=32, steps=25)
