"""Checks and file helpers shared by the datamodules and ``archlab-prepare``; no Lightning import, so
``archlab-prepare`` starts quickly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from archlab.errors import ConfigError

IGNORE = -100  # targets that are not scored (torch.nn.functional.cross_entropy's ignore_index)


def check_positive(field: str, value: Any, minimum: int = 1) -> None:
    """Raise ConfigError unless ``value`` is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(field, value, f"an integer >= {minimum}")


def check_fraction(field: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is a number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ConfigError(field, value, "a number strictly between 0 and 1")


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
