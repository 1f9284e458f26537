"""archlab-eval's results file: lm-eval's results dict (per-task metrics under ``results``; perplexity
figures there too, as ``perplexity:<file>``), one file per run that later evaluations add to."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from archlab.run_files import EVAL_RESULTS

RESULTS = Path(EVAL_RESULTS)  # eval/results.json in a run directory
PER_TASK = ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "group_subtasks")


def write_results(results: dict[str, Any], directory: Path) -> Path:
    """``results.json`` in ``directory``: these results merged into those already there, task by task (an
    evaluation of other tasks adds to the file; of the same task, replaces its entry). Written atomically."""
    file = directory / RESULTS.name
    merged = json.loads(file.read_text()) if file.is_file() else {}
    for key, value in results.items():
        per_task = key in PER_TASK and isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = {**merged[key], **value} if per_task else value
    directory.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(merged, indent=2, default=str) + "\n")
    os.replace(tmp, file)
    return file
