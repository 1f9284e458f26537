"""DeepSeek-V3's auxiliary-loss-free balancing (``model.mlp.routing.bias_update_speed``): the correction
bias after one step against the rule worked by hand, the loads summed over processes before the update,
nothing moved at γ=0, a skewed router's imbalance falling over a few steps, activation checkpointing's
recomputation not counted twice, ``RouterLoad``'s figures against hand arithmetic, and the report's columns."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers.report_runs import job, report, rows

from archlab import build_model
from archlab.config import to_model_config
from archlab.training.routing import RouterLoad, balance_routers, imbalance, moe_layers

pytestmark = pytest.mark.usefixtures("single_thread")

D, V, E = 16, 32, 4


def moe_model(n_layer: int = 1, **routing):
    """A tiny decoder whose layers are MoE layers of E experts (top 2) with a correction bias."""
    cfg = to_model_config(
        {
            "vocab_size": V,
            "context_length": 16,
            "n_layer": n_layer,
            "d_model": D,
            "attention": {"n_head": 2},
            "mlp": {
                "kind": "moe",
                "expert_d_ff": 8,
                "routing": {"n_experts": E, "top_k": 2, "scoring": "sigmoid", "correction_bias": True, **routing},
            },
        }
    )
    torch.manual_seed(0)
    return build_model(cfg).train()


def fixed_routing(model, bias):
    """Router weights zero, so every token's scores are equal and ``bias`` alone picks its experts."""
    moe = moe_layers(model)[0]
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router_bias.copy_(torch.tensor(bias))
    return moe


def test_one_step_moves_the_bias_by_the_rule_worked_by_hand():
    """12 tokens, each to experts 0 and 1: loads 12, 12, 0, 0, mean 6, so γ=0.1 takes 0.1 from the first two
    experts' biases and gives it to the other two."""
    model = moe_model(bias_update_speed=0.1)
    moe = fixed_routing(model, [0.3, 0.2, 0.1, 0.0])
    model(torch.randint(0, V, (2, 6)))
    assert moe.load.tolist() == [12, 12, 0, 0]
    loads = balance_routers(model, lambda t: t)
    assert loads[0].tolist() == [12, 12, 0, 0]
    assert torch.allclose(moe.router_bias, torch.tensor([0.2, 0.1, 0.2, 0.1]))
    assert moe.load.tolist() == [0, 0, 0, 0]  # counting starts again


def test_the_update_uses_the_loads_summed_over_processes():
    """Another process's 30 tokens all on expert 2 (reduce adds its loads): the sum 12, 12, 30, 0 has
    mean 13.5, so experts 0, 1 and 3 gain γ and expert 2 loses it; this process's own loads alone would
    have given the opposite for expert 2."""
    model = moe_model(bias_update_speed=0.1)
    moe = fixed_routing(model, [0.3, 0.2, 0.1, 0.0])
    model(torch.randint(0, V, (2, 6)))
    other = torch.tensor([0, 0, 30, 0])
    balance_routers(model, lambda t: t + other)
    assert torch.allclose(moe.router_bias, torch.tensor([0.4, 0.3, 0.0, 0.1]))


def test_speed_zero_leaves_the_bias_where_it_is_and_reduces_nothing():
    """γ = 0: no collective each step (the window's sum is reduced once, by RouterLoad), the bias as it was."""

    def no_collective(t):
        raise AssertionError("reduced with γ = 0")

    model = moe_model()
    moe = fixed_routing(model, [0.3, 0.2, 0.1, 0.0])
    model(torch.randint(0, V, (2, 6)))
    assert balance_routers(model, no_collective)[0].tolist() == [12, 12, 0, 0]
    assert moe.router_bias.tolist() == pytest.approx([0.3, 0.2, 0.1, 0.0])


