"""LAuReL (``model.block.laurel_rank``, archlab/nn/laurel.py): its branch against transformers'
``Gemma3nTextLaurelBlock`` (every weight randomised) joined as ``Gemma3nTextDecoderLayer`` joins it; a sandwich
and a pre block with it against their parts written out; the closed-form counts by hand, per layer kind too;
a model that trains and decodes in pieces as it runs whole; the refusals."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.mixers import check_trains_then_decodes_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.block import build_block
from archlab.nn.laurel import Laurel

pytestmark = pytest.mark.usefixtures("single_thread")

D, R = 32, 4
TINY = ["model=nano", "model.d_model=32", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]
LAUREL = [*TINY, "model/norm=rmsnorm", "model.norm.eps=1e-6", f"model.block.laurel_rank={R}"]


def test_the_branch_is_gemma3n_s_laurel_block_joined_as_its_layer_joins_it():
    """``(x + attn + Gemma3nTextLaurelBlock(n))/√2``, n the normed input: float32, every weight random."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextLaurelBlock

    ours = randomise(Laurel(compose_model(LAUREL)), seed=1)
    theirs = Gemma3nTextLaurelBlock(
        transformers.Gemma3nTextConfig(hidden_size=D, laurel_rank=R, rms_norm_eps=1e-6, num_hidden_layers=2)
    )
    with torch.no_grad():
        theirs.linear_left.weight.copy_(ours.left.weight)
        theirs.linear_right.weight.copy_(ours.right.weight)
        theirs.post_laurel_norm.weight.copy_(ours.norm.weight)
    g = torch.Generator().manual_seed(2)
    x, normed = torch.randn(2, 5, D, generator=g), torch.randn(2, 5, D, generator=g)
    torch.testing.assert_close(ours(x, normed), (x + theirs(normed)) / math.sqrt(2), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("block", ["sandwich", "pre"])
def test_a_block_with_it_is_its_parts_written_out(block):
    """The stream after attention is (x + attended + n + norm(B·A·n))/√2, n = attn_norm(x), then the block's
    MLP step as it is (sandwich: normed after; pre: added as it is); every weight random."""
    cfg = compose_model([*LAUREL, f"model/block={block}", "model.position.kind=none"])
    b = randomise(build_block(cfg, 0), seed=3).eval()
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        n = b.attn_norm(x)
        attended = b.attn(n, None, None, None, 0)
        if block == "sandwich":
            attended = b.attn_out_norm(attended)
        assert b.laurel is not None
        h = (x + attended + n + b.laurel.norm(b.laurel.right(b.laurel.left(n)))) / math.sqrt(2)
        out = b.mlp(b.mlp_norm(h))
        expected = h + (b.mlp_out_norm(out) if block == "sandwich" else out)
        torch.testing.assert_close(b(x), expected, rtol=1e-5, atol=1e-5)


def test_the_counts_are_the_closed_form_worked_by_hand():
    """d 32, r 4: per layer A and B 2·32·4 and an RMSNorm of 32, 288; over 2 layers 576, or 288 where a
    layer kind leaves the first layer without it; FLOPs 6 per weight."""
    plain = count_params(compose_model([*TINY, "model/norm=rmsnorm"]))
    laurel = count_params(compose_model(LAUREL))
    assert laurel["laurel"] == 2 * (2 * 32 * 4 + 32) == 576 and plain["laurel"] == 0
    assert laurel["total"] - plain["total"] == 576 and laurel["per_block"] - plain["per_block"] == 288
    assert laurel["flops_per_token"] - plain["flops_per_token"] == 6 * 576
    first_without = [*LAUREL, "+model.layers.kinds.bare.block.laurel_rank=0", "model.layers.first=[bare]"]
    assert count_params(compose_model(first_without))["laurel"] == 288


def test_a_model_with_it_trains_and_decodes_in_pieces_as_whole():
    torch.manual_seed(0)
    model = build_model(compose_model([*LAUREL, "model/block=sandwich"]))
    idx = torch.randint(0, 64, (4, 24))
    check_trains_then_decodes_in_pieces(model, idx, [10, 11, 12, 24])


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.block.laurel_rank=-1"],
        ["model/block=post"],
        ["model/block=parallel"],
        ["model.block.attn_norm=false"],
        ["model/stream=hyper"],
        ["model/block=normed_skip"],
    ],
)
def test_bad_settings_name_the_field(overrides):
    with pytest.raises(ConfigError) as err:
        compose_model([*LAUREL, *overrides])
    assert err.value.field == "model.block.laurel_rank"
