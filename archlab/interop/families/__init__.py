"""The Hugging Face families archlab converts, one record (a ``base.Family``) each, a module per family or
a tight group of them. Every module of this package is imported here and its ``RECORDS`` (a tuple of
records) joined into ``FAMILIES`` by ``model_type``: a model_type has one record (a second is refused at
import), and the order ``hf.family_of`` tries them in is stated in ``_collect``. Adding a family is its
record module (its config keys copied as they are in ``keys``, the rest computed in ``to_hf`` and
``from_hf``; its tensor names in ``tensors``; ``RECORDS`` at the end) and its tests: nothing else.
``refused.REFUSED`` names the families archlab does not convert; a record supersedes its entry
(``refusals``). Shared parts: ``base`` (the record, ``FEATURES``, the rules many state), ``tensors`` (tensor maps),
``values`` and ``mlps`` (config fields and MLP sections both ways), ``rope`` and ``windows``
(RoPE and sliding windows both ways), ``dense`` and ``moe`` (the tables that route a layout; the MoE parts in
``experts``). A record is at most three classes below ``Family``: a relative reuses another's parts through
functions and declared data, not a subclass of a subclass."""

from __future__ import annotations

import importlib
import pkgutil

from archlab.interop.families.base import Family
from archlab.interop.families.refused import REFUSED, Refused


def _collect() -> dict[str, Family]:
    """Every module's ``RECORDS``, by ``model_type`` (a model_type with two records is refused), in this
    order: the families the layout tables route to (a module's ``ROUTES``, by module name: ``dense``'s,
    then ``moe``'s), then by name the others, those whose layers may differ (``model.layers`` among their
    features) first, then likewise those that defer to another (``Family.defers``)."""
    found: dict[str, tuple[str, Family]] = {}
    routes: list[str] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        routes += getattr(module, "ROUTES", ())
        for record in getattr(module, "RECORDS", ()):
            if record.model_type in found:
                raise ImportError(
                    f"model_type {record.model_type!r} has two records: in families.{found[record.model_type][0]} "
                    f"and in families.{info.name}"
                )
            found[record.model_type] = (info.name, record)

    def rank(t: str) -> tuple:
        record = found[t][1]
        layered = bool(record.features & {"model.layers.first", "model.layers.pattern"})
        if t in routes:
            return (0, routes.index(t), t)
        return (1, record.defers, not layered, t)

    return {t: found[t][1] for t in sorted(found, key=rank)}


# by Hugging Face model_type, in ``_collect``'s order, which ``hf.family_of`` tries them in
FAMILIES: dict[str, Family] = _collect()


def refusals() -> dict[str, Refused]:
    """``refused.REFUSED`` less the model_types a record converts: a family that gains a record is no
    longer refused, whatever the table says."""
    return {t: r for t, r in REFUSED.items() if t not in FAMILIES}
