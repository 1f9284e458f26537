"""Field helpers for the schemas: metadata that validation and ``--help`` read; a mapping node read back as
a plain dict; a section's fields, a sub-config's one by one."""

from __future__ import annotations

import dataclasses
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


def leaves(section: Any, prefix: str = "") -> list[tuple[str, Any, dataclasses.Field]]:
    """(dotted name, value, field) of each field of config ``section``, a sub-config's one by one
    (``scaling.factor``), each name after ``prefix`` (``model.position.``)."""
    out = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            out += leaves(value, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", value, f))
    return out
