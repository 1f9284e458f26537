"""AltUp (``model.stream.kind: altup``, archlab/nn/streams/altup.py): one layer's prediction and correction
against transformers' ``Gemma3nTextAltUp`` (every weight randomised), the widening and merging against Gemma 3n's
formulas written out copy by copy; the closed-form counts by hand; a model that trains and decodes in pieces
as it runs whole; the refusals."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import check_trains_then_decodes_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.streams.altup import AltUp, AltUpLayer

pytestmark = pytest.mark.usefixtures("single_thread")

D, N = 32, 4
TINY = ["model=nano", "model.d_model=32", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]
ALTUP = [*TINY, "model/stream=altup", "model/norm=rmsnorm", "model.norm.eps=1e-6"]


def _gemma3n_altup(clip: float = 120.0):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextAltUp

    config = transformers.Gemma3nTextConfig(
        hidden_size=D, altup_num_inputs=N, rms_norm_eps=1e-6, altup_coef_clip=clip, num_hidden_layers=2
    )
    return Gemma3nTextAltUp(config)


def _copied(ours: AltUpLayer, clip: float = 120.0):
    theirs = _gemma3n_altup(clip)
    with torch.no_grad():
        theirs.router_norm.weight.copy_(ours.router_norm.weight)
        theirs.modality_router.weight.copy_(ours.router.weight)
        theirs.prediction_coefs.weight.copy_(ours.predict.weight)
        theirs.correction_coefs.weight.copy_(ours.correct.weight)
        assert ours.output_scale is not None
        theirs.correct_output_scale.copy_(ours.output_scale)
    return theirs


def test_a_layer_is_gemma3n_s_predict_block_correct():
    """Copies [B, T, n, d] through one block: archlab's layer against ``Gemma3nTextAltUp.predict``, the block
    on the active prediction, ``correct``, and ``scale_corrected_output`` of the active copy, which is what
    the per-layer input reads; float32, every weight random."""
    cfg = compose_model([*ALTUP, "model.per_layer_input.dim=8"])
    ours = randomise(AltUpLayer(cfg), seed=1)
    theirs = _copied(ours)
    h = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(2))
    w = torch.randn(D, D, generator=torch.Generator().manual_seed(3)) / D**0.5

    def block(x):
        return torch.tanh(x @ w) * 3.0

    predictions = theirs.predict(h.permute(2, 0, 1, 3))
    corrected = theirs.correct(predictions, block(predictions[0]))
    expected = corrected.permute(1, 2, 0, 3)
    got = ours(h, block)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    late = torch.randn(D, D, generator=torch.Generator().manual_seed(4)) / D**0.5
    scaled = theirs.scale_corrected_output(corrected[0])
    added = ours.add(got, lambda a: a @ late)
    torch.testing.assert_close(added[..., 0, :], got[..., 0, :], rtol=0, atol=0)
    torch.testing.assert_close(added[..., 1:, :], got[..., 1:, :] + (scaled @ late).unsqueeze(-2), rtol=1e-5, atol=1e-5)


def test_training_clamps_the_coefficients_as_gemma3n_does():
    """In training the prediction coefficients are clamped in place to [-clip, clip] and the correction
    ones as read, as ``Gemma3nTextAltUp`` does in training: the same output from weights beyond the clip."""
    cfg = compose_model([*ALTUP, "model.per_layer_input.dim=8", "model.stream.coef_clip=0.1"])
    ours = randomise(AltUpLayer(cfg), seed=5).train()
    theirs = _copied(ours, clip=0.1).train()
    h = torch.randn(2, 3, N, D, generator=torch.Generator().manual_seed(6))

    def block(x):
        return x * 2.0 + 1.0

    predictions = theirs.predict(h.permute(2, 0, 1, 3))
    expected = theirs.correct(predictions, block(predictions[0])).permute(1, 2, 0, 3)
    torch.testing.assert_close(ours(h, block), expected, rtol=1e-5, atol=1e-5)
    assert ours.predict.weight.abs().max() <= 0.1 and ours.correct.weight.abs().max() > 0.1


def _rescaled(x, like):
    return x * like.pow(2).mean(-1, keepdim=True).sqrt() / x.pow(2).mean(-1, keepdim=True).clamp(min=1e-5).sqrt()


def test_widening_and_merging_are_gemma3n_s_copy_by_copy():
    """Gemma3nTextModel's, written out: copy 0 the embeddings, copy i their i-th projection rescaled to their
    RMS; at the end copy i's unembedding projection rescaled to copy 0's RMS, the n averaged."""
    cfg = compose_model(ALTUP)
    stream = randomise(AltUp(cfg), seed=7)
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(8)) * 4
    widened = stream.widen(x)
    assert torch.equal(widened[:, :, 0], x)
    for i in range(1, N):
        torch.testing.assert_close(widened[:, :, i], _rescaled(stream.projections[i - 1](x), x))
    h = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(9))
    copies = [h[:, :, 0]] + [_rescaled(stream.unembed[i - 1](h[:, :, i]), h[:, :, 0]) for i in range(1, N)]
    torch.testing.assert_close(stream.merge(h), sum(copies) / N)


def test_the_counts_are_the_closed_form_worked_by_hand():
    """d 32, n 4: projections in and out 2·3·32² = 6,144; per layer the router 4 × 32, its RMSNorm 32, the
    coefficients 64 + 16: 240, and with per-layer inputs the output scale 32 more; 2 layers. FLOPs add
    6 per weight and 6·d·(n² + n) per layer."""
    plain = count_params(compose_model([*TINY, "model/norm=rmsnorm"]))
    altup = count_params(compose_model(ALTUP))
    assert altup["streams"] == 6_144 + 2 * 240 == 6_624
    assert altup["total"] - plain["total"] == 6_624 and altup["per_block"] - plain["per_block"] == 240
    assert altup["flops_per_token"] - plain["flops_per_token"] == 6 * 6_624 + 2 * 6 * 32 * 20
    ple = count_params(compose_model([*ALTUP, "model.per_layer_input.dim=8"]))
    assert ple["streams"] == 6_624 + 2 * 32


@pytest.mark.parametrize("extra", [[], ["model/block=sandwich", "model.per_layer_input.dim=8"]])
def test_an_altup_model_trains_and_decodes_in_pieces_as_whole(extra):
    """A few AdamW steps lower the loss on a fixed batch; with every weight randomised, logits decoded
    through the cache in pieces (a prefill, then single tokens) equal the whole sequence's."""
    torch.manual_seed(0)
    model = build_model(compose_model([*ALTUP, *extra]))
    idx = torch.randint(0, 64, (4, 24))
    check_trains_then_decodes_in_pieces(model, idx, [10, 11, 12, 24])


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.stream.n=0"], "model.stream.n"),
        (["model.stream.coef_clip=-1.0"], "model.stream.coef_clip"),
        (["model.block.layer_scalar=true"], "model.block.layer_scalar"),
        (["model/layers=dense_first", "+model.layers.kinds.dense.stream.n=2"], "model.layers.kinds.dense.stream.n"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model([*ALTUP, *overrides])
    assert err.value.field == field
