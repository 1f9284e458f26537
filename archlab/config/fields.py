"""Field helpers for the schemas: metadata that validation and ``--help`` read."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any


def choice(default: str, *allowed: str) -> Any:
    """A string field that takes one of ``allowed`` values: validation checks every such field of the
    model config, whatever variant is chosen (``archlab.nn.validation``)."""
    return field(default=default, metadata={"choices": (default, *allowed)})


def setting(default: Any = MISSING, help: str = "") -> Any:
    """A command's field with the one-line description its ``--help`` prints; no default (``MISSING``)
    makes it required."""
    return field(default="???" if default is MISSING else default, metadata={"help": help})
