"""μP's learning rates for Muon and SGD (archlab/training/mup_rates.py): Muon's updates against the spectral
condition (Yang, Simon & Bernstein 2023: spectral norm Θ(sqrt(fan_out/fan_in)), width-free for a hidden
matrix, falling as 1/sqrt(width) for an output one), SGD's rates against Table 3 of Yang et al. 2022, the
coordinate check flat under both and failing a rule taken away, and completep's refusal of SGD."""

from __future__ import annotations

import pytest
import torch
from helpers.layouts import layout

from archlab.build import build_model
from archlab.errors import ConfigError
from archlab.nn.component import Role
from archlab.training import mup_rates
from archlab.training.coordcheck import check_models
from archlab.training.optim import build_optimizer
from archlab.training.parametrization import check_param, initialise, parametrize

pytestmark = pytest.mark.usefixtures("single_thread")

MUON = {"kind": "muon", "lr": 1e-2, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True, "ns_steps": 5}
MUON |= {"betas": [0.9, 0.99], "eps": 1e-8, "adamw_lr": 3e-3}
SGD = {"kind": "sgd", "lr": 0.5, "weight_decay": 0.0, "momentum": 0.9, "nesterov": False}
CPU = torch.device("cpu")


def _param(kind: str) -> dict:
    return {"kind": kind, "base_d_model": None if kind == "sp" else 32, "base_n_layer": None, "base_head_dim": None}


def _muon_update_norms(width: int, kind: str, adjust: str) -> dict[str, float]:
    """The spectral norm of one Muon step's update (random gradients, no decay) of the MoE layout's first
    attention matrix (hidden) and router (output) at ``width`` over a proxy of 32."""
    cfg = parametrize(layout("moe", width), _param(kind))
    torch.manual_seed(0)
    model = build_model(cfg)
    initialise(model, _param(kind))
    optimizer = build_optimizer(model, {**MUON, "weight_decay": 0.0, "adjust_lr_fn": adjust}, CPU, param=_param(kind))
    named = {"hidden": "blocks.0.attn.qkv.weight", "output": "blocks.0.mlp.router.weight"}
    params = dict(model.named_parameters())
    before = {k: params[n].detach().clone() for k, n in named.items()}
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    return {k: float(torch.linalg.matrix_norm(params[n].detach() - before[k], ord=2)) for k, n in named.items()}


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_muons_updates_meet_the_spectral_condition_at_every_width(adjust):
    """Under mup, width 128 over 32: the hidden matrix's update as large (in spectral norm) as the proxy's,
    the router's (4 × d: the fan-in grows) half as large, sqrt(32/128); under sp match_rms_adamw's hidden
    update grows as sqrt(width) (twice the proxy's), which is what the rule corrects."""
    proxy, wide = _muon_update_norms(32, "mup", adjust), _muon_update_norms(128, "mup", adjust)
    assert wide["hidden"] / proxy["hidden"] == pytest.approx(1.0, rel=0.1)
    assert wide["output"] / proxy["output"] == pytest.approx(0.5, rel=0.1)
    if adjust == "match_rms_adamw":
        sp = _muon_update_norms(128, "sp", adjust)["hidden"]
        assert sp / _muon_update_norms(32, "sp", adjust)["hidden"] == pytest.approx(2.0, rel=0.1)


def _rates(optim: dict, kind: str = "mup") -> dict[str, tuple[float, float]]:
    """parameter name -> (lr, weight_decay) of its group, for the MoE layout at width 128 over 32 (m = 4)."""
    model = build_model(parametrize(layout("moe", 128), _param(kind)))
    optimizer = build_optimizer(model, optim, CPU, param=_param(kind))
    of = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    return {n: of[id(p)] for n, p in model.named_parameters()}


def test_muons_rates_by_rule_and_its_adamw_part_by_adamws():
    """m = 4: Muon's hidden matrices × 1 (original) or × 1/2 (match_rms_adamw: 0.2·sqrt(max) grows as
    sqrt(m)); the router (4 × d) × 1/2 and × 1/4; completep's decay × the inverse (η·λ kept); the tables,
    norms and stacked experts in AdamW at adamw_lr by AdamW's rules (experts / m)."""
    original = _rates({**MUON, "adjust_lr_fn": "original"})
    match = _rates({**MUON, "adjust_lr_fn": "match_rms_adamw"})
    assert original["blocks.0.attn.qkv.weight"] == pytest.approx((1e-2, 0.1))
    assert original["blocks.0.mlp.router.weight"] == pytest.approx((1e-2 / 2, 0.1))
    assert match["blocks.0.attn.proj.weight"] == pytest.approx((1e-2 / 2, 0.1))
    assert match["blocks.0.mlp.router.weight"] == pytest.approx((1e-2 / 4, 0.1))
    for rates in (original, match):
        assert rates["tok_emb.weight"] == pytest.approx((3e-3, 0.1))
        assert rates["blocks.0.attn_norm.weight"] == pytest.approx((3e-3, 0.0))
        assert rates["blocks.0.mlp.experts.down"] == pytest.approx((3e-3 / 4, 0.1))
    base = {**_param("completep"), "base_n_layer": 2}
    model = build_model(parametrize(layout("moe", 128), base))
    optimizer = build_optimizer(model, {**MUON, "adjust_lr_fn": "match_rms_adamw"}, CPU, param=base)
    qkv = dict(model.named_parameters())["blocks.0.attn.qkv.weight"]
    group = next(g for g in optimizer.param_groups if any(p is qkv for p in g["params"]))
    assert (group["lr"], group["weight_decay"]) == pytest.approx((1e-2 / 2, 0.2))


