"""The config classes of one registry family's options, one class per ``kind``, each holding exactly the
fields its option reads (``model.attention``'s mixers, ``model.position``'s schemes, ``model.mlp``'s
MLPs): registering a class beside its option, building one from values (a field the option lacks refused
naming the option and its fields), the node Hydra composes the section into, and what a composed section
sets for other options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Callable, Optional, TypeVar, get_type_hints

from omegaconf import DictConfig, OmegaConf

from archlab.errors import ConfigError

Class = TypeVar("Class", bound=type)


@dataclass
class Options:
    """The options of the section ``model.<section>``, whose config classes derive from ``base``. When a
    layer kind names another option, the new option starts from its own defaults and keeps the ``base``
    fields of the model's section, or (``keep_shared``) every field the two options share: MLPs, whose
    fields of one name mean one thing in every kind, and residual streams' (``n``), unlike mixers' (a head_dim of
    attention and of Mamba-2)."""

    section: str  # "mlp"
    noun: str  # "MLP": how an error names an option
    base: type  # its fields are every option's
    keep_shared: bool = False
    classes: dict[str, type] = field(default_factory=dict)  # kind -> config class, filled as options register
    subs: dict[str, type] = field(default_factory=dict)  # field -> its sub-config class (``routing``), likewise

    def register(self, kind: str) -> Callable[[Class], Class]:
        """Register the decorated subclass of ``base`` as the config of option ``kind``."""

        def register(cls: Class) -> Class:
            if not issubclass(cls, self.base) or getattr(cls, "kind", None) != kind:
                raise TypeError(f"{cls.__name__}: a {self.base.__name__} subclass whose kind defaults to {kind!r}")
            self.classes[kind] = cls
            self.subs.update((name, hint) for name, hint in get_type_hints(cls).items() if _sub_class(hint))
            return cls

        return register

    def of(self, kind: Any, where: str) -> type:
        """The config class of ``kind`` (``where``: the field naming it), or a ConfigError naming them all."""
        if kind not in self.classes:
            raise ConfigError(where, kind, f"one of {sorted(self.classes)}")
        return self.classes[kind]

    def fields(self, kind: str) -> tuple[str, ...]:
        """The fields of option ``kind``'s config, in its class's order."""
        return tuple(f.name for f in fields(self.classes[kind]))

    def values(self, values: dict[str, Any], where: str, base: Any = None) -> tuple[type, dict[str, Any]]:
        """The class of the option ``values`` names by ``kind`` (else ``base``'s kind) and its fields:
        ``values`` over ``base`` where the kind is ``base``'s, else over that option's defaults with what
        it keeps of ``base`` (see the class); a sub-config's values merged into ``base``'s. A field the
        option lacks is refused in one line naming the option and its fields."""
        kind = values.get("kind", base.kind if base is not None else self.base.kind)
        cls = self.of(kind, f"{where}.kind")
        own = self.fields(kind)
        for key, value in values.items():
            if key not in own:
                raise ConfigError(f"{where}.{key}", value, f"a field of {self.noun} {kind}: {', '.join(own)}")
        start: dict[str, Any] = {}
        if base is not None:
            kept = own if base.kind == kind or self.keep_shared else self.fields_of_base()
            start = {name: getattr(base, name) for name in kept if hasattr(base, name)}
        merged = {**start, "kind": kind}
        for key, value in values.items():
            merged[key] = _merged(merged.get(key), value) if isinstance(value, dict) else value
        return cls, merged

    def fields_of_base(self) -> tuple[str, ...]:
        """The fields every option has (the base class's)."""
        return tuple(f.name for f in fields(self.base))

    def build(self, values: dict[str, Any], where: str, base: Any = None) -> Any:
        """The config ``values`` gives, as its dataclass (a layer kind's merge: as cheap as
        ``dataclasses.replace``; ``typed`` type-checks a model's own section once)."""
        cls, fields_of = self.values(values, where, base)
        subs = {
            k: _sub(self.subs[k], v, f"{where}.{k}")
            for k, v in fields_of.items()
            if isinstance(v, dict) and k in self.subs
        }
        return cls(**{**fields_of, **subs})

    def make(self, **values: Any) -> Any:
        """The config of ``values`` (a ``kind`` and its fields; a sub-config as a dict or its dataclass)."""
        return self.build(values, f"model.{self.section}")

    def typed(self, values: Any, where: str) -> Any:
        """``values`` (a dict, or a config object already) as its option's config, type-checked as Hydra does."""
        if isinstance(values, self.base):
            return values
        cls, fields_of = self.values(dict(values), where)
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), fields_of))

    def schema(self) -> Any:
        """The node Hydra composes ``model.<section>`` into: every registered option's fields, unset
        (``???``) but the base's, so a preset, an option and the command line may each set any of them (a
        name no option has fails in Hydra); ``to_model_config`` keeps the chosen option's and reports the
        rest (``config.model.left_out``)."""
        types: dict[str, Any] = {}
        base = set(self.fields_of_base())
        for cls in self.classes.values():
            for name, kind in get_type_hints(cls).items():
                if name not in base:
                    types[name] = kind if types.get(name, kind) == kind else Any
        spec = [
            # a sub-config at its defaults, so that one of its fields may be set alone (Hydra)
            (n, k, field(default_factory=self.subs[n])) if n in self.subs else (n, Optional[k], field(default="???"))
            for n, k in types.items()
        ]
        return OmegaConf.structured(make_dataclass(self.schema_name, spec, bases=(self.base,)))

    @property
    def schema_name(self) -> str:
        """The name of ``schema``'s class, by which ``composed`` knows a node of it."""
        return f"{self.base.__name__}Fields"

    def composed(self, node: Any) -> bool:
        """Whether ``node`` is a section Hydra composed onto ``schema``."""
        return isinstance(node, DictConfig) and getattr(OmegaConf.get_type(node), "__name__", "") == self.schema_name

    def split(self, values: dict[str, Any], kind: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Set fields (unset: ``???``) split into the rest and another option's fields that option ``kind``
        lacks: its own and any name no option has stay, which building refuses (a typo stays an error)."""
        own = self.fields(kind) if kind in self.classes else tuple(values)
        others = {f.name for cls in self.classes.values() for f in fields(cls)} - set(own)
        subs = self._sub_defaults()  # a sub-config at its defaults sets nothing
        values = {k: v for k, v in values.items() if v != "???" and not (k in subs and v == subs[k])}
        return {k: v for k, v in values.items() if k not in others}, {k: v for k, v in values.items() if k in others}

    def set_fields(self, name: str, value: Any) -> list[tuple[str, Any]]:
        """(field, value) of what a section's ``name`` sets: the field itself, or for a sub-config each of
        its fields away from its default (``routing.top_k``)."""
        default = self._sub_defaults().get(name)
        if default is None or not isinstance(value, dict):
            return [(name, value)]
        return [(f"{name}.{k}", v) for k, v in value.items() if default.get(k) != v]

    def _sub_defaults(self) -> dict[str, dict[str, Any]]:
        """Each sub-config field's default values, as a dict (the schema holds them unless set)."""
        return {name: dataclasses.asdict(sub()) for name, sub in self.subs.items()}

    def recorded(self, values: dict[str, Any], kind: str) -> dict[str, Any]:
        """A section recorded when every option's fields sat side by side, as option ``kind``'s: a
        sub-config's fields gathered under its name (a sub-config recorded as one value is its ``kind``:
        ``scaling: yarn``), the fields the option lacks (it never read them) dropped; one of today's form
        is returned as it is."""
        if kind not in self.classes:
            return values
        out = dict(values)
        for name, sub in self.subs.items():
            if name in self.fields(kind):
                names = {f.name for f in fields(sub)} - {"kind"}
                given = out.get(name)
                inner = {k: out.pop(k) for k in list(out) if k in names}
                if isinstance(given, str):
                    out[name] = {"kind": given, **inner}
                elif inner:
                    out[name] = {**(given or {}), **inner}
        return self.own_fields(out, kind)

    def own_fields(self, section: dict[str, Any], kind: str) -> dict[str, Any]:
        """``section``'s fields that option ``kind`` has (all of them for a kind not registered)."""
        names = self.fields(kind) if kind in self.classes else tuple(section)
        return {k: v for k, v in section.items() if k in names}


def _sub_class(kind: Any) -> Any:
    """The sub-config class a field's type is, else None."""
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def _merged(base: Any, values: dict[str, Any]) -> dict[str, Any]:
    """A sub-config's ``values`` over ``base`` (a dataclass or dict of it, or None)."""
    if base is None or isinstance(base, dict):
        return {**(base or {}), **values}
    return {**{f.name: getattr(base, f.name) for f in fields(base)}, **values}


def _sub(sub: type, values: dict[str, Any], where: str) -> Any:
    """Sub-config class ``sub`` built from ``values``, a field it lacks refused naming its fields."""
    own = tuple(f.name for f in fields(sub))
    for key, value in values.items():
        if key not in own:
            raise ConfigError(f"{where}.{key}", value, f"a field of {where}: {', '.join(own)}")
    return sub(**values)
