"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"): the built-in task that needs no files.

A sequence lists ``num_pairs`` key-value pairs, then asks ``num_queries`` questions, each a key of the
sequence followed by its value: ``k1 v1 k2 v2 ... kN vN  q1 a1 q2 a2 ...``. Only the answers ``a`` are
scored (targets are -100 elsewhere), so accuracy is recall accuracy. Keys are tokens ``[0, num_keys)``,
distinct within a sequence; values are tokens ``[num_keys, num_keys + num_values)``, drawn
independently, so guessing scores ``1 / num_values``. Questions pick their pair with replacement: had
each key been asked once, the last answers could be found by elimination (asking all 8 keys of 8
pairs once lets elimination alone reach H_8/8 = 34% without any recall). The second validation set
``val_long`` holds ``eval_num_pairs`` pairs (twice as many by default) to measure length generalisation.
Zoology's protocol instead trains on several pair counts at once (``train_pairs``: each batch draws its
count) and scores each count apart (``val_pairs``: sets ``val_p<N>`` in val_long's place).
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import lightning as L
import numpy as np
import torch
from torch.utils.data import TensorDataset

from archlab import checks
from archlab.data.stream import BatchFn, batch_rng, eval_loader, stream_loader
from archlab.errors import ConfigError
from archlab.nn.loss import IGNORE


def mqar_batch(
    rng: np.random.Generator, n: int, num_pairs: int, num_queries: int, num_keys: int, num_values: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` MQAR sequences as ``(inputs, targets)`` of shape ``[n, 2*(num_pairs + num_queries) - 1]``."""
    keys = rng.random((n, num_keys)).argsort(axis=1)[:, :num_pairs]  # distinct keys per row
    values = rng.integers(num_keys, num_keys + num_values, size=(n, num_pairs))
    asked = rng.integers(0, num_pairs, size=(n, num_queries))  # with replacement: no answer by elimination
    queries = np.take_along_axis(keys, asked, axis=1)
    answers = np.take_along_axis(values, asked, axis=1)
    context = np.stack([keys, values], axis=2).reshape(n, -1)
    recall = np.stack([queries, answers], axis=2).reshape(n, -1)
    sequence = torch.from_numpy(np.concatenate([context, recall], axis=1))
    targets = torch.full((n, sequence.shape[1] - 1), IGNORE, dtype=torch.long)
    targets[:, 2 * num_pairs :: 2] = torch.from_numpy(answers)  # predicted at each question's position
    return sequence[:, :-1].contiguous(), targets


def mixed_batch(rng: np.random.Generator, n: int, make: dict[int, BatchFn]) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of one pair count drawn uniformly from ``make``'s keys (one count per batch, so a
    batch's rows share their length), made by that count's batch function."""
    pairs = list(make)
    return make[pairs[int(rng.integers(len(pairs)))]](rng, n)


class MQARDataModule(L.LightningDataModule):
    """An endless seeded training stream plus fixed validation sets: ``val`` (``num_pairs`` pairs) and
    ``val_long`` (``eval_num_pairs`` pairs), or with ``val_pairs`` one ``val_p<N>`` per count instead of
    val_long. Training draws ``num_pairs`` pairs, or with ``train_pairs`` one of its counts per batch."""

    tokenizer = None

    def __init__(
        self,
        num_pairs: int = 8,
        num_queries: Optional[int] = None,
        num_keys: int = 32,
        num_values: int = 32,
        eval_num_pairs: Optional[int] = None,
        train_pairs: Optional[list[int]] = None,
        val_pairs: Optional[list[int]] = None,
        val_examples: int = 1000,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        checks.integer("data.num_pairs", num_pairs, 1, "an integer >= 1")
        train_pairs = [num_pairs] if train_pairs is None else list(train_pairs)
        val_pairs = None if val_pairs is None else list(val_pairs)
        for name, counts in (("data.train_pairs", train_pairs), ("data.val_pairs", val_pairs)):
            if counts is not None and (
                not counts or len(set(counts)) < len(counts) or not all(isinstance(c, int) and c >= 1 for c in counts)
            ):
                raise ConfigError(name, counts, "null, or a list of distinct integers >= 1 (pair counts)")
        if val_pairs is not None and eval_num_pairs is not None:
            raise ConfigError(
                "data.eval_num_pairs", eval_num_pairs, "null when data.val_pairs is set (val_p<N> replace val_long)"
            )
        eval_num_pairs = 2 * num_pairs if eval_num_pairs is None else eval_num_pairs
        checks.integer("data.eval_num_pairs", eval_num_pairs, 1, "an integer >= 1")
        if num_queries is not None:
            checks.integer("data.num_queries", num_queries, 1, "an integer >= 1")
        checks.integer("data.num_keys", num_keys, 1, "an integer >= 1")
        val_counts = [num_pairs] + ([eval_num_pairs] if val_pairs is None else val_pairs)
        most = max(train_pairs + val_counts)
        if num_keys < most:
            counted = "data.num_pairs, data.eval_num_pairs" + (", data.train_pairs" if len(train_pairs) > 1 else "")
            raise ConfigError(
                "data.num_keys",
                num_keys,
                f"at least max({counted}{', data.val_pairs' if val_pairs else ''})={most}"
                " (keys are distinct within a sequence)",
            )
        checks.integer("data.num_values", num_values, 1, "an integer >= 1")
        checks.integer("data.val_examples", val_examples, 1, "an integer >= 1")
        checks.integer("data.batch_size", batch_size, 1, "an integer >= 1")
        checks.integer("data.num_workers", num_workers, 0, "an integer >= 0")
        self.num_pairs, self.num_queries, self.eval_num_pairs = num_pairs, num_queries, eval_num_pairs
        self.train_pairs, self.val_counts = train_pairs, val_counts
        self.val_names = ["val"] + (["val_long"] if val_pairs is None else [f"val_p{n}" for n in val_pairs])
        self.num_keys, self.num_values = num_keys, num_values
        self.val_examples, self.batch_size, self.num_workers, self.seed = val_examples, batch_size, num_workers, seed
        self.vocab_size = num_keys + num_values
        self.max_seq_len = max(self.seq_len(n) for n in train_pairs + val_counts)
        self.chance_accuracy = 1.0 / num_values
        self.val_sets: list[tuple[torch.Tensor, torch.Tensor]] = []

    def queries(self, pairs: int) -> int:
        """Questions per sequence of ``pairs`` pairs (``num_queries``, or one per pair when null)."""
        return pairs if self.num_queries is None else self.num_queries

    def seq_len(self, pairs: int) -> int:
        """Model input length for sequences of ``pairs`` pairs."""
        return 2 * (pairs + self.queries(pairs)) - 1

    def batch_fn(self, pairs: int):
        """``(rng, n) -> (inputs, targets)`` for sequences of ``pairs`` pairs (picklable for workers)."""
        return partial(
            mqar_batch,
            num_pairs=pairs,
            num_queries=self.queries(pairs),
            num_keys=self.num_keys,
            num_values=self.num_values,
        )

    def setup(self, stage: Optional[str] = None) -> None:
        if not self.val_sets:  # fixed sets: streams 1, 2, ... of the seed; training uses stream 0
            self.val_sets = [
                self.batch_fn(pairs)(batch_rng(self.seed, 1 + i, 0), self.val_examples)
                for i, pairs in enumerate(self.val_counts)
            ]

    def train_dataloader(self):
        if len(self.train_pairs) == 1:
            make = self.batch_fn(self.train_pairs[0])
        else:
            make = partial(mixed_batch, make={n: self.batch_fn(n) for n in self.train_pairs})
        return stream_loader(make, self.seed, self.batch_size, self.num_workers, self.trainer)

    def val_dataloader(self):
        self.setup()
        return [
            eval_loader(TensorDataset(x, y), self.batch_size, self.num_workers, self.trainer) for x, y in self.val_sets
        ]
