"""``LitModel``: next-token training of one archlab build (loss, optimizer, schedule, validation metrics)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, cast

import lightning as L
import torch
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy

from archlab.build import build_model
from archlab.config import to_model_config
from archlab.nn.loss import IGNORE, next_token_loss
from archlab.nn.model import Decoder, document_inputs
from archlab.nn.ngpt import renormalise
from archlab.nn.validation import validate
from archlab.training.optim import build_optimizer, build_scheduler
from archlab.training.parametrization import initialise
from archlab.training.routing import balance_routers


def history_entry(step: int, metrics: dict[str, Tensor]) -> dict[str, Any]:
    """One validation's figures as a run's history keeps them (summary.json): floats, a non-finite one as
    None (JSON has no NaN), beside the step."""
    figures = {k: float(v) for k, v in metrics.items()}
    return {"step": step, **{k: v if math.isfinite(v) else None for k, v in figures.items()}}


def rng_state(device: torch.device) -> dict[str, Tensor]:
    """The global torch RNG state (CPU, and the device's on CUDA) as uint8 tensors."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


class LitModel(L.LightningModule):
    """A LightningModule around ``archlab.build_model(model)``.

    Every argument is a plain container (saved as hparams), so a checkpoint loads with
    ``torch.load(weights_only=True)``. The model itself is built in ``configure_model``, where
    ``trainer=fsdp`` shards it with FSDP2 (``fully_shard`` per block, then the root). ``documents`` (the
    datamodule's: ``eos_id``, ``reset_positions``) keeps attention within the documents of packed rows."""

    def __init__(
        self,
        model: dict[str, Any],
        optim: dict[str, Any],
        scheduler: dict[str, Any],
        val_names: Sequence[str] = ("val",),
        compile: bool = False,
        activation_checkpointing: bool = False,
        documents: Optional[dict[str, Any]] = None,
        param: Optional[dict[str, Any]] = None,
        val_pools: Optional[dict[str, list[str]]] = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model_cfg = validate(to_model_config(model))
        self.model: Optional[Decoder] = None
        self.param = param or {"kind": "sp"}  # checkpoints of earlier versions have none: sp
        self.val_names = list(val_names)
        # a set that pools the batches of others (a data mixture's val: every source's) has no loader of its own
        self.val_pools = dict(val_pools or {})
        self.loader_names = [n for n in self.val_names if n not in self.val_pools]
        loss, acc = self.val_metrics()
        self.val_loss, self.val_acc = nn.ModuleDict(loss), nn.ModuleDict(acc)
        self.history: list[dict[str, float]] = []  # one entry per validation: step and metrics
        self._rng_to_restore: Optional[dict[str, Tensor]] = None
        self._rng_before_validation: Optional[dict[str, Tensor]] = None
        self.router_load: dict[int, Tensor] = {}  # the last optimizer step's load per MoE layer (RouterLoad reads it)

    @property
    def decoder(self) -> Decoder:
        """The model ``configure_model`` built (the Trainer calls it before any step)."""
        if self.model is None:
            raise RuntimeError("LitModel.model is built by configure_model: call it (the Trainer does) first")
        return self.model

    def val_metrics(self) -> tuple[dict[str, MeanMetric], dict[str, MulticlassAccuracy]]:
        """Fresh metrics of every validation set: the token-weighted mean loss and the accuracy."""
        V = self.model_cfg.vocab_size
        # a NaN batch loss makes the mean NaN (torchmetrics' default drops it and averages the rest)
        loss = {n: MeanMetric(nan_strategy=math.nan) for n in self.val_names}
        acc = {n: MulticlassAccuracy(num_classes=V, average="micro", ignore_index=IGNORE) for n in self.val_names}
        return loss, acc

    def score_batch(
        self,
        name: str,
        inputs: Tensor,
        targets: Tensor,
        loss: Mapping[str, Metric],
        acc: Mapping[str, Metric],
    ) -> None:
        """One batch of validation set ``name`` into the metrics ``loss`` and ``acc`` (by set name) of that
        set and of each set that pools it (a data mixture's ``val``)."""
        logits = self(inputs)
        scored = (targets != IGNORE).sum()
        # a batch of padding rows only (see RankPadded) has no loss: weight 0, and 0 rather than NaN
        batch_loss = torch.where(scored > 0, next_token_loss(logits, targets), 0.0)
        for into in (name, *(pool for pool, names in self.val_pools.items() if name in names)):
            loss[into].update(batch_loss, weight=scored)
            acc[into].update(logits.argmax(dim=-1), targets)

    def val_figures(self, loss: Mapping[str, Metric], acc: Mapping[str, Metric]) -> dict[str, Tensor]:
        """Per set, the mean loss, its exponential (perplexity) and the accuracy on the scored positions,
        reduced over all processes by torchmetrics."""
        out: dict[str, Tensor] = {}
        for name in self.val_names:
            mean = loss[name].compute()
            out.update({f"{name}/loss": mean, f"{name}/ppl": torch.exp(mean), f"{name}/acc": acc[name].compute()})
        return out

    def _own_metrics(self) -> tuple[Mapping[str, Metric], Mapping[str, Metric]]:
        """The module's own validation metrics (registered, so they move with it and reduce over processes)."""
        return cast(Mapping[str, Metric], self.val_loss), cast(Mapping[str, Metric], self.val_acc)

    def _reset_metrics(self) -> None:
        for metrics in self._own_metrics():
            for metric in metrics.values():
                metric.reset()

    def setup(self, stage: str) -> None:
        # Spawned processes (ddp_spawn) receive the module's tensors in one shared memory; Lightning gives
        # parameters and buffers private copies but not metric states, so ranks adding into them at once
        # lost updates (a wrong first val/loss). A reset gives each process its own.
        self._reset_metrics()

    def configure_model(self) -> None:
        """Build (once), with the GPT-2 init drawn from the seeded RNG, so every rank starts identical;
        under ``ModelParallelStrategy`` shard each block and then the root across the data-parallel mesh."""
        if self.model is not None:
            return
        model = build_model(self.model_cfg)
        initialise(model, self.param)
        model.activation_checkpointing = self.hparams["activation_checkpointing"]
        if self.hparams["compile"]:
            model.compile_blocks()
        if self.device_mesh is not None:
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        self.model = model

    def forward(self, idx: Tensor, targets: Optional[Tensor] = None) -> Tensor:
        """Logits for packed rows ``idx``, within documents where the data asks (``documents``); with
        ``targets``, any multi-token prediction modules compute their loss too (``Decoder.forward``)."""
        documents = self.hparams["documents"]
        if documents is None:
            return self.decoder(idx, targets=targets)
        inputs = document_inputs(idx, documents["eos_id"], documents["reset_positions"])
        return self.decoder(idx, targets=targets, **inputs)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        inputs, targets = batch
        loss = next_token_loss(self(inputs, targets), targets)
        self.log("train/loss", loss, prog_bar=True)
        # auxiliary losses (a mixture of experts' load balance, router z-loss, multi-token prediction), logged unweighted
        for name, (weight, aux) in self.decoder.auxiliary_losses().items():
            self.log(f"train/{name}", aux)
            loss = loss + weight * aux
        optimizer = self.optimizers()
        assert not isinstance(optimizer, list)  # configure_optimizers returns one
        self.log("train/lr", optimizer.param_groups[0]["lr"])
        return loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # every MoE layer's correction bias moves by the step's load, summed over the processes
        # (model.mlp.routing.bias_update_speed; 0: unchanged)
        self.router_load = balance_routers(self.decoder, lambda t: self.trainer.strategy.reduce(t, reduce_op="sum"))
        renormalise(self.decoder, self.model_cfg)  # nGPT's matrices back on the sphere (model.block.unit_weights)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Validate (and so checkpoint) after the last step too, not only every val_check_interval
        # batches: the final metrics and last.ckpt then describe the final weights.
        if self.global_step >= self.trainer.max_steps:
            self.trainer.should_stop = True
        # A validation may follow; it draws from the global RNG (each DataLoader iterator takes a seed), so
        # training's random stream is put back after it: how often a run validates changes no weight.
        self._rng_before_validation = rng_state(self.device)

    def on_validation_end(self) -> None:
        if self._rng_before_validation is not None:
            set_rng_state(self._rng_before_validation, self.device)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        inputs, targets = batch
        self.score_batch(self.loader_names[dataloader_idx], inputs, targets, *self._own_metrics())

    def on_validation_epoch_end(self) -> None:
        """``val_figures`` logged and kept in ``history``; the metrics start again."""
        metrics = self.val_figures(*self._own_metrics())
        self._reset_metrics()
        self.log_dict(metrics, sync_dist=True)  # already reduced by torchmetrics: a no-op mean, no warning
        if not self.trainer.sanity_checking:
            self.history.append(history_entry(self.global_step, metrics))

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        mixed = str(self.trainer.precision).endswith("-mixed")
        optimizer = build_optimizer(
            self.decoder, self.hparams["optim"], self.device, mixed_precision=mixed, param=self.param
        )
        scheduler = build_scheduler(optimizer, self.hparams["scheduler"], self.trainer.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # plain lists and uint8 tensors: the checkpoint still loads with weights_only=True
        checkpoint["archlab_history"] = list(self.history)
        # the state training continues from (at a validation's end: the one from before it)
        checkpoint["archlab_rng"] = self._rng_before_validation or rng_state(self.device)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.history = list(checkpoint.get("archlab_history", []))
        self._rng_to_restore = checkpoint.get("archlab_rng")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Restore the RNG of the checkpoint just before the first step after resuming (building the
        # model and loaders drew from it since): dropout then continues with the same masks.
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore, self.device)
            self._rng_to_restore = None
        self._rng_before_validation = None

    def full_state_dict(self) -> dict[str, Tensor]:
        """The model's unsharded weights on the CPU. Under FSDP this gathers shards: call it on every rank."""
        from torch.distributed.tensor import DTensor

        model = self.decoder
        if any(isinstance(p, DTensor) for p in model.parameters()):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            # a full state dict of a module's parameters and buffers holds plain tensors only
            return cast(dict[str, Tensor], get_model_state_dict(model, options=options))
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}

    def export_model(self, state: Optional[dict[str, Tensor]] = None) -> Decoder:
        """A plain CPU ``Decoder`` holding ``state`` (default: ``full_state_dict()``), for
        ``archlab.weights.save_weights``."""
        state = self.full_state_dict() if state is None else state
        model = build_model(self.model_cfg)
        model.load_state_dict(state, strict=True)
        return model
