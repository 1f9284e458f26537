"""Scaling ladders (``archlab-report scaling=ND``, archlab/report/ladder.py and ladder_fit.py): the fit of
L(N, D) = E + A/N^α + B/D^β recovers known parameters from noisy synthetic runs and its bootstrap intervals
cover them, the compute-optimal allocation is the minimum of L along C = 6ND, and a ladder that cannot be
fitted is refused, naming the field, before anything is written."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helpers.report_runs import job, report, rows

from archlab.errors import ConfigError
from archlab.report import ladder_fit
from archlab.report.ladder import Ladder, Point, ladder_section
from archlab.report.ladder_fit import Bootstrap, Law, bootstrap, check_points, fit_law

# Hoffmann et al. 2022's own fit (Sec. 3.3): E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28
CHINCHILLA = Law(1.69, 406.4, 410.7, 0.34, 0.28)


def synthetic(law: Law, noise: float, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 4 × 4 ladder, N 1e7 to 1e9 and D 1e9 to 1e11, each loss × exp(noise · a standard normal)."""
    n, d = (x.ravel() for x in np.meshgrid(np.geomspace(1e7, 1e9, 4), np.geomspace(1e9, 1e11, 4)))
    return n, d, law(n, d) * np.exp(np.random.default_rng(seed).normal(0.0, noise, n.size))


def test_the_fit_recovers_known_parameters_and_the_bootstrap_intervals_cover_them():
    n, d, loss = synthetic(CHINCHILLA, noise=0.003)
    found = bootstrap(n, d, loss, draws=20)
    law = found.law
    assert law.E == pytest.approx(1.69, rel=0.03)
    assert law.alpha == pytest.approx(0.34, abs=0.02) and law.beta == pytest.approx(0.28, abs=0.02)
    assert law.A == pytest.approx(406.4, rel=0.25) and law.B == pytest.approx(410.7, rel=0.25)
    assert len(found.laws) == 20
    for name in ladder_fit.PARAMETERS:
        low, high = found.parameter(name)
        truth = getattr(CHINCHILLA, name)
        assert low <= truth <= high, (name, low, truth, high)
        assert high - low < truth, (name, low, high)  # an interval, not everything
    # without noise the fit is the law itself
    exact = fit_law(*synthetic(CHINCHILLA, noise=0.0))
    for name in ladder_fit.PARAMETERS:
        assert getattr(exact, name) == pytest.approx(getattr(CHINCHILLA, name), rel=1e-3)


def test_the_compute_optimal_allocation_is_the_closed_form_and_the_minimum_along_the_isoflop():
    for c in (1e18, 5.76e23, 1e25):  # 5.76e23: Chinchilla's own budget
        n_opt, d_opt = CHINCHILLA.optimum(c)
        assert 6 * n_opt * d_opt == pytest.approx(c, rel=1e-12)
        # the isoFLOP curve L(N, C/6N) minimised numerically over log N, independently of the closed form
        log_n = np.linspace(math.log(n_opt) - 3, math.log(n_opt) + 3, 600_001)
        along = CHINCHILLA(np.exp(log_n), c / (6 * np.exp(log_n)))
        assert math.exp(log_n[np.argmin(along)]) == pytest.approx(n_opt, rel=1e-4)
    # Hoffmann et al.'s approach 3: N_opt ∝ C^0.46 (their Table 2, from unrounded parameters; β/(α+β) = 0.452)
    (n1, _), (n2, _) = CHINCHILLA.optimum(1e20), CHINCHILLA.optimum(1e24)
    assert math.log(n2 / n1) / math.log(1e4) == pytest.approx(0.28 / 0.62, rel=1e-12)


def test_points_that_cannot_fit_five_parameters_are_refused_by_name():
    n, d, loss = synthetic(CHINCHILLA, noise=0.0)
    with pytest.raises(ValueError, match="runs: at least 5"):
        check_points(n[:4], d[:4], loss[:4])
    with pytest.raises(ValueError, match="N: at least 2 distinct values"):
        check_points([1e8] * 6, d[:6], loss[:6])
    with pytest.raises(ValueError, match="D: at least 2 distinct values"):
        check_points(n[:6], [1e10] * 6, loss[:6])
    with pytest.raises(ValueError, match="L: every value a positive"):
        check_points(n, d, [*loss[:-1], math.nan])


