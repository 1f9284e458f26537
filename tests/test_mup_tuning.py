"""μTransfer's "tune at the proxy, transfer the multipliers" (Yang et al. 2022): the base hyperparameters
(the init stds, the embedding, logit, attention and residual multipliers) set at the proxy's size and scaled
by param=mup|completep as μP's rules say, plain constants under sp, against closed forms; μP's input rule
(``model.embedding_init_std``) against the coordinate check and a mutation of it; and ``lr_from`` handing
a proxy sweep's best setting of the rate and the multipliers together to a run at another width."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from helpers.layouts import layout
from helpers.report_runs import job
from helpers.training import cli

from archlab import compose_model
from archlab.build import build_model, compose
from archlab.config import ModelConfig
from archlab.nn.validation import validate
from archlab.report.proxy import TUNABLE, transfer_lr, transferred
from archlab.training import coordcheck, parametrization
from archlab.training.coordcheck import check_models
from archlab.training.parametrization import initialise, parametrize

pytestmark = pytest.mark.usefixtures("single_thread")

TUNED = [  # the proxy's tuned values: none is a default, so a rule that drops one is seen
    "model.init_std=0.05",
    "model.embedding_init_std=1.0",
    "model.embedding_multiplier=2.5",
    "model.head.logit_scale=3.0",
    "model.attention.scale=0.4",
    "model.block.residual_multiplier=0.8",
]


def _param(kind: str) -> dict:
    """``kind`` over a proxy of width 32 and depth 1 (heads of 16 there)."""
    return {
        "kind": kind,
        "base_d_model": None if kind == "sp" else 32,
        "base_n_layer": 1 if kind == "completep" else None,
        "base_head_dim": None,
    }


@pytest.mark.parametrize("kind", ["sp", "mup", "completep"])
def test_tuned_values_scale_from_the_proxy_as_the_closed_forms_say(kind):
    """At width 128 and depth 4 over a proxy of 32 and 1 (m = l = 4, head dim 64 over 16): the logit
    multiplier 3/m, the attention temperature 0.4·sqrt(16/64), the residual multiplier 0.8/l (completep),
    the hidden init std 0.05/sqrt(m), the embedding multiplier and the tables' std (μP's input layer) the
    proxy's; under sp every value as set."""
    cfg = compose_model(
        ["model=nano", "model.vocab_size=32", "model.context_length=16", "model.d_model=128", "model.n_layer=4"]
        + ["model.attention.n_head=2", *TUNED]
    )
    m, depth = (1, 1) if kind == "sp" else (4, 4 if kind == "completep" else 1)
    scaled = parametrize(cfg, _param(kind))
    assert scaled.head.logit_scale == pytest.approx(3.0 / m)
    assert scaled.attention.scale == pytest.approx(0.4 * (math.sqrt(16 / 64) if m != 1 else 1))
    assert scaled.block.residual_multiplier == pytest.approx(0.8 / depth)
    assert scaled.embedding_multiplier == 2.5
    torch.manual_seed(0)
    model = build_model(scaled)
    initialise(model, _param(kind))
    std = {n: p.std().item() for n, p in model.named_parameters()}
    assert std["tok_emb.weight"] == pytest.approx(1.0, rel=0.05)
    assert std["position.table.weight"] == pytest.approx(1.0, rel=0.05)
    assert std["blocks.0.attn.qkv.weight"] == pytest.approx(0.05 / math.sqrt(m), rel=0.05)
    assert std["blocks.0.mlp.fc.weight"] == pytest.approx(0.05 / math.sqrt(m), rel=0.05)


def _llama(width: int, fields: dict[str, float]) -> ModelConfig:
    """The shrunk LLaMA layout at ``width`` with ``fields`` ("head.logit_scale": 0.5 ...) set."""
    cfg = layout("llama", width)
    for path, value in fields.items():
        section, _, name = path.rpartition(".")
        if section:
            cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})
        else:
            cfg = dataclasses.replace(cfg, **{name: value})
    return validate(cfg)