def test_a_skewed_routers_imbalance_falls_over_a_few_steps():
    """Router weights drawn N(0, 1) and a bias of 0.4 on experts 0 and 1: over ten steps on one batch the
    load's max/mean stays at 1.375 with γ=0 and falls below 1.1 with γ=0.05."""
    figures = {}
    for speed in (0.0, 0.05):
        model = moe_model(bias_update_speed=speed)
        moe = moe_layers(model)[0]
        with torch.no_grad():
            moe.router.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(2))
            moe.router_bias.copy_(torch.tensor([0.4, 0.4, 0.0, 0.0]))
        batch = torch.randint(0, V, (4, 16), generator=torch.Generator().manual_seed(1))
        seen = []
        for _ in range(10):
            with torch.no_grad():
                model(batch)
            seen.append(imbalance(balance_routers(model, lambda t: t)[0])["max_over_mean"])
        figures[speed] = seen
    assert figures[0.0] == [1.375] * 10
    assert figures[0.05][0] == 1.375 and max(figures[0.05][-3:]) < 1.1


def test_recomputation_under_activation_checkpointing_is_not_counted_again():
    model = moe_model(n_layer=2)
    model.activation_checkpointing = True
    model(torch.randint(0, V, (2, 6))).sum().backward()
    assert [moe.load.sum().item() for moe in moe_layers(model).values()] == [24, 24]  # 12 tokens · top-2


def test_evaluation_is_not_counted():
    model = moe_model().eval()
    model(torch.randint(0, V, (2, 6)))
    assert moe_layers(model)[0].load.sum().item() == 0


def test_router_load_logs_shares_and_records_the_imbalance():
    """Two steps of loads 2, 1, 0, 1 and 4, 1, 0, 1 in one window, 6, 2, 0, 2, and another process's the
    same (the window's sum reduced over processes once, as it closes): 12, 4, 0, 4, shares 0.6, 0.2, 0,
    0.2, max/mean 6/2.5, cv sqrt((3.5² + 0.5² + 2.5² + 0.5²)/4)/2.5, 20 assignments per layer."""
    callback = RouterLoad(log_every_n_steps=2)
    logged = {}
    module = SimpleNamespace(router_load={}, log_dict=logged.update)
    reduced = []
    strategy = SimpleNamespace(reduce=lambda t, reduce_op: reduced.append(reduce_op) or 2 * t)
    for step, load in ((1, [2, 1, 0, 1]), (2, [4, 1, 0, 1])):
        module.router_load = {1: torch.tensor(load)}
        callback.on_train_batch_end(SimpleNamespace(global_step=step, strategy=strategy), module, None, None, 0)
        assert module.router_load == {}  # taken
    record = callback.summary_fields()["router_load"]
    cv = math.sqrt((3.5**2 + 0.25 + 2.5**2 + 0.25) / 4) / 2.5
    assert reduced == ["sum"] and record["steps"] == 2 and record["assignments"] == 20
    assert record["max_over_mean"] == pytest.approx(2.4) and record["cv"] == pytest.approx(cv)
    assert record["layers"]["1"]["load"] == pytest.approx([0.6, 0.2, 0.0, 0.2])
    assert logged["router/layer1/expert0"] == pytest.approx(0.6) and logged["router/layer1/cv"] == pytest.approx(cv)


def test_the_report_shows_the_imbalance_per_variant(tmp_path):
    """A variant's router max/mean is the mean over its seeds, in the table and the CSV (cv in the CSV);
    a sweep without MoE runs has neither column."""
    for speed, seed, figure in (("0", 1, 2.0), ("0", 2, 3.0), ("0.001", 1, 1.1)):
        load = {"max_over_mean": figure, "cv": figure / 10, "steps": 5, "layers": {}}
        job(tmp_path / "moe", [f"model.mlp.routing.bias_update_speed={speed}", f"seed={seed}"], [2.0], router_load=load)
    written = report(tmp_path / "moe")
    table = written["markdown"].read_text()
    assert "| router max/mean |" in table and "| 2.50 ± 0.71 |" in table and "| 1.1 |" in table
    by_speed = {r["model.mlp.routing.bias_update_speed"]: r for r in rows(written["csv"])}
    assert float(by_speed["0"]["router max/mean mean"]) == pytest.approx(2.5)
    assert float(by_speed["0.001"]["router cv mean"]) == pytest.approx(0.11)
    job(tmp_path / "dense", ["optim.lr=1e-3"], [2.0])
    job(tmp_path / "dense", ["optim.lr=2e-3"], [2.1])
    assert "router" not in report(tmp_path / "dense")["markdown"].read_text()
