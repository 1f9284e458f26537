"""Learning-rate schedules (``scheduler.kind``): the multiplier of the peak lr before each optimizer step.

Every schedule starts with nanoGPT's linear warm-up, ``(step + 1) / (warmup + 1)`` over ``warmup_steps``,
then: ``cosine`` to ``min_lr_ratio`` at ``decay_steps``; ``linear`` to it; ``constant`` stays at the peak;
``wsd`` (warm-up, stable, decay) holds the peak and decays over the last ``decay_fraction`` of the steps
with the 1-sqrt shape of Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed
Training Durations" (Sec. 3: 1-sqrt beats a linear cooldown; 20% of the steps matches cosine), the
schedule MiniCPM (Hu et al. 2024) introduced as WSD. After ``decay_steps`` each decaying schedule stays at
its floor.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from archlab.errors import ConfigError

SCHEDULES = ("cosine", "linear", "constant", "wsd")


def warmup_factor(step: int, warmup_steps: int) -> float:
    """nanoGPT's warm-up: ``(step + 1) / (warmup_steps + 1)``, the peak reached one step after it ends."""
    return (step + 1) / (warmup_steps + 1)


def warmup_decay_factor(
    step: int, warmup_steps: int, decay_steps: int, min_lr_ratio: float, shape: Callable[[float], float]
) -> float:
    """Warm-up, then ``min_lr_ratio + shape(progress) * (1 - min_lr_ratio)``, ``progress`` going from 0
    at the end of the warm-up to 1 at ``decay_steps`` (``shape`` from 1 to 0), then the floor."""
    if step < warmup_steps:
        return warmup_factor(step, warmup_steps)
    if step >= decay_steps:
        return min_lr_ratio
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr_ratio + shape(progress) * (1.0 - min_lr_ratio)


def lr_factor(step: int, warmup_steps: int, decay_steps: int, min_lr_ratio: float) -> float:
    """``cosine``: warm-up, then cosine from 1 to ``min_lr_ratio`` at ``decay_steps``, then the floor
    (nanoGPT's ``get_lr``)."""
    return warmup_decay_factor(
        step, warmup_steps, decay_steps, min_lr_ratio, lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress))
    )


def linear_factor(step: int, warmup_steps: int, decay_steps: int, min_lr_ratio: float) -> float:
    """``linear``: warm-up, then a straight line from 1 to ``min_lr_ratio`` at ``decay_steps``, then the floor."""
    return warmup_decay_factor(step, warmup_steps, decay_steps, min_lr_ratio, lambda progress: 1.0 - progress)


def constant_factor(step: int, warmup_steps: int) -> float:
    """``constant``: warm-up, then the peak for good."""
    return warmup_factor(step, warmup_steps) if step < warmup_steps else 1.0


def cooldown_steps(decay_steps: int, decay_fraction: float) -> int:
    """Steps of the wsd decay: ``decay_fraction * decay_steps`` rounded half up, at least one."""
    return max(1, int(decay_fraction * decay_steps + 0.5))


def decay_start(decay_steps: int, decay_fraction: float) -> int:
    """The first step of the wsd decay: the peak holds before it (a cooldown branch starts here)."""
    return decay_steps - cooldown_steps(decay_steps, decay_fraction)


def wsd_factor(step: int, warmup_steps: int, decay_steps: int, min_lr_ratio: float, decay_fraction: float) -> float:
    """``wsd``: warm-up, the peak until the last ``cooldown_steps`` before ``decay_steps``, then
    ``1 - sqrt(progress)`` from 1 down to ``min_lr_ratio`` at ``decay_steps``, then the floor."""
    if step < warmup_steps:
        return warmup_factor(step, warmup_steps)
    start = decay_start(decay_steps, decay_fraction)
    if step < start:
        return 1.0
    if step >= decay_steps:
        return min_lr_ratio
    return min_lr_ratio + (1.0 - math.sqrt((step - start) / (decay_steps - start))) * (1.0 - min_lr_ratio)


def schedule(scheduler: dict[str, Any], max_steps: int) -> Callable[[int], float]:
    """The multiplier as a function of the optimizer step, for a ``scheduler`` node (no ``kind``: cosine,
    as checkpoints of earlier versions record it; ``decay_steps`` null: ``max_steps``)."""
    kind = scheduler.get("kind", "cosine")
    warmup: int = scheduler["warmup_steps"]
    if kind == "constant":
        return lambda step: constant_factor(step, warmup)
    if kind not in SCHEDULES:
        raise ConfigError("scheduler.kind", kind, f"one of {list(SCHEDULES)}")
    decay_steps: Optional[int] = scheduler.get("decay_steps")
    decay = decay_steps if decay_steps is not None else max_steps
    floor: Optional[float] = scheduler.get("min_lr_ratio")
    if floor is None:  # validate_train requires it of a decaying schedule
        raise ConfigError("scheduler.min_lr_ratio", floor, f"a number in [0, 1] for scheduler.kind={kind}")
    if kind == "cosine":
        return lambda step: lr_factor(step, warmup, decay, floor)
    if kind == "linear":
        return lambda step: linear_factor(step, warmup, decay, floor)
    if kind == "wsd":
        fraction = scheduler["decay_fraction"]
        return lambda step: wsd_factor(step, warmup, decay, floor, fraction)
    raise ConfigError("scheduler.kind", kind, f"one of {list(SCHEDULES)}")


def build_scheduler(optimizer: torch.optim.Optimizer, scheduler: dict[str, Any], max_steps: int):
    """A ``LambdaLR`` over ``schedule``, to be stepped once per optimizer step (each parameter group's own
    lr is scaled: Muon's and AdamW's under ``optim=muon``)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(scheduler, max_steps))


def warmup_limit(scheduler: Any, max_steps: int) -> tuple[int, Optional[str]]:
    """The most warm-up steps the schedule allows and, for wsd, why (the decay it must end before); the
    others must end their warm-up before ``decay_steps`` (null: ``max_steps``)."""
    decay = scheduler.decay_steps if scheduler.decay_steps is not None else max_steps
    if scheduler.kind == "wsd" and scheduler.decay_fraction is not None and 0.0 < scheduler.decay_fraction < 1.0:
        start = decay_start(decay, scheduler.decay_fraction)
        return start, f"the decay over the last {decay - start} of {decay} steps (scheduler.decay_fraction)"
    return decay - 1, None
