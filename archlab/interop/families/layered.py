"""What the dense Hugging Face families whose layers differ share (``LayeredFamily``): Gemma 2, Qwen2 and
Qwen3 (some layers sliding; modules ``gemma2``, ``qwen2``, ``qwen3``), Gemma 3 (text), SmolLM3, Cohere2,
EXAONE 4 and OLMo 3, each in its own module.

Each of them describes its layers per layer in its config: ``layer_types`` (sliding or full attention),
RoPE parameters per layer type (Gemma 3, OLMo 3), ``no_rope_layers`` (SmolLM3), or no position encoding on
the full-attention layers (Cohere2; EXAONE 4 when it has a sliding window). A record reads that into an
archlab ``model.layers`` layout of named kinds (``local``/``global`` where layers differ in their window,
``rope``/``nope`` where they differ only in their position encoding), the first layers in ``first`` and the
rest in a cycled ``pattern``, the shortest pair that gives every layer its kind. The other way it reads
each layer's config (``archlab.config.layers.layer_configs``) and refuses, naming the field (a layer kind's
own, ``model.layers.kinds.<kind>.attention.window``, where the kind sets it), what the family cannot
express: parts that differ between layers beyond the window and the position encoding, windows of two
sizes, RoPE that differs where the family has one set, NoPE where the family has RoPE.

Nothing here imports transformers: records read configs by attribute.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from archlab.config import (
    ModelConfig,
    PositionConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.errors import ConfigError
from archlab.interop.families.base import Family, Problem, bare
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.values import differences, kind_field, refuse_hf
from archlab.interop.families.windows import FULL, SLIDING, checked_types, layer_types, sliding_to_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.rope import RoPEConfig


class Layer(NamedTuple):
    """What differs between the layers of these families: the sliding window (None: full attention) and
    the position scheme (kind ``rope`` with its parameters, or ``none``)."""

    window: int | None
    position: PositionConfig


class _View:
    """A transformers config with some attributes replaced (a parent family's reader then sees one set of
    RoPE parameters, or no windows)."""

    def __init__(self, c: Any, changes: dict[str, Any]):
        self.__dict__.update(_c=c, _changes=changes)

    def __getattr__(self, name: str) -> Any:
        changes = self.__dict__["_changes"]
        return changes[name] if name in changes else getattr(self.__dict__["_c"], name)


def view(c: Any, **changes: Any) -> Any:
    """``c`` with ``changes``, under the class name of ``c``, so that a refusal names its config class."""
    return type(type(c).__name__, (_View,), {})(c, changes)


def rope_of(c: Any, params: Any, hd: int, where: str | None = None, partial: bool = False) -> RoPEConfig:
    """archlab's RoPE of one set of transformers rope parameters (``where``: its layer type, named in a
    refusal: ``rope_parameters.full_attention.rope_type``). Half-paired, over whole heads unless ``partial``."""
    try:
        return rope_from_hf(view(c, rope_parameters=params), hd, partial=partial)
    except ConfigError as err:
        if where is None:
            raise
        field = err.field.replace(".rope_parameters", f".rope_parameters.{where}", 1)
        raise ConfigError(field, err.value, err.allowed) from None


def per_type_rope(c: Any, types: list[str], hd: int) -> dict[str, RoPEConfig]:
    """The RoPE of each layer type present (Gemma 3, OLMo 3: ``rope_parameters`` keyed by layer type)."""
    params = getattr(c, "rope_parameters", None) or {}
    out = {}
    for t in sorted(set(types)):
        if not isinstance(params.get(t), dict):
            refuse_hf(c, f"rope_parameters.{t}", f"the RoPE parameters of the {t} layers", params.get(t))
        out[t] = rope_of(c, params[t], hd, t)
    return out


def _differing(a: Any, b: Any) -> dict[str, Any]:
    """What a layer kind sets to make config section ``b`` into ``a``: the fields that differ (a
    sub-config's as a dict of its own that differ), or for an option of another kind, that kind and its
    fields away from the option's defaults."""
    if type(a) is not type(b):
        return {"kind": a.kind, **_differing(a, type(a)())}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x) and type(x) is type(y):
            inner = _differing(x, y)
            if inner:
                out[f.name] = inner
        elif x != y:
            out[f.name] = x
    return out


