"""Per-layer input embeddings (``model.per_layer_input``, Gemma 3n and 4's PLE) and the fixed scalar per layer
(``model.block.layer_scalar``): each layer's input and what a layer adds against their formulas recomputed from
the weights; the scalar at 1 is the model without it and scales the layer's stream; decoding in pieces as
whole; the counts by hand; every parameter's μP role declared; the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import decode_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.validation import ignored
from archlab.training.parametrization import roles

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["model=nano", "model.d_model=32", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]
TINY += ["model/norm=rmsnorm", "model.norm.eps=1e-6"]
PLE = [*TINY, "model.per_layer_input.dim=8", "model.per_layer_input.vocab=80", "model.block.layer_scalar=true"]


def _rms(x, w):
    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w


def test_each_layer_s_input_and_what_it_adds_are_the_formulas():
    """inputs = (RMS(proj(e)·d^-1/2) + table[idx]·sqrt(p))·2^-1/2, sliced per layer; a layer adds
    RMS(up(gelu_tanh(gate(x))·u_i)) to its stream, then times its scalar."""
    model = randomise(build_model(compose_model(PLE)), seed=3).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.layer_scalar.fill_(0.7)
    idx = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(4))
    ple = model.per_layer_inputs
    with torch.no_grad():
        e = model.embed(idx)
        u = ple(idx, e)
        projected = _rms((e @ ple.projection.weight.T * 32**-0.5).unflatten(-1, (2, 8)), ple.norm.weight)
        expected = (projected + ple.table.weight[idx].unflatten(-1, (2, 8)) * 8**0.5) * 2**-0.5
        torch.testing.assert_close(u, expected, rtol=1e-5, atol=1e-6)
        x, block = torch.randn(2, 10, 32), model.blocks[1]
        g = block.per_layer_input
        added = _rms(F.gelu(x @ g.gate.weight.T, approximate="tanh") * u[:, :, 1] @ g.up.weight.T, g.norm.weight)
        torch.testing.assert_close(block.finish(x, u[:, :, 1]), (x + added) * 0.7, rtol=1e-5, atol=1e-6)


def test_the_scalar_at_1_is_the_model_without_it_and_is_kept_in_the_weights():
    plain = randomise(build_model(compose_model(TINY)), seed=5).eval()
    scaled = build_model(compose_model([*TINY, "model.block.layer_scalar=true"])).eval()
    missing = scaled.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["blocks.0.layer_scalar", "blocks.1.layer_scalar"]  # a buffer of the weights
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(scaled(idx), plain(idx), rtol=0, atol=0)
        scaled.blocks[0].layer_scalar.fill_(3.0)
        assert not torch.allclose(scaled(idx), plain(idx))


def test_decoding_in_pieces_is_the_whole():
    model = randomise(build_model(compose_model(PLE)), seed=6).eval()
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        whole = model(idx)
    torch.testing.assert_close(decode_in_pieces(model, idx, [9, 10, 16]), whole, rtol=1e-5, atol=1e-5)


def test_the_counts_are_the_closed_form_and_every_role_is_declared():
    """d = 32, L = 2, p = 8, 80 rows: the table 80·2·8 = 1280 (an embedding: not in non_embedding); the
    projection 32·16 and its norm 8, each layer's gate 32·8, up 8·32 and norm 32: 512 + 8 + 2·544 = 1608."""
    plain, ple = count_params(compose_model(TINY)), count_params(compose_model(PLE))
    assert (ple["per_layer_embedding"], ple["per_layer_inputs"]) == (1280, 1608)
    assert ple["total"] - plain["total"] == 1280 + 1608
    assert ple["non_embedding"] - plain["non_embedding"] == 1608
    assert ple["per_block"] - plain["per_block"] == 544
    model = build_model(compose_model(PLE), device="meta")
    assert len(roles(model)) == len(list(model.parameters()))


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.per_layer_input.dim=-1"], "model.per_layer_input.dim"),
        (["model.per_layer_input.dim=8", "model.per_layer_input.vocab=0"], "model.per_layer_input.vocab"),
        (["model.per_layer_input.dim=8", "model/stream=mhc"], "model.per_layer_input.dim"),
        (["model.per_layer_input.dim=8", "model.head.mtp.depth=1"], "model.per_layer_input.dim"),
        (["model.block.layer_scalar=true", "model/stream=mhc"], "model.block.layer_scalar"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model([*TINY, *overrides])
    assert err.value.field == field


def test_the_table_s_fields_without_inputs_are_reported_ignored():
    cfg = compose_model([*TINY, "model.per_layer_input.vocab=80", "model.per_layer_input.activation=silu"])
    assert [(i.field, i.value) for i in ignored(cfg)] == [
        ("model.per_layer_input.vocab", 80),
        ("model.per_layer_input.activation", "silu"),
    ]
    assert ignored(compose_model(PLE)) == []
