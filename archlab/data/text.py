"""``data=text``: any local UTF-8 file, as characters or bytes; first 90% for training, last 10% for validation."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from archlab import checks
from archlab.data.common import read_text, split_point
from archlab.data.windows import WindowDataModule
from archlab.errors import ConfigError
from archlab.tokenizer import ByteTokenizer, CharTokenizer

VOCABS = {
    "char": "one id per distinct character of the file, as nanoGPT's shakespeare_char",
    "byte": "the 256 byte values of the UTF-8 encoding",
}


class TextDataModule(WindowDataModule):
    """A text file tokenised whole; the char vocabulary is fitted on the whole file, so validation
    characters are always known."""

    def __init__(
        self,
        path: str,
        vocab: str = "char",
        seq_len: int = 256,
        val_fraction: float = 0.1,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        eval_seq_len: Optional[int] = None,
    ):
        super().__init__(seq_len, batch_size, num_workers, seed, eval_seq_len)
        if vocab not in VOCABS:
            raise ConfigError("data.vocab", vocab, " | ".join(f"{k} ({v})" for k, v in VOCABS.items()))
        checks.fraction("data.val_fraction", val_fraction)
        self.path = Path(path).expanduser()
        self.text = read_text(path, "data.path")
        self.tokenizer = CharTokenizer.fit(self.text) if vocab == "char" else ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        n = len(self.text) if vocab == "char" else len(self.text.encode("utf-8"))
        self.split = split_point(n, val_fraction)
        self.check_splits(self.split, n - self.split, str(path), "data.path")

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_data is None:
            ids = np.asarray(self.tokenizer.encode(self.text), dtype=np.int32)
            self.train_data, self.val_data = ids[: self.split], ids[self.split :]
