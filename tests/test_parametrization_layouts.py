"""param=sp|mup|completep on every layout archlab's presets compose (tests/helpers/layouts.py), shrunk: each
builds and trains a step at a width other than the proxy's, its softmax layers at 1/head_dim attention."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import torch
from helpers.layouts import LAYOUTS, layout

from archlab.build import build_model
from archlab.config.layers import layer_configs
from archlab.nn.mixers.base import head_dim
from archlab.nn.validation import validate
from archlab.training.optim import build_optimizer
from archlab.training.parametrization import KINDS, check_param, initialise, parametrize

pytestmark = pytest.mark.usefixtures("single_thread")

OPTIM = {"kind": "adamw", "lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99], "eps": 1e-8}


def param_of(kind: str, name: str, base_d_model: int = 32, base_n_layer: int = 1) -> dict:
    """``kind``'s settings over a proxy of ``base_d_model`` (and ``base_n_layer`` for completep) of layout
    ``name``; MLA's head dims are fields of their own, not d_model's split, so its proxy's is given outright."""
    width_rule = kind != "sp"
    return {
        "kind": kind,
        "base_d_model": base_d_model if width_rule else None,
        "base_n_layer": base_n_layer if kind == "completep" else None,
        "base_head_dim": head_dim(layout(name, base_d_model)) if width_rule and name == "mla" else None,
    }


def _scores_times_head_dim(cfg) -> list[float]:
    """Per softmax layer of the model built from ``cfg``: its score multiplier times its head dim."""
    mixers = [cast(Any, block).attn for block in build_model(cfg, device="meta").blocks]
    return [
        mixer.scale * head_dim(layer) for mixer, layer in zip(mixers, layer_configs(cfg)) if hasattr(mixer, "scale")
    ]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_builds_and_trains_under_every_parametrisation(name, kind):
    """At twice the proxy's width (and depth, under completep) the model validates, builds, takes an AdamW
    step with a finite loss, its logits × 1/2 (mup, completep); every softmax layer's multiplier × head dim
    is the proxy's (1/head_dim attention: μP's temperature), where sp keeps 1/sqrt(head_dim)."""
    param, cfg = param_of(kind, name), layout(name, d_model=64)
    check_param(param, cfg, "adamw")
    scaled = validate(parametrize(cfg, param))
    torch.manual_seed(0)
    model = build_model(scaled)
    initialise(model, param)
    optimizer = build_optimizer(model, OPTIM, torch.device("cpu"), param=param)
    idx = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    assert math.isfinite(loss.item())
    assert scaled.head.logit_scale == (1.0 if kind == "sp" else 0.5)
    wide, proxy = _scores_times_head_dim(scaled), _scores_times_head_dim(layout(name, d_model=32))
    assert len(wide) == len(proxy) == (0 if name == "mamba2" else 1 if name == "gated_deltanet" else 2)
    if kind == "sp":
        assert wide == [pytest.approx(p * math.sqrt(2)) for p in proxy]  # heads twice as wide
    else:
        assert wide == [pytest.approx(p) for p in proxy]
