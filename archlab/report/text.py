"""How archlab-report writes numbers and variants: one format for the table, the intervals and the fits."""

from __future__ import annotations

import math


def number(value: float) -> str:
    """4 significant digits; from 10,000 up, the whole number with thousands separators."""
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def plus_minus(mean: float, spread: float) -> str:
    """``mean ± spread``, the spread to 2 significant digits and the mean to the same decimal place; the
    plain mean where there is no spread (0, rounding noise far below the mean, or nan for a single value)."""
    if not math.isfinite(spread) or spread <= 1e-12 * abs(mean):
        return number(mean)
    places = 1 - math.floor(math.log10(spread))
    if round(mean, places) == 0:
        mean = 0.0  # a mean that rounds to zero is written 0.00, not -0.00
    if places > 0:
        return f"{mean:.{places}f} ± {spread:.{places}f}"
    return f"{round(mean, places):,.0f} ± {round(spread, places):,.0f}"


def difference(mean: float, spread: float) -> str:
    """A difference as ``plus_minus`` writes it, signed: the true minus sign (−) or a leading +; no sign
    where it rounds to zero."""
    text = plus_minus(mean, spread)
    if text.startswith("-"):
        return "−" + text[1:]
    shown_zero = not any(c in "123456789" for c in text.split(" ")[0])
    return "+" + text if mean > 0 and not shown_zero else text


def label(settings: dict[str, str]) -> str:
    """A variant as ``key=value, key=value``; ``all runs`` where nothing was swept."""
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "all runs"


def values_label(settings: dict[str, str]) -> str:
    """A variant by its values alone (``rope, swiglu``), where a figure's title names the axes."""
    return ", ".join(settings.values()) or "all runs"
