"""Per-layer health in the report: from each run's ``health.jsonl`` (``callbacks.health``), a layer × step
heatmap per variant of each figure (block-output RMS, attention entropy and largest logit, gradient norm,
update/weight ratio), the variants' panels side by side on one colour scale per figure (log10 but for the
attention's two), so two variants' layers compare; a variant's cell is
the mean over its completed seeds at the steps every seed recorded."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from archlab.figures import PANEL, pyplot, save_figure
from archlab.report.runs import Variant
from archlab.report.text import values_label
from archlab.run_files import HEALTH

FIGURES = {
    "rms": "block output RMS",
    "attn_entropy": "attention entropy (nats)",
    "attn_max_logit": "largest attention logit",
    "grad_norm": "gradient norm",
    "update_ratio": "update/weight ratio",
}
LINEAR = {"attn_entropy", "attn_max_logit"}  # drawn as they are: an entropy may be 0, a logit negative


def read_health(run_dir: Path) -> list[dict]:
    """The run's health records, one per measured step (none without the file)."""
    file = run_dir / HEALTH
    if not file.is_file():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def health_matrix(runs: list[list[dict]], figure: str) -> tuple[list[int], list[str], list[list[float]]]:
    """The steps every run recorded, the blocks (in order) and ``figure`` per block and step, the mean over
    ``runs`` (each a run's records): [block][step]."""
    steps = sorted(set.intersection(*({r["step"] for r in records} for records in runs))) if runs else []
    at = [{r["step"]: r.get(figure, {}) for r in records} for records in runs]
    blocks = sorted({k for rs in at for s in steps for k in rs[s] if k.isdigit()}, key=int)
    matrix = [[statistics.fmean(_value(rs[s].get(b)) for rs in at) for s in steps] for b in blocks]
    return steps, blocks, matrix


def _value(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def plot_health(variants: list[Variant], out: Path) -> dict[str, Path]:
    """``health.png`` where some variant's runs recorded their health: ``health_rows`` drawn, blocks up and
    steps across, the figure (log10 but for ``LINEAR``) as colour (one scale per row); name -> path."""
    rows = health_rows(variants)
    if not rows:
        return {}
    axes = ", ".join(variants[0].settings)
    title = "per-layer health (mean over seeds)" + (f"; panels: {axes}" if axes else "")
    return {"health": _draw(rows, title, out / "health.png")}


Panel = tuple[str, list[int], list[str], list[list[float]]]  # variant, steps, blocks, [block][step]
Row = tuple[str, bool, list[Panel]]  # the figure's title, whether drawn linear, a panel per variant


def health_rows(variants: list[Variant]) -> list[Row]:
    """A row per figure some run recorded, in ``FIGURES``' order, a panel per variant with health records."""
    per_variant = []
    for v in variants:
        runs = [records for records in (read_health(r.path) for r in v.completed) if records]
        if runs:
            per_variant.append((values_label(v.settings), runs))
    rows = []
    for figure, title in FIGURES.items():
        panels = [(name, *health_matrix(runs, figure)) for name, runs in per_variant]
        if any(p[2] and p[1] for p in panels):
            rows.append((title, figure in LINEAR, panels))
    return rows


def _draw(rows: list[Row], title: str, path: Path) -> Path:
    import numpy as np

    plt = pyplot()
    cols = len(rows[0][2])
    size = (PANEL[0] * cols + 1.2, PANEL[1] * len(rows) + 0.4)  # and the colour bars, the title
    fig, grid = plt.subplots(len(rows), cols, figsize=size, squeeze=False, layout="constrained")
    for axes, (figure, linear, panels) in zip(grid, rows):
        scale = (lambda m: m) if linear else (lambda m: np.log10(np.where(m > 0, m, np.nan)))
        logs = [scale(np.array(m, dtype=float)) if m else None for *_, m in panels]
        finite = np.concatenate([x[np.isfinite(x)] for x in logs if x is not None] or [np.zeros(0)])
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        image = None
        for ax, (name, steps, blocks, _), values in zip(axes, panels, logs):
            ax.set_title(name, fontsize=9)
            if values is None:  # this variant did not record this figure
                ax.axis("off")
                continue
            image = ax.imshow(values, origin="lower", aspect="auto", vmin=low, vmax=high, cmap="viridis")
            ticks = sorted({0, len(steps) // 2, len(steps) - 1})
            ax.set_xticks(ticks, [str(steps[i]) for i in ticks])
            shown = blocks if len(blocks) <= 12 else [b if int(b) % 4 == 0 else "" for b in blocks]
            ax.set_yticks(range(len(blocks)), shown)
            ax.set_xlabel("step")
            ax.set_ylabel("block")
        if image is not None:
            fig.colorbar(image, ax=list(axes), shrink=0.8, label=figure if linear else f"log10 {figure}")
    fig.suptitle(title)
    return save_figure(fig, path)
