"""Input injection in looped layers (``model.layers.loop.inject``, Dory's): each pass starts from norm(h) + norm(e),
e the state entering the loop, against the walk written out here over the model's own blocks; through the KV
cache in pieces and a padded batch; its refusals and its report when no loop reads it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.mixers import decode_in_pieces, randomise
from omegaconf import OmegaConf

from archlab import build_model
from archlab.config import to_model_config
from archlab.errors import ConfigError
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")

BASE = {
    "vocab_size": 48,
    "context_length": 16,
    "n_layer": 4,
    "d_model": 32,
    "norm": {"kind": "l2", "eps": 1e-12},
    "position": {"kind": "rope"},
    "attention": {"n_head": 4},
    "mlp": {"kind": "swiglu", "d_ff": 40, "bias": False},
    "layers": {"loop": {"start": 1, "end": 3, "passes": 3, "inject": True}},
}


def cfg_of(**overrides):
    return to_model_config(OmegaConf.merge(BASE, overrides))


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def walked(model: Any, idx):
    """Layer 0; e = unit(h); three passes of layers 1 and 2, each from unit(h) + e; layer 3; the final norm and head."""
    h = model.tok_emb(idx)
    rotary = model.position.rotary(torch.arange(idx.shape[1]), h.dtype, cached=False)

    def run(i, x):
        return model.blocks[i](x, rotary)  # causal: no mask

    h = run(0, h)
    e = unit(h)
    for _ in range(3):
        h = unit(h) + e
        h = run(2, run(1, h))
    return model.head(unit(run(3, h)))


def test_each_pass_starts_from_the_injected_input():
    """Every weight random: the logits are the walk written out; without the injection they differ."""
    model = randomise(build_model(cfg_of(), dtype=torch.float64), 0).eval()
    idx = torch.randint(0, 48, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = walked(model, idx)
        torch.testing.assert_close(model(idx), expected, rtol=1e-10, atol=1e-10)
        plain = randomise(build_model(cfg_of(layers={"loop": {"inject": False}}), dtype=torch.float64), 0).eval()
        assert (plain(idx) - expected).abs().max() > 1e-3


@pytest.mark.parametrize("window", [None, 3])
def test_cached_decoding_and_padding_follow_the_full_forward(window):
    """Prefill, a chunk, then token by token through one cache (each pass its own), a left-padded row among
    them: the logits of the whole sequence run at once."""
    model = randomise(build_model(cfg_of(attention={"window": window}), dtype=torch.float64), 1).eval()
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        full = model(idx, attention_mask=mask)
        pieces = decode_in_pieces(model, idx, [5, 8, 9, 10, 11, 12], mask)
    torch.testing.assert_close(pieces[0], full[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(pieces[1, 3:], full[1, 3:], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "overrides",
    [{"norm": {"kind": "rmsnorm"}}, {"stream": {"kind": "hyper"}}],
    ids=["norm-with-weights", "streams"],
)
def test_refusals(overrides):
    with pytest.raises(ConfigError) as error:
        validate(cfg_of(**overrides))
    assert error.value.field == "model.layers.loop.inject"


def test_inject_without_a_loop_is_reported_ignored():
    cfg = cfg_of(layers={"loop": {"passes": 1, "start": 0, "end": None}})
    assert [i.field for i in ignored(cfg)] == ["model.layers.loop.inject"]
