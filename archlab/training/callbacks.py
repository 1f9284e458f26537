"""Callbacks of ``archlab-train``: parameter check, throughput, text samples, progress.

A callback with a ``summary_fields()`` method contributes those fields to the run's summary.json.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, RichProgressBar

from archlab.accounting import COMPONENTS, built_counts, count, flops_per_token
from archlab.bench.peak_flops import peak_flops
from archlab.errors import ConfigError
from archlab.precision import compute_dtype
from archlab.training.module import LitModel

log = logging.getLogger("archlab.train")


def _lit(callback: Callback, pl_module: L.LightningModule) -> LitModel:
    """``pl_module`` as the ``LitModel`` these callbacks read (its ``model_cfg``, ``model``)."""
    if not isinstance(pl_module, LitModel):
        raise TypeError(f"{type(callback).__name__} needs archlab's LitModel, not {type(pl_module).__name__}")
    return pl_module


class ParameterCheck(Callback):
    """At fit start, log the closed-form count of every component beside the built module's count."""

    def __init__(self):
        self.analytic: dict[str, int] = {}
        self.built: dict[str, int] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        lit = _lit(self, pl_module)
        self.analytic, self.built = count(lit.model_cfg), built_counts(lit.decoder)
        if trainer.is_global_zero:
            lines = [f"{'component':<20}{'analytic':>16}{'built':>16}"]
            for c in (*COMPONENTS, "total"):
                mark = "" if self.analytic[c] == self.built[c] else "   MISMATCH"
                lines.append(f"{c:<20}{self.analytic[c]:>16,}{self.built[c]:>16,}{mark}")
            log.info("parameters (analytic vs built):\n%s", "\n".join(lines))

    def summary_fields(self) -> dict[str, Any]:
        return {"parameters": {"analytic": self.analytic, "built": self.built}}


