"""Router balance in training: after each optimizer step every MoE layer's per-expert load (the step's
(token, expert) assignments, summed over the processes) moves its correction bias by DeepSeek-V3's
auxiliary-loss-free rule (``balance_routers``, which ``LitModel.optimizer_step`` calls), and ``RouterLoad``
logs each layer's load and records its imbalance in summary.json."""

from __future__ import annotations

from typing import Any, Callable, Optional

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from archlab.errors import ConfigError
from archlab.nn.model import Decoder
from archlab.nn.moe import MoE


def moe_layers(model: Decoder) -> dict[int, MoE]:
    """layer index -> its MoE, for the layers of ``model`` whose MLP is one (a multi-token prediction
    module's block numbered after the model's layers)."""
    mlps = (getattr(block, "mlp", None) for block in model.all_blocks())
    return {i: mlp for i, mlp in enumerate(mlps) if isinstance(mlp, MoE)}


def balance_routers(model: Decoder, reduce: Callable[[Tensor], Tensor]) -> dict[int, Tensor]:
    """End an optimizer step: each MoE layer's load [E] moves its correction bias
    (``MoE.update_correction_bias``; the loads summed over the processes by ``reduce``, so every process
    updates the same bias, where some layer's γ is not 0) and its count starts again; this process's loads
    by layer, on the device (none without MoE layers): ``RouterLoad`` sums them over its window, then over
    the processes, so a step with γ = 0 costs no collective and no copy to the host."""
    layers = moe_layers(model)
    if not layers:
        return {}
    local = torch.cat([moe.load for moe in layers.values()])
    balanced = any(moe.bias_update_speed > 0 for moe in layers.values())
    loads = reduce(local.clone()) if balanced else local  # one collective for every layer
    splits = [moe.n_experts for moe in layers.values()]
    for moe, load in zip(layers.values(), loads.split(splits)):
        moe.update_correction_bias(load)
    return dict(zip(layers, local.split(splits)))


def imbalance(load: Tensor) -> dict[str, float]:
    """The load's max/mean (1: balanced; E/k: every token on the same k experts) and coefficient of
    variation (population standard deviation / mean; 0: balanced)."""
    load = load.double()
    mean = load.mean()
    if mean == 0:
        return {"max_over_mean": float("nan"), "cv": float("nan")}
    return {"max_over_mean": float(load.max() / mean), "cv": float(load.std(correction=0) / mean)}


class RouterLoad(Callback):
    """Every ``log_every_n_steps`` optimizer steps, log each MoE layer's load over those steps: the share of
    each expert (``router/layer<i>/expert<e>``, summing to 1 per layer), max/mean and the coefficient of
    variation (``router/layer<i>/max_over_mean``, ``.../cv``). summary.json's ``router_load`` holds the
    last window's: its steps and (token, expert) assignments per layer (every process's), each layer's
    shares and both figures, and over the layers the largest max/mean and the mean cv, which archlab-report
    shows. Nothing for a model without MoE layers."""

    def __init__(self, log_every_n_steps: int = 50):
        if not isinstance(log_every_n_steps, int) or isinstance(log_every_n_steps, bool) or log_every_n_steps < 1:
            raise ConfigError("callbacks.router_load.log_every_n_steps", log_every_n_steps, "a positive integer")
        self.log_every_n_steps = log_every_n_steps
        self.window: dict[int, Tensor] = {}  # layer -> load summed over the steps since the last log
        self.steps = 0
        self.last: Optional[dict[str, Any]] = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        taken: dict[int, Tensor] = getattr(pl_module, "router_load", {})
        loads = dict(taken)
        taken.clear()  # read once: a batch that ends no optimizer step (gradient accumulation) adds nothing
        if not loads:  # no MoE layer, or no optimizer step ended with this batch
            return
        for layer, load in loads.items():
            self.window[layer] = self.window.get(layer, torch.zeros_like(load)) + load
        self.steps += 1
        if trainer.global_step % self.log_every_n_steps == 0:
            self._close_window(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.steps:  # the steps after the last full window
            self._close_window(trainer, None)

    def _close_window(self, trainer: L.Trainer, pl_module: Optional[L.LightningModule]) -> None:
        order = sorted(self.window)
        summed = trainer.strategy.reduce(torch.cat([self.window[i] for i in order]), reduce_op="sum")
        self.window = dict(zip(order, summed.cpu().split([len(self.window[i]) for i in order])))
        layers = {}
        for layer, load in sorted(self.window.items()):
            share = load.double() / load.sum().clamp(min=1)
            layers[str(layer)] = {"load": share.tolist(), **imbalance(load)}
        self.last = {
            "steps": self.steps,
            "assignments": int(sum(load.sum() for load in self.window.values()) / len(self.window)),  # per layer
            "max_over_mean": max(v["max_over_mean"] for v in layers.values()),
            "cv": sum(v["cv"] for v in layers.values()) / len(layers),
            "layers": layers,
        }
        if pl_module is not None:
            logged = {}
            for layer, figures in layers.items():
                logged |= {f"router/layer{layer}/expert{e}": s for e, s in enumerate(figures["load"])}
                logged |= {f"router/layer{layer}/{k}": figures[k] for k in ("max_over_mean", "cv")}
            pl_module.log_dict(logged)
        self.window, self.steps = {}, 0

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.last}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last = state_dict.get("last")

    def summary_fields(self) -> dict[str, Any]:
        return {"router_load": self.last} if self.last is not None else {}
