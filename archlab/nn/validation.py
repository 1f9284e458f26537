"""Model validation: the whole config is checked before any tensor is allocated, by rules that hold for
every layout (sizes, probabilities, enumerated fields) and by each chosen registry entry's own
``validate``; nothing here knows a family's variants. ``entries`` gives the chosen entries, typed per
family, to whoever sums or describes them."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, NamedTuple

from archlab import checks
from archlab.config import ModelConfig
from archlab.config.layers import check_layers, kind_config, used_kinds
from archlab.errors import ConfigError
from archlab.nn.attention import ATTENTIONS, Attention
from archlab.nn.block import BLOCKS, Block
from archlab.nn.component import Component
from archlab.nn.head import HEADS, Head
from archlab.nn.mlp import MLP, MLPS
from archlab.nn.norms import NORMS, Norm
from archlab.nn.positions import POSITIONS, Position
from archlab.registry import Lookup

# model.<family> -> its registry; the family's ``kind`` picks the entry
# (attention first: the others read the head size it checks)
FAMILIES: dict[str, Lookup[type[Component]]] = {
    "attention": ATTENTIONS,
    "norm": NORMS,
    "block": BLOCKS,
    "position": POSITIONS,
    "mlp": MLPS,
    "head": HEADS,
}


def _check_choices(node: Any, path: str) -> None:
    """Every field declared with ``config.model.choice`` holds one of its values, whichever variant
    is chosen (a value a variant ignores is still checked: a typo stays a typo)."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if "choices" in f.metadata:
            checks.choice(f"{path}.{f.name}", value, f.metadata["choices"])
        elif dataclasses.is_dataclass(value):
            _check_choices(value, f"{path}.{f.name}")


def validate(cfg: ModelConfig) -> ModelConfig:
    """Raise one ConfigError naming the first inconsistent field; return the config unchanged."""
    for name in ("vocab_size", "context_length", "n_layer", "d_model"):
        checks.positive(f"model.{name}", getattr(cfg, name))
    checks.probability("model.dropout", cfg.dropout)
    checks.positive("model.init_std", cfg.init_std)
    _check_choices(cfg, "model")
    for family, registry in FAMILIES.items():
        registry.get(getattr(cfg, family).kind).validate(cfg)
    check_layers(cfg)
    for name in sorted(used_kinds(cfg)):
        _validate_kind(cfg, name)
    return cfg


def _validate_kind(cfg: ModelConfig, name: str) -> None:
    """A layer kind's config passes every check, naming the kind's own field where it set the one
    refused; a position scheme may differ per layer only between schemes that act inside attention."""
    layer = kind_config(cfg, name)
    overrides = cfg.layers.kinds[name]
    try:
        validate(layer)
    except ConfigError as err:
        family, _, rest = err.field.removeprefix("model.").partition(".")
        if rest and rest in (overrides.get(family) or {}):
            raise ConfigError(f"model.layers.kinds.{name}.{family}.{rest}", err.value, err.allowed) from None
        raise ConfigError(err.field, err.value, f"{err.allowed} (in layer kind {name})") from None
    if layer.position != cfg.position:
        for scheme in (cfg.position.kind, layer.position.kind):
            if not POSITIONS.get(scheme).in_attention:
                raise ConfigError(
                    f"model.layers.kinds.{name}.position",
                    overrides["position"],
                    f"no change while model.position.kind={cfg.position.kind} (a scheme that adds to the "
                    f"embeddings, {scheme}, is the whole model's; rotary and score-bias schemes may differ per layer)",
                )


class Entries(NamedTuple):
    """The entry ``cfg`` chooses in each family, in ``FAMILIES``' order."""

    attention: type[Attention]
    norm: type[Norm]
    block: type[Block]
    position: type[Position]
    mlp: type[MLP]
    head: type[Head]


def entries(cfg: ModelConfig) -> Entries:
    """The registry entries of the kinds ``cfg`` names (``ConfigError`` for an unknown kind)."""
    return Entries(
        attention=ATTENTIONS.get(cfg.attention.kind),
        norm=NORMS.get(cfg.norm.kind),
        block=BLOCKS.get(cfg.block.kind),
        position=POSITIONS.get(cfg.position.kind),
        mlp=MLPS.get(cfg.mlp.kind),
        head=HEADS.get(cfg.head.kind),
    )


class Ignored(NamedTuple):
    """A field the chosen variant does not use, set away from its default: harmless where a sweep crosses
    variants, a silent mistake otherwise, so training and ``archlab-check`` say so."""

    field: str  # model.mlp.aux_loss_weight
    value: Any
    variant: str  # what ignores it: model.mlp.kind=swiglu

    def __str__(self) -> str:
        return f"{self.field}={self.value!r} is ignored for this variant ({self.variant} does not use it)"


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # pyright: ignore[reportCallIssue]


def ignored(cfg: ModelConfig) -> list[Ignored]:
    """Every field of ``cfg``'s registry sections that the chosen entry does not read (``reads``) and
    that differs from the dataclass default."""
    out = []
    for family, registry in FAMILIES.items():
        section = getattr(cfg, family)
        used = registry.get(section.kind).reads(cfg)
        if used is None:
            continue
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if f.name != "kind" and f.name not in used and value != _default(f):
                out.append(Ignored(f"model.{family}.{f.name}", value, f"model.{family}.kind={section.kind}"))
    return out


def uses(cfg: ModelConfig, field: str) -> bool:
    """Whether the chosen variant reads ``field`` (``mlp.expert_d_ff``; a top-level field: always)."""
    family, _, leaf = field.rpartition(".")
    if family not in FAMILIES:
        return True
    used = FAMILIES[family].get(getattr(cfg, family).kind).reads(cfg)
    return used is None or leaf in used


def without_ignored(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with every ignored field back at its default: the same model, spelled one way (a resumed
    run's config is compared with its checkpoint's so)."""
    out = copy.deepcopy(cfg)
    for item in ignored(cfg):
        _, family, name = item.field.split(".")
        section = getattr(out, family)
        setattr(section, name, _default(next(f for f in dataclasses.fields(section) if f.name == name)))
    return out
