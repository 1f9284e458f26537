"""archlab.report.stats against hand-computed values: t intervals, seed-paired differences, best-setting choice,
power-law fits recovering a known curve, and compute multipliers against their closed form."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from archlab.report.stats import (
    PowerLaw,
    best_setting,
    compute_multipliers,
    fit_power_law,
    geometric_mean,
    higher_is_better,
    paired_difference,
    t_interval,
)

ROOT = Path(__file__).resolve().parents[1]
T_975_DF2 = 4.30265273  # Student t, 97.5th percentile, 2 degrees of freedom (tables: 4.303)
T_975_DF1 = 12.7062047  # 1 degree of freedom (tables: 12.706)


def test_t_interval_of_1_2_3_is_2_plus_minus_4_303_over_root_3():
    i = t_interval([1, 2, 3])
    assert (i.mean, i.std, i.n) == (2.0, 1.0, 3)
    assert i.half_width == pytest.approx(T_975_DF2 * 1 / math.sqrt(3), rel=1e-8)
    assert (i.low, i.high) == pytest.approx((2 - 2.4841377, 2 + 2.4841377), abs=1e-6)
    two = t_interval([2.0, 2.1])  # std 0.0707..., half-width 12.706 * 0.0707 / sqrt(2) = 0.635
    assert two.half_width == pytest.approx(T_975_DF1 * 0.1 / math.sqrt(2) / math.sqrt(2), rel=1e-8)


def test_one_value_has_no_interval():
    i = t_interval([2.5])
    assert (i.mean, i.std, i.n) == (2.5, 0.0, 1) and math.isnan(i.half_width) and not i.excludes_zero
    with pytest.raises(ValueError):
        t_interval([])


def test_paired_difference_uses_only_the_shared_seeds():
    variant = {"0": 2.0, "1": 2.3, "2": 2.1, "3": 9.0}  # seed 3 has no baseline run
    baseline = {"0": 2.1, "1": 2.5, "2": 2.2, "4": 1.0}  # seed 4 has no variant run
    d = paired_difference(variant, baseline)
    # differences -0.1, -0.2, -0.1: mean -0.1333, sample std sqrt(((1/30)^2 + (2/30)^2 + (1/30)^2) / 2)
    std = math.sqrt(((1 / 30) ** 2 + (2 / 30) ** 2 + (1 / 30) ** 2) / 2)
    assert d.n == 3 and d.mean == pytest.approx(-0.4 / 3, rel=1e-12) and d.std == pytest.approx(std, rel=1e-9)
    assert d.half_width == pytest.approx(T_975_DF2 * std / math.sqrt(3), rel=1e-8)
    assert d.high > 0 and not d.excludes_zero  # -0.133 + 0.143: the interval includes 0

    tight = paired_difference({"0": 1.9, "1": 1.88, "2": 1.89}, {"0": 2.0, "1": 2.0, "2": 2.0})
    # differences -0.10, -0.12, -0.11: mean -0.11, std 0.01, half-width 4.303 * 0.01 / sqrt(3) = 0.0248
    assert tight.mean == pytest.approx(-0.11) and tight.half_width == pytest.approx(T_975_DF2 * 0.01 / math.sqrt(3))
    assert tight.excludes_zero and tight.high < 0
    assert paired_difference({"0": 1.0}, {"1": 1.0}) is None


def test_best_setting_lowest_loss_highest_accuracy():
    assert higher_is_better("val/acc") and higher_is_better("val_long/acc")
    assert not higher_is_better("val/loss") and not higher_is_better("val/ppl")
    means = {"1e-3": 2.2, "3e-3": 2.05, "1e-2": 2.4}
    assert best_setting(means, higher=False) == "3e-3" and best_setting(means, higher=True) == "1e-2"
    assert best_setting({"a": 1.0, "b": 1.0}, higher=False) == "a"  # a tie: the first


def test_power_law_fit_recovers_a_known_curve_from_noisy_points():
    """a = 6e4, b = 0.3, e = 1.5 over four decades of compute, 0.2% multiplicative noise: b within 0.02,
    e within 0.02, a within 25% (a and b trade off along the curve), and b's standard error covers b."""
    a, b, e = 6e4, 0.3, 1.5
    x = np.geomspace(1e15, 1e19, 8)
    rng = np.random.default_rng(0)
    for _ in range(5):
        y = (a * x**-b + e) * np.exp(rng.normal(0, 0.002, x.size))
        fit = fit_power_law(x, y)
        assert abs(fit.b - b) < 0.02 and abs(fit.e - e) < 0.02 and abs(fit.a / a - 1) < 0.25, fit
        assert abs(fit.b - b) < 4 * fit.stderr[1] and fit.at_bound == ()


