"""Language-model windows over a 1-D token array, shared by the ``text`` and ``tokens`` datamodules.

Training draws windows of ``seq_len + 1`` tokens at seeded random offsets; validation reads every
non-overlapping window of the split in order, plus one final window that scores the tail the others
leave out, so each validation token after the first is scored exactly once. With ``eval_seq_len``,
``val_long`` reads the same split in windows of that length (length generalisation: a model trained on
``seq_len`` tokens, scored on longer ones).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional

import lightning as L
import numpy as np
import torch
from torch.utils.data import Dataset

from archlab import checks
from archlab.data.stream import eval_loader, stream_loader
from archlab.errors import ConfigError
from archlab.nn.loss import IGNORE


def random_windows(rng: np.random.Generator, n: int, data: Any, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` windows at uniform random offsets of ``data``: inputs and next-token targets ``[n, seq_len]``."""
    offsets = rng.integers(0, len(data) - seq_len, size=n)  # the last offset still has seq_len + 1 tokens
    window = torch.from_numpy(np.asarray(data[offsets[:, None] + np.arange(seq_len + 1)], dtype=np.int64))
    return window[:, :-1], window[:, 1:]


class ValidationWindows(Dataset):
    """Window ``i`` predicts tokens ``i*seq_len + 1 ... (i+1)*seq_len``; when tokens remain after the
    last full window, one more window ends at the split's end with its already-scored targets at -100."""

    def __init__(self, data: Any, seq_len: int):
        self.data, self.seq_len = data, seq_len
        self.full, self.tail = divmod(len(data) - 1, seq_len)

    def __len__(self) -> int:
        return self.full + (self.tail > 0)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        start = i * self.seq_len if i < self.full else len(self.data) - 1 - self.seq_len
        window = torch.from_numpy(np.asarray(self.data[start : start + self.seq_len + 1], dtype=np.int64))
        inputs, targets = window[:-1], window[1:].clone()
        if i == self.full:
            targets[: self.seq_len - self.tail] = IGNORE
        return inputs, targets


class WindowDataModule(L.LightningDataModule):
    """A token array split into train and validation: random training windows from the seeded stream,
    every validation window in order. Subclasses set ``vocab_size``, ``tokenizer`` and load the splits."""

    chance_accuracy = None  # no single guessing baseline for text: the run reports val/loss

    def __init__(self, seq_len: int, batch_size: int, num_workers: int, seed: int, eval_seq_len: Optional[int] = None):
        super().__init__()
        checks.integer("data.seq_len", seq_len, 1, "an integer >= 1")
        checks.integer("data.batch_size", batch_size, 1, "an integer >= 1")
        checks.integer("data.num_workers", num_workers, 0, "an integer >= 0")
        if eval_seq_len is not None:
            checks.integer("data.eval_seq_len", eval_seq_len, 1, "an integer >= 1 (val_long's windows), or null")
        self.seq_len, self.batch_size, self.num_workers, self.seed = seq_len, batch_size, num_workers, seed
        self.eval_seq_len = eval_seq_len
        self.val_names = ["val"] if eval_seq_len is None else ["val", "val_long"]
        self.max_seq_len = max(seq_len, eval_seq_len or 0)  # the model's context covers val_long's windows
        self.train_data: Optional[Any] = None
        self.val_data: Optional[Any] = None

    def check_splits(self, train_tokens: int, val_tokens: int, source: str, source_field: str) -> None:
        """Both splits must hold at least one window of ``seq_len + 1`` tokens; when not even a window of
        two fits, the data (``source_field``) is what is wrong, not ``seq_len``."""
        shortest = min(train_tokens, val_tokens)
        if shortest < 2:
            raise ConfigError(
                source_field,
                source,
                f"data long enough for a window of seq_len + 1 >= 2 tokens in each "
                f"split (it gives {train_tokens} training and {val_tokens} validation tokens)",
            )
        if shortest < self.seq_len + 1:
            raise ConfigError(
                "data.seq_len",
                self.seq_len,
                f"at most {shortest - 1}: {source} has {train_tokens} training and {val_tokens}"
                " validation tokens and a window needs seq_len + 1 of them",
            )
        if self.eval_seq_len is not None and val_tokens < self.eval_seq_len + 1:
            raise ConfigError(
                "data.eval_seq_len",
                self.eval_seq_len,
                f"at most {val_tokens - 1}: {source} has {val_tokens} validation tokens and a val_long"
                " window needs eval_seq_len + 1 of them",
            )

    def train_dataloader(self):
        self.setup("fit")
        make_batch = partial(random_windows, data=self.train_data, seq_len=self.seq_len)
        return stream_loader(make_batch, self.seed, self.batch_size, self.num_workers, self.trainer)

    def val_dataloader(self):
        self.setup("validate")
        lengths = [self.seq_len] + ([] if self.eval_seq_len is None else [self.eval_seq_len])
        return [
            eval_loader(ValidationWindows(self.val_data, n), self.batch_size, self.num_workers, self.trainer)
            for n in lengths
        ]
