"""The look every figure of archlab shares (the report's, archlab-coord's, archlab-bench's context sweep):
pyplot on a file-only backend, the size of a panel, a distinct colour per key, PNG files at one resolution;
and the numeric order of a setting's values, which sets the colours' order and the report's.

Below the training, the report and the benchmark, which each draw with it: pyplot is imported when a
figure is drawn (matplotlib costs a second to import)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Optional

DPI = 120
PANEL = (3.3, 2.5)  # inches per panel


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend: figures are files, drawn without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out ``fig`` (unless it lays itself out), write it to ``path`` as PNG and release it; returns ``path``."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def colours(keys: list[str]) -> dict[str, Any]:
    """A different colour per key: for numbers (learning rates), a sequential colormap in ascending order,
    so the colour reads as the value; for names, tab10, tab20, or beyond 20 evenly spaced hues of turbo."""
    from matplotlib import colormaps

    keys = ordered(keys)
    n = len(keys)
    if as_numbers(keys) is not None and n > 1:
        return {k: colormaps["viridis"](0.9 * i / (n - 1)) for i, k in enumerate(keys)}
    if n <= 20:
        table = colormaps["tab10" if n <= 10 else "tab20"]
        return {k: table(i) for i, k in enumerate(keys)}
    return {k: colormaps["turbo"](0.05 + 0.9 * i / (n - 1)) for i, k in enumerate(keys)}


def as_numbers(values: list[str]) -> Optional[list[float]]:
    """The values as numbers where every one reads as a number (an axis of learning rates, sizes), else None."""
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def ordered(values: list[str]) -> list[str]:
    """``values`` in ascending numeric order where every one is a number (3e-3 before 1e-2, whatever order
    combined sweeps listed them in), as given otherwise."""
    numeric = as_numbers(values)
    return [v for _, v in sorted(zip(numeric, values), key=lambda pair: pair[0])] if numeric else list(values)
