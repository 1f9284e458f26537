"""LightningDataModules built from ``conf/data/<name>.yaml``: ``mqar`` (built-in recall task), ``text``
(a UTF-8 file, char or byte vocabulary), ``tokens`` (nanoGPT-format shards from ``archlab-prepare``) and
``mixture`` (several such shard directories sampled by weight).

Each exposes, right after construction, ``vocab_size``, ``max_seq_len`` (the longest input it will feed,
evaluation included), ``val_names`` (one per validation loader), ``tokenizer`` and ``chance_accuracy``;
a mixture also ``val_pools`` (``val``, which pools its sources' loaders, has none of its own) and
``callbacks`` (its own, which training adds to the run's).
Batches are ``(inputs, targets)`` LongTensors ``[B, T]``; targets are -100 where nothing is scored.
The classes load on first use (PEP 562), so ``archlab-prepare`` never imports Lightning.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers only: at run time __getattr__ imports them on first use
    from archlab.data.mixture import MixtureDataModule
    from archlab.data.mqar import MQARDataModule
    from archlab.data.text import TextDataModule
    from archlab.data.tokens import TokensDataModule

_MODULES = {
    "MixtureDataModule": "archlab.data.mixture",
    "MQARDataModule": "archlab.data.mqar",
    "TextDataModule": "archlab.data.text",
    "TokensDataModule": "archlab.data.tokens",
}
__all__ = [
    "MixtureDataModule",
    "MQARDataModule",
    "TextDataModule",
    "TokensDataModule",
]  # _MODULES' keys, spelled out for type checkers


def __getattr__(name: str):
    if name in _MODULES:
        return getattr(import_module(_MODULES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
