"""Per-layer health (``callbacks.health``): the block-output RMS against the coordinate check's, the
gradient norms per block and per μP role and the update/weight ratio against direct computations on a tiny
model, the callback's steps, file and resume through a LitModel, its refusal, and the report's heatmaps from
hand-written run directories."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.report_runs import job, report

from archlab import build_model
from archlab.config import to_model_config
from archlab.errors import ConfigError
from archlab.report.health import health_matrix, read_health
from archlab.training.coordcheck import activation_rms
from archlab.training.health import LayerHealth, Probe
from archlab.training.module import LitModel
from archlab.training.parametrization import roles

pytestmark = pytest.mark.usefixtures("single_thread")

MODEL = {
    "vocab_size": 32,
    "context_length": 16,
    "n_layer": 2,
    "d_model": 16,
    "attention": {"n_head": 2},
    "head": {"tied": False},
}
BATCH = torch.randint(0, 32, (4, 13), generator=torch.Generator().manual_seed(0))


def norm(tensors) -> float:
    return float(torch.sqrt(sum(t.double().square().sum() for t in tensors)))


def test_rms_grad_norms_and_update_ratios_equal_direct_computations():
    cfg = to_model_config(MODEL)
    torch.manual_seed(0)
    expected_rms = activation_rms(cfg, {"kind": "sp"}, BATCH, steps=0, lr=1e-2)[0]  # the coordinate check's
    torch.manual_seed(0)
    model = build_model(cfg)
    probe = Probe(model, roles(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe.watch()
    F.cross_entropy(model(BATCH[:, :-1]).flatten(0, 1), BATCH[:, 1:].flatten()).backward()
    figures = probe.gradients()
    assert figures["rms"] == pytest.approx({"0": expected_rms["block 0"], "1": expected_rms["block 1"]}, rel=1e-6)

    grads = {n: p.grad for n, p in model.named_parameters()}
    for i in ("0", "1"):
        assert figures["grad_norm"][i] == pytest.approx(
            norm(g for n, g in grads.items() if n.startswith(f"blocks.{i}."))
        )
    assert figures["grad_norm"]["other"] == pytest.approx(
        norm(g for n, g in grads.items() if not n.startswith("blocks."))
    )
    by_role = {  # the roles by shape: matrices inside the blocks hidden, tables and the head input, 1-d vectors
        "hidden": [g for n, g in grads.items() if n.startswith("blocks.") and g.dim() == 2],
        "input": [g for n, g in grads.items() if not n.startswith("blocks.") and g.dim() == 2],
        "vector": [g for g in grads.values() if g.dim() == 1],
    }
    assert figures["grad_norm_role"] == pytest.approx({k: norm(v) for k, v in by_role.items()})

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer.step()
    ratios = probe.updates()
    for i in ("0", "1"):
        names = [n for n in before if n.startswith(f"blocks.{i}.")]
        change = norm(dict(model.named_parameters())[n].detach() - before[n] for n in names)
        assert ratios["update_ratio"][i] == pytest.approx(change / norm(before[n] for n in names))
    assert set(ratios["update_ratio_role"]) == {"hidden", "input", "vector"}


def test_no_hook_outside_the_watched_steps():
    model = build_model(to_model_config(MODEL))
    probe = Probe(model, roles(model))
    probe.watch()
    model(BATCH[:, :-1]).sum().backward()
    probe.gradients()
    assert all(not block._forward_hooks for block in model.blocks)
    model(BATCH[:, :-1])
    assert probe.gradients()["rms"] == {}  # nothing seen since


def fake_trainer(step: int) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step, is_global_zero=True, strategy=SimpleNamespace(reduce=lambda t, reduce_op: t)
    )


def test_the_callback_writes_every_kth_step_and_a_resume_drops_the_later_lines(tmp_path):
    lit = LitModel(MODEL, optim={}, scheduler={})
    lit.configure_model()
    logged = {}
    lit.log_dict = logged.update  # pyright: ignore[reportAttributeAccessIssue]
    optimizer = torch.optim.SGD(lit.decoder.parameters(), lr=0.1)
    callback = LayerHealth(every_n_steps=2, dirpath=tmp_path)
    callback.on_fit_start(fake_trainer(0), lit)  # pyright: ignore[reportArgumentType]
    for step in range(5):  # optimizer steps 1..5
        callback.on_train_batch_start(fake_trainer(step), lit, None, 0)  # pyright: ignore[reportArgumentType]
        optimizer.zero_grad()
        lit.decoder(BATCH[:, :-1]).square().mean().backward()
        callback.on_before_optimizer_step(fake_trainer(step), lit, optimizer)  # pyright: ignore[reportArgumentType]
        optimizer.step()
        callback.on_train_batch_end(fake_trainer(step + 1), lit, None, None, 0)  # pyright: ignore[reportArgumentType]
    records = [json.loads(line) for line in (tmp_path / "health.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    assert set(records[0]) == {"step", "rms", "grad_norm", "grad_norm_role", "update_ratio", "update_ratio_role"}
    assert set(records[0]["rms"]) == {"0", "1"} and set(records[0]["grad_norm"]) == {"0", "1", "other"}
    assert logged["health/rms/1"] == records[1]["rms"]["1"]
    assert callback.summary_fields()["health"]["steps"] == 2
    resumed = LayerHealth(every_n_steps=2, dirpath=tmp_path)
    resumed.on_fit_start(fake_trainer(3), lit)  # pyright: ignore[reportArgumentType]
    assert [json.loads(line)["step"] for line in (tmp_path / "health.jsonl").read_text().splitlines()] == [2]


@pytest.mark.parametrize("every", [-1, 2.5, True])
def test_a_bad_interval_is_refused_naming_the_field(every):
    with pytest.raises(ConfigError) as err:
        LayerHealth(every_n_steps=every)
    assert err.value.field == "callbacks.health.every_n_steps"


def test_off_by_default_records_nothing(tmp_path):
    callback = LayerHealth(dirpath=tmp_path)
    assert callback.every_n_steps == 0 and callback.summary_fields() == {}


def write_health(run, layers: int, steps: list[int], scale: float) -> None:
    """A health.jsonl: block b's figures at step s are scale·(b + 1)·s."""
    lines = []
    for s in steps:
        values = {str(b): scale * (b + 1) * s for b in range(layers)}
        lines.append({"step": s, "rms": values, "grad_norm": {**values, "other": 1.0}, "update_ratio": values})
    (run / "health.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_the_report_draws_a_layer_by_step_heatmap_per_variant(tmp_path):
    """Two variants (2 and 3 blocks), the first with two seeds whose records differ by a factor 3 and share
    steps 10 and 20 of 10, 20, 30: its matrix is blocks × shared steps, the mean over seeds; one PNG per
    figure, all in one PNG listed in report.md."""
    a1 = job(tmp_path, ["model.n_layer=2", "seed=0"], [2.0])
    a2 = job(tmp_path, ["model.n_layer=2", "seed=1"], [2.1])
    b = job(tmp_path, ["model.n_layer=3", "seed=0"], [1.9])
    write_health(a1, 2, [10, 20, 30], 1.0)
    write_health(a2, 2, [10, 20], 3.0)
    write_health(b, 3, [10, 20, 30], 1.0)
    steps, blocks, matrix = health_matrix([read_health(a1), read_health(a2)], "rms")
    assert steps == [10, 20] and blocks == ["0", "1"]
    assert matrix == [[20.0, 40.0], [40.0, 80.0]]  # (1 + 3)/2 · (b + 1) · s
    steps, blocks, matrix = health_matrix([read_health(b)], "grad_norm")  # "other" is no block
    assert (steps, blocks, len(matrix[0])) == ([10, 20, 30], ["0", "1", "2"], 3)
    written = report(tmp_path)
    assert written["health"] == tmp_path / "health.png" and written["health"].stat().st_size > 0
    assert "](health.png)" in written["markdown"].read_text()


def test_a_sweep_without_health_records_draws_no_heatmap(tmp_path):
    job(tmp_path, ["optim.lr=1e-3"], [2.0])
    assert not [k for k in report(tmp_path) if k.startswith("health")]