def laid_out(cfg: ModelConfig, layers: list[Layer]) -> ModelConfig:
    """``cfg`` with each layer's window and position scheme: the model's own parts are those of the
    full-attention layers with RoPE (else of any full-attention layer, else of any layer with RoPE), and
    layers that differ from them get a kind that overrides what differs. Kinds are named by what varies:
    ``local``/``global`` by the window, ``rope``/``nope`` by the position scheme (both joined where both
    vary apart, SmolLM3 can: ``local_nope``)."""
    full = [x for x in layers if x.window is None]
    base_window = None if full else layers[0].window
    roped = [x for x in full if x.position.kind == "rope"] or [x for x in layers if x.position.kind == "rope"]
    base_position = (roped or full or layers)[0].position
    cfg.attention.window, cfg.position = base_window, base_position
    by_window = {x.window is not None for x in layers}
    by_rope = {x.position.kind for x in layers}
    rope_follows_window = all(
        len({x.position.kind for x in layers if (x.window is not None) == s}) == 1 for s in by_window
    )

    def name(x: Layer) -> str:
        parts = ["local" if x.window is not None else "global"] if len(by_window) > 1 else []
        if len(by_rope) > 1 and not (parts and rope_follows_window):
            parts.append("rope" if x.position.kind == "rope" else "nope")
        return "_".join(parts)

    if len(by_window) == 1 and len(set(map(_key, layers))) == 1:
        cfg.attention.window, cfg.position = layers[0].window, layers[0].position
        return cfg
    kinds: dict[str, dict[str, Any]] = {}
    for x in layers:
        overrides: dict[str, Any] = {}
        if x.window != base_window:
            overrides["attention"] = {"window": x.window}
        position = _differing(x.position, base_position)
        if position:
            overrides["position"] = position
        kinds.setdefault(name(x), overrides)
    first, pattern = shortest_layout([name(x) for x in layers])
    cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
    return cfg


def _key(x: Layer) -> tuple:
    return (x.window, repr(x.position))  # a dataclass's repr: its class and every field


# the fields whose value is resolved by a rule where they are null, compared resolved
_RESOLVED_ATTENTION = {"n_kv_head": n_kv_head, "head_dim": head_dim}
_WIDTH_RULE = {"d_ff", "multiplier", "ffn_dim_multiplier", "multiple_of"}


def _uniform_values(lc: ModelConfig) -> dict[str, Any]:
    """The fields of a layer's attention and MLP that these families give every layer alike (all but the
    window), with head counts, head sizes and the MLP width resolved."""
    out = {f"model.attention.{k}": v for k, v in dataclasses.asdict(lc.attention).items() if k != "window"}
    out.update({f"model.attention.{k}": fn(lc) for k, fn in _RESOLVED_ATTENTION.items()})
    out.update({f"model.mlp.{k}": v for k, v in dataclasses.asdict(lc.mlp).items() if k not in _WIDTH_RULE})
    out["model.mlp.d_ff"] = d_ff(lc)
    return out