SIZES = (2e5, 1e6, 5e6)  # N of each model.d_model
BUDGETS = (1e8, 4e8, 1.6e9)  # D of each trainer.max_steps
LAW = Law(1.2, 30.0, 600.0, 0.3, 0.35)


def ladder_sweep(root, sizes=SIZES, budgets=BUDGETS, tokens=True):
    for i, n in enumerate(sizes):
        for j, d in enumerate(budgets):
            overrides = [f"model.d_model={32 * (i + 1)}", f"trainer.max_steps={100 * (j + 1)}"]
            if tokens:
                job(root, overrides, [LAW(n, d)], n=n, throughput={"tokens": d})
            else:
                job(root, overrides, [LAW(n, d)], n=n)


def test_the_report_fits_the_ladder_and_writes_its_section_csv_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(ladder_fit, "BOOTSTRAP", 10)  # the report's 200 refits, fewer for the test's time
    ladder_sweep(tmp_path / "sweep")
    written = report(tmp_path / "sweep", tmp_path / "out", scaling="ND")
    md = written["markdown"].read_text()
    assert "## Scaling ladder: L(N, D)" in md and "of 9 runs" in md and "10 bootstrap refits" in md
    found = {r["quantity"]: r for r in rows(written["ladder csv"]) if r["C"] == ""}
    for name in ladder_fit.PARAMETERS:
        assert float(found[name]["value"]) == pytest.approx(getattr(LAW, name), rel=1e-3)
    optimum = [r for r in rows(written["ladder csv"]) if r["quantity"] == "N_opt"]
    assert len(optimum) == 6  # 4 budgets over the runs' 6ND, then 10× and 100× the largest
    assert float(optimum[-1]["C"]) == pytest.approx(100 * 6 * SIZES[-1] * BUDGETS[-1])
    for row in optimum:
        assert float(row["value"]) == pytest.approx(LAW.optimum(float(row["C"]))[0], rel=1e-2)
    assert written["ladder"].stat().st_size > 0 and "![ladder](ladder.png)" in md


@pytest.mark.parametrize(
    ("sweep", "metric", "field", "words"),
    [
        ({"sizes": SIZES[:1], "budgets": (*BUDGETS, 3e9, 6e9)}, None, "scaling", "2 or more values of N"),
        ({"budgets": BUDGETS[:1], "sizes": (*SIZES, 1e7, 2e7)}, None, "scaling", "2 or more values of D"),
        ({"sizes": SIZES[:2], "budgets": BUDGETS[:2]}, None, "scaling", "at least 5 completed runs"),
        ({"tokens": False}, None, "scaling", "throughput.tokens"),
        ({}, "val/acc", "metric", "a loss for scaling=ND"),
    ],
)
def test_a_ladder_that_cannot_be_fitted_is_refused_before_anything_is_written(tmp_path, sweep, metric, field, words):
    ladder_sweep(tmp_path / "sweep", **sweep)
    with pytest.raises(ConfigError) as refused:
        report(tmp_path / "sweep", tmp_path / "out", scaling="ND", **({"metric": metric} if metric else {}))
    assert refused.value.field == field and words in refused.value.allowed
    assert not (tmp_path / "out").exists()


def test_a_fit_whose_loss_does_not_fall_with_d_gives_no_compute_optimal_allocation():
    """β ≤ 0: L has no minimum along C = 6ND; the section says so rather than print the closed form's nan."""
    rising = Law(1.0, 50.0, 0.5, 0.3, -0.05)
    points = [Point(Path(f"run{i}"), n, d, float(rising(n, d))) for i, (n, d) in enumerate([(1e5, 1e7), (1e6, 1e8)])]
    found = Ladder(points, Bootstrap(rising, [rising, CHINCHILLA]), budgets=[1e15])
    text = "\n".join(ladder_section(found, "val/loss", None))
    assert "No compute-optimal allocation: the fit has α = 0.3, β = -0.05" in text and "N_opt |" not in text
    assert not rising.falls and found.fit.falling == [CHINCHILLA]
    assert found.fit.optimum(1e20)[0] == (CHINCHILLA.optimum(1e20)[0],) * 2  # the one refit that has one
