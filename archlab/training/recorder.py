"""``RunRecorder``: the callback that exports the final weights and writes summary.json (global rank 0)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from archlab.run_files import EXPORT
from archlab.training.summary import run_summary, write_summary
from archlab.weights import TOKENIZER_KEY, save_weights


class RunRecorder(Callback):
    """Collects the run's facts; at the end of fit exports the weights and writes summary.json.

    ``info`` holds what is known before fit (choices, model config, seed, data facts, start time)."""

    def __init__(
        self, output_dir: str | Path, info: dict[str, Any], tokenizer: Any = None, primary_metric: Optional[str] = None
    ):
        self.output_dir = Path(output_dir)
        self.info = info
        self.tokenizer = tokenizer
        self.primary_metric = primary_metric
        self.wrote = False
        self.earlier_seconds = 0.0  # wall time of the attempts before a resume, up to their checkpoint

    def summary(
        self,
        trainer: Optional[L.Trainer],
        pl_module: Any,
        status: str,
        error: Optional[BaseException] = None,
        export: Optional[Path] = None,
    ) -> dict[str, Any]:
        """This run's summary as it stands: ``run_summary`` with what the trainer, the module's validation
        history and the callbacks (their ``summary_fields()``) know."""
        history = list(getattr(pl_module, "history", []) or [])
        fields: dict[str, Any] = {}
        if self.primary_metric:
            fields["primary_metric"] = {
                "name": self.primary_metric,
                "value": history[-1].get(self.primary_metric) if history else None,
                "chance": self.info.get("data", {}).get("chance_accuracy"),
            }
        paths: dict[str, Any] = {"export": str(export) if export else None}
        if trainer is not None:
            # Lightning sets Trainer.callbacks from its callback connector without declaring it on Trainer
            for cb in trainer.callbacks:  # pyright: ignore[reportAttributeAccessIssue]
                if hasattr(cb, "summary_fields"):
                    fields.update(cb.summary_fields())
            ckpt = trainer.checkpoint_callback
            if isinstance(ckpt, ModelCheckpoint):
                paths["checkpoint"] = ckpt.best_model_path or ckpt.last_model_path or None
                paths["last_checkpoint"] = ckpt.last_model_path or None
            paths["logs"] = [str(lg.log_dir) for lg in trainer.loggers if getattr(lg, "log_dir", None)]
            fields["trainer"] = {
                "strategy": type(trainer.strategy).__name__,
                "accelerator": type(trainer.accelerator).__name__,
                "world_size": trainer.world_size,
                "num_nodes": trainer.num_nodes,
                "precision": str(trainer.precision),
            }
        return run_summary(
            self.output_dir,
            self.info,
            status,
            error,
            steps=trainer.global_step if trainer is not None else 0,
            wall_time_s=self.wall_time(),
            history=history,
            paths=paths,
            **fields,
        )

    def wall_time(self) -> float:
        """Seconds of this run: this attempt's, and those of earlier attempts up to the checkpoint resumed."""
        return self.earlier_seconds + time.time() - self.info["start_time"]

    def state_dict(self) -> dict[str, Any]:
        return {"wall_time_s": self.wall_time()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.earlier_seconds = float(state_dict["wall_time_s"])

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        state = pl_module.full_state_dict()  # every rank: under FSDP this gathers the shards
        if not trainer.is_global_zero:
            return
        meta = {TOKENIZER_KEY: json.dumps(self.tokenizer.to_dict())} if self.tokenizer is not None else None
        export = save_weights(pl_module.export_model(state), self.output_dir / EXPORT, metadata=meta)
        write_summary(self.output_dir, self.summary(trainer, pl_module, "completed", export=export))
        self.wrote = True

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        if trainer.is_global_zero:
            write_summary(self.output_dir, self.summary(trainer, pl_module, "failed", exception))
            self.wrote = True
