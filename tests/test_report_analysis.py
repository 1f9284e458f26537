"""archlab-report's statistics on hand-built sweeps (run directories with summary.json and
.hydra/overrides.yaml, no training): 95% intervals, seed-paired baseline comparisons, best_over, scaling
fits with compute multipliers, and the refusals of bad options before anything is written."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from helpers.report_runs import failed, job, report, rows

from archlab.errors import ConfigError
from archlab.report.stats import PowerLaw
from archlab.report.text import difference

T_975_DF2 = 4.30265273  # Student t, 97.5th percentile, 2 degrees of freedom (tables: 4.303)


GELU = [2.00, 2.10, 2.05]  # final val/loss of seeds 0, 1, 2
SWIGLU = [1.98, 2.07, 2.03]  # paired differences -0.02, -0.03, -0.02


@pytest.fixture
def mlp_sweep(tmp_path):
    """``model/mlp=gelu,swiglu seed=0,1,2``: swiglu's seed 1 had its lowest loss before the end."""
    root = tmp_path / "sweep"
    for seed in range(3):
        job(root, ["model/mlp=gelu", f"seed={seed}"], [2.3, GELU[seed]])
        swiglu = [2.3, 2.05, SWIGLU[seed]] if seed == 1 else [2.3, SWIGLU[seed]]
        job(root, ["model/mlp=swiglu", f"seed={seed}"], swiglu)
    return root


def test_end_to_end_intervals_and_the_paired_baseline_line(mlp_sweep, tmp_path):
    written = report(mlp_sweep, tmp_path / "out", baseline="model/mlp=gelu")
    md = written["markdown"].read_text()
    # the compact table leads, as before: mean ± sample std (gelu: std 0.05)
    assert md.index("| model/mlp | seeds | final val/loss | best val/loss |") < md.index("## 95% confidence")
    assert "| gelu | 3/3 | 2.050 ± 0.050 | 2.050 ± 0.050 |" in md
    # gelu: mean 2.05, std 0.05, half-width 4.303 · 0.05 / √3 = 0.124; swiglu's best is 2.03, 2.05, 2.03
    assert "- model/mlp=gelu: final val/loss 2.05 ± 0.12, best val/loss 2.05 ± 0.12 (95% CI, 3 seeds)" in md
    # swiglu final 1.98, 2.07, 2.03: mean 2.0267, std 0.0451, half-width 0.112; best 1.98, 2.05, 2.03: mean
    # 2.02, std 0.0361, half-width 0.0896 (the spread to 2 significant digits, the mean to the same place)
    assert "- model/mlp=swiglu: final val/loss 2.03 ± 0.11, best val/loss 2.020 ± 0.090 (95% CI, 3 seeds)" in md
    # differences -0.02, -0.03, -0.02: mean -0.0233, std 0.00577, half-width 4.303 · 0.00577 / √3 = 0.0143
    assert "- model/mlp=swiglu: −0.023 ± 0.014 vs model/mlp=gelu (95% CI, 3 seeds, paired): lower (better)" in md

    (gelu, swiglu) = rows(written["csv"])
    assert float(gelu["final val/loss ci95"]) == pytest.approx(T_975_DF2 * 0.05 / math.sqrt(3), rel=1e-7)
    assert gelu["final val/loss n"] == "3" and gelu["baseline"] == "" and gelu["final val/loss vs baseline diff"] == ""
    assert swiglu["baseline"] == "model/mlp=gelu" and swiglu["final val/loss vs baseline n"] == "3"
    assert float(swiglu["final val/loss vs baseline diff"]) == pytest.approx(-0.07 / 3, rel=1e-9)
    assert float(swiglu["final val/loss vs baseline ci95"]) == pytest.approx(
        T_975_DF2 * math.sqrt(((0.01 / 3) ** 2 * 2 + (0.02 / 3) ** 2) / 2) / math.sqrt(3), rel=1e-6
    )
    # best values paired too: swiglu's best 1.98, 2.05, 2.03 against gelu's 2.00, 2.10, 2.05
    assert float(swiglu["best val/loss vs baseline diff"]) == pytest.approx((-0.02 - 0.05 - 0.02) / 3, rel=1e-9)


