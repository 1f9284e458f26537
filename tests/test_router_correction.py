"""Where the router's correction bias is added (``model.mlp.routing.correction_on``): to the scores
(DeepSeek-V3, the default) or to the logits before the sigmoid (Kolibri-1). The logits form chooses the
experts transformers' ``Kolibri1TopKRouter`` chooses, with its weights, where the scores form chooses
others; it adds no parameters; it needs a correction bias."""

from typing import Any

import pytest
import torch
from test_moe import config

from archlab import count_params
from archlab.errors import ConfigError
from archlab.nn.moe import MoE
from archlab.nn.validation import validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")

SIGMOID: dict[str, Any] = dict(scoring="sigmoid", n_experts=8, top_k=2, correction_bias=True, normalize_top_k=False)


def routers(correction_on: str, seed: int = 0):
    """An archlab MoE (d_model 16, 8 experts, top-2) and a Kolibri1TopKRouter with the same weight and a
    correction bias N(0, 2²), of the logits' spread, so it moves the choice."""
    from transformers import Kolibri1Config
    from transformers.models.kolibri1.modeling_kolibri1 import Kolibri1TopKRouter

    cfg = validate(config(n_layer=1, correction_on=correction_on, **SIGMOID))
    g = torch.Generator().manual_seed(seed)
    moe = MoE(cfg)
    hf = Kolibri1TopKRouter(Kolibri1Config(hidden_size=16, num_experts=8, num_experts_per_tok=2))
    with torch.no_grad():
        moe.router.weight.copy_(torch.randn(8, 16, generator=g))
        hf.weight.copy_(moe.router.weight)
        hf.e_score_correction_bias.copy_(torch.randn(8, generator=g) * 2)
        moe.get_buffer("router_bias").copy_(hf.e_score_correction_bias)
    return moe, hf


def by_expert(indices, weights):
    order = indices.argsort(dim=-1)
    return indices.gather(-1, order), weights.gather(-1, order)


def test_logits_form_routes_as_kolibri_s_router():
    moe, hf = routers("logits")
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_logits, hf_weights, hf_indices = hf(x)
        logits, weights, indices = moe.route(x)
    torch.testing.assert_close(logits, hf_logits)
    indices, weights = by_expert(indices, weights)
    hf_indices, hf_weights = by_expert(hf_indices, hf_weights)
    assert torch.equal(indices, hf_indices)
    torch.testing.assert_close(weights, hf_weights)


def test_scores_form_chooses_other_experts_for_the_same_weights():
    moe, hf = routers("scores")
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_indices = hf(x)[2].sort(dim=-1).values
        indices = moe.route(x)[2].sort(dim=-1).values
    assert (indices != hf_indices).any(dim=-1).sum() >= 4  # of 64 tokens


def test_it_adds_no_parameters_and_needs_a_correction_bias():
    logits = config(n_layer=1, correction_on="logits", **SIGMOID)
    assert count_params(logits) == count_params(config(n_layer=1, **SIGMOID))
    with pytest.raises(ConfigError, match="correction_bias=true") as err:
        validate(config(n_layer=1, **dict(SIGMOID, correction_bias=False), correction_on="logits"))
    assert err.value.field == "model.mlp.routing.correction_on"
    with pytest.raises(ConfigError) as err:
        validate(config(n_layer=1, correction_on="probabilities", **SIGMOID))
    assert err.value.field == "model.mlp.routing.correction_on"
