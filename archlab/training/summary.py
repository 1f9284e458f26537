"""summary.json: what a run was (choices, model, counts) and what it gave (metrics, throughput, status).

The file format only (no Lightning import, so a run failing at set-up still writes one quickly);
``archlab.training.recorder.RunRecorder`` fills it in during fit. ``archlab-report`` reads these
files and never parses logs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SUMMARY = "summary.json"
EXPORT = "model.safetensors"


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


def write_summary(output_dir: Path, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically (a temporary file, then a rename)."""
    path = Path(output_dir) / SUMMARY
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=jsonable) + "\n")
    os.replace(tmp, path)
    return path


def jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
