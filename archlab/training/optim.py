"""AdamW over two parameter groups (decay on 2-D weights only) and the warm-up + cosine schedule."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

log = logging.getLogger("archlab.train")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Matrices and embedding tables decay; biases and norm scales (1-D) do not (GPT-2/nanoGPT).
    A tied head is the token table itself and is listed once."""
    params = {id(p): (n, p) for n, p in model.named_parameters() if p.requires_grad}.values()
    decay = [p for _, p in params if p.dim() >= 2]
    no_decay = [p for _, p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module, optim: dict[str, Any], device: torch.device, mixed_precision: bool = False
) -> torch.optim.Optimizer:
    """Instantiate ``optim`` (a ``_partial_`` AdamW node) over ``param_groups``; fused kernels on CUDA
    and CPU (one pass over each tensor per step instead of a dozen foreach passes), except under
    ``mixed_precision``: Lightning's autocast plugin refuses to clip the gradients of a fused optimizer."""
    make = instantiate(optim)
    extra = {"fused": True} if device.type in ("cuda", "cpu") and not mixed_precision else {}
    return make(param_groups(model, optim["weight_decay"]), **extra)


def lr_factor(step: int, warmup_steps: int, decay_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr before optimizer step ``step`` (0-based), nanoGPT's ``get_lr``:
    ``(step + 1) / (warmup + 1)`` during warm-up, then cosine from 1 to ``min_lr_ratio`` at
    ``decay_steps``, then the floor."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if step >= decay_steps:
        return min_lr_ratio
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr_ratio + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - min_lr_ratio)


def build_scheduler(optimizer: torch.optim.Optimizer, scheduler: dict[str, Any], max_steps: int):
    """A ``LambdaLR`` over ``lr_factor``, to be stepped once per optimizer step."""
    decay = scheduler["decay_steps"] if scheduler["decay_steps"] is not None else max_steps
    warmup, floor = scheduler["warmup_steps"], scheduler["min_lr_ratio"]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, warmup, decay, floor))


def command_line_sets(cfg: DictConfig, key: str) -> bool:
    """Whether this run's command line sets ``key`` (Hydra's task overrides: those of the ``hydra`` node
    of a config composed with ``return_hydra_config=True``, else the running Hydra job's). True where
    neither is known: a value of unknown origin is taken as chosen."""
    from hydra.core.hydra_config import HydraConfig

    task = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
    if task is None and HydraConfig.initialized():
        task = HydraConfig.get().overrides.task
    if task is None:
        return True
    return any(str(o).split("=", 1)[0].lstrip("+~") == key for o in task)


def fit_warmup(cfg: DictConfig) -> None:
    """Where ``scheduler.warmup_steps`` would not end before the cosine decay does and the command line
    did not set it (a default or an experiment's value, made for longer runs), shorten it in ``cfg`` to a
    tenth of the decay steps (rounded down) and log the change; a value set on the command line is kept,
    for validation to reject."""
    s = cfg.scheduler
    decay = s.decay_steps if s.decay_steps is not None else cfg.trainer.max_steps
    if not 0 < decay <= s.warmup_steps or command_line_sets(cfg, "scheduler.warmup_steps"):
        return
    fitted = decay // 10
    field = "scheduler.decay_steps" if s.decay_steps is not None else "trainer.max_steps"
    log.info(
        "scheduler.warmup_steps: %d -> %d (a tenth of %s=%d: the warm-up must end before the cosine decay does; "
        "set scheduler.warmup_steps to choose it)",
        s.warmup_steps,
        fitted,
        field,
        decay,
    )
    s.warmup_steps = fitted