def test_only_seeds_both_completed_are_paired_and_one_seed_gives_no_interval(tmp_path):
    root = tmp_path / "sweep"
    for seed in range(3):
        job(root, ["model/mlp=gelu", f"seed={seed}"], [GELU[seed]])
    job(root, ["model/mlp=swiglu", "seed=0"], [1.90])
    job(root, ["model/mlp=swiglu", "seed=2"], [1.95])
    failed(root, ["model/mlp=swiglu", "seed=1"])
    job(root, ["model/mlp=geglu", "seed=1"], [2.2])
    job(root, ["model/mlp=geglu", "seed=7"], [2.0])  # no gelu run with seed 7
    md = report(root, tmp_path / "out", baseline="model/mlp=gelu")["markdown"].read_text()
    # seeds 0 and 2: differences -0.10, -0.10 -> no spread: the plain mean
    assert "- model/mlp=swiglu: −0.1 vs model/mlp=gelu (95% CI, 2 seeds, paired): lower (better)" in md
    assert "- model/mlp=geglu: +0.1 vs model/mlp=gelu (1 seed, paired): no interval from one seed" in md
    assert "- model/mlp=swiglu: final val/loss 1.92 ± 0.32, best val/loss 1.92 ± 0.32 (95% CI, 2 seeds)" in md


def test_with_two_axes_each_variant_is_compared_at_the_same_other_settings(tmp_path):
    root = tmp_path / "sweep"
    for seed in range(2):
        for position, shift in (("learned", 0.0), ("rope", -0.5)):
            job(root, [f"model/position={position}", "model/mlp=gelu", f"seed={seed}"], [2.0 + shift + 0.01 * seed])
            job(root, [f"model/position={position}", "model/mlp=swiglu", f"seed={seed}"], [2.1 + shift + 0.03 * seed])
    md = report(root, tmp_path / "out", baseline="model/mlp=gelu")["markdown"].read_text()
    # +0.10 and +0.12 within each position (the 0.5 between positions never enters)
    for position in ("learned", "rope"):
        line = next(x for x in md.splitlines() if x.startswith(f"- model/position={position}, model/mlp=swiglu: +"))
        assert line.startswith(
            f"- model/position={position}, model/mlp=swiglu: +0.11 ± 0.13 vs model/position={position}, "
            "model/mlp=gelu (95% CI, 2 seeds, paired): the interval includes 0"
        ), line


def test_ignore_pools_runs_that_differ_only_where_they_ran(tmp_path):
    """ignore=trainer.accelerator: gelu's seeds 0, 1 on a GPU and seed 2 on the CPU are one variant (its
    mean over 3 seeds), and the report names the pooled key with the values it took."""
    root = tmp_path / "sweep"
    for seed in range(3):
        where = ["trainer.accelerator=gpu"] if seed < 2 else []
        job(root, ["model/mlp=gelu", f"seed={seed}", *where], [GELU[seed]])
        job(root, ["model/mlp=swiglu", f"seed={seed}", *where], [SWIGLU[seed]])
    split = report(root, tmp_path / "split")["markdown"].read_text()
    assert "swept: model/mlp, trainer.accelerator." in split and "| gelu | gpu | 2/2 |" in split
    md = report(root, tmp_path / "out", baseline="model/mlp=gelu", ignore="trainer.accelerator")["markdown"].read_text()
    assert "swept: model/mlp; not a variant (ignore): trainer.accelerator ((default), gpu)." in md
    assert "| gelu | 3/3 | 2.050 ± 0.050 | 2.050 ± 0.050 |" in md
    assert "- model/mlp=swiglu: −0.023 ± 0.014 vs model/mlp=gelu (95% CI, 3 seeds, paired): lower (better)" in md


def test_a_baseline_naming_no_variant_is_refused_before_anything_is_written(mlp_sweep, tmp_path):
    out = tmp_path / "out"
    for bad in ("model/mlp=relu", "model/mlp", "model/norm=rmsnorm", "seed=0"):
        with pytest.raises(ConfigError) as refused:
            report(mlp_sweep, out, baseline=bad)
        assert refused.value.field == "baseline" and refused.value.value == bad
        assert "model/mlp=gelu|swiglu" in refused.value.allowed
    assert not out.exists()


def lr_sweep(root: Path) -> None:
    """``optim.lr=0.001,0.003,0.03 model/mlp=gelu,swiglu seed=0,1``: gelu is best at 0.003, swiglu at 0.03."""
    loss = {
        ("gelu", "0.001"): 2.20,
        ("gelu", "0.003"): 2.00,
        ("gelu", "0.03"): 2.40,
        ("swiglu", "0.001"): 2.30,
        ("swiglu", "0.003"): 2.10,
        ("swiglu", "0.03"): 1.90,
    }
    for (mlp, lr), value in loss.items():
        for seed in range(2):
            job(root, [f"model/mlp={mlp}", f"optim.lr={lr}", f"seed={seed}"], [value + 0.02 * seed])


