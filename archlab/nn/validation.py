"""Model validation: the whole config is checked before any tensor is allocated, by rules that hold for
every layout (sizes, probabilities, enumerated fields) and by each chosen registry entry's own
``validate``; nothing here knows a family's variants. ``entries`` gives the chosen entries, typed per
family, to whoever sums or describes them."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, NamedTuple, Optional

from archlab import checks
from archlab.config import ModelConfig
from archlab.config.fields import leaves
from archlab.config.layers import check_layers, kind_config, layer_configs, used_kinds
from archlab.config.loop import check_loop, unread_loop
from archlab.config.shared import check_shared, unread_shared
from archlab.errors import ConfigError
from archlab.nn import bitlinear, ngram_input, per_layer_inputs
from archlab.nn.block import BLOCKS, Block
from archlab.nn.component import Component
from archlab.nn.head import HEADS, Head
from archlab.nn.loop import validate_injection
from archlab.nn.mixers.base import MIXERS, Mixer
from archlab.nn.mixers.shared_index import check_shared_index
from archlab.nn.mixers.shared_kv import check_shared_kv
from archlab.nn.mlp import MLP, MLPS
from archlab.nn.mtp import MultiTokenPrediction
from archlab.nn.norms import NORMS, Norm
from archlab.nn.positions import POSITIONS, Position
from archlab.nn.streams import STREAMS, Stream
from archlab.nn.streams.base import check_layer_stream
from archlab.registry import Lookup

# model.<family> -> its registry; the family's ``kind`` picks the entry
# (attention first: the others read the head size it checks)
FAMILIES: dict[str, Lookup[type[Component]]] = {
    "attention": MIXERS,
    "norm": NORMS,
    "block": BLOCKS,
    "position": POSITIONS,
    "mlp": MLPS,
    "head": HEADS,
    "stream": STREAMS,
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


class Resolved(NamedTuple):
    """A validated model config and each layer's config (its kind's fields merged in), derived once: the
    one object counting, building and checking read (``resolve``)."""

    cfg: ModelConfig
    layers: tuple[ModelConfig, ...]


def resolve(cfg: ModelConfig | Resolved) -> Resolved:
    """``cfg`` validated once, with its per-layer configs; a ``Resolved`` is returned as it is."""
    if isinstance(cfg, Resolved):
        return cfg
    kinds = _validate(cfg)
    return Resolved(cfg, tuple(layer_configs(cfg, kinds)))


def validate(cfg: ModelConfig) -> ModelConfig:
    """Raise one ConfigError naming the first inconsistent field; return the config unchanged."""
    _validate(cfg)
    return cfg


def _validate(cfg: ModelConfig, whole: bool = True) -> dict[str, ModelConfig]:
    """``validate``'s checks; return each layer kind's config, merged once. ``whole``: ``cfg`` is a model's,
    not a layer kind's (whose layers' relations, such as which serves a kv_shared one, are the model's)."""
    for name in ("vocab_size", "context_length", "n_layer", "d_model"):
        checks.positive(f"model.{name}", getattr(cfg, name))
    checks.probability("model.dropout", cfg.dropout)
    if cfg.embedding_dropout is not None and not 0.0 <= checks.finite(cfg.embedding_dropout) < 1.0:
        raise ConfigError(
            "model.embedding_dropout", cfg.embedding_dropout, "a probability in [0, 1), or null (model.dropout's rate)"
        )
    checks.positive("model.init_std", cfg.init_std)
    if cfg.residual_init_depth is not None:
        checks.integer("model.residual_init_depth", cfg.residual_init_depth, 1, "a positive integer, or null (n_layer)")
    if cfg.embedding_init_std is not None:
        checks.positive("model.embedding_init_std", cfg.embedding_init_std, "a positive number, or null (init_std)")
    for name in ("scale_embedding", "embedding_norm"):
        if not isinstance(getattr(cfg, name), bool):
            raise ConfigError(f"model.{name}", getattr(cfg, name), "true or false")
    checks.positive("model.embedding_multiplier", cfg.embedding_multiplier)
    if cfg.scale_embedding and cfg.embedding_multiplier != 1.0:  # one factor, not a product of two roundings
        raise ConfigError(
            "model.embedding_multiplier",
            cfg.embedding_multiplier,
            "1.0 while model.scale_embedding is true (that multiplies by sqrt(d_model), rounded to the "
            "activations' dtype as Gemma does); for another factor, scale_embedding=false and the whole "
            "factor here",
        )
    if cfg.embedding_dim is not None:
        checks.integer("model.embedding_dim", cfg.embedding_dim, allowed="a positive integer, or null (d_model)")
        if cfg.embedding_dim == cfg.d_model:
            raise ConfigError(
                "model.embedding_dim",
                cfg.embedding_dim,
                f"null for embeddings of d_model={cfg.d_model} (a width other than d_model adds the projections)",
            )
    _check_choices(cfg, "model")
    per_layer_inputs.validate(cfg)
    bitlinear.validate(cfg, MIXERS.get(cfg.attention.kind), MLPS.get(cfg.mlp.kind))
    for family, registry in FAMILIES.items():
        registry.get(getattr(cfg, family).kind).validate(cfg)
    MultiTokenPrediction.validate(cfg)
    kinds = check_layers(cfg)
    mtp_kind = {cfg.head.mtp.layer} & set(kinds) if cfg.head.mtp.depth and cfg.head.mtp.layer is not None else set()
    for name in sorted(used_kinds(cfg) | mtp_kind):
        _validate_kind(cfg, name, kinds[name])
    check_loop(cfg)
    ngram_input.validate(cfg)
    validate_injection(cfg)
    check_shared(cfg)
    if whole:
        check_shared_kv(cfg, layer_configs(cfg, kinds))
        check_shared_index(cfg, layer_configs(cfg, kinds))
    return kinds


