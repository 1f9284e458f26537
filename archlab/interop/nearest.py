"""The export hint of a layout that no Hugging Face class holds: the nearest class and every change that
makes it hold the layout. A family's check can stop at the first problem of a kind (GraniteMoeSWA names
the sinks, then, once they are set, its mixture of experts), so the changes are found by making them, one
round of problems at a time, until the family holds the result; classes that keep the layout's own parts
(its mixers and ``model.layers``) rank first, as a study of that layout needs them kept."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from archlab.config import ModelConfig
from archlab.config.model import with_fields
from archlab.errors import ConfigError
from archlab.interop.families.base import Family, Problem, first_per_field
from archlab.interop.families.values import has_field, value_of
from archlab.nn.validation import validate

ROUNDS = 6  # rounds of changes tried before a route counts as incomplete


class Route(NamedTuple):
    """What ``family`` needs changed to hold a layout: each field once, with the layout's own value."""

    family: Family
    problems: list[Problem]
    complete: bool  # setting each field to its first allowed value makes the family hold the layout

    def keeps_layout(self) -> bool:
        """Whether the route leaves the per-layer parts (``model.layers.*``: the pattern, the first layers, a
        layer kind's fields) as the layout has them."""
        return not any(p.field.startswith("model.layers.") for p in self.problems)


def _changes(problems: list[Problem]) -> dict[str, Any]:
    """Each problem's field (``model.a.b``) at its first allowed value, as the nested dict ``with_fields``
    takes: ``{"a": {"b": value}}``."""
    out: dict[str, Any] = {}
    for p in problems:
        *path, leaf = p.field.split(".")[1:]
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = p.allowed[0]
    return out


def _changed(cfg: ModelConfig, problems: list[Problem]) -> Optional[ModelConfig]:
    """``cfg`` with each problem's field set to its first allowed value, or None where that is no layout."""
    try:
        return validate(with_fields(cfg, _changes(problems), "the export hint"))
    except (ConfigError, ValueError, TypeError, AttributeError, KeyError):
        return None


def route(family: Family, cfg: ModelConfig) -> Route:
    """Every change ``family`` needs to hold ``cfg``: its problems, then the problems of ``cfg`` so changed,
    until none are left (complete), or a problem lists no value to set, names a field already set, or gives
    a value that is no layout (incomplete: the problems found so far)."""
    found: dict[str, Problem] = {}
    current = cfg
    for _ in range(ROUNDS):
        problems = first_per_field(family.problems(current))
        if not problems:
            return Route(family, list(found.values()), True)
        fresh = [p for p in problems if p.field not in found]
        for p in fresh:  # named with the layout's own value where it has the field
            found[p.field] = p._replace(value=value_of(cfg, p.field)) if has_field(cfg, p.field) else p
        if len(fresh) < len(problems) or not all(p.allowed for p in fresh):
            break
        changed = _changed(current, fresh)
        if changed is None:
            break
        current = changed
    return Route(family, list(found.values()), False)


def _rank(r: Route, routed: Optional[Family]) -> tuple:
    return not r.keeps_layout(), not r.complete, len(r.problems), r.family is not routed


def nearest(families: list[Family], cfg: ModelConfig, routed: Optional[Family]) -> Route:
    """The nearest of ``families`` to ``cfg``, none of which holds it: among those with its mixers, one that
    keeps its per-layer parts, then one whose changes are complete, then the fewest changes, then the
    family its parts route to; where no family has its mixers, the fewest problems of one pass (a family
    of other mixers names the mixer alone). A route only adds to its first pass, so the first pass, taken
    as complete, bounds its rank from below: routes are followed best bound first, until none can win."""
    own = [f for f in families if not f.mixer_problems(cfg)]
    first = [Route(f, first_per_field(f.problems(cfg)), True) for f in own or families]
    if not own:
        return min(first, key=lambda r: (len(r.problems), r.family is not routed))
    bounds = sorted(first, key=lambda r: _rank(r, routed))
    best = route(bounds[0].family, cfg)
    for bound in bounds[1:]:
        if _rank(best, routed) <= _rank(bound, routed):
            break
        found = route(bound.family, cfg)
        if _rank(found, routed) < _rank(best, routed):
            best = found
    return best