def test_sgds_rates_are_table_3s():
    """Yang et al. 2022 Table 3, SGD, in the multiplier form (the head's weight an input table, its 1/m the
    logit multiplier): input weights and all biases/gains η·m, hidden η, output η/m; sp: η everywhere."""
    mup, sp = _rates(SGD), _rates(SGD, "sp")
    assert mup["tok_emb.weight"][0] == pytest.approx(0.5 * 4)
    assert mup["head.weight"][0] == pytest.approx(0.5 * 4)
    assert mup["blocks.0.attn_norm.weight"][0] == pytest.approx(0.5 * 4)
    assert mup["blocks.0.attn.qkv.weight"][0] == pytest.approx(0.5)
    assert mup["blocks.0.mlp.experts.down"][0] == pytest.approx(0.5)
    assert mup["blocks.0.mlp.router.weight"][0] == pytest.approx(0.5 / 4)
    assert {lr for lr, _ in sp.values()} == {0.5}


def _slopes(kind: str, optim: dict) -> dict[str, float]:
    """The width check (32 to 128 over 32, 3 steps) of the LLaMA layout trained with ``optim``."""
    models = {w: layout("llama", w) for w in (32, 64, 128)}
    settings = {"steps": 3, "lr": optim["lr"], "batch_size": 4, "seq_len": 16, "optim": optim}
    return check_models(models, _param(kind), "d_model", **settings)["slopes"]


def _flat(slopes: dict[str, float]) -> bool:
    return all(abs(s) < (0.4 if n == "logits" else 0.2) for n, s in slopes.items())


def test_the_coordinate_check_is_flat_under_mup_with_muon_and_fails_without_its_factor(monkeypatch):
    """Muon (match_rms_adamw, lr 0.1): mup flat (measured: blocks 0.04, 0.06); mutation, each matrix at the
    proxy's rate (the factor 1/sqrt(m) dropped): the blocks grow (0.63, 0.76)."""
    muon = {**MUON, "lr": 0.1, "weight_decay": 0.0, "adamw_lr": None, "adjust_lr_fn": "match_rms_adamw"}
    assert _flat(_slopes("mup", muon))
    monkeypatch.setattr(mup_rates, "muon_factor", lambda *args: 1.0)
    mutated = _slopes("mup", muon)
    assert mutated["last block"] > 0.5, mutated


def test_the_coordinate_check_is_flat_under_mup_with_sgd_and_fails_with_adams_table(monkeypatch):
    """SGD (lr 0.5): sp's blocks grow (measured 1.75, 2.10), mup's are flat (-0.01, -0.02); mutation,
    Adam's table used for SGD (inputs and vectors × 1, hidden × 1/m): everything shrinks (-0.41)."""
    assert _slopes("sp", SGD)["last block"] > 1.0
    assert _flat(_slopes("mup", SGD))
    adams = {Role.INPUT: 0.0, Role.VECTOR: 0.0, Role.HIDDEN: -1.0, Role.OUTPUT: -1.0}
    monkeypatch.setattr(mup_rates, "SGD_FACTOR", adams)
    mutated = _slopes("mup", SGD)
    assert mutated["embeddings"] < -0.3 and mutated["last block"] < -0.3, mutated


def test_completep_refuses_sgd_and_takes_muon():
    """CompleteP's depth rule is for normalised updates: SGD refused naming the optimizer (the command
    line's refusal: tests/test_parametrization.py), Muon taken, and SGD under mup."""
    model, completep = layout("llama", 64), {**_param("completep"), "base_n_layer": 2}
    with pytest.raises(ConfigError, match="use param=mup") as caught:
        check_param(completep, model, "sgd")
    assert caught.value.field == "optim.kind"
    check_param(completep, model, "muon")
    check_param(_param("mup"), model, "sgd")


def test_archlab_coord_trains_with_the_optimizer_it_is_given():
    """``archlab-coord optimizer=muon``: the steps are Muon's with mup's rules (flat; sp grows), the result
    says so, and optimizer=sgd under completep is refused naming ``optimizer`` before any training."""
    from archlab.build import compose
    from archlab.config import to_model_config
    from archlab.config.fields import plain_dict
    from archlab.training.coordcheck import check_settings, run_coord

    small = ["model.n_layer=2", "widths=[32,64,128]", "steps=3", "batch_size=4", "seq_len=16", "lr=0.1"]
    slopes = {}
    for kind in ("sp", "mup"):
        base = [] if kind == "sp" else ["param.base_d_model=32"]
        cfg = compose("coord", [f"param={kind}", *base, "optimizer=muon", *small])
        check_settings(cfg)
        result = run_coord(to_model_config(cfg.model), plain_dict(cfg.param, resolve=True), cfg, None)["d_model"]
        assert result["optim"] == "muon"
        slopes[kind] = result["slopes"]
    assert _flat(slopes["mup"]), slopes
    assert slopes["sp"]["last block"] > 0.5, slopes
    with pytest.raises(ConfigError, match="use param=mup") as caught:
        check_settings(compose("coord", ["param=completep", "param.base_d_model=32", "optimizer=sgd", *small]))
    assert caught.value.field == "optimizer"
