"""The ``gated`` residual streams (Qwen4-Exp's): a connection and the merge against transformers'
``Qwen4ExpTextGatedResidual`` (every weight randomised, float32), wired as ``Qwen4ExpTextDecoderLayer`` wires
it; the closed-form count worked by hand; a model that trains and decodes in pieces as it runs whole; the
refusals."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import check_trains_then_decodes_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.component import Role
from archlab.nn.streams.gated import Gated, GatedConnection
from archlab.training.parametrization import roles

pytestmark = pytest.mark.usefixtures("single_thread")

D, N, R = 32, 4, 12
TINY = ["model=nano", "model.d_model=32", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]
GATED = [*TINY, "model/stream=gated", f"model.stream.rank={R}", "model/norm=rmsnorm", "model.norm.eps=1e-6"]
OFFSET = [*GATED, "model.norm.unit_offset=true"]


def _theirs(use_combine: bool):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextGatedResidual

    config = transformers.Qwen4ExpTextConfig(
        hidden_size=D, hc_count=N, hc_lowrank=R, rms_norm_eps=1e-6, num_attention_heads=4, num_hidden_layers=2
    )
    return Qwen4ExpTextGatedResidual(config, use_combine=use_combine)


def _copy(ours, theirs) -> None:
    with torch.no_grad():
        theirs.hc_norm.weight.copy_(ours.norm_weight.flatten())
        theirs.input_mix_weight_down.weight.copy_(ours.down.weight)
        theirs.input_mix_weight_up.weight.copy_(ours.up.weight)
        if theirs.block_inject_weight is not None:
            theirs.block_inject_weight.weight.copy_(ours.inject.weight)


def test_the_connection_is_qwen4_exps_gated_residual():
    """Streams [B, T, n, d] through one sublayer: transformers' module gives the sublayer's input, the streams
    and the injection weights, combined as its decoder layer does, ``H + c ⊗ F(x)``."""
    cfg = compose_model(OFFSET)
    ours = randomise(GatedConnection(cfg), seed=1)
    theirs = _theirs(use_combine=True)
    _copy(ours, theirs)
    h = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(2)) * 3
    w = torch.randn(D, D, generator=torch.Generator().manual_seed(3)) / D**0.5

    def sublayer(x):
        return torch.tanh(x @ w)

    x, hyper_input, injection = theirs(h.flatten(-2))
    expected = hyper_input + (sublayer(x).unsqueeze(-2) * injection.unsqueeze(-1)).flatten(-2)
    torch.testing.assert_close(ours(h, sublayer).flatten(-2), expected, rtol=1e-5, atol=1e-5)


def test_the_merge_is_qwen4_exps_mixer():
    cfg = compose_model(OFFSET)
    ours = randomise(Gated(cfg), seed=4)
    theirs = _theirs(use_combine=False)
    _copy(ours.mixer, theirs)
    h = torch.randn(3, 4, N, D, generator=torch.Generator().manual_seed(5)) * 3
    torch.testing.assert_close(ours.merge(h), theirs(h.flatten(-2)), rtol=1e-5, atol=1e-5)


def test_without_the_unit_offset_the_scale_is_applied_as_stored():
    """The same module with ``model.norm.unit_offset`` false reads its scale w as transformers' reads 1 + w."""
    ours = randomise(GatedConnection(compose_model(GATED)), seed=6)
    theirs = _theirs(use_combine=True)
    _copy(ours, theirs)
    with torch.no_grad():
        theirs.hc_norm.weight.sub_(1.0)
    h = torch.randn(2, 3, N, D, generator=torch.Generator().manual_seed(7))
    x, _, injection = theirs(h.flatten(-2))
    torch.testing.assert_close(ours.read(h)[0], x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(2 * torch.sigmoid(ours.inject(ours.read(h)[1]) / N), injection)


def test_the_count_is_the_closed_form_worked_by_hand():
    """d 32, n 4, rank 12: a connection holds the norm scale 128, down and up 2 × 12 × 128 and inject 4 × 128,
    3,712; two per layer over 2 layers, and the merge's 128 + 3,072 = 3,200: 18,048 beside the plain model's;
    and the count is the built model's."""
    plain = count_params(compose_model([*TINY, "model/norm=rmsnorm"]))
    gated = count_params(compose_model(GATED))
    assert gated["streams"] == 4 * (128 + 2 * 12 * 128 + 4 * 128) + (128 + 2 * 12 * 128) == 18_048
    assert gated["total"] - plain["total"] == 18_048
    model = build_model(compose_model(GATED))
    assert sum(p.numel() for p in model.parameters()) == gated["total"]
    # FLOPs: 6 per added weight, and per token 6·n·d·3 for each of the 4 connections, 6·n·d·2 to merge
    assert gated["flops_per_token"] - plain["flops_per_token"] == 6 * 18_048 + 6 * 128 * (3 * 4 + 2)


def test_a_gated_model_trains_and_decodes_in_pieces_as_whole():
    """A few AdamW steps lower the loss on a fixed batch; with every weight randomised, logits decoded through
    the cache in pieces (a prefill, then single tokens) equal the whole sequence's."""
    torch.manual_seed(0)
    model = build_model(compose_model(OFFSET))
    idx = torch.randint(0, 64, (4, 24))
    check_trains_then_decodes_in_pieces(model, idx, [10, 11, 12, 24])


def test_every_parameter_has_its_mup_role():
    model = build_model(compose_model(GATED))
    found = roles(model)
    assert len(found) == len(list(model.parameters()))
    connection = model.blocks[0].attn_stream
    assert isinstance(connection, GatedConnection)
    assert found[id(connection.down.weight)] == Role.OUTPUT and found[id(connection.up.weight)] == Role.INPUT


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.stream.rank=0"], "model.stream.rank"),
        (["model.stream.n=0"], "model.stream.n"),
        (["model/block=post"], "model.block.kind"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model([*GATED, *overrides])
    assert err.value.field == field
