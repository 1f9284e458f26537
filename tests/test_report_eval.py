"""archlab-report on evaluation scores (hand-built sweeps, no training): archlab-eval's ``eval <task>
<metric>`` and the in-training ``eval/<set>/<metric>`` (summary.json's ``evaluation``) may lead the report
(``metric=``), choose ``best_over``'s value and get seed-paired differences against the baseline; the
in-training curves are drawn and tabulated per variant with 95% intervals over seeds."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from helpers.report_runs import job, report, rows

from archlab.errors import ConfigError
from archlab.report.stats import higher_is_better

T_975_DF2 = 4.30265273  # Student t, 97.5th percentile, 2 degrees of freedom (tables: 4.303)

# tiny_mc accuracy per (mlp, lr) and seed 0, 1, 2: gelu is best at lr 1e-3, swiglu at 3e-3
ACC = {
    ("gelu", "1e-3"): [0.50, 0.60, 0.55],
    ("gelu", "3e-3"): [0.40, 0.45, 0.41],
    ("swiglu", "1e-3"): [0.52, 0.58, 0.57],
    ("swiglu", "3e-3"): [0.70, 0.75, 0.80],
}
# in-training eval/web/ppl at steps 10, 20 (the last is final) per variant and seed: lower is better
PPL = {
    ("gelu", "1e-3"): [[9.0, 6.0], [9.5, 6.5], [9.2, 6.1]],
    ("gelu", "3e-3"): [[8.0, 5.0], [8.5, 5.2], [8.1, 5.3]],
    ("swiglu", "1e-3"): [[9.9, 7.0], [9.8, 7.5], [9.7, 7.1]],
    ("swiglu", "3e-3"): [[9.1, 6.2], [9.0, 6.0], [9.3, 6.9]],
}


def evaluation(ppls: list[float]) -> dict:
    history = [
        {"step": 10 * (k + 1), "eval/web/ppl": p, "eval/web/nll": math.log(p), "seconds": 0.1}
        for k, p in enumerate(ppls)
    ]
    final = {k: v for k, v in history[-1].items() if k.startswith("eval/")}
    return {"every_n_steps": 10, "history": history, "final": final}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """``model/mlp=gelu,swiglu optim.lr=1e-3,3e-3 seed=0,1,2``, each run with an archlab-eval score and
    an evaluation during training; val/loss the same everywhere (it must not decide anything here)."""
    root = tmp_path / "sweep"
    for (mlp, lr), accs in ACC.items():
        for seed, acc in enumerate(accs):
            run = job(
                root,
                [f"model/mlp={mlp}", f"optim.lr={lr}", f"seed={seed}"],
                [2.0],
                evaluation=evaluation(PPL[mlp, lr][seed]),
            )
            (run / "eval").mkdir()
            results = {"tiny_mc": {"acc,none": acc, "acc_stderr,none": 0.1, "alias": "tiny_mc"}}
            (run / "eval" / "results.json").write_text(json.dumps({"results": results}))
    return root


def test_an_archlab_eval_score_leads_chooses_best_over_and_is_paired_against_the_baseline(sweep, tmp_path):
    written = report(
        sweep, tmp_path / "out", metric="eval tiny_mc acc", best_over="optim.lr", baseline="model/mlp=gelu"
    )
    md = written["markdown"].read_text()
    # best_over by the highest mean accuracy: gelu at 1e-3 (0.55 vs 0.42), swiglu at 3e-3 (0.75 vs 0.557)
    by = {(r["model/mlp"], r["optim.lr"]): r for r in rows(written["csv"])}
    assert by["gelu", "1e-3"]["optim.lr chosen"] == "yes" and by["gelu", "3e-3"]["optim.lr chosen"] == "no"
    assert by["swiglu", "3e-3"]["optim.lr chosen"] == "yes"
    # swiglu at 3e-3 minus gelu at 1e-3, paired by seed: 0.20, 0.15, 0.25
    diffs = [s - g for s, g in zip(ACC["swiglu", "3e-3"], ACC["gelu", "1e-3"])]
    mean, hw = statistics.fmean(diffs), T_975_DF2 * statistics.stdev(diffs) / math.sqrt(3)
    row = by["swiglu", "3e-3"]
    assert float(row["eval tiny_mc acc vs baseline diff"]) == pytest.approx(mean)
    assert float(row["eval tiny_mc acc vs baseline ci95"]) == pytest.approx(hw)
    assert row["eval tiny_mc acc vs baseline n"] == "3"
    assert float(row["eval tiny_mc acc ci95"]) == pytest.approx(
        T_975_DF2 * statistics.stdev(ACC["swiglu", "3e-3"]) / math.sqrt(3)
    )
    line = next(x for x in md.splitlines() if x.startswith("- model/mlp=swiglu at optim.lr=3e-3:"))
    assert "vs model/mlp=gelu at optim.lr=1e-3 (95% CI, 3 seeds, paired): higher (better)" in line
    table = md.splitlines()[4]
    assert table.split(" | ")[3] == "eval tiny_mc acc"  # it leads the table, after the axes and seeds
    best = json.loads(written["json"].read_text())
    assert best["metric"] == "eval tiny_mc acc"
    assert best["best_runs"][0]["final eval tiny_mc acc"] == 0.80  # swiglu 3e-3 seed 2, the highest


def test_an_in_training_evaluation_leads_with_its_final_and_best_value(sweep, tmp_path):
    written = report(sweep, tmp_path / "out", metric="eval/web/ppl", best_over="optim.lr", baseline="model/mlp=gelu")
    by = {(r["model/mlp"], r["optim.lr"]): r for r in rows(written["csv"])}
    # lower is better: both at 3e-3
    assert by["gelu", "3e-3"]["optim.lr chosen"] == "yes" and by["swiglu", "3e-3"]["optim.lr chosen"] == "yes"
    finals = {k: [seed[-1] for seed in v] for k, v in PPL.items()}
    assert float(by["gelu", "3e-3"]["final eval/web/ppl mean"]) == pytest.approx(
        statistics.fmean(finals["gelu", "3e-3"])
    )
    assert float(by["gelu", "3e-3"]["best eval/web/ppl mean"]) == pytest.approx(
        statistics.fmean(finals["gelu", "3e-3"])
    )
    diffs = [s - g for s, g in zip(finals["swiglu", "3e-3"], finals["gelu", "3e-3"])]
    assert float(by["swiglu", "3e-3"]["final eval/web/ppl vs baseline diff"]) == pytest.approx(statistics.fmean(diffs))
    winners = json.loads(written["json"].read_text())["best_runs"]
    assert winners[0]["final eval/web/ppl"] == 5.0  # gelu 3e-3 seed 0, the lowest


def test_in_training_curves_are_tabulated_and_drawn_with_intervals_over_seeds(sweep, tmp_path):
    written = report(sweep, tmp_path / "out")
    assert written["eval_curves"].is_file() and written["eval_curves"].stat().st_size > 0
    found = {(r["model/mlp"], r["optim.lr"], r["metric"], r["step"]): r for r in rows(written["eval curves csv"])}
    assert len(found) == 4 * 2 * 2  # variants × metrics × steps
    for (mlp, lr), seeds in PPL.items():
        for k, step in enumerate(("10", "20")):
            values = [s[k] for s in seeds]
            r = found[mlp, lr, "eval/web/ppl", step]
            assert float(r["mean"]) == pytest.approx(statistics.fmean(values)) and r["n"] == "3"
            assert float(r["ci95"]) == pytest.approx(T_975_DF2 * statistics.stdev(values) / math.sqrt(3))
    md = written["markdown"].read_text()
    assert "## Evaluation during training" in md and "### eval/web/ppl" in md
    row = next(x for x in md.splitlines() if x.startswith("| model/mlp=gelu, optim.lr=1e-3 | 3 |"))
    assert row.count("±") == 2  # steps 10 and 20
    assert "final eval/web/ppl" in md.splitlines()[4]  # the final in-training figures are table columns


def test_a_metric_that_is_neither_a_final_metric_nor_a_score_is_refused(sweep, tmp_path):
    with pytest.raises(ConfigError) as err:
        report(sweep, tmp_path / "out", metric="eval tiny_mc acc_norm")
    assert err.value.field == "metric" and "eval tiny_mc acc" in err.value.allowed
    assert "eval/web/ppl" in err.value.allowed


@pytest.mark.parametrize(
    "metric, higher",
    [
        ("val/acc", True),
        ("val/loss", False),
        ("eval tiny_mc acc", True),
        ("eval tiny_mc acc_norm", True),
        ("eval gsm8k exact_match,strict-match", True),
        ("eval wikitext word_perplexity", False),
        ("eval wikitext bits_per_byte", False),
        ("eval perplexity:val.bin nll", False),
        ("eval/web/ppl", False),
        ("eval/tiny_mc/acc_norm", True),
        ("eval/gsm8k/exact_match.strict-match", True),
    ],
)
def test_which_way_an_evaluation_metric_is_better(metric, higher):
    assert higher_is_better(metric) is higher
