"""AdamW over two parameter groups (decay on 2-D weights only) and the warm-up + cosine schedule."""

from __future__ import annotations

import math
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn


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
