"""Value checks every layer shares: each raises one ConfigError naming the field, the value and what is
allowed, so a positive, a fraction or a choice reads the same in every command."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable

from archlab.errors import ConfigError


def finite(value: Any) -> float:
    """``value`` as a float when it is a finite number (not a bool), else NaN, which fails every comparison."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return math.nan
    return float(value)


def positive(field: str, value: Any, allowed: str = "a positive number") -> None:
    """A finite number > 0 (sizes, rates, scales)."""
    if not finite(value) > 0:
        raise ConfigError(field, value, allowed)


def non_negative(field: str, value: Any, allowed: str = "a non-negative number") -> None:
    """A finite number >= 0."""
    if not finite(value) >= 0:
        raise ConfigError(field, value, allowed)


def probability(field: str, value: Any) -> None:
    """A dropout-style probability in [0, 1)."""
    if not 0.0 <= finite(value) < 1.0:
        raise ConfigError(field, value, "a probability in [0, 1)")


def fraction(field: str, value: Any) -> None:
    """A number strictly between 0 and 1 (a split of the data)."""
    if not 0.0 < finite(value) < 1.0:
        raise ConfigError(field, value, "a number strictly between 0 and 1")


def integer(field: str, value: Any, minimum: int = 1, allowed: str | None = None) -> None:
    """An int (not a bool) >= ``minimum``: 'a positive integer' for 1, 'a non-negative integer' for 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        words = {1: "a positive integer", 0: "a non-negative integer"}
        raise ConfigError(field, value, allowed or words.get(minimum, f"an integer >= {minimum}"))


def choice(field: str, value: Any, allowed: Iterable[Any]) -> None:
    """One of ``allowed``, listed in the error."""
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(field, value, f"one of {allowed}")


def writable_dir(field: str, value: str | Path) -> Path:
    """A directory this process can create or write into: it exists as a directory, or its nearest
    existing parent is a writable directory. Returns the path, user-expanded."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(field, str(value), "a directory (this path is a file)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "is not writable" if existing.is_dir() else "is a file"
        raise ConfigError(field, str(value), f"a directory this user can create or write into ({existing} {why})")
    return path


def png_file(field: str, value: Any) -> None:
    """A figure to write, or None: a path ending in .png in a directory this process can write into."""
    if value is None:
        return
    if not str(value).endswith(".png"):
        raise ConfigError(field, value, "null or a path ending in .png")
    writable_dir(field, Path(value).expanduser().parent)
