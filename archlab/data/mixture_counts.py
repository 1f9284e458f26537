"""``MixtureCounts``: the tokens each source of a data mixture has given training, counted from the
allocation's closed form (nothing is tallied in the loader, so resuming or ``num_workers`` change nothing):
logged as ``mixture/<name>/tokens`` and recorded in summary.json (``mixture``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback

from archlab.data.allocation import Allocation

log = logging.getLogger("archlab.data")


def batches_drawn(trainer: L.Trainer) -> int:
    """The training batches of the stream drawn so far (a resumed run's restored ones included)."""
    return trainer.fit_loop.epoch_loop.batch_progress.total.ready


class MixtureCounts(Callback):
    """Each source's rows and tokens over the batches trained: sources ``names`` (shard directories
    ``dirs``, relative ``weights``, ``train_tokens`` in each training split), windows of ``seq_len``
    tokens, ``batch_size`` rows per process."""

    def __init__(
        self,
        names: list[str],
        dirs: list[Path],
        weights: list[float],
        train_tokens: list[int],
        seq_len: int,
        batch_size: int,
        seed: int,
    ):
        self.names, self.dirs, self.weights, self.train_tokens = names, dirs, weights, train_tokens
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.allocation: Optional[Allocation] = None
        self.batches = 0
        self.rows = np.zeros(len(names), dtype=np.int64)

    def count(self, trainer: L.Trainer) -> None:
        """Bring the totals to the batches drawn: one more batch added, any other change counted afresh."""
        if self.allocation is None:  # one batch is every process's rows
            self.allocation = Allocation(self.weights, trainer.world_size * self.batch_size, self.seed)
        batches = batches_drawn(trainer)
        if batches == self.batches + 1:
            self.rows = self.rows + self.allocation.rows_of(self.batches)
        elif batches != self.batches:
            self.rows = self.allocation.totals(batches)
        self.batches = batches

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.count(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.count(trainer)
        for name, rows in zip(self.names, self.rows):
            pl_module.log(f"mixture/{name}/tokens", float(rows * self.seq_len))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            for name, fields in self.summary_fields()["mixture"]["sources"].items():
                log.info(
                    "mixture: %s gave %d training tokens, %.4f of them (weight share %.4f; %.2f passes over its %d)",
                    name,
                    fields["tokens"],
                    fields["fraction"],
                    fields["share"],
                    fields["passes"],
                    fields["train_tokens"],
                )

    def summary_fields(self) -> dict[str, Any]:
        total_rows, total_weight = int(self.rows.sum()), sum(self.weights)
        sources = {}
        for name, dir, weight, available, rows in zip(
            self.names, self.dirs, self.weights, self.train_tokens, self.rows.tolist()
        ):
            sources[name] = {
                "dir": str(dir.absolute()),  # absolute, as every path summary.json records
                "weight": weight,
                "share": weight / total_weight,
                "train_tokens": available,
                "rows": rows,
                "tokens": rows * self.seq_len,
                "fraction": rows / total_rows if total_rows else None,
                "passes": rows * self.seq_len / available,
            }
        return {"mixture": {"batches": self.batches, "sources": sources}}
