"""The figures' common ground: pyplot on a file-only backend, imported when a plot is drawn (matplotlib
costs a second to import), and one way to save a figure."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

DPI = 120


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend: reports are files, drawn without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` as PNG and release it; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path