def test_best_over_reports_each_variant_at_its_own_best_value_and_compares_those(tmp_path):
    root = tmp_path / "sweep"
    lr_sweep(root)
    written = report(root, tmp_path / "out", baseline="model/mlp=gelu", best_over="optim.lr")
    md = written["markdown"].read_text()
    assert "## Best optim.lr per variant" in md and "(lower is better)" in md
    table = [line for line in md.split("## Best optim.lr per variant")[1].splitlines() if line.startswith("| ")]
    assert table[0] == (
        "| model/mlp | optim.lr | seeds | final val/loss | best val/loss | final val/loss by optim.lr |"
    )
    # means 2.01 (0.003) and 1.91 (0.03); std of (x, x + 0.02) 0.01414, half-width 12.706 · 0.01414 / √2 = 0.127
    assert table[1] == "| gelu | 0.003 | 2 | 2.01 ± 0.13 | 2.01 ± 0.13 | 0.001: 2.21, 0.003: 2.01, 0.03: 2.41 |"
    assert table[2] == "| swiglu | 0.03 | 2 | 1.91 ± 0.13 | 1.91 ± 0.13 | 0.001: 2.31, 0.003: 2.11, 0.03: 1.91 |"
    # swiglu at 0.03 minus gelu at 0.003, seed by seed: -0.10, -0.10
    assert "- model/mlp=swiglu at optim.lr=0.03: −0.1 vs model/mlp=gelu at optim.lr=0.003 (95% CI, 2 seeds" in md
    chosen = {(r["model/mlp"], r["optim.lr"]): r["optim.lr chosen"] for r in rows(written["csv"])}
    assert {k for k, v in chosen.items() if v == "yes"} == {("gelu", "0.003"), ("swiglu", "0.03")}
    assert sum(v == "no" for v in chosen.values()) == 4
    assert written["sensitivity"].stat().st_size > 0 and "![sensitivity](sensitivity.png)" in md


def test_sensitivity_plots_a_log_axis_only_for_positive_values_spanning_more_than_10x():
    from archlab.report.plots import log_scale

    assert log_scale([1e-3, 3e-3, 3e-2]) and not log_scale([1e-3, 1e-2]) and not log_scale([0.0, 1.0, 100.0])


def test_best_over_of_accuracy_takes_the_highest(tmp_path):
    root = tmp_path / "sweep"
    for lr, acc in (("0.001", 0.7), ("0.01", 0.9), ("0.1", 0.8)):
        job(root, [f"optim.lr={lr}", "seed=0"], [2.0], acc=acc)
    md = report(root, tmp_path / "out", metric="val/acc", best_over="optim.lr")["markdown"].read_text()
    assert "| 0.01 | 1 | 0.9 | 0.9 | 0.001: 0.7, 0.01: 0.9, 0.1: 0.8 |" in md and "(higher is better)" in md


def test_best_over_and_scaling_refuse_axes_the_sweep_does_not_have(mlp_sweep, tmp_path):
    cases = [
        ({"best_over": "optim.lr"}, "best_over", "a swept axis of these runs: model/mlp"),
        ({"scaling": "model.d_model"}, "scaling", "a swept axis of these runs: model/mlp"),
        ({"scaling": "model/mlp"}, "scaling", "completed runs at 3 or more values"),
        ({"best_over": "model/mlp", "baseline": "model/mlp=gelu"}, "baseline", "naming a variant: none"),
    ]
    for options, field, allowed in cases:
        with pytest.raises(ConfigError) as refused:
            report(mlp_sweep, tmp_path / "out", **options)
        assert refused.value.field == field and allowed in refused.value.allowed, refused.value
    assert not (tmp_path / "out").exists()


A_GELU, B, E = 2 * 1e13**0.3, 0.3, 1.5  # L = a·C^-0.3 + 1.5: 3.5 at the smallest size
SIZES = {"32": (1e5, 1e13), "64": (4e5, 1e14), "128": (1.6e6, 1e15), "256": (6.4e6, 1e16)}  # d_model: (N, C)
SCALE = {0: 0.999, 1: 1.0, 2: 1.001}  # per seed: a and e scaled alike, still an exact power law


