"""The coordinate check (archlab/training/coordcheck.py, Yang et al. 2022 Fig. 5) on every layout the presets
compose, shrunk (tests/helpers/layouts.py): after a few AdamW steps, mup's and completep's activations flat
in width and completep's in depth, sp's growing with width and mup's with depth; and the check failing a
rule with its width scaling or its residual multiplier taken away (a wrong rule is caught)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from helpers.layouts import LAYOUTS, layout

from archlab.nn.mixers.base import head_dim
from archlab.training import coordcheck, parametrization
from archlab.training.coordcheck import check_models

pytestmark = pytest.mark.usefixtures("single_thread")

WIDTHS, DEPTHS = [32, 64, 128], [2, 4, 8]  # proxy: width 32, depth 2
SETTINGS = {"steps": 3, "lr": 1e-2, "batch_size": 4, "seq_len": 16}
FAST = ["llama", "gemma", "mla", "gated_deltanet", "mamba2"]  # in CI; every layout under -m slow
# the largest |slope| of a flat check: the embeddings and each block's output (the logits, which at init
# fall as 1/sqrt(width) under μP's logit multiplier and keep some of that after 3 steps, within LOGITS); a
# check that grows: some tensor's slope above GROWS
FLAT, LOGITS, GROWS = 0.2, 0.4, 0.25


def param_of(kind: str, name: str) -> dict[str, Any]:
    """``kind`` over the proxy (width 32, depth 2); MLA's head dims are fields of their own: its proxy's given."""
    width_rule = kind != "sp"
    return {
        "kind": kind,
        "base_d_model": 32 if width_rule else None,
        "base_n_layer": 2 if kind == "completep" else None,
        "base_head_dim": head_dim(layout(name, 32)) if width_rule and name == "mla" else None,
    }


def width_slopes(name: str, kind: str) -> dict[str, float]:
    return check_models({w: layout(name, w) for w in WIDTHS}, param_of(kind, name), "d_model", **SETTINGS)["slopes"]


def depth_slopes(name: str, kind: str, **fields: Any) -> dict[str, float]:
    """The depth check's slopes; ``fields`` set on the model at every depth."""
    models = {d: dataclasses.replace(layout(name, 32, d), **fields) for d in DEPTHS}
    return check_models(models, param_of(kind, name), "n_layer", **SETTINGS)["slopes"]


def is_flat(slopes: dict[str, float]) -> bool:
    return all(abs(s) < (LOGITS if n == "logits" else FLAT) for n, s in slopes.items())


def grows(slopes: dict[str, float]) -> bool:
    return max(slopes.values()) > GROWS


def _layouts(*left_out: str) -> list:
    return [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in LAYOUTS if n not in left_out]


@pytest.mark.parametrize("name", _layouts())
def test_mup_is_flat_in_width_and_sp_grows(name):
    sp, mup = width_slopes(name, "sp"), width_slopes(name, "mup")
    assert grows(sp), sp
    assert is_flat(mup), mup


@pytest.mark.parametrize("name", _layouts("mamba2"))  # mamba2: below
def test_completep_is_flat_in_depth_and_mup_grows(name):
    mup, completep = depth_slopes(name, "mup"), depth_slopes(name, "completep")
    assert grows({"last block": mup["last block"]}), mup
    assert is_flat({"last block": completep["last block"], "logits": completep["logits"]}), completep


def test_mamba2s_depth_check_is_flat_once_its_embeddings_outweigh_its_branches():
    """Mamba-2's branch ends in a gated RMSNorm and out_proj, so at init it outputs init_std·sqrt(inner /
    2·base_n_layer), some 4 times its embeddings (init_std): the residual stream is its branches, and L of
    them × 1/L, not yet correlated, sum to L^-1/2 (measured slope -0.34). With the embeddings ×10 (an input
    multiplier: Θ(1) coordinates, as μP's input layer has) the stream is the embeddings' and completep is
    flat (-0.05) where mup still grows (0.16): the rules hold; the check reads the proxy's embedding scale."""
    assert depth_slopes("mamba2", "completep")["last block"] < -FLAT
    completep = depth_slopes("mamba2", "completep", embedding_multiplier=10.0)["last block"]
    mup = depth_slopes("mamba2", "mup", embedding_multiplier=10.0)["last block"]
    assert abs(completep) < 0.1 < mup, (completep, mup)


def test_a_rule_without_its_width_scaling_fails_the_width_check(monkeypatch):
    """Mutation: AdamW's hidden and output rates left at the proxy's (no 1/m); mup's check on the LLaMA
    layout then grows with width (measured: the blocks' slopes 1.16 and 1.56, against -0.03 and -0.06)."""
    scale_groups = parametrization.scale_groups

    def unscaled_rates(model, groups, optim, param):
        return [{**g, "lr": optim["lr"]} for g in scale_groups(model, groups, optim, param)]

    with monkeypatch.context() as patch:
        patch.setattr(parametrization, "scale_groups", unscaled_rates)
        slopes = width_slopes("llama", "mup")
    assert not is_flat(slopes) and grows(slopes), slopes


def test_completep_without_its_residual_multiplier_fails_the_depth_check(monkeypatch):
    """Mutation: completep's branches not scaled by 1/l (the residual multiplier left at 1); its depth check
    on the LLaMA layout then grows as mup's does (measured: the last block's slope 0.64, against -0.07)."""
    parametrize = coordcheck.parametrize

    def unscaled_branches(model, param):
        cfg = parametrize(model, param)
        return dataclasses.replace(cfg, block=dataclasses.replace(cfg.block, residual_multiplier=1.0))

    monkeypatch.setattr(coordcheck, "parametrize", unscaled_branches)
    slopes = depth_slopes("llama", "completep")
    assert grows({"last block": slopes["last block"]}), slopes
