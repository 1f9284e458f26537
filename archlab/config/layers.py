"""Layers that differ: the config of each layer of a model whose ``model.layers`` gives some layers a
named kind, each kind overriding fields of the model's ``attention``, ``position``, ``mlp`` and ``block`` (a
sliding window, no position encoding, a mixture of experts, another block wiring: OLMo Hybrid's post-norm
attention layers beside pre-norm ones; the final norm stays the model's block's), or swapping the model's mixer or MLP for
another whole (``attention: {kind: mamba2, ...}``: that mixer's own fields, the model's ``n_head``;
``mlp: {kind: swiglu, d_ff: ...}``: that MLP's fields, those it shares with the model's kept), or its layers'
connections to the model's residual streams (``stream: {kind: mhc}``: on the model's ``n`` streams, which the
model widens and merges). Everything built or counted per layer reads ``layer_configs``: a layer's config is
the model's with its kind's fields merged in."""

from __future__ import annotations

import dataclasses
from typing import Optional, cast

from archlab.config.model import OPTIONS, LayersConfig, ModelConfig, MTPConfig
from archlab.errors import ConfigError

FAMILIES = ("attention", "position", "mlp", "block", "stream")  # what a layer kind may override


def layer_kind(cfg: ModelConfig, layer: int) -> Optional[str]:
    """The kind ``model.layers`` gives ``layer``: from ``first``, then ``pattern`` cycled; None for none."""
    layers = cfg.layers
    if layer < len(layers.first):
        return layers.first[layer]
    if not layers.pattern:
        return None
    return layers.pattern[(layer - len(layers.first)) % len(layers.pattern)]


def kind_config(cfg: ModelConfig, name: str) -> ModelConfig:
    """The model's config with kind ``name``'s fields set in it, and no layer kinds or multi-token prediction
    modules of its own; a family or field a kind cannot set is refused naming it. Sections a kind leaves
    alone are the model's own objects."""
    overrides = (cfg.layers.kinds or {})[name]
    where = f"model.layers.kinds.{name}"
    if not isinstance(overrides, dict):
        raise ConfigError(where, overrides, "a mapping of families to fields, e.g. {attention: {window: 512}}")
    sections = {}
    for family, fields in overrides.items():
        if family not in FAMILIES:
            raise ConfigError(
                f"{where}.{family}", fields, f"fields of {', '.join(FAMILIES)} (what may differ per layer)"
            )
        section = getattr(cfg, family)
        names = sorted(f.name for f in dataclasses.fields(section))
        if not isinstance(fields, dict):
            raise ConfigError(f"{where}.{family}", fields, f"a mapping of model.{family}'s fields to values")
        if family in OPTIONS:  # an option of the model's kind over the model's, or another option whole
            sections[family] = OPTIONS[family].build(fields, f"{where}.{family}", base=section)
            continue
        for key, value in fields.items():
            if key not in names:
                raise ConfigError(f"{where}.{family}.{key}", value, f"a field of model.{family}: {', '.join(names)}")
        sections[family] = dataclasses.replace(section, **fields)
    # a layer holds no multi-token prediction modules (the model's, after its layers, are built of layers)
    head = dataclasses.replace(cfg.head, mtp=MTPConfig()) if cfg.head.mtp.depth else cfg.head
    return dataclasses.replace(cfg, layers=LayersConfig(), head=head, **sections)


def check_layers(cfg: ModelConfig) -> dict[str, ModelConfig]:
    """``first`` and ``pattern`` name defined kinds, ``first`` fits in the model, and every kind merges;
    return each kind's config."""
    layers, kinds = cfg.layers, cfg.layers.kinds or {}
    if not isinstance(kinds, dict):
        raise ConfigError("model.layers.kinds", kinds, "null, or a mapping of kind names to overrides")
    names = sorted(kinds)
    for field in ("first", "pattern"):
        unknown = [k for k in getattr(layers, field) if k not in kinds]
        if unknown:
            allowed = (
                f"names of model.layers.kinds ({', '.join(names)})"
                if names
                else "names of model.layers.kinds (none defined)"
            )
            raise ConfigError(f"model.layers.{field}", list(getattr(layers, field)), allowed)
    if len(layers.first) > cfg.n_layer:
        raise ConfigError("model.layers.first", list(layers.first), f"at most model.n_layer={cfg.n_layer} kinds")
    return {name: kind_config(cfg, name) for name in names}


def layer_configs(cfg: ModelConfig, kinds: Optional[dict[str, ModelConfig]] = None) -> list[ModelConfig]:
    """The config of every layer, in order (each kind merged once, or taken from ``kinds``, the kinds'
    configs ``check_layers`` returned); the model's own where no kind is given."""
    by_kind: dict[Optional[str], ModelConfig] = {None: cfg}
    by_kind.update((name, c) for name, c in (kinds or {}).items())
    out = []
    for layer in range(cfg.n_layer):
        kind = layer_kind(cfg, layer)
        if kind not in by_kind:
            by_kind[kind] = kind_config(cfg, cast(str, kind))
        out.append(by_kind[kind])
    return out


def used_kinds(cfg: ModelConfig) -> set[str]:
    """The kinds some layer is given."""
    return {k for k in (layer_kind(cfg, i) for i in range(cfg.n_layer)) if k is not None}
