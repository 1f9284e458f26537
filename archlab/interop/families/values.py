"""Reading configs both ways: a field of an archlab config by its dotted name (``model.a.b``), the fields of
a section that differ from another's, a layer kind's own field, and the refusal of a transformers config
field; the values many ``from_hf`` read alike (a head size, the dropouts)."""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

from archlab.config import ModelConfig
from archlab.config.fields import leaves
from archlab.errors import ConfigError


def has_field(cfg: ModelConfig, field: str) -> bool:
    """Whether ``cfg`` has ``model.a.b`` (a mixer's field exists only where that mixer is chosen)."""
    try:
        value_of(cfg, field)
    except AttributeError:
        return False
    return True


def differences(have: Any, want: Any) -> list[tuple[str, Any, Any]]:
    """(field, value, wanted) for each field of config section ``have`` that differs from ``want``'s (a
    sub-config's as ``routing.top_k``); an option of another kind differs in its kind alone (the rest are
    that option's own fields)."""
    if type(have) is not type(want):
        return [("kind", have.kind, want.kind)]
    out = []
    for f in dataclasses.fields(have):
        a, b = getattr(have, f.name), getattr(want, f.name)
        if dataclasses.is_dataclass(a) and type(a) is type(b):
            out += [(f"{f.name}.{name}", x, y) for name, x, y in differences(a, b)]
        elif a != b:
            out.append((f.name, a, b))
    return out


def leaf_fields(section: Any, prefix: str) -> list[str]:
    """``prefix.<field>`` for each field of config ``section``, a sub-config's one by one
    (``model.position.scaling.factor``)."""
    return [name for name, _, _ in leaves(section, f"{prefix}.")]


def value_of(cfg: ModelConfig, field: str) -> Any:
    """The value of ``model.a.b`` in ``cfg``."""
    value = cfg
    for part in field.split(".")[1:]:
        value = getattr(value, part)
    return value


def kind_field(cfg: ModelConfig, kind: str | None, field: str) -> str:
    """``field`` (``model.attention.window``) as the field a refusal names: the kind's own
    (``model.layers.kinds.<kind>.attention.window``) where layer kind ``kind`` sets it, else ``field``."""
    if kind is None:
        return field
    value: Any = (cfg.layers.kinds or {}).get(kind, {})
    parts = field.split(".")[1:]
    for part in parts:
        if not isinstance(value, dict) or part not in value:
            return field
        value = value[part]
    return f"model.layers.kinds.{kind}.{'.'.join(parts)}"


def refuse_hf(c: Any, name: str, allowed: str, value: Any = None) -> NoReturn:
    """Refuse the HF config field ``name`` (dotted for a key of a dict field), naming its class."""
    if value is None and "." not in name:
        value = getattr(c, name, None)
    raise ConfigError(f"{type(c).__name__}.{name}", value, allowed)


def config_head_dim(c: Any) -> int:
    """A transformers config's head size: its ``head_dim`` where set, else hidden_size / heads."""
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def dropouts(residual: Any, embedding: Any) -> dict[str, Any]:
    """``model.dropout`` and ``model.embedding_dropout`` of an HF family that drops each sublayer's output
    at ``residual`` and the embeddings at ``embedding``: null where the two are equal, so a family with one
    rate reads as before. A family that drops no embeddings passes ``embedding`` 0.0."""
    residual, embedding = float(residual), float(embedding)
    return {"dropout": residual, "embedding_dropout": None if embedding == residual else embedding}