def scaling_sweep(root: Path, seeds=(0, 1, 2), mlps=(("gelu", 1.0), ("swiglu", 0.8))) -> None:
    for d, (n, c) in SIZES.items():
        for mlp, factor in mlps:
            for seed in seeds:
                loss = SCALE[seed] * (factor * A_GELU * c**-B + E)
                job(root, [f"model.d_model={d}", f"model/mlp={mlp}", f"seed={seed}"], [loss], n=n, c=c)


def test_scaling_fits_recover_the_exponent_and_the_compute_multiplier(tmp_path):
    """swiglu's curve is gelu's with a 0.8 a: gelu needs (1/0.8)^(1/0.3) = 2.104x the compute at every
    loss; over swiglu's C range the fifth point (1e16 · 2.1) lies beyond gelu's largest run."""
    root = tmp_path / "sweep"
    scaling_sweep(root)
    written = report(root, tmp_path / "out", scaling="model.d_model", baseline="model/mlp=gelu")
    fits = {(r["model/mlp"], r["X"], r["seed"]): r for r in rows(written["scaling csv"])}
    for seed, k in SCALE.items():
        fit = fits[("gelu", "C", str(seed))]
        assert float(fit["b"]) == pytest.approx(B, rel=1e-4) and float(fit["e"]) == pytest.approx(E * k, rel=1e-4)
        assert float(fit["a"]) == pytest.approx(A_GELU * k, rel=2e-3)
    mean = fits[("gelu", "C", "all")]
    assert float(mean["e"]) == pytest.approx(E, rel=1e-4) and float(mean["e ci95"]) == pytest.approx(
        T_975_DF2 * E * 0.001 / math.sqrt(3), rel=1e-2
    )
    # against N: C grows as N^(log 10 / log 4), so L falls as N^(-0.3 · 1.661)
    assert float(fits[("gelu", "N", "all")]["b"]) == pytest.approx(0.3 * math.log(10) / math.log(4), rel=1e-4)
    swiglu = fits[("swiglu", "C", "all")]
    closed = (1 / 0.8) ** (1 / 0.3)
    assert float(swiglu["multiplier geomean"]) == pytest.approx(closed, rel=1e-3)
    assert float(swiglu["multiplier min"]) == pytest.approx(closed, rel=1e-3) and swiglu["multiplier points"] == "4/5"
    md = written["markdown"].read_text()
    assert "## Scaling with model.d_model" in md and "| model/mlp | X | seeds | a | b | e |" in md
    # a = 2·1e13^0.3 = 15,887 over seeds scaled 0.999, 1, 1.001: std 15.887, half-width 4.303 · 15.887 / √3 = 39;
    # e likewise 1.5 ± 4.303 · 0.0015 / √3 = 0.0037; b the same for every seed: no spread
    assert "| gelu | C | 3 | 15,887 ± 39 | 0.3 | 1.5000 ± 0.0037 |" in md
    line = next(x for x in md.splitlines() if x.startswith("- model/mlp=swiglu: model/mlp=gelu needs"))
    assert line.startswith(f"- model/mlp=swiglu: model/mlp=gelu needs {closed:.3g}× the compute") and (
        "1 of 5 points outside range" in line
    ), line
    assert written["scaling"].stat().st_size > 0
    # the per-size comparisons are there too, paired by seed at each d_model
    assert md.count("vs model.d_model=") == 4


def test_scaling_with_one_seed_gives_the_fit_standard_error(tmp_path):
    root = tmp_path / "sweep"
    for i, (d, (n, c)) in enumerate(SIZES.items()):
        noise = (1.002, 0.998, 1.001, 0.999)[i]
        job(root, [f"model.d_model={d}", "seed=0"], [noise * (A_GELU * c**-B + E)], n=n, c=c)
    written = report(root, tmp_path / "out", scaling="model.d_model")
    row = next(r for r in rows(written["scaling csv"]) if r["X"] == "C" and r["seed"] == "0")
    assert 0 < float(row["b se"]) < 1 and math.isfinite(float(row["a se"]))
    table = [x for x in written["markdown"].read_text().splitlines() if x.startswith("| C | 1 |")]
    assert len(table) == 1 and table[0].count("(SE)") == 3


def test_scaling_refuses_an_accuracy_and_runs_without_compute(tmp_path):
    root = tmp_path / "sweep"
    scaling_sweep(root, seeds=(0,), mlps=(("gelu", 1.0),))
    with pytest.raises(ConfigError) as refused:
        report(root, tmp_path / "out", metric="val/acc", scaling="model.d_model")
    assert refused.value.field == "metric" and "a loss or perplexity" in refused.value.allowed
    bare = tmp_path / "bare"
    for d in SIZES:
        job(bare, [f"model.d_model={d}", "seed=0"], [2.0])  # an older summary: no throughput
    with pytest.raises(ConfigError) as refused:
        report(bare, tmp_path / "out", scaling="model.d_model")
    assert refused.value.field == "scaling" and "throughput" in refused.value.allowed
    assert not (tmp_path / "out").exists()


