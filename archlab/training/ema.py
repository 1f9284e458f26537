"""``EMA``: an exponential moving average of the weights during training (``callbacks.ema``), validated
beside the raw weights, kept in the checkpoint (a resumed run stays exact) and written at the end as the
run's ``model_ema.safetensors``, which archlab-eval, archlab-export and archlab-generate read."""

from __future__ import annotations

import json
import logging
import math
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.optim.swa_utils import get_ema_multi_avg_fn

from archlab import checks
from archlab.errors import ConfigError
from archlab.run_files import EMA_EXPORT
from archlab.training.module import LitModel, history_entry
from archlab.weights import TOKENIZER_KEY, save_weights

log = logging.getLogger("archlab.train")

DEVICES = ("accelerator", "cpu")  # where the average is kept: beside the model, or in host memory


def ema_name(metric: str) -> str:
    """The name the EMA weights' figure is logged under: ``val/loss`` -> ``val/ema_loss``."""
    name, _, kind = metric.rpartition("/")
    return f"{name}/ema_{kind}"


class EMA(Callback):
    """After each optimizer step, ``average ← decay · average + (1 − decay) · weights`` over every parameter
    (``torch.optim.swa_utils.get_ema_multi_avg_fn``, in float32), starting as the weights after step
    ``start_step`` (0: the initial ones). At each validation the average is validated too, on the same
    batches, and logged as ``<val name>/ema_loss|ema_ppl|ema_acc``; summary.json's ``ema`` holds them.
    ``decay`` null (the default) leaves it off. Not under FSDP (each process holds a shard only)."""

    def __init__(
        self, decay: Optional[float] = None, start_step: int = 0, device: str = "accelerator", dirpath: str = "."
    ):
        if decay is not None and not 0.0 < checks.finite(decay) < 1.0:
            raise ConfigError(
                "callbacks.ema.decay", decay, "null (no average) or a number strictly between 0 and 1 (e.g. 0.999)"
            )
        checks.integer("callbacks.ema.start_step", start_step, 0)
        checks.choice("callbacks.ema.device", device, DEVICES)
        self.decay, self.start_step, self.device, self.dirpath = decay, start_step, device, Path(dirpath)
        self.weights: Optional[dict[str, Tensor]] = None  # the average, by parameter name
        self.started_at: Optional[int] = None  # the step whose weights the average started as
        self.updated_at: Optional[int] = None  # the last step folded in
        self.history: list[dict[str, Any]] = []  # one entry per validation of the average
        self.path: Optional[Path] = None
        self._update = get_ema_multi_avg_fn(decay) if decay is not None else None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.decay is None:
            return
        if self.start_step >= trainer.max_steps:
            raise ConfigError(
                "callbacks.ema.start_step",
                self.start_step,
                f"a step below trainer.max_steps={trainer.max_steps} (the average starts after it)",
            )
        if any(hasattr(p, "to_local") for p in pl_module.parameters()):
            raise ConfigError(
                "callbacks.ema.decay", self.decay, "null under trainer=fsdp (each process holds a shard of the weights)"
            )

    def _where(self, pl_module: L.LightningModule) -> torch.device:
        return torch.device("cpu") if self.device == "cpu" else pl_module.device

    def _parameters(self, pl_module: L.LightningModule) -> dict[str, Tensor]:
        return dict(_lit(pl_module).decoder.named_parameters())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.weights is not None:  # restored from the checkpoint: onto the device it is kept on
            where = self._where(pl_module)
            self.weights = {k: v.to(where) for k, v in self.weights.items()}
        self._step(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self._step(trainer, pl_module)

    @torch.no_grad()
    def _step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the average at ``start_step``, or fold in the weights of an optimizer step not folded in yet
        (with gradient accumulation, batches that end without a step change nothing)."""
        step = trainer.global_step
        if self._update is None or step == self.updated_at or step < self.start_step:
            return
        where, params = self._where(pl_module), self._parameters(pl_module)
        if self.weights is None:  # also a run continued from a checkpoint without an average: it starts here
            dtype = {n: torch.promote_types(p.dtype, torch.float32) for n, p in params.items()}
            self.weights = {n: p.detach().to(where, dtype[n], copy=True) for n, p in params.items()}
            self.started_at = step
            log.info("callbacks.ema: the average starts as the weights after step %d (decay %g)", step, self.decay)
        else:
            names = list(self.weights)
            current = [params[n].detach().to(where, self.weights[n].dtype) for n in names]
            self._update([self.weights[n] for n in names], current, None)
        self.updated_at = step

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.weights is None or trainer.sanity_checking:
            return
        lit = _lit(pl_module)
        with swapped_in(self.weights, self._parameters(lit)):
            metrics = validate(trainer, lit)
        lit.log_dict({ema_name(k): v for k, v in metrics.items()}, sync_dist=True)  # reduced already: a no-op
        self.history.append(history_entry(trainer.global_step, metrics))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.weights is None:
            return
        if trainer.is_global_zero:
            model = _lit(pl_module).export_model()  # the raw weights and buffers, each parameter then its average
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(self.weights[name])
            tokenizer = getattr(trainer.datamodule, "tokenizer", None)  # pyright: ignore[reportAttributeAccessIssue]
            meta = {TOKENIZER_KEY: json.dumps(tokenizer.to_dict())} if tokenizer is not None else None
            self.path = save_weights(model, self.dirpath / EMA_EXPORT, metadata=meta)

    def state_dict(self) -> dict[str, Any]:
        weights = None if self.weights is None else {k: v.cpu() for k, v in self.weights.items()}
        return {
            "weights": weights,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "history": list(self.history),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.decay is None:  # a run continued with the average off: it keeps none
            return
        self.weights = state_dict.get("weights")
        self.started_at, self.updated_at = state_dict.get("started_at"), state_dict.get("updated_at")
        self.history = list(state_dict.get("history", []))

    def summary_fields(self) -> dict[str, Any]:
        if self.decay is None:
            return {}
        return {
            "ema": {
                "decay": self.decay,
                "start_step": self.start_step,
                "device": self.device,
                "started_at": self.started_at,
                "final": self.history[-1] if self.history else {},
                "history": list(self.history),
                "path": str(self.path) if self.path else None,
            }
        }


def _lit(pl_module: L.LightningModule) -> LitModel:
    if not isinstance(pl_module, LitModel):
        raise TypeError(f"EMA needs archlab's LitModel, not {type(pl_module).__name__}")
    return pl_module


@contextmanager
def swapped_in(weights: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Iterator[None]:
    """Within the block the parameters hold ``weights`` (cast to their dtypes); after it, exactly their own
    values again (from a copy kept where the average is)."""
    with torch.no_grad():
        saved = {name: p.detach().to(weights[name].device, copy=True) for name, p in params.items()}
        for name, p in params.items():
            p.copy_(weights[name])
    try:
        yield
    finally:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(saved[name])


def validate(trainer: L.Trainer, lit: LitModel) -> dict[str, Tensor]:
    """``LitModel``'s validation figures (``val_figures``) of the weights the module holds now, over the
    batches its validation just ran, by its own ``score_batch``."""
    found = trainer.val_dataloaders
    loaders = found if isinstance(found, (list, tuple)) else [] if found is None else [found]
    loss, acc = lit.val_metrics()
    loss = {n: m.to(lit.device) for n, m in loss.items()}
    acc = {n: m.to(lit.device) for n, m in acc.items()}
    for name, loader, limit in zip(lit.loader_names, loaders, trainer.num_val_batches):
        for inputs, targets in islice(loader, int(limit) if math.isfinite(limit) else None):
            with trainer.precision_plugin.val_step_context():  # the autocast validation_step runs under
                lit.score_batch(name, inputs.to(lit.device), targets.to(lit.device), loss, acc)
    return lit.val_figures(loss, acc)
