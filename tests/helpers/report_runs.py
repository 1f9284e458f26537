"""Hand-built sweeps for archlab-report's tests: run directories with summary.json and .hydra/overrides.yaml
(and, where asked, a training log), no training."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Optional

from archlab.config.commands import ReportConfig
from archlab.report.write import write_report


def job(
    root: Path,
    overrides: list[str],
    losses: list[float],
    *,
    acc: float = 0.5,
    n=None,
    c=None,
    train: Optional[list[float]] = None,
    **fields: Any,
) -> Path:
    """One completed run: validation losses at steps 10, 20, ... (the last is the final one, the lowest
    the best), and, for scaling, its non-embedding parameters ``n`` and training FLOPs ``c``; ``train``:
    training losses logged at steps 0, 1, 2, ... into logs/metrics.csv; ``fields``: more summary fields."""
    run = root / f"{len(list(root.glob('*'))) if root.exists() else 0}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(json.dumps(overrides))
    history = [{"step": 10 * (k + 1), "val/loss": v, "val/acc": acc} for k, v in enumerate(losses)]
    summary = {
        "status": "completed",
        "primary_metric": {"name": "val/loss"},
        "metrics": {
            "final": history[-1],
            "best": {"val/loss": {"value": min(losses), "step": 0}, "val/acc": {"value": acc, "step": 0}},
            "history": history,
        },
        "parameters": {"analytic": {"total": 1000, "non_embedding": n or 800}},
    }
    if c is not None:  # the ThroughputMonitor's rates over its seconds: C = flops_per_s · train_seconds
        summary["throughput"] = {"tokens_per_s": c / 1e6 / 10.0, "flops_per_s": c / 10.0, "train_seconds": 10.0}
    if train is not None:
        (run / "logs").mkdir()
        rows = "".join(f"{step},{loss}\n" for step, loss in enumerate(train))
        (run / "logs" / "metrics.csv").write_text("step,train/loss\n" + rows)
        summary["paths"] = {"summary": str(run / "summary.json"), "logs": [str(run / "logs")]}
    summary.update(fields)
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def failed(root: Path, overrides: list[str]) -> None:
    run = root / f"{len(list(root.glob('*')))}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(json.dumps(overrides))
    (run / "summary.json").write_text(json.dumps({"status": "failed", "error": "RuntimeError: boom"}))


def report(sweep: Path | str, out: Optional[Path] = None, **settings: Any) -> dict[str, Path]:
    """archlab-report on ``sweep`` with these ``ReportConfig`` settings, written into ``out`` (default: the
    sweep's directory); the paths it wrote."""
    return write_report(ReportConfig(sweep_dir=str(sweep), out=None if out is None else str(out), **settings))


def rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))
