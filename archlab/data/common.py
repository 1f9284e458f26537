"""Checks and file helpers shared by the datamodules and ``archlab-prepare``; no Lightning import, so
``archlab-prepare`` starts quickly."""

from __future__ import annotations

from pathlib import Path

from archlab.errors import ConfigError


def read_text(path: str | Path, field: str) -> str:
    """The file's text; ConfigError naming ``field`` when it is missing, empty or not UTF-8."""
    allowed = "an existing, non-empty UTF-8 text file"
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(field, str(path), f"{allowed} ({'a directory' if file.is_dir() else 'no file'} there)")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(field, str(path), f"{allowed} (byte {err.start} is not UTF-8)") from None
    if not text:
        raise ConfigError(field, str(path), f"{allowed} (the file is empty)")
    return text


def split_point(n: int, val_fraction: float) -> int:
    """Tokens in the training split: the first ``int(n * (1 - val_fraction))`` (nanoGPT's 90/10 rule)."""
    return int(n * (1 - val_fraction))


def token_dtype(vocab_size: int) -> str:
    """The smallest shard dtype that holds every id of a ``vocab_size`` vocabulary."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def evaluation_only(val_fraction: object) -> bool:
    """``val_fraction=1``: every token validates and no ``train.bin`` is written (held-out text, encoded
    with a training run's tokenizer, for evaluation only)."""
    return val_fraction == 1