def test_three_points_fix_the_curve_exactly_without_standard_errors():
    x = [1e12, 1e13, 1e14]
    curve = PowerLaw(2e3, 0.25, 1.8)
    fit = fit_power_law(x, [curve(v) for v in x])
    assert (fit.a, fit.b, fit.e) == pytest.approx((2e3, 0.25, 1.8), rel=1e-5)
    assert all(math.isinf(s) for s in fit.stderr)
    with pytest.raises(ValueError, match="3 or more distinct x"):
        fit_power_law([1e12, 1e12, 1e13], [3.0, 3.1, 2.9])


def test_points_that_rise_are_flagged_as_no_power_law():
    fit = fit_power_law([1e12, 2e12, 4e12, 8e12], [2.0, 2.1, 2.2, 2.3])  # loss grows with compute
    assert fit.at_bound, fit


def test_inverse_undoes_the_curve_and_never_reaches_the_asymptote():
    curve = PowerLaw(1.5e4, 0.3, 1.5)
    for x in (1e13, 3e15, 1e18):
        assert curve.inverse(float(curve(x))) == pytest.approx(x, rel=1e-9)
    assert math.isinf(curve.inverse(1.5)) and math.isinf(curve.inverse(1.0))


def test_compute_multiplier_equals_the_closed_form():
    """Same b and e: the baseline needs (a_base / a_var)^(1/b) times the compute at every C. Different
    curves: C_base = ((a_v C^-b_v + e_v - e_b) / a_b)^(-1/b_b); none where that loss is below e_b or the
    needed compute lies outside the baseline's observed range."""
    base, variant = PowerLaw(2e4, 0.3, 1.5), PowerLaw(1.5e4, 0.3, 1.5)
    at = list(np.geomspace(1e13, 1e16, 5))
    ratios = compute_multipliers(variant, base, at)
    assert ratios == pytest.approx([(2e4 / 1.5e4) ** (1 / 0.3)] * 5, rel=1e-9)
    assert geometric_mean(ratios) == pytest.approx(2.6089, rel=1e-4)

    other = PowerLaw(3e4, 0.35, 1.4)
    ratios = compute_multipliers(other, base, at)
    for c, r in zip(at, ratios):
        loss = 3e4 * c**-0.35 + 1.4
        expected = ((loss - 1.5) / 2e4) ** (-1 / 0.3) / c if loss > 1.5 else None
        assert r == (None if expected is None else pytest.approx(expected, rel=1e-9))
    assert ratios[-1] is None  # at 1e16 the variant's loss, 1.45, is below the baseline's asymptote

    within = compute_multipliers(variant, base, at, reach=(1e13, 1e16))
    inside = [c * (2e4 / 1.5e4) ** (1 / 0.3) <= 1e16 for c in at]
    assert [r is not None for r in within] == inside and inside == [
        True,
        True,
        True,
        True,
        False,
    ]  # 1.8e15 · 2.61 = 4.6e15: inside; 1e16 · 2.61: not


def test_the_module_stands_alone_without_torch():
    """stats.py loaded as a file on its own (the archlab package's __init__ builds models, so it imports
    torch): its arithmetic runs and torch is never imported."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('stats', {str(ROOT / 'archlab' / 'report' / 'stats.py')!r})\n"
        "s = sys.modules['stats'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(s)\n"
        "s.t_interval([1, 2]); s.fit_power_law([1, 2, 4], [3, 2, 1.5])\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