class LayeredFamily(Family):
    """A family whose layers differ in their window and position scheme, each layer described by
    transformers' config (``hf_layers``) and by archlab's ``layer_configs``. Subclasses name the parent
    family whose every other part they share (as the second base), and say which layers may go without
    position encoding (``nope``) and whether RoPE parameters are per layer type (``rope_per_type``). By
    default (Ministral, Gemma 2) the layers slide or not as ``layer_types`` says, with one ``sliding_window``
    and one RoPE, and the parent family reads and writes the rest, a window on every layer or none."""

    nope = False  # some layers may have no position encoding
    rope_per_type = False  # RoPE parameters per layer type (else one set for every layer with RoPE)
    layout_why = ""  # what the family's layer types give, appended to a refusal of a layer's position

    # ---- Hugging Face -> archlab

    def hf_layers(self, c: Any) -> list[Layer]:
        """Each layer's window and position scheme, read from transformers' config ``c``: by default
        ``sliding_window`` on the layers ``layer_types`` marks sliding, and every layer the one RoPE."""
        rope = self.uniform_from_hf(c).position
        return [Layer(c.sliding_window if t == SLIDING else None, rope) for t in checked_types(c)]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        """archlab's config of every part the layers share: by default the parent family's reader, on a view
        of ``c`` with no windows (others read one set of RoPE parameters too)."""
        return super().from_hf(view(c, layer_types=None, sliding_window=None))

    def from_hf(self, c: Any) -> ModelConfig:
        layers = self.hf_layers(c)
        return laid_out(self.uniform_from_hf(c), layers)

    # ---- archlab -> Hugging Face

    def layer_problems(self, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        """The family's rules on which layers slide and which have RoPE: (layer, problem) pairs."""
        return []

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        """The transformers config keys that describe the layers (layer_types, windows, RoPE per layer): by
        default ``sliding_window`` and ``layer_types``."""
        return sliding_to_hf(cfg, lcs)

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        """The keys of the parts every layer shares, from one layer's config ``rep`` (one with RoPE if any)."""
        return super().to_hf(rep)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        rep = next((lc for lc in lcs if lc.position.kind == "rope"), lcs[0])
        return {**self.uniform_to_hf(rep), **self.layers_to_hf(cfg, lcs)}

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """The parent family's problems on each layer's config (a NoPE layer passes where ``nope``), named
        as the layer's kind sets the field; then what differs between layers that the family cannot
        express: parts beyond the window and position, two window sizes, RoPE that differs where the family
        has one set (per layer type: Gemma 3, OLMo 3), and the family's rules on NoPE layers."""
        lcs = layer_configs(cfg)
        found: dict[str, Problem] = {}
        checked: set[str | None] = set()
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind in checked:
                continue
            checked.add(kind)
            for p in super().part_problems(lc):
                if self.nope and p.field == "model.position.kind" and p.value == "none":
                    continue
                name = kind_field(cfg, layer_kind(cfg, i), p.field)
                found.setdefault(name, p._replace(field=name))
        if found:
            return list(found.values())
        return [
            p._replace(field=kind_field(cfg, layer_kind(cfg, i), p.field)) for i, p in self._layout_problems(cfg, lcs)
        ][:1]

    def _layout_problems(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        first = _uniform_values(lcs[0])
        for i, lc in enumerate(lcs):
            for field, value in _uniform_values(lc).items():
                if value != first[field]:
                    why = f" ({self.title} gives every layer the same parts but for its window and position encoding)"
                    if (
                        kind_field(cfg, layer_kind(cfg, i), field)
                        == field
                        != kind_field(cfg, layer_kind(cfg, 0), field)
                    ):  # layer 0's kind sets it
                        return [(0, Problem(field, first[field], bare(value), why, (value,)))]
                    return [(i, Problem(field, value, bare(first[field]), why, (first[field],)))]
        windows = [(i, lc.attention.window) for i, lc in enumerate(lcs) if lc.attention.window is not None]
        for i, w in windows:
            if w != windows[0][1]:
                why = f" ({self.title} has one sliding_window for all its sliding layers)"
                return [(i, Problem("model.attention.window", w, f"{windows[0][1]} or null", why))]
        groups: dict[Any, ModelConfig] = {}
        for i, lc in enumerate(lcs):
            if lc.position.kind != "rope":
                continue
            group = (lc.attention.window is None) if self.rope_per_type else None
            ref = groups.setdefault(group, lc)
            differ = differences(lc.position, ref.position)
            if differ:
                field, value, wanted = differ[0]
                where = "layers of its type" if self.rope_per_type else "layers with RoPE"
                why = f" ({self.title} has one set of RoPE parameters for all its {where})"
                return [(i, Problem(f"model.position.{field}", value, bare(wanted), why, (wanted,)))]
        return self.layer_problems(lcs)


def rope_per_type_to_hf(lcs: list[ModelConfig]) -> dict[str, Any]:
    """rope_parameters by layer type (Gemma 3, OLMo 3): each type's RoPE, the other type's where no layer
    has it (transformers reads only the types its layers have)."""
    by_type = {t: rope_to_hf(lc) for t, lc in zip(layer_types(lcs), lcs)}
    return {t: by_type.get(t, next(iter(by_type.values()))) for t in (SLIDING, FULL)}


def rule_problems(lcs: list[ModelConfig], want: Any, why: str) -> list[tuple[int, Problem]]:
    """Where a layer's position kind differs from ``want(i, lc)``: (layer, problem)."""
    for i, lc in enumerate(lcs):
        wanted = want(i, lc)
        if lc.position.kind != wanted:
            return [(i, Problem("model.position.kind", lc.position.kind, wanted, why))]
    return []