def _width_slopes(**fields: float) -> dict[str, float]:
    """mup's width check (widths 32 to 128 over 32, as tests/test_coordcheck_layouts.py runs it) on the
    shrunk LLaMA layout with ``fields`` set ("head__logit_scale" for head.logit_scale)."""
    models = {w: _llama(w, {k.replace("__", "."): v for k, v in fields.items()}) for w in (32, 64, 128)}
    settings = {"steps": 3, "lr": 1e-2, "batch_size": 4, "seq_len": 16}
    return check_models(models, _param("mup") | {"base_n_layer": None}, "d_model", **settings)["slopes"]


def test_mups_input_rule_keeps_unit_embeddings_flat_and_a_width_scaled_table_is_caught(monkeypatch):
    """With unit embeddings and the proxy's tuned multipliers, mup's width check stays flat (|slope| under
    0.2, the logits 0.4, as tests/test_coordcheck_layouts.py asks); mutation: the tables initialised as a
    hidden matrix (std × 1/sqrt(m)) shrink the embeddings with width at slope −1/2, which the check fails."""
    fields = {"embedding_init_std": 1.0, "head__logit_scale": 0.5, "attention__scale": 0.5}
    slopes = _width_slopes(**fields)
    assert all(abs(s) < (0.4 if n == "logits" else 0.2) for n, s in slopes.items()), slopes
    initialise = parametrization.initialise

    def tables_as_hidden(model, param):
        initialise(model, param)
        m = parametrization.width_ratio(model.cfg, param)
        with torch.no_grad():
            model.tok_emb.weight.mul_(1 / math.sqrt(m))

    monkeypatch.setattr(coordcheck, "initialise", tables_as_hidden)
    mutated = _width_slopes(**fields)
    assert mutated["embeddings"] == pytest.approx(-0.5, abs=0.1), mutated


def test_a_tuned_multiplier_the_rule_drops_away_from_the_proxy_is_caught(monkeypatch):
    """Mutation: the logit multiplier set to μP's 1/m away from the proxy, the proxy's tuned 4 dropped (the
    proxy keeps it: it is the sp run); the logits then fall with width far past the flat check's 0.4."""
    parametrize = coordcheck.parametrize

    def paper_constant(model, param):
        cfg = parametrize(model, param)
        m = parametrization.width_ratio(model, param)
        return cfg if m == 1 else dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, logit_scale=1 / m))

    assert abs(_width_slopes(head__logit_scale=4.0)["logits"]) < 0.4
    monkeypatch.setattr(coordcheck, "parametrize", paper_constant)
    assert _width_slopes(head__logit_scale=4.0)["logits"] < -0.8  # measured -1.05: the 1/4 at 64 and 128


def _proxy(root, param: dict) -> None:
    """A hand-built proxy sweep of optim.lr × model.head.logit_scale × model/mlp (two seeds): gelu's best
    pair is (1e-2, 0.5), mean 1.55, where lr 1e-2 alone is best at logit scale 0.5 and 1e-3 at 2; swiglu's
    is (1e-3, 2), mean 1.45."""
    losses = {
        ("gelu", "1e-3", "0.5"): [2.0, 2.1],
        ("gelu", "1e-2", "0.5"): [1.5, 1.6],
        ("gelu", "1e-3", "2"): [1.7, 1.8],
        ("gelu", "1e-2", "2"): [1.9, 2.0],
        ("swiglu", "1e-3", "0.5"): [1.6, 1.7],
        ("swiglu", "1e-2", "0.5"): [1.9, 2.0],
        ("swiglu", "1e-3", "2"): [1.4, 1.5],
        ("swiglu", "1e-2", "2"): [1.8, 1.9],
    }
    for (mlp, lr, scale), per_seed in losses.items():
        for seed, loss in enumerate(per_seed):
            overrides = [f"optim.lr={lr}", f"model.head.logit_scale={scale}", f"model/mlp={mlp}", f"seed={seed}"]
            job(root, overrides, [loss + 1, loss], config={"param": param})


