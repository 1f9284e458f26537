"""The recurrent rules run in the dtype their mixer hands them (float32, or a float64 model's), never in
autocast's bf16: a state accumulates over the whole sequence, as flash-linear-attention's and mamba-ssm's
kernels keep theirs in float32 under bf16 training."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch
from torch import Tensor

Rule = TypeVar("Rule", bound=Callable)


def without_autocast(rule: Rule) -> Rule:
    """``rule`` with autocast off on the device of its first tensor argument."""

    @functools.wraps(rule)
    def run(*args, **kwargs):
        device = next(a for a in args if isinstance(a, Tensor)).device
        with torch.autocast(device.type, enabled=False):
            return rule(*args, **kwargs)

    return run  # type: ignore[return-value]
