"""Cooldown branches (``branch_from``): a wsd run that starts from a stable-phase run's checkpoint at the step
its own decay begins, so one stable run gives a cooled-down model at several budgets (Hägele et al. 2024:
a cooldown branched from the constant phase matches a run trained to that length)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from archlab.config.fields import plain_dict
from archlab.errors import ConfigError
from archlab.run_files import SUMMARY, read_checkpoint, read_summary
from archlab.training.checkpoints import config_differences
from archlab.training.outputs import newest_checkpoint
from archlab.training.schedules import decay_start, schedule

log = logging.getLogger("archlab.train")

FIELD = "branch_from"


def branch_point(cfg: DictConfig) -> int:
    """The step this run's wsd decay begins: where it leaves the stable run (``scheduler.decay_steps``,
    null: ``trainer.max_steps``)."""
    s = cfg.scheduler
    return decay_start(s.decay_steps if s.decay_steps is not None else cfg.trainer.max_steps, s.decay_fraction)


def branch_record(cfg: DictConfig) -> Optional[dict[str, Any]]:
    """What summary.json records of a branch: the stable run, the step it left it and its decay's length."""
    if cfg.get(FIELD) is None:
        return None
    start = branch_point(cfg)
    return {"from": str(Path(cfg[FIELD]).resolve()), "step": start, "decay_steps": cfg.trainer.max_steps - start}


def branch_checkpoint(cfg: DictConfig, out: Path) -> Optional[str]:
    """The checkpoint a run with ``branch_from`` starts from: with ``resume=auto``, this run's own newest
    (a branch continued after a kill), else the stable run's at ``branch_point``, once sure the stable run
    trained with this run's optimizer and, before that step, this run's learning rates."""
    if cfg.ckpt_path is not None:
        raise ConfigError(FIELD, cfg[FIELD], "null when ckpt_path is given (they both pick the checkpoint)")
    if cfg.scheduler.kind != "wsd":
        raise ConfigError(
            "scheduler.kind", cfg.scheduler.kind, f"wsd with {FIELD} (a branch is the cooldown of a stable phase)"
        )
    if cfg.resume == "auto" and (own := newest_checkpoint(out / "checkpoints")) is not None:
        log.info("resume=auto: continuing this branch from %s", own)
        return str(own)
    stable, start = Path(cfg[FIELD]), branch_point(cfg)
    found = _checkpoints(stable)
    if start not in found:
        have = ", ".join(str(s) for s in sorted(found)) or "none"
        raise ConfigError(
            FIELD,
            str(stable),
            f"a run directory with a checkpoint at step {start}, where this run's decay begins "
            f"(trainer.max_steps={cfg.trainer.max_steps}, scheduler.decay_fraction={cfg.scheduler.decay_fraction}); "
            f"its checkpoints are at steps: {have} (callbacks.checkpoint.every_n_train_steps and keep=all make more)",
        )
    path, checkpoint = found[start]
    _check_same_stable_phase(cfg, stable, checkpoint.get("hyper_parameters") or {}, start)
    log.info("%s: branching at step %d from %s", FIELD, start, path)
    return str(path.resolve())


def _checkpoints(stable: Path) -> dict[int, tuple[Path, dict[str, Any]]]:
    """Each checkpoint file of the run directory ``stable`` by its step (links, ``last.ckpt``, left out)."""
    folder = stable / "checkpoints"
    if not folder.is_dir():
        raise ConfigError(FIELD, str(stable), f"a run directory of archlab-train with checkpoints ({folder} is absent)")
    found = {}
    for path in sorted(p for p in folder.glob("*.ckpt") if not p.is_symlink()):
        checkpoint = read_checkpoint(path, FIELD)
        if isinstance(checkpoint.get("global_step"), int):
            found[checkpoint["global_step"]] = (path, checkpoint)
    return found


def _check_same_stable_phase(cfg: DictConfig, stable: Path, saved: dict[str, Any], start: int) -> None:
    """Refuse a stable run whose optimizer, parametrisation, data or seed (the last two from its summary.json,
    where it has one) differs from this run's, or whose learning-rate multiplier differs from this run's at
    any step before ``start``: the branch would not be the run it stands for. Its ``trainer.max_steps``, read
    from its summary.json too, where its schedule depends on it."""
    diffs = [
        d
        for name in ("optim", "param")
        for d in config_differences(saved.get(name) or {}, plain_dict(cfg[name], resolve=True), prefix=name)
    ]
    recorded = (read_summary(stable / SUMMARY) or {}).get("config") or {}
    if recorded:  # a stable run still training has no summary yet: its data and seed go unchecked
        diffs += config_differences(recorded.get("data") or {}, plain_dict(cfg.data, resolve=True), prefix="data")
        diffs += config_differences({"seed": recorded.get("seed")}, {"seed": cfg.seed}, prefix="config")
    if diffs:
        raise ConfigError(
            FIELD,
            str(stable),
            "a stable run with this run's optimizer, data and seed; it differs in " + "; ".join(diffs),
        )
    theirs_cfg = saved.get("scheduler") or {}
    theirs_steps = 0  # a constant schedule does not read it
    if theirs_cfg.get("kind", "cosine") != "constant" and theirs_cfg.get("decay_steps") is None:
        theirs_steps = (recorded.get("trainer") or {}).get("max_steps")
        if not isinstance(theirs_steps, int):
            raise ConfigError(
                FIELD,
                str(stable),
                f"a stable run whose {SUMMARY} records trainer.max_steps (its schedule depends on it)",
            )
    theirs = schedule(theirs_cfg, theirs_steps)
    ours = schedule(plain_dict(cfg.scheduler, resolve=True), cfg.trainer.max_steps)
    step = next((s for s in range(start) if abs(theirs(s) - ours(s)) > 1e-12), None)
    if step is not None:
        raise ConfigError(
            FIELD,
            str(stable),
            f"a stable run with this run's learning rates before step {start}; at step {step} its multiplier is "
            f"{theirs(step):.6g}, this run's {ours(step):.6g} (scheduler {theirs_cfg})",
        )
