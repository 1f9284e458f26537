"""Instantiating the config nodes of ``archlab-train`` (data, trainer, callbacks, loggers, optimizer):
each node is checked against its target's signature first, so a wrong argument is one ConfigError
naming the field instead of a TypeError from deep inside Hydra."""

from __future__ import annotations

import inspect
from typing import Any

from omegaconf import OmegaConf

from archlab.errors import ConfigError


def check_arguments(node: Any, field: str, *supplied: str) -> Any:
    """The class or function ``node._target_`` names, once sure that a call with the node's values (plus
    the arguments named in ``supplied``) would bind: ConfigError for an unknown ``_target_``, a value left
    missing (``???``), an argument the target does not take, or a required one left out."""
    from archlab.hydra_private import locate

    target = node["_target_"]
    try:
        made = locate(target)
    except Exception as err:
        raise ConfigError(
            f"{field}._target_", target, f"an importable class or function ({err.__cause__ or err})"
        ) from None
    keys = [k for k in node if not str(k).startswith("_")]
    missing = [k for k in keys if OmegaConf.is_config(node) and OmegaConf.is_missing(node, k)]
    try:
        params = inspect.signature(made).parameters
    except ValueError:  # no signature to check (some builtins): the call itself decides
        params = None
    if params is not None:
        takes = [n for n, p in params.items() if n not in supplied and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            for key in keys:
                if key not in params:
                    raise ConfigError(f"{field}.{key}", node[key], f"an argument of {target}: {', '.join(takes)}")
        if not node.get("_partial_", False):
            missing += [n for n in takes if params[n].default is params[n].empty and n not in keys]
    if missing:
        raise ConfigError(f"{field}.{missing[0]}", None, f"a value: {target} needs it (e.g. {field}.{missing[0]}=...)")
    return made


def instantiate_node(node: Any, field: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(node, **kwargs)`` after ``check_arguments``, with a ConfigError (or
    Lightning's MisconfigurationException) of the constructor itself reported as one ConfigError."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    check_arguments(node, field, *kwargs)
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        if type(cause).__name__ == "MisconfigurationException":  # Lightning's own "this setting cannot work"
            raise ConfigError(field, node["_target_"], f"settings {node['_target_']} accepts ({cause})") from None
        raise


def instantiate_group(nodes: Any, group: str) -> list[Any]:
    """Every node of a config group (``callbacks``, ``logger``), skipping those set to null."""
    return [instantiate_node(node, f"{group}.{name}") for name, node in (nodes or {}).items() if node is not None]