def test_lr_from_takes_the_best_rate_and_multipliers_together(tmp_path):
    """The rate and the logit multiplier chosen as one setting (gelu: 1e-2 with 0.5, mean 1.55; the grid's
    edge in both, warned), set on the run and recorded; a multiplier this run's command line sets selects a
    group instead (logit scale 2: rate 1e-3)."""
    param = _param("mup") | {"base_n_layer": None}
    _proxy(tmp_path / "proxy", param)
    base = ["param=mup", "param.base_d_model=32", "model.d_model=128", f"lr_from={tmp_path / 'proxy'}"]
    cfg = compose("train", [*base, "model/mlp=gelu"], return_hydra_config=True)
    record = transfer_lr(cfg)
    assert (cfg.optim.lr, cfg.model.head.logit_scale) == (1e-2, 0.5)
    assert record is not None
    assert record["values"] == {"optim.lr": "1e-2", "model.head.logit_scale": "0.5"}
    assert (record["mean"], record["seeds"], record["group"]) == (pytest.approx(1.55), 2, {"model/mlp": "gelu"})
    assert len(record["warnings"]) == 2 and all("widen the grid" in w for w in record["warnings"])
    fixed = compose("train", [*base, "model/mlp=gelu", "model.head.logit_scale=2"], return_hydra_config=True)
    transfer_lr(fixed)
    assert (fixed.optim.lr, fixed.model.head.logit_scale) == (1e-3, 2.0)
    found = transferred(tmp_path / "proxy", "optim.lr", "val/loss", "lr_from", {"model/mlp": "swiglu"}, None, TUNABLE)
    assert (found.values, found.mean) == ({"optim.lr": "1e-3", "model.head.logit_scale": "2"}, pytest.approx(1.45))


@pytest.mark.slow
def test_a_proxy_sweep_hands_its_best_rate_and_multipliers_to_a_wider_run(conf, tmp_path):
    """End to end: archlab-train -m over the logit multiplier at the proxy (width 32, two runs), then a run
    at width 64 with lr_from: it trains with the best run's rate and multiplier, μP's 1/m applied, and its
    summary.json records where they came from."""
    proxy = ["param=mup", "param.base_d_model=32", "trainer.max_steps=6", "trainer.val_check_interval=6"]
    sweep = cli(
        conf,
        tmp_path / "unused",
        [*proxy, "optim.lr=3e-3,3e-2", "model.head.logit_scale=0.5,4", f"hydra.sweep.dir={tmp_path / 'proxy'}"],
        multirun=True,
    )
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    finals = {}
    for summary in (tmp_path / "proxy").glob("*/summary.json"):
        s = json.loads(summary.read_text())
        key = (s["config"]["optim"]["lr"], s["config"]["model"]["head"]["logit_scale"])
        finals[key] = s["metrics"]["final"]["val/loss"]
    best = min(finals, key=lambda k: finals[k])
    wide = cli(
        conf,
        tmp_path / "wide",
        [
            "param=mup",
            "param.base_d_model=32",
            "model.d_model=64",
            "trainer.max_steps=6",
            f"lr_from={tmp_path / 'proxy'}",
        ],
    )
    assert wide.returncode == 0, wide.stderr[-2000:]
    s = json.loads((tmp_path / "wide" / "summary.json").read_text())
    assert (s["config"]["optim"]["lr"], s["config"]["model"]["head"]["logit_scale"]) == best
    assert s["model"]["head"]["logit_scale"] == pytest.approx(best[1] / 2)
    values = s["transferred"]["values"]
    assert (float(values["optim.lr"]), float(values["model.head.logit_scale"])) == best
    assert s["transferred"]["from"] == str(tmp_path / "proxy") and len(finals) == 4
