"""Where a run writes, and whether it may: a directory holding an earlier run's results is only ever
continued (``resume=auto``, or a ``ckpt_path`` of its own), never started over."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from archlab.errors import ConfigError, DirectoryHoldsRun
from archlab.run_files import EXPORT, HYDRA_FILES, SUMMARY, continues_run, read_summary

LAST = "last.ckpt"  # the run's newest checkpoint: what resume=auto continues from
# callbacks.checkpoint.keep: which checkpoints a run keeps beside last.ckpt
KEEP = {
    "best_and_last": "the save_top_k best by monitor, and last.ckpt",
    "last": "last.ckpt alone",
    "all": "every checkpoint written, and last.ckpt",
}


def output_dir(cfg: DictConfig) -> tuple[Path, str]:
    """``paths.output_dir`` (made absolute: every path the run prints or records is), or the Hydra run
    (or sweep job) directory when it is null; with the setting that chose it."""
    if cfg.paths.output_dir is not None:
        return Path(cfg.paths.output_dir).resolve(), "paths.output_dir"
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        raise ConfigError("paths.output_dir", None, "a directory (required when not run by archlab-train)")
    hydra = HydraConfig.get()
    return Path(hydra.runtime.output_dir), "hydra.sweep.dir" if hydra.mode == RunMode.MULTIRUN else "hydra.run.dir"


def check_keep(keep: Any, save_top_k: Any) -> None:
    """``callbacks.checkpoint.keep`` is one of ``KEEP``; ``save_top_k`` (how many best) is read by
    ``best_and_last`` alone, so the others take it at its default, 1."""
    if keep not in KEEP:
        raise ConfigError(
            "callbacks.checkpoint.keep", keep, " | ".join(f"{name} ({what})" for name, what in KEEP.items())
        )
    if keep != "best_and_last" and save_top_k != 1:
        raise ConfigError(
            "callbacks.checkpoint.save_top_k",
            save_top_k,
            f"1 (its default) with callbacks.checkpoint.keep={keep}, which keeps {KEEP[keep]}; "
            "to keep the N best, keep=best_and_last save_top_k=N",
        )


def newest_checkpoint(directory: Path) -> Optional[Path]:
    """The most recently written checkpoint (file, or sharded directory) under ``directory``; ``last.ckpt``
    where it links to the newest one. A link a kill left pointing at a deleted checkpoint is passed over."""
    found = [p for p in directory.glob("**/*.ckpt") if p.exists()] if directory.exists() else []
    return max(found, key=lambda p: (p.stat().st_mtime_ns, p.name == LAST)) if found else None


def has_results(summary_path: Path) -> bool:
    """Whether the summary records results: a completed run or one validation (an unreadable one counts
    too). A run that failed before validating, e.g. on a mistyped setting, has none."""
    summary = read_summary(summary_path)
    if summary is None:
        return False
    metrics = summary.get("metrics")
    return summary.get("status") != "failed" or bool(isinstance(metrics, dict) and metrics.get("history"))


def completed_summary(out: Path) -> Optional[dict[str, Any]]:
    """The summary of a run in ``out`` that completed (its export written), else None."""
    summary = read_summary(out / SUMMARY)
    return summary if summary and summary.get("status") == "completed" and (out / EXPORT).exists() else None


def held_results(out: Path) -> list[str]:
    """What of an earlier run's results ``out`` holds: a summary with results, the export, checkpoints."""
    held = [SUMMARY] if has_results(out / SUMMARY) else []
    held += [EXPORT] if (out / EXPORT).exists() else []
    return held + (["checkpoints"] if newest_checkpoint(out / "checkpoints") else [])


def check_fresh(cfg: DictConfig, out: Path, field: str) -> None:
    """Refuse to start over in a directory that holds an earlier run's results (its summary, export or
    checkpoints would be overwritten) unless this run continues it: ``resume=auto``, or a ``ckpt_path``
    inside it."""
    if cfg.resume == "auto" or (cfg.ckpt_path is not None and continues_run(cfg.ckpt_path, out)):
        return
    held = held_results(out)
    if held:
        raise DirectoryHoldsRun(
            field,
            str(out),
            f"a directory without an earlier run; this one holds "
            f"{', '.join(held)}. Continue that run with resume=auto, or give "
            "a new directory (delete this one to start over)",
        )


def _global_rank() -> int:
    """This process's rank as the launchers set it (torchrun, SLURM tasks, LSF), 0 when none does; the
    same variables, in the same order, as Lightning reads."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def settle_hydra_files(keep: bool, out: Optional[Path] = None) -> None:
    """Hydra writes a job's config files before the job runs, into ``hydra.output_subdir`` (a pending
    name here). ``keep``: this attempt writes the run's summary (in ``out``), so they become the job's
    ``.hydra``; otherwise (a refused re-run, an already completed run, or a ``paths.output_dir`` elsewhere
    while the Hydra job directory holds another run) they are removed and the ``.hydra`` of the run in the
    directory stays as it was. Nothing where Hydra wrote none (``ddp``'s extra processes)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or _global_rank() != 0:  # one process of a multi-task job moves them
        return
    hydra = HydraConfig.get()
    job_dir, pending = Path(hydra.runtime.output_dir), hydra.output_subdir
    if not pending or pending == HYDRA_FILES or not (job_dir / pending).is_dir():
        return
    if keep and out is not None and out.resolve() != job_dir.resolve() and held_results(job_dir):
        keep = False
    if keep:
        if (job_dir / HYDRA_FILES).exists():
            shutil.rmtree(job_dir / HYDRA_FILES)
        (job_dir / pending).rename(job_dir / HYDRA_FILES)
    else:
        shutil.rmtree(job_dir / pending)
