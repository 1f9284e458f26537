"""summary.json: what a run was (choices, model, counts) and what it gave (metrics, throughput, status).

The file format only (no Lightning import, so a run failing at set-up still writes one quickly): every
summary, completed or failed, is made by ``run_summary``. ``archlab.training.recorder.RunRecorder`` fills
it in during fit, ``archlab.training.sweep.record_failure`` before. ``archlab-report`` reads these files
and never parses logs.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any, Iterable, Optional

from archlab.run_files import SUMMARY

METRICS = ("loss", "ppl", "acc")  # what each validation set reports (``LitModel.on_validation_epoch_end``)


def metric_names(val_names: Iterable[str]) -> list[str]:
    """Every metric a run with these validation sets records: ``<val name>/loss|ppl|acc``."""
    return [f"{n}/{m}" for n in val_names for m in METRICS]


def best_metrics(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For each metric, its best value over the validations and the step it came at
    (lowest loss and perplexity, highest accuracy)."""
    best: dict[str, dict[str, Any]] = {}
    for entry in history:
        for key, value in entry.items():
            if key == "step" or value is None:
                continue
            higher = key.endswith("/acc")
            old = best.get(key)
            if old is None or (value > old["value"] if higher else value < old["value"]):
                best[key] = {"value": value, "step": entry["step"]}
    return best


def run_summary(
    output_dir: str | Path,
    info: dict[str, Any],
    status: str,
    error: Optional[BaseException] = None,
    *,
    steps: int = 0,
    wall_time_s: float,
    history: Iterable[dict[str, Any]] = (),
    paths: Optional[dict[str, Any]] = None,
    **fields: Any,
) -> dict[str, Any]:
    """The summary of a run in ``output_dir``: ``status`` (completed | failed) and its ``error`` with the
    traceback, the facts known before fit (``info``), the metrics of each validation in ``history``
    (final and best), the run's ``paths`` (those not given: null) and any other ``fields``. JSON-ready:
    tensors as numbers, non-finite numbers as null."""
    history = list(history)
    summary = {
        "status": status,
        "error": None if error is None else f"{type(error).__name__}: {error}",
        **info,
        "steps": steps,
        "wall_time_s": wall_time_s,
        "metrics": {"final": history[-1] if history else {}, "best": best_metrics(history), "history": history},
        **fields,
        "paths": {
            "summary": str(Path(output_dir) / SUMMARY),
            "export": None,
            "checkpoint": None,
            "last_checkpoint": None,
            "logs": [],
            **(paths or {}),
        },
    }
    if error is not None:
        summary["traceback"] = "".join(traceback.format_exception(error))
    return json.loads(json.dumps(summary, default=jsonable), parse_constant=lambda c: None)


def write_summary(output_dir: Path, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically (a temporary file, then a rename)."""
    path = Path(output_dir) / SUMMARY
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=jsonable) + "\n")
    os.replace(tmp, path)
    return path


def jsonable(value: Any) -> Any:
    """A tensor or numpy scalar as its number, a path as its string (``json.dumps``'s ``default``)."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
