"""The seeded training stream shared by every datamodule: batch k is a pure function of (seed, k).

Making each batch a function of its index (rather than of an iterator's history) gives three things:
a resumed run continues with exactly the batches it would have seen, the stream does not depend on
``num_workers``, and ``W`` processes each taking their slice of global batch k see together exactly
what one process with a ``W`` times larger batch sees. The evaluation loaders live here too: fixed
rows in order, split among processes so that each row is scored once.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from archlab.nn.loss import IGNORE

# make_batch(rng, n) -> (inputs, targets): n examples drawn from the generator rng
BatchFn = Callable[[np.random.Generator, int], tuple[torch.Tensor, torch.Tensor]]


def batch_rng(seed: int, stream: int, index: int) -> np.random.Generator:
    """The generator for batch ``index`` of stream ``stream`` (train, or one fixed evaluation set)."""
    return np.random.default_rng([seed, stream, index])


class BatchStream(IterableDataset):
    """An endless stream of ready batches; this process keeps rows ``[rank*B, (rank+1)*B)`` of each
    global batch of ``world_size * B`` rows, starting at batch ``start``."""

    def __init__(
        self,
        make_batch: Callable[..., tuple[torch.Tensor, torch.Tensor]],  # a BatchFn, or one a subclass calls its way
        seed: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        start: int = 0,
    ):
        self.make_batch, self.seed, self.batch_size = make_batch, seed, batch_size
        self.rank, self.world_size, self.start = rank, world_size, start

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        inputs, targets = self.global_batch(index)
        return inputs[rows], targets[rows]

    def global_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` of every process: ``world_size * batch_size`` rows from its own generator."""
        return self.make_batch(batch_rng(self.seed, 0, index), self.world_size * self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # DataLoader workers are read round-robin, so worker w producing batches w, w+n, ... keeps the order
        info = get_worker_info()
        index, step = (self.start + info.id, info.num_workers) if info else (self.start, 1)
        while True:
            yield self.batch(index)
            index += step


def stream_loader(
    make_batch: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    seed: int,
    batch_size: int,
    num_workers: int,
    trainer: Any,
    stream: type[BatchStream] = BatchStream,
) -> DataLoader:
    """The training loader: this rank's slice of the stream (a ``BatchStream``, or the subclass ``stream``
    that calls ``make_batch`` its own way), resumed after the batches that ``trainer`` (restored from a
    checkpoint, or fresh) has already trained on."""
    rank, world, start = 0, 1, 0
    if trainer is not None:
        rank, world = trainer.global_rank, trainer.world_size
        # restored from the checkpoint before the loaders are built; 0 on a fresh run
        start = trainer.fit_loop.epoch_loop.batch_progress.total.ready
    batches = stream(make_batch, seed, batch_size, rank, world, start)
    return DataLoader(batches, batch_size=None, num_workers=num_workers, persistent_workers=num_workers > 0)


class RankPadded(Dataset):
    """``dataset`` padded to a multiple of ``world_size`` rows with unscored rows (every target IGNORE):
    each process then gets as many rows as the others (sharded models run their forwards together),
    and the distributed sampler adds no padding of its own, which repeats real rows that the metrics,
    reduced over processes, would count twice."""

    def __init__(self, dataset: Dataset, world_size: int):
        if not isinstance(dataset, Sized):
            raise TypeError(f"RankPadded pads a dataset of known length, not a {type(dataset).__name__}")
        self.dataset, self.rows = dataset, len(dataset)
        self.padded = -(-self.rows // world_size) * world_size

    def __len__(self) -> int:
        return self.padded

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.padded:
            raise IndexError(i)
        if i < self.rows:
            return self.dataset[i]
        inputs, targets = self.dataset[0]
        return inputs, torch.full_like(targets, IGNORE)


def eval_loader(dataset: Dataset, batch_size: int, num_workers: int, trainer: Any) -> DataLoader:
    """An evaluation loader over ``dataset``'s rows in order; across processes, each row scored once."""
    if trainer is not None and trainer.world_size > 1:
        dataset = RankPadded(dataset, trainer.world_size)
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers, persistent_workers=num_workers > 0
    )
