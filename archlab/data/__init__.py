"""LightningDataModules built from ``conf/data/<name>.yaml``: ``mqar`` (built-in recall task), ``text``
(a UTF-8 file, char or byte vocabulary) and ``tokens`` (nanoGPT-format shards from ``archlab-prepare``).

Each exposes, right after construction, ``vocab_size``, ``max_seq_len`` (the longest input it will feed,
evaluation included), ``val_names`` (one per validation loader), ``tokenizer`` and ``chance_accuracy``.
Batches are ``(inputs, targets)`` LongTensors ``[B, T]``; targets are -100 where nothing is scored.
"""

from archlab.data.mqar import MQARDataModule
from archlab.data.text import TextDataModule
from archlab.data.tokens import TokensDataModule

__all__ = ["MQARDataModule", "TextDataModule", "TokensDataModule"]
