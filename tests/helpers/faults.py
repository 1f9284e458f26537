"""Callbacks that the reliability tests plug into a run (``+callbacks.<name>={_target_: ...}``): slow it
down so it can be killed mid-run, make one step's loss or gradient non-finite, record the weights."""

from __future__ import annotations

import time
from typing import Optional

import lightning as L
import torch


class Pace(L.Callback):
    """Sleep after every training step: a run of a tiny model then lasts long enough to be killed mid-way.
    (Sleeping changes no number the run computes.)"""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)


class Poison(L.Callback):
    """Make training step ``loss_step`` (1-based) compute a NaN loss (its logits are multiplied by NaN), and
    step ``grad_step`` a NaN gradient for a finite loss (a hook on the token embedding's gradient)."""

    def __init__(self, loss_step: Optional[int] = None, grad_step: Optional[int] = None):
        self.loss_step, self.grad_step = loss_step, grad_step
        self._handles: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step + 1
        if step == self.loss_step:
            self._handles.append(pl_module.model.register_forward_hook(lambda m, args, out: out * float("nan")))
        if step == self.grad_step:
            weight = pl_module.model.tok_emb.weight
            self._handles.append(weight.register_hook(lambda g: g * float("nan")))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class Snapshots(L.Callback):
    """The model's weights after every training step (``after[step]``), and when an exception ends fit.
    Made by Hydra from the config: the test finds the instance in ``Snapshots.made``."""

    made: list[Snapshots] = []

    def __init__(self):
        Snapshots.made.append(self)
        self.after: dict[int, dict[str, torch.Tensor]] = {}
        self.at_exception: Optional[dict[str, torch.Tensor]] = None

    @staticmethod
    def _state(pl_module) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_fit_start(self, trainer, pl_module) -> None:
        self.checkpoint_io = trainer.strategy.checkpoint_io  # what the run writes its checkpoints with

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.after[trainer.global_step] = self._state(pl_module)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.at_exception = self._state(pl_module)
