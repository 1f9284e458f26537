"""The ``transform`` head (archlab/nn/head.py): dense, activation and norm before the vocabulary matrix, held
to transformers' ``ModernBertPredictionHead`` and decoder Linear; its count, the multi-token prediction
FLOPs that read it, what it reads and its refusal by every family."""

import pytest
import torch
from helpers.hf import check_routed_family_refuses, layout
from helpers.parts import build, plain

from archlab import build_model, count_params
from archlab.accounting import mtp_flops_per_token
from archlab.nn.validation import ignored

pytestmark = pytest.mark.usefixtures("single_thread")

HEAD = {"kind": "transform", "tied": False, "bias": True, "transform_bias": True}
LAYERNORM = {"kind": "layernorm", "eps": 1e-5, "bias": True}


def test_it_is_modernberts_prediction_head_and_decoder():
    """logits = decoder(norm(gelu(dense(x)))) as transformers' ModernBertPredictionHead and the decoder Linear
    compute them, every weight and bias of the head copied over (float32)."""
    from transformers.models.modernbert_decoder.configuration_modernbert_decoder import ModernBertDecoderConfig
    from transformers.models.modernbert_decoder.modeling_modernbert_decoder import ModernBertDecoderPredictionHead

    cfg = plain(head=HEAD, norm=LAYERNORM)
    head = build(cfg).head.float()
    hf_cfg = ModernBertDecoderConfig(hidden_size=32, classifier_bias=True, norm_bias=True, norm_eps=1e-5)
    theirs, decoder = ModernBertDecoderPredictionHead(hf_cfg), torch.nn.Linear(32, 48)
    with torch.no_grad():
        theirs.dense.load_state_dict(head.dense.state_dict())
        theirs.norm.load_state_dict(head.transform_norm.state_dict())
        decoder.weight.copy_(head.weight)
        decoder.bias.copy_(head.bias)
        x = torch.randn(2, 5, 32) * 2
        torch.testing.assert_close(head(x), decoder(theirs(x)))
        assert (head(x) - torch.nn.functional.linear(x, head.weight, head.bias)).abs().max() > 0.1


def test_its_count_is_the_dense_and_the_norm_beside_the_matrix():
    """Beside linear's V·d + V: d·d + d (dense and its bias) and 2·d (a LayerNorm with bias), the built
    model agreeing; tied, the matrix is the embedding's; a multi-token prediction module's FLOPs count the
    transform once more per depth."""
    d, V = 32, 48
    transform = count_params(plain(head=HEAD, norm=LAYERNORM))["head"]
    assert transform == V * d + V + d * d + d + 2 * d
    model = build_model(plain(head=HEAD, norm=LAYERNORM))
    assert sum(p.numel() for p in model.head.parameters()) == transform
    tied = {**HEAD, "tied": True, "transform_bias": False}
    assert count_params(plain(head=tied, norm={"kind": "rmsnorm"}))["head"] == V + d * d + d
    mtp = {"depth": 2}
    linear = mtp_flops_per_token(plain(head={"mtp": mtp}), 16)
    assert mtp_flops_per_token(plain(head={**tied, "mtp": mtp}), 16) - linear == 6 * 2 * (d * d + d)


def test_the_linear_head_ignores_its_fields_out_loud():
    names = {i.field for i in ignored(plain(head={"transform_bias": True, "transform_activation": "relu"}))}
    assert names == {"model.head.transform_bias", "model.head.transform_activation"}
    assert ignored(plain(head=HEAD)) == []


def test_it_trains_with_multi_token_prediction():
    """A transform head under MTP modules: the loss falls, and the dense layer gets gradients."""
    from helpers.parts import short_fit

    torch.manual_seed(0)
    model = build_model(plain(head={**HEAD, "mtp": {"depth": 1}}, norm=LAYERNORM))
    losses = short_fit(model, 48, 12, steps=10)
    assert losses[-1] < losses[0]
    assert model.head.dense.weight.grad is not None and model.head.dense.weight.grad.abs().sum() > 0


def test_families_refuse_it():
    check_routed_family_refuses("gpt_neox", layout("model.head.kind=transform"), "model.head.kind")
