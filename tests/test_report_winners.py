"""archlab-report beyond the statistics, on hand-built sweeps: the best runs and how to export them, warnings
where a best_over choice sits at its grid's edge, the baseline at each value of the tuned axis, numeric
order across combined sweeps, active parameters, matched values only where matched, and stability
(loss spikes, gradient norms, the largest learning rate within a tolerance of the best)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.report_runs import failed, job, report, rows

from archlab.errors import ConfigError
from archlab.report.stability import loss_spikes

# final val/loss per (mlp, lr); seed s adds 0.02·s. gelu: best at the lowest lr; swiglu: at the middle one
LOSS = {
    ("gelu", "1e-3"): 2.00,
    ("gelu", "3e-3"): 2.10,
    ("gelu", "1e-2"): 2.30,
    ("swiglu", "1e-3"): 2.20,
    ("swiglu", "3e-3"): 1.90,
    ("swiglu", "1e-2"): 1.905,  # within 1% of 1.90 (+0.26%)
}


def lr_sweep(root: Path, spelled: dict[str, str] | None = None) -> None:
    """``model/mlp=gelu,swiglu optim.lr=1e-3,3e-3,1e-2 seed=0,1``, the directories in an order that sorts
    the rates as strings (1e-2 first); ``spelled`` writes a rate another way (a second sweep's 0.003)."""
    for (mlp, lr), loss in sorted(LOSS.items(), key=lambda item: item[0][1]):
        for seed in range(2):
            value = (spelled or {}).get(lr, lr) if seed == 1 else lr
            job(root, [f"model/mlp={mlp}", f"optim.lr={value}", f"seed={seed}"], [loss + 0.02 * seed])


def run_of(root: Path, overrides: list[str]) -> Path:
    return next(p for p in root.iterdir() if json.loads((p / ".hydra/overrides.yaml").read_text()) == overrides)


def section(md: str, title: str) -> list[str]:
    return [line for line in md.split(f"## {title}")[1].split("\n## ")[0].splitlines() if line.startswith(("- ", "| "))]


def test_best_runs_name_the_directory_checkpoint_and_export_command(tmp_path):
    root = tmp_path / "sweep"
    lr_sweep(root)
    # the swiglu seed-0 run at 3e-3 was written elsewhere and moved here: its checkpoint is found beside it
    best = run_of(root, ["model/mlp=swiglu", "optim.lr=3e-3", "seed=0"])
    summary = json.loads((best / "summary.json").read_text())
    summary["paths"] = {"summary": "/old/place/run/summary.json", "checkpoint": "/old/place/run/checkpoints/step1.ckpt"}
    (best / "summary.json").write_text(json.dumps(summary))
    written = report(root, tmp_path / "out", best_over="optim.lr")
    table = section(written["markdown"].read_text(), "Best runs")
    # gelu's best run: 1e-3 seed 0 (2.00); swiglu's and the overall: 3e-3 seed 0 (1.90)
    gelu = run_of(root, ["model/mlp=gelu", "optim.lr=1e-3", "seed=0"])
    checkpoint = best / "checkpoints/step1.ckpt"
    assert table == [
        f"- overall: `{best}`, final val/loss 1.9; checkpoint `{checkpoint}`; "
        f"export: `archlab-export {best} out=exports/best`",
        f"- model/mlp=gelu: `{gelu}`, final val/loss 2; checkpoint none kept; "
        f"export: `archlab-export {gelu} out=exports/gelu`",
        f"- model/mlp=swiglu: `{best}`, final val/loss 1.9; checkpoint `{checkpoint}`; "
        f"export: `archlab-export {best} out=exports/swiglu`",
    ]
    record = json.loads(written["json"].read_text())["best_runs"]
    assert record[0] == {
        "variant": None,
        "run": str(best),
        "final val/loss": 1.9,
        "checkpoint": str(best / "checkpoints/step1.ckpt"),
        "export": f"archlab-export {best} out=exports/best",
    }
    assert [r["variant"] for r in record[1:]] == [{"model/mlp": "gelu"}, {"model/mlp": "swiglu"}]


def test_a_best_value_at_the_edge_of_its_grid_is_warned_about(tmp_path):
    root = tmp_path / "sweep"
    lr_sweep(root)
    for seed in range(2):  # geglu: best at the highest rate that completed, but a higher one was swept and failed
        job(root, ["model/mlp=geglu", "optim.lr=1e-3", f"seed={seed}"], [2.5])
        job(root, ["model/mlp=geglu", "optim.lr=3e-3", f"seed={seed}"], [2.2])
        job(root, ["model/mlp=geglu", "optim.lr=1e-2", f"seed={seed}"], [2.1])
        failed(root, ["model/mlp=geglu", "optim.lr=3e-2", f"seed={seed}"])
    written = report(root, tmp_path / "out", best_over="optim.lr")
    text = "the best optim.lr of model/mlp=gelu is the grid's lowest, 1e-3: widen the grid"
    assert section(written["markdown"].read_text(), "Warnings") == [f"- {text}"]
    warnings = json.loads(written["json"].read_text())["warnings"]
    assert warnings == [
        {"variant": {"model/mlp": "gelu"}, "axis": "optim.lr", "value": "1e-3", "edge": "lowest", "text": text}
    ]
    edge = {(r["model/mlp"], r["optim.lr"]): r["optim.lr at grid edge"] for r in rows(written["csv"])}
    assert edge[("gelu", "1e-3")] == "lowest" and [k for k, v in edge.items() if v] == [("gelu", "1e-3")]


def test_the_baseline_is_compared_at_each_value_in_numeric_order_across_combined_sweeps(tmp_path):
    root = tmp_path / "sweep"
    lr_sweep(root, spelled={"3e-3": "0.003"})  # seed 1 at 3e-3 from a sweep that wrote 0.003: the same variant
    written = report(root, tmp_path / "out", baseline="model/mlp=gelu", best_over="optim.lr")
    md = written["markdown"].read_text()
    # swiglu minus gelu, seed by seed at the same rate: +0.20, -0.20, -0.395 (no spread: the seeds shift alike)
    assert section(md, "Against the baseline at each optim.lr") == [
        "- model/mlp=swiglu at optim.lr=1e-3: +0.2 vs model/mlp=gelu at optim.lr=1e-3 (95% CI, 2 seeds, paired): "
        "higher (worse)",
        "- model/mlp=swiglu at optim.lr=3e-3: −0.2 vs model/mlp=gelu at optim.lr=3e-3 (95% CI, 2 seeds, paired): "
        "lower (better)",
        "- model/mlp=swiglu at optim.lr=1e-2: −0.395 vs model/mlp=gelu at optim.lr=1e-2 (95% CI, 2 seeds, paired): "
        "lower (better)",
    ]
    # at each one's best: swiglu at 3e-3 (1.90) minus gelu at 1e-3 (2.00)
    assert "- model/mlp=swiglu at optim.lr=3e-3: −0.1 vs model/mlp=gelu at optim.lr=1e-3" in md
    table = section(md, "Best optim.lr per variant")
    assert table[1].endswith("| 1e-3: 2.01, 3e-3: 2.11, 1e-2: 2.31 |")  # numeric, not string, order
    csv_rows = rows(written["csv"])
    assert [(r["model/mlp"], r["optim.lr"]) for r in csv_rows][:3] == [
        ("gelu", "1e-3"),
        ("gelu", "3e-3"),
        ("gelu", "1e-2"),
    ]
    swiglu = next(r for r in csv_rows if (r["model/mlp"], r["optim.lr"]) == ("swiglu", "1e-2"))
    assert swiglu["baseline at same optim.lr"] == "model/mlp=gelu, optim.lr=1e-2"
    assert float(swiglu["final val/loss vs baseline at same optim.lr diff"]) == pytest.approx(-0.395)


def test_active_parameters_beside_total_and_no_matched_value_where_nothing_was_matched(tmp_path):
    root = tmp_path / "sweep"
    counts = {"total": 5000, "non_embedding": 4000, "active": 2000, "active_non_embedding": 1000}
    job(root, ["model/mlp=moe", "seed=0"], [2.0], parameters={"analytic": counts}, match=None)
    dense = {"total": 2100, "non_embedding": 1100, "active": 2100, "active_non_embedding": 1100}
    job(root, ["model/mlp=swiglu", "seed=0"], [2.1], parameters={"analytic": dense}, match=None)
    written = report(root, tmp_path / "out")
    md = written["markdown"].read_text()
    assert "| model/mlp | seeds | final val/loss | best val/loss | params | active params |" in md
    assert "| moe | 1/1 | 2 | 2 | 5000 | 2000 |" in md and "| swiglu | 1/1 | 2.1 | 2.1 | 2100 | 2100 |" in md
    (moe, _) = rows(written["csv"])
    assert moe["params active_non_embedding mean"] == "1000.0"
    assert not any("match" in column for column in moe)
    assert "## Stability" not in md  # no training log, no gradient norm, no rate swept: nothing to report
    # a dense-only sweep has no active column: it would repeat the total
    dense_only = tmp_path / "dense"
    job(dense_only, ["model/mlp=swiglu", "seed=0"], [2.1], parameters={"analytic": dense})
    job(dense_only, ["model/mlp=gelu", "seed=0"], [2.2], parameters={"analytic": dense})
    assert "active params" not in report(dense_only, tmp_path / "out2")["markdown"].read_text()


def test_loss_spikes_against_the_running_median():
    losses = list(enumerate([3.0, 2.0, 2.1, 1.9, 2.6, 2.0, 1.95, 4.0]))
    # step 4: 2.6 > 1.2 · median(2.0, 2.1, 1.9) = 2.4; step 7: 4.0 > 1.2 · median(2.6, 2.0, 1.95) = 2.4
    spikes = loss_spikes(losses, factor=1.2, window=3)
    assert [(s.step, s.loss, s.median) for s in spikes] == [(4, 2.6, 2.0), (7, 4.0, 2.0)]
    assert [s.step for s in loss_spikes(losses, factor=1.5, window=3)] == [7]  # 2.6 < 3.0
    assert loss_spikes(list(enumerate([3.0, 2.5, 2.0, 1.5])), factor=1.01, window=10) == []  # falling: none


def test_stability_per_run_and_per_variant(tmp_path):
    root = tmp_path / "sweep"
    lr_sweep(root)
    steady, spiky = [3.0, 2.5, 2.2, 2.1, 2.0], [3.0, 2.5, 2.2, 2.1, 2.9]  # 2.9 > 1.2 · median(2.5, 2.2, 2.1)
    for seed, (train, norm) in enumerate(((steady, 1.5), (spiky, 7.25))):
        job(
            root,
            ["model/mlp=geglu", "optim.lr=1e-2", f"seed={seed}"],
            [2.0],
            train=train,
            grad_norm={"max": norm, "step": 3},
        )
    written = report(root, tmp_path / "out", spike_window=3)
    md = written["markdown"].read_text()
    table = section(md, "Stability")
    assert "| model/mlp=geglu, optim.lr=1e-2 | 2 | 1 | 7.25 |" in table
    assert "| model/mlp=gelu, optim.lr=1e-3 | 2 | - | - |" in table  # no training log, no gradient norm
    spiked = run_of(root, ["model/mlp=geglu", "optim.lr=1e-2", "seed=1"])
    assert f"- `{spiked}` spiked at step 4: 2.9 (median 2.2)" in table
    # gelu: 2.01 best at 1e-3, nothing else within 1%; swiglu: 1.915 at 1e-2 is within 1% of 1.91 at 3e-3
    assert "| model/mlp=gelu | 1e-3 | 1e-3 |" in table and "| model/mlp=swiglu | 3e-3 | 1e-2 |" in table
    record = json.loads(written["json"].read_text())["stability"]
    assert record["settings"] == {"spike_factor": 1.2, "spike_window": 3, "lr_tolerance": 0.01}
    run = next(r for r in record["runs"] if r["run"] == str(spiked))
    assert run == {
        "run": str(spiked),
        "logged_losses": 5,
        "spikes": [{"step": 4, "loss": 2.9, "median": 2.2}],
        "max_grad_norm": 7.25,
    }
    geglu = next(r for r in rows(written["csv"]) if r["model/mlp"] == "geglu")
    assert (geglu["loss spikes"], geglu["max grad norm"], geglu["largest stable optim.lr"]) == ("1", "7.25", "1e-2")
    tight = report(root, tmp_path / "tight", lr_tolerance=0.001)["markdown"].read_text()
    assert "| model/mlp=swiglu | 3e-3 | 3e-3 |" in tight  # 1.915 is 0.26% above 1.91


def test_stability_settings_are_checked():
    for setting, value in (("spike_factor", 1.0), ("spike_window", 0), ("lr_tolerance", -0.1)):
        with pytest.raises(ConfigError) as refused:
            report("nowhere", **{setting: value})
        assert refused.value.field == setting