class FiniteLoss(Callback):
    """Never train on a NaN/inf loss or gradient. ``action=stop`` (default) fails the run with a
    FloatingPointError naming the step before that step changes any weight, so the weights and the last
    checkpoint stay good (the failure is recorded in summary.json); ``action=skip`` drops the step's
    update (weights and optimizer state unchanged, the schedule moves on) and lists it in summary.json.

    Every process takes the same decision (one all-reduce of a flag per micro-batch under DDP/FSDP).
    With fp16 autocast (16-mixed) the gradient scaler already skips overflowing steps, so only the loss
    is checked there."""

    ACTIONS = ("stop", "skip")

    def __init__(self, action: str = "stop"):
        if action not in self.ACTIONS:
            raise ConfigError(
                "callbacks.finite_loss.action",
                action,
                "stop (fail the run at the step) | skip (drop that step's update and go on)",
            )
        self.action = action
        self.skipped: list[int] = []
        self._problem: Optional[str] = None  # what was not finite since the last optimizer step

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        finite = trainer.strategy.reduce_boolean_decision(bool(torch.isfinite(loss).all()), all=True)
        if not finite and self._problem is None:
            self._problem = f"train/loss is {float(loss.detach())}"
            if self.action == "stop":  # before backward: nothing of this step has touched the weights
                self._stop(trainer)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if self._problem is None and getattr(trainer.precision_plugin, "scaler", None) is None:
            grads = [_local(p.grad) for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            finite = bool(torch.isfinite(torch.nn.utils.get_total_norm(grads))) if grads else True
            if not trainer.strategy.reduce_boolean_decision(finite, all=True):
                self._problem = "a gradient is not finite"
        if self._problem is None:
            return
        if self.action == "stop":
            self._stop(trainer)
        for group in optimizer.param_groups:  # AdamW leaves parameters without a gradient untouched
            for p in group["params"]:
                p.grad = None
        step = trainer.global_step + 1
        self.skipped.append(step)
        log.warning("%s at step %d: skipped that update (callbacks.finite_loss.action=skip)", self._problem, step)
        self._problem = None

    def _stop(self, trainer: L.Trainer) -> None:
        ckpt = trainer.checkpoint_callback
        last = (ckpt.last_model_path or ckpt.best_model_path) if isinstance(ckpt, ModelCheckpoint) else None
        raise FloatingPointError(
            f"{self._problem} at step {trainer.global_step + 1}; stopped before that step changed any weight. "
            + (
                f"Last good checkpoint: {last}; continue from it with ckpt_path={last} and a lower optim.lr or "
                "trainer.gradient_clip_val. "
                if last
                else "No checkpoint was written yet; lower optim.lr or trainer.gradient_clip_val. "
            )
            + "To drop such steps instead: callbacks.finite_loss.action=skip"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = list(state_dict.get("skipped", []))

    def summary_fields(self) -> dict[str, Any]:
        return {"nonfinite": {"action": self.action, "skipped_steps": list(self.skipped)}}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor (FSDP2), the tensor itself otherwise."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


class GradNorm(Callback):
    """The L2 norm of all gradients of each optimizer step, before clipping, logged as ``train/grad_norm``;
    the largest finite one and its step go into summary.json (``grad_norm``), which archlab-report reads
    as a stability figure. Kept on the device between steps (no sync per step) and across resumes."""

    def __init__(self):
        self.max: Optional[torch.Tensor] = None
        self.step: Optional[torch.Tensor] = None

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        norm = torch.nn.utils.get_total_norm(grads).detach()
        full_tensor = getattr(norm, "full_tensor", None)  # FSDP2: the norm over every shard
        norm = (full_tensor() if full_tensor is not None else norm).float()
        pl_module.log("train/grad_norm", norm)
        step = torch.tensor(trainer.global_step + 1, device=norm.device)
        if self.max is None or self.step is None:
            self.max, self.step = torch.full_like(norm, -1.0), torch.zeros_like(step)
        top, at = self.max.to(norm.device), self.step.to(norm.device)  # restored from a checkpoint: on the CPU
        larger = torch.isfinite(norm) & (norm > top)
        self.max, self.step = torch.where(larger, norm, top), torch.where(larger, step, at)

    def state_dict(self) -> dict[str, Any]:
        return self.summary_fields()["grad_norm"]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("max") is not None:
            self.max, self.step = torch.tensor(float(state_dict["max"])), torch.tensor(int(state_dict["step"]))

    def summary_fields(self) -> dict[str, Any]:
        if self.max is None or self.step is None or float(self.max) < 0:
            return {"grad_norm": {"max": None, "step": None}}
        return {"grad_norm": {"max": float(self.max), "step": int(self.step)}}


class ThroughputMonitor(Callback):
    """Tokens/s of the training steps (data loading and validation excluded), FLOP/s from the
    analytic FLOPs per token at the batch's sequence length, and MFU where the device's peak is
    known (``archlab.bench.peak_flops``, which archlab-bench reads too; none for CPUs)."""

    def __init__(self, log_every_n_steps: int = 50):
        self.log_every_n_steps = log_every_n_steps
        self.tokens, self.seconds, self.flops = 0, 0.0, 0.0
        self.peak: Optional[float] = None
        self._start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        peak = peak_flops(trainer.strategy.root_device, compute_dtype(trainer.precision))
        self.peak = peak * trainer.world_size if peak else None
        self.active_non_embedding = count(_lit(self, pl_module).model_cfg)["active_non_embedding"]

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync(pl_module)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(pl_module)
        self.seconds += time.perf_counter() - self._start
        inputs = batch[0]
        tokens = inputs.numel() * trainer.world_size
        self.tokens += tokens
        cfg = _lit(self, pl_module).model_cfg
        self.flops += tokens * flops_per_token(cfg, self.active_non_embedding, inputs.shape[1])
        if trainer.global_step % self.log_every_n_steps == 0:
            pl_module.log_dict({f"perf/{k}": v for k, v in self.rates().items() if v is not None})

    def state_dict(self) -> dict[str, Any]:
        # in the checkpoint: a resumed run's figures cover the steps of every attempt
        return {"tokens": self.tokens, "seconds": self.seconds, "flops": self.flops}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tokens, self.seconds, self.flops = state_dict["tokens"], state_dict["seconds"], state_dict["flops"]

    def rates(self) -> dict[str, Optional[float]]:
        tokens_per_s = self.tokens / self.seconds if self.seconds else None
        flops_per_s = self.flops / self.seconds if self.seconds else None
        mfu = flops_per_s / self.peak if flops_per_s and self.peak else None
        return {"tokens_per_s": tokens_per_s, "flops_per_s": flops_per_s, "mfu": mfu}

    def summary_fields(self) -> dict[str, Any]:
        return {
            "throughput": {
                **self.rates(),
                "peak_flops_per_s": self.peak,
                "train_seconds": self.seconds,
                "tokens": self.tokens,
            }
        }


class TextSamples(Callback):
    """At the end of fit, continue the start of the first validation sequence with the trained model for
    ``max_new_tokens`` tokens (past the context as ``archlab.generate`` does) and log the text (only when
    the data has a tokenizer)."""

    def __init__(
        self,
        num_samples: int = 2,
        prompt_tokens: int = 32,
        max_new_tokens: int = 200,
        temperature: float = 0.8,
        top_k: Optional[int] = 40,
        seed: int = 0,
    ):
        self.num_samples, self.prompt_tokens, self.max_new_tokens = num_samples, prompt_tokens, max_new_tokens
        self.temperature, self.top_k, self.seed = temperature, top_k, seed
        self.samples: list[dict[str, str]] = []

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from archlab.generate import generate

        # Lightning sets Trainer.datamodule from its data connector without declaring it on Trainer
        datamodule = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
        tokenizer = getattr(datamodule, "tokenizer", None)
        if tokenizer is None or self.num_samples == 0:
            return
        lit = _lit(self, pl_module)
        inputs, _ = next(iter(datamodule.val_dataloader()[0]))
        prompt = inputs[: self.num_samples, : self.prompt_tokens].to(lit.device)
        generator = torch.Generator(device=lit.device).manual_seed(self.seed)
        # every rank decodes (under FSDP each forward gathers shards collectively); rank 0 reports
        model = lit.decoder
        out = generate(model, prompt, self.max_new_tokens, self.temperature, self.top_k, generator)
        reshard = getattr(model, "reshard", None)
        if reshard is not None:  # FSDP2 leaves the root gathered after a no-grad forward
            reshard()
        self.samples = [
            {"prompt": tokenizer.decode(p.tolist()), "completion": tokenizer.decode(o[prompt.shape[1] :].tolist())}
            for p, o in zip(prompt.cpu(), out.cpu())
        ]
        if trainer.is_global_zero:
            for s in self.samples:
                log.info("sample:\n%s[%s]", s["prompt"], s["completion"])

    def summary_fields(self) -> dict[str, Any]:
        return {"samples": self.samples}


class PlainProgress(Callback):
    """Periodic log lines (for logs and non-terminal output) instead of a live progress bar."""

    def __init__(self, every_n_steps: int = 50):
        self.every_n_steps = every_n_steps
        self._start = time.perf_counter()

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if trainer.is_global_zero and (step % self.every_n_steps == 0 or step == trainer.max_steps):
            m = trainer.callback_metrics
            log.info(
                "step %d/%d  loss %.4f  lr %.2e  %.0fs",
                step,
                trainer.max_steps,
                float(m.get("train/loss", float("nan"))),
                float(m.get("train/lr", float("nan"))),
                time.perf_counter() - self._start,
            )

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            names = getattr(pl_module, "val_names", [])
            shown = [f"{k} {float(v):.4f}" for k, v in trainer.callback_metrics.items() if k.split("/")[0] in names]
            log.info("step %d  %s", trainer.global_step, "  ".join(shown))


class StepProgress(RichProgressBar):
    """Lightning's rich bar counting optimizer steps toward ``trainer.max_steps`` (training here is
    step-based, with no epoch limit), with the latest validation loss and accuracy beside train/loss.
    While it is shown, log lines meant for the terminal are printed above it, never into it."""

    DESCRIPTION = "Training"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._rerouted: list[tuple[logging.StreamHandler, Any]] = []

    def _get_train_description(self, current_epoch: int) -> str:
        return f"{self.DESCRIPTION:{len(self.validation_description)}}"  # as wide as "Validation": no flicker

    def _initialize_train_progress_bar_id(self) -> None:
        trainer = self.trainer
        assert self.progress is not None  # set up in on_train_start while enabled, as Lightning's _add_task assumes
        self.train_progress_bar_id = self.progress.add_task(
            self._get_train_description(trainer.current_epoch), total=trainer.max_steps, completed=trainer.global_step
        )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # one bar for the whole run: a new epoch of a finite dataset neither resets nor re-sizes it
        if self.is_enabled and self.progress is not None and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
            self.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.is_enabled and self.train_progress_bar_id is None:  # e.g. resumed mid-epoch
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        if isinstance(pl_module, LitModel) and pl_module.history:
            # the latest validation of the first validation set (null: not finite)
            history = pl_module.history
            name = pl_module.val_names[0]
            for key in (f"{name}/loss", f"{name}/acc"):
                if key in history[-1]:
                    items[key] = float("nan") if history[-1][key] is None else history[-1][key]
        return items

    def _init_progress(self, trainer: L.Trainer) -> None:
        starting = self.is_enabled and (self.progress is None or self._progress_stopped)
        terminal = (sys.stdout, sys.stderr)
        super()._init_progress(trainer)
        if starting:
            self._reroute_logs(terminal)

    def _stop_progress(self) -> None:
        super()._stop_progress()
        for handler, stream in self._rerouted:
            handler.setStream(stream)
        self._rerouted = []

    def _reroute_logs(self, terminal: tuple[Any, Any]) -> None:
        """Point the log handlers that write to the terminal at the live display's stand-ins for
        stdout/stderr (rich's FileProxy, set while it is shown), which print each line above the bar."""
        proxies = dict(zip(map(id, terminal), (sys.stdout, sys.stderr)))
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        handlers = {h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers}
        for handler in handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                proxy = proxies.get(id(stream))
                if proxy is not None and proxy is not stream:
                    self._rerouted.append((handler, handler.setStream(proxy)))


def progress(every_n_steps: int = 50) -> Callback:
    """A rich progress bar of the run's steps in a terminal, plain periodic log lines otherwise."""
    return StepProgress() if sys.stdout.isatty() else PlainProgress(every_n_steps)
