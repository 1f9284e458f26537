"""Field helpers for the schemas: metadata that validation and ``--help`` read; and a mapping node read
back as a plain dict."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any, cast

from omegaconf import OmegaConf


def choice(default: str, *allowed: str) -> Any:
    """A string field that takes one of ``allowed`` values: validation checks every such field of the
    model config, whatever variant is chosen (``archlab.nn.validation``)."""
    return field(default=default, metadata={"choices": (default, *allowed)})


def setting(default: Any = MISSING, help: str = "") -> Any:
    """A command's field with the one-line description its ``--help`` prints; no default (``MISSING``)
    makes it required."""
    return field(default="???" if default is MISSING else default, metadata={"help": help})


def plain_dict(node: Any, resolve: bool = False) -> dict[str, Any]:
    """A mapping config node (a DictConfig, a structured config) as plain containers: OmegaConf types
    ``to_container`` as any container, of which a mapping node gives the dict."""
    return cast(dict[str, Any], OmegaConf.to_container(node, resolve=resolve))
