"""A run directory's files by name, and the readers of those that more than one command reads.

Training writes a run directory; the report, the export and archlab-eval read it. They share these names
and readers here, below all of them, so none imports another for them, and none pulls in Lightning: a
checkpoint is read with torch alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from archlab.errors import ConfigError

SUMMARY = "summary.json"  # what the run was and gave: archlab.training.summary writes it
EXPORT = "model.safetensors"  # the final weights, written when the run completes
EMA_EXPORT = "model_ema.safetensors"  # their moving average (callbacks.ema), written beside them
AVERAGE_EXPORT = "model_last{k}.safetensors"  # archlab-average's mean of the run's last k checkpoints
HEALTH = "health.jsonl"  # per-layer health every K steps (callbacks.health): the report's heatmaps
EVAL_RESULTS = "eval/results.json"  # archlab-eval's results in a run directory: archlab-report's eval columns
HYDRA_FILES = ".hydra"  # the job's composed config, overrides and Hydra settings, as Hydra names them
PENDING_HYDRA_FILES = ".hydra.pending"  # where Hydra writes them first: hydra.output_subdir in conf/train.yaml
SHARDED_METADATA = "meta.pt"  # a sharded (FSDP) checkpoint directory's non-tensor part, as Lightning names it


def read_summary(path: Path) -> Optional[dict[str, Any]]:
    """The summary at ``path``; None where there is none, ``{}`` where it does not read as one."""
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
        return summary if isinstance(summary, dict) else {}
    except (OSError, ValueError):
        return {}


def continues_run(ckpt_path: str, run_dir: Path, cwd: Optional[str | Path] = None) -> bool:
    """Whether ``ckpt_path`` (relative to ``cwd``, by default this process's) lies inside ``run_dir``: a
    checkpoint of that run, so training from it continues the run rather than starting another."""
    return (Path(cwd or ".") / ckpt_path).resolve().is_relative_to(Path(run_dir).resolve())


def read_checkpoint(path: str | Path, field: str) -> dict[str, Any]:
    """The checkpoint's non-tensor content (hyperparameters, loop state); tensors stay memory-mapped.
    A sharded (FSDP) checkpoint is a directory whose ``meta.pt`` holds that part."""
    import torch  # here, not above: the report reads this module's names without loading torch

    path = Path(path)
    file = path / SHARDED_METADATA if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            field, str(path), f"a checkpoint file, or a sharded checkpoint directory with {SHARDED_METADATA}"
        )
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # truncated, overwritten, not a torch file: torch's message says which
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            field,
            str(path),
            f"a complete checkpoint written by archlab-train; this one does not load ({type(err).__name__}: {reason})",
        ) from None