def test_the_command_line_takes_the_options_as_key_value(mlp_sweep, tmp_path, capsys):
    from archlab.cli.report import main

    main([str(mlp_sweep), f"out={tmp_path / 'out'}", "baseline=model/mlp=gelu"])
    assert "vs model/mlp=gelu (95% CI, 3 seeds, paired)" in (tmp_path / "out" / "report.md").read_text()
    with pytest.raises(SystemExit) as exit_:
        main([str(mlp_sweep), "baseline=model/mlp=relu"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: baseline='model/mlp=relu'") and "gelu|swiglu" in err


# GELU at its best learning rate in experiments/scaling (d_model 32, 64, 128; seeds 0, 1, 2): C, final val/loss
STUDY_POINTS = {
    219611136000.0: (2.0981, 2.0884, 2.0827),
    741212160000.0: (1.9612, 1.9622, 1.9494),
    2690383872000.0: (1.8127, 1.8128, 1.8288),
}


def test_the_scaling_curve_is_fitted_to_every_seed_and_passes_through_their_losses(tmp_path):
    """With three sizes each seed's fit is exact, and here one seed's e leaves 0 while the others' stay at
    it: the mean of their a, b and e misses the data (by 0.06 at the middle size), the curve fitted to all
    nine points lies within the seeds' spread at every size."""
    root = tmp_path / "sweep"
    for i, (c, losses) in enumerate(STUDY_POINTS.items()):
        for seed, loss in enumerate(losses):
            job(root, [f"model.d_model={32 * 2**i}", f"seed={seed}"], [loss], n=10**i, c=c)
    written = report(root, tmp_path / "out", scaling="model.d_model")
    fits = {r["seed"]: r for r in rows(written["scaling csv"]) if r["X"] == "C"}
    pooled = PowerLaw(*(float(fits["all"][p]) for p in "abe"))
    mean = PowerLaw(*(statistics.mean(float(fits[s][p]) for s in "012") for p in "abe"))
    for c, losses in STUDY_POINTS.items():
        assert min(losses) - 0.01 <= pooled(c) <= max(losses) + 0.01, (c, pooled(c), losses)
    assert abs(mean(741212160000.0) - statistics.mean(STUDY_POINTS[741212160000.0])) > 0.03


@pytest.mark.parametrize(
    "mean, spread, text",
    [
        (-0.021, 0.008, "−0.0210 ± 0.0080"),
        (0.153, 0.053, "+0.153 ± 0.053"),
        (-0.001, 0.27, "0.00 ± 0.27"),  # rounds to zero: no sign, not "−0.00"
        (0.004, 0.27, "0.00 ± 0.27"),
        (-1234.0, 56.0, "−1,234 ± 56"),
    ],
)
def test_a_difference_is_signed_unless_it_rounds_to_zero(mean, spread, text):
    assert difference(mean, spread) == text


def test_archlab_evals_metrics_are_columns_beside_the_validation_loss(mlp_sweep, tmp_path):
    """Each run's eval/results.json (lm-eval's results, a perplexity entry): the mean over seeds of each
    metric is a column of report.csv and of report.md's table, standard errors and counts left out."""
    import json

    acc = {"model/mlp=gelu": [0.25, 0.5, 0.75], "model/mlp=swiglu": [0.5, 0.5, 1.0]}
    for run in sorted(mlp_sweep.iterdir()):
        mlp, seed = json.loads((run / ".hydra" / "overrides.yaml").read_text())
        value = acc[mlp][int(seed.split("=")[1])]
        results = {
            "tiny_mc": {"alias": "tiny_mc", "acc,none": value, "acc_stderr,none": 0.1, "sample_len": 4},
            "perplexity:val.bin": {"nll": 2 * value, "ppl": math.exp(2 * value), "tokens": 99, "windows": 3},
        }
        (run / "eval").mkdir()
        (run / "eval" / "results.json").write_text(json.dumps({"results": results}))
    paths = report(mlp_sweep, tmp_path / "out")
    by_mlp = {f"model/mlp={r['model/mlp']}": r for r in rows(paths["csv"])}
    for mlp, values in acc.items():
        assert float(by_mlp[mlp]["eval tiny_mc acc mean"]) == pytest.approx(statistics.fmean(values))
        assert float(by_mlp[mlp]["eval perplexity:val.bin nll mean"]) == pytest.approx(2 * statistics.fmean(values))
    header = rows(paths["csv"])[0].keys()
    assert not any("stderr" in h or "tokens" in h or "sample_len" in h for h in header)
    table = [line for line in paths["markdown"].read_text().splitlines() if line.startswith("|")]
    assert "| final val/loss |" in table[0] and "| eval tiny_mc acc |" in table[0]


LRS = ["1e-3", "2e-3", "4e-3", "8e-3", "1.6e-2"]


def _transfer_sweep(root: Path, params=("sp", "mup"), widths=(32, 64, 128), seeds=(0, 1)) -> Path:
    """``param=sp,mup model.d_model=32,64,128 optim.lr=LRS seed=0,1``: final loss 2 + 0.1 (log2 lr - c)^2
    with c the log2 of 4e-3 at width 64, under sp halving as the width doubles (drift -1), under mup
    fixed (drift 0); seed 1's optimum 0.1 higher in log2 everywhere."""
    for param in params:
        for width in widths:
            for lr in LRS:
                for seed in seeds:
                    c = math.log2(4e-3) - (math.log2(width / 64) if param == "sp" else 0) + 0.1 * seed
                    loss = 2 + 0.1 * (math.log2(float(lr)) - c) ** 2
                    job(
                        root,
                        [f"param={param}", f"model.d_model={width}", f"optim.lr={lr}", f"seed={seed}"],
                        [3.0, loss],
                    )
    return root


def test_transfer_follows_the_best_rate_along_the_width(tmp_path):
    from archlab.report.runs import group_variants, load_runs, swept_axes
    from archlab.report.transfer import record, transfers

    root = _transfer_sweep(tmp_path / "sweep")
    failed(root, ["param=sp", "model.d_model=128", "optim.lr=3.2e-2", "seed=0"])  # diverged: the worst, not a gap
    runs = load_runs(root)
    found = record(transfers(group_variants(runs, swept_axes(runs)), "optim.lr", "model.d_model", "64", "val/loss"))
    sp, mup = (next(t for t in found if t["settings"] == {"param": p}) for p in ("sp", "mup"))
    assert sp["drift"]["mean"] == pytest.approx(-1.0, abs=1e-9) and mup["drift"]["mean"] == pytest.approx(0.0, abs=1e-9)
    assert sp["proxy_best"] == mup["proxy_best"] == "4e-3"
    at_128 = next(p for p in sp["points"] if p["value"] == "128")
    # the parabola's vertex, seed by seed: log2(2e-3) and 0.1 above it
    assert at_128["best"] == "2e-3" and at_128["log2_optimum"]["mean"] == pytest.approx(math.log2(2e-3) + 0.05)
    # at the proxy's 4e-3: 0.1 * 1^2 - 0 (seed 0) and 0.1 * 0.9^2 - 0.1 * 0.1^2 (seed 1)
    assert at_128["cost"]["mean"] == pytest.approx((0.1 + 0.08) / 2)
    assert all(p["cost"]["mean"] == pytest.approx(0.0, abs=1e-12) for p in mup["points"])


def test_transfer_writes_its_section_and_figure(tmp_path):
    root = _transfer_sweep(tmp_path / "sweep", params=("sp",), widths=(64, 128), seeds=(0,))
    written = report(root, tmp_path / "out", best_over="optim.lr", transfer="model.d_model=64")
    md = written["markdown"].read_text()
    assert "## Transfer of optim.lr across model.d_model" in md and "| 64 (proxy) | 4e-3 |" in md
    assert written["transfer"].exists() and json.loads(written["json"].read_text())["transfer"][0]["proxy"] == "64"


@pytest.mark.parametrize(
    "options",
    [{"transfer": "model.d_model"}, {"best_over": "optim.lr", "transfer": "model.d_model=48"}],
    ids=["without best_over", "a proxy not swept"],
)
def test_transfer_is_refused_without_best_over_or_with_a_proxy_not_swept(tmp_path, options):
    root = tmp_path / "sweep"
    for width in (32, 64):
        for lr in ("1e-3", "2e-3"):
            job(root, [f"model.d_model={width}", f"optim.lr={lr}", "seed=0"], [2.0])
    with pytest.raises(ConfigError) as caught:
        report(root, tmp_path / "out", **options)
    assert caught.value.field == "transfer" and not (tmp_path / "out").exists()