def _validate_kind(cfg: ModelConfig, name: str, layer: ModelConfig) -> None:
    """A layer kind's config ``layer`` passes every check, naming the kind's own field where it set the one
    refused; a position scheme may differ per layer only between schemes that act inside attention."""
    overrides = cfg.layers.kinds[name]
    check_layer_stream(cfg, layer, f"model.layers.kinds.{name}.stream")  # before the layer's own checks of it
    try:
        _validate(layer, whole=False)
    except ConfigError as err:
        family, _, rest = err.field.removeprefix("model.").partition(".")
        if rest and rest in (overrides.get(family) or {}):
            raise ConfigError(f"model.layers.kinds.{name}.{family}.{rest}", err.value, err.allowed) from None
        raise ConfigError(err.field, err.value, f"{err.allowed} (in layer kind {name})") from None
    if getattr(cfg.attention, "value_residual", False) and layer.attention != cfg.attention:
        raise ConfigError(
            f"model.layers.kinds.{name}.attention",
            overrides["attention"],
            "no change with model.attention.value_residual=true (every layer mixes its values with the first's)",
        )
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

    attention: type[Mixer]
    norm: type[Norm]
    block: type[Block]
    position: type[Position]
    mlp: type[MLP]
    head: type[Head]
    stream: type[Stream]


def entries(cfg: ModelConfig) -> Entries:
    """The registry entries of the kinds ``cfg`` names (``ConfigError`` for an unknown kind)."""
    return Entries(
        attention=MIXERS.get(cfg.attention.kind),
        norm=NORMS.get(cfg.norm.kind),
        block=BLOCKS.get(cfg.block.kind),
        position=POSITIONS.get(cfg.position.kind),
        mlp=MLPS.get(cfg.mlp.kind),
        head=HEADS.get(cfg.head.kind),
        stream=STREAMS.get(cfg.stream.kind),
    )


class Ignored(NamedTuple):
    """A field the chosen variant does not use, set away from its default: harmless where a sweep crosses
    variants, a silent mistake otherwise, so training and ``archlab-check`` say so."""

    field: str  # model.mlp.aux_loss_weight
    value: Any
    why: str  # model.mlp.kind=swiglu does not use it

    def __str__(self) -> str:
        return f"{self.field}={self.value!r} is ignored for this variant ({self.why})"


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # pyright: ignore[reportCallIssue]


def _reads(cfg: ModelConfig, family: str) -> Optional[frozenset[str]]:
    return FAMILIES[family].get(getattr(cfg, family).kind).reads(cfg)


def _why(cfg: ModelConfig, family: str, field: str, where: str = "") -> str:
    """Why ``field`` of ``family``'s section goes unread: the entry's reason (another field takes its
    place), else that the chosen kind does not use it."""
    kind = getattr(cfg, family).kind
    return FAMILIES[family].get(kind).unread(cfg, field) or f"model.{family}.kind={kind}{where} does not use it"


def ignored(cfg: ModelConfig) -> list[Ignored]:
    """Every field set away from its dataclass default that no chosen entry reads (``reads``; a
    sub-config's fields one by one, ``scaling.factor``): of the model's sections (read by its own entries
    or by a layer kind's built from them), of a layer kind's overrides (read by that layer's entries), and
    a layer kind no layer is given, the loop's range where it makes no loop, and the per-layer inputs' table
    and activation where there are none."""
    kinds = cfg.layers.kinds or {}
    used = sorted(used_kinds(cfg))
    layers = {name: kind_config(cfg, name) for name in used}
    out = []
    for family in FAMILIES:
        section = getattr(cfg, family)
        reads = [_reads(c, family) for c in (cfg, *layers.values())]
        if any(r is None for r in reads):
            continue
        read = frozenset().union(*(r for r in reads if r is not None))
        for name, value, default in _fields(section):
            if name != "kind" and not _is_read(name, read) and value != default:
                out.append(Ignored(f"model.{family}.{name}", value, _why(cfg, family, name)))
    for name, layer in layers.items():
        for family, fields in kinds[name].items():
            read = _reads(layer, family)
            for field, value in _dotted(fields or {}):
                if read is not None and field != "kind" and not _is_read(field, read):
                    why = _why(layer, family, field, f" in layer kind {name}")
                    out.append(Ignored(f"model.layers.kinds.{name}.{family}.{field}", value, why))
    for name in sorted(set(kinds) - set(used)):
        out.append(Ignored(f"model.layers.kinds.{name}", kinds[name], "no layer is given it"))
    out += [Ignored(field, value, "model.layers.loop.passes=1: no loop") for field, value in unread_loop(cfg)]
    out += [Ignored(field, value, why) for field, value, why in unread_shared(cfg)]
    no_inputs = "model.per_layer_input.dim=0: no per-layer inputs"
    out += [Ignored(field, value, no_inputs) for field, value in per_layer_inputs.unread(cfg)]
    out += [
        Ignored(field, value, "model.linear.kind=dense: full-precision projections")
        for field, value in bitlinear.unread(cfg)
    ]
    return out


def _fields(section: Any) -> list[tuple[str, Any, Any]]:
    """(name, value, default) of each field of a config section, a sub-config's as ``sub.field``."""
    return [(name, value, _default(f)) for name, value, f in leaves(section)]


def _dotted(values: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, value) of a layer kind's overrides, a sub-config's as ``sub.field``."""
    return [
        (f"{k}.{name}", value) if isinstance(v, dict) else (k, v)
        for k, v in values.items()
        for name, value in (v.items() if isinstance(v, dict) else [(None, v)])
    ]


def _is_read(name: str, read: frozenset[str]) -> bool:
    """Whether field ``name`` (``scaling.factor``) is among ``read``, or its sub-config is, whole."""
    return name in read or name.partition(".")[0] in read


def uses(cfg: ModelConfig, field: str) -> bool:
    """Whether the chosen variant reads ``field`` (``mlp.expert_d_ff``, ``position.scaling.factor``) in the
    model's parts or a layer kind's built from them (a top-level field: always)."""
    family, _, rest = field.partition(".")
    if family not in FAMILIES or not rest:
        return True
    configs = [cfg, *(kind_config(cfg, name) for name in sorted(used_kinds(cfg)))]
    return any((read := _reads(c, family)) is None or _is_read(rest, read) for c in configs)


def without_ignored(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with every ignored field back at its default: the same model, spelled one way (a resumed
    run's config is compared with its checkpoint's so)."""
    out = copy.deepcopy(cfg)
    for item in ignored(cfg):
        path = item.field.split(".")[1:]
        if path[:2] == ["layers", "kinds"]:  # a layer kind no layer is given, or a field a kind's layer does not read
            node, *keys = out.layers.kinds, *path[2:]
            for key in keys[:-1]:
                node = node[key]
            del node[keys[-1]]
            continue
        node = out
        for key in path[:-1]:  # the section, and a sub-config in it
            node = getattr(node, key)
        setattr(node, path[-1], _default(next(f for f in dataclasses.fields(node) if f.name == path[-1])))
    return out
