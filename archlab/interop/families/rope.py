"""RoPE both ways: archlab's position config <-> transformers' ``rope_parameters`` (partial rotary,
linear, llama3 and YaRN scaling)."""

from __future__ import annotations

import math
from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.rope import RoPEConfig, RoPEScalingConfig, attention_factor, rotary_dim

# RoPE scalings archlab implements, and the rope_parameters keys each one reads (yarn: as transformers'
# _compute_yarn_parameters reads them; DeepSeek's families alone convert it, see hf_sparse).
_ROPE_KEYS = {
    "default": {"rope_type", "rope_theta", "partial_rotary_factor"},
    "linear": {"rope_type", "rope_theta", "partial_rotary_factor", "factor"},
    "llama3": {
        "rope_type",
        "rope_theta",
        "partial_rotary_factor",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    },
    "yarn": {
        "rope_type",
        "rope_theta",
        "partial_rotary_factor",
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
        "attention_factor",
    },
    "longrope": {
        "rope_type",
        "rope_theta",
        "partial_rotary_factor",
        "factor",
        "original_max_position_embeddings",
        "short_factor",
        "long_factor",
        "attention_factor",
    },
}

# ---------------------------------------------------------------- RoPE both ways


def rope_fraction(cfg: ModelConfig) -> float:
    """partial_rotary_factor for cfg's rotary dims r of a head of hd: transformers rotates int(hd · factor)
    dims, and hd · (r / hd) can fall just below r in floating point; the next float up then reaches it."""
    hd, r, p = head_dim(cfg), rotary_dim(cfg), cfg.position
    fraction = p.rotary_fraction if p.rotary_fraction is not None else r / hd
    while int(hd * fraction) < r:
        fraction = math.nextafter(fraction, 1.0)
    return fraction


def rope_to_hf(cfg: ModelConfig, fraction: float | None = None) -> dict[str, Any]:
    """transformers' rope_parameters for cfg's RoPE (with partial_rotary_factor when ``fraction``)."""
    p, s = cfg.position, cfg.position.scaling
    params: dict[str, Any] = {"rope_type": "default" if s.kind == "none" else s.kind, "rope_theta": p.theta}
    if s.kind != "none":
        params["factor"] = s.factor
    if s.kind == "llama3":
        params.update(
            low_freq_factor=s.low_freq_factor,
            high_freq_factor=s.high_freq_factor,
            original_max_position_embeddings=s.original_context,
        )
    if s.kind == "yarn":
        params.update(original_max_position_embeddings=s.original_context, beta_fast=s.beta_fast, beta_slow=s.beta_slow)
        if not s.truncate:  # transformers' default is true: written only when false (gpt-oss's published configs)
            params["truncate"] = False
        if s.mscale is not None:  # with mscale_all_dim (archlab's validation asks for both or neither)
            params.update(mscale=s.mscale, mscale_all_dim=s.mscale_all_dim)
    if s.kind == "longrope":
        params.update(
            original_max_position_embeddings=s.original_context,
            short_factor=list(s.short_factor or []),
            long_factor=list(s.long_factor or []),
        )
        if s.attention_factor is not None:
            params["attention_factor"] = s.attention_factor
    if fraction is not None:
        params["partial_rotary_factor"] = fraction
    return params


def rope_from_hf(
    c: Any,
    hd: int,
    partial: bool,
    scalings: tuple[str, ...] = ("default", "linear", "llama3"),
    yarn_softmax: bool = True,
    ignored: frozenset[str] = frozenset(),
) -> RoPEConfig:
    """archlab's RoPE from transformers' rope_parameters (``partial``: the family rotates part of a head;
    ``scalings``: the rope_types this family converts; ``yarn_softmax``: its YaRN scales the softmax by
    ``mscale_all_dim`` as DeepSeek's does, else cos and sin alone, as transformers' generic yarn;
    ``ignored``: keys the family reads that change nothing for text, left unread)."""
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if any(isinstance(v, dict) for v in rope.values()):
        refuse_hf(c, "rope_parameters", "one set of RoPE parameters for every layer", rope)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in scalings:
        names = ", ".join(repr(s) for s in scalings)
        refuse_hf(
            c, "rope_parameters.rope_type", f"one of {names} (the scalings archlab converts for this family)", rope_type
        )
    for key in sorted(set(rope) - _ROPE_KEYS[rope_type] - {"type"} - ignored):
        refuse_hf(
            c, f"rope_parameters.{key}", f"absent for rope_type={rope_type!r} (archlab has no such setting)", rope[key]
        )
    fraction = rope.get("partial_rotary_factor", 1.0)
    dims = int(hd * fraction)
    position = RoPEConfig(theta=float(rope.get("rope_theta", 10000.0)), pairing="half")
    if fraction != 1.0:
        if not partial:
            refuse_hf(c, "rope_parameters.partial_rotary_factor", "1.0 (this family rotates whole heads)", fraction)
        if dims <= 0 or dims % 2:
            refuse_hf(
                c,
                "rope_parameters.partial_rotary_factor",
                f"a fraction of head_dim={hd} that rotates an even number of dims",
                fraction,
            )
        if abs(hd * fraction - dims) <= 1e-6:
            position.rotary_fraction = fraction
        else:
            position.rotary_dim = dims
    if rope_type in ("linear", "llama3"):
        position.scaling = RoPEScalingConfig(kind=rope_type, factor=float(rope["factor"]))
    if rope_type == "llama3":
        position.scaling.low_freq_factor = float(rope["low_freq_factor"])
        position.scaling.high_freq_factor = float(rope["high_freq_factor"])
        position.scaling.original_context = int(rope["original_max_position_embeddings"])
    if rope_type == "longrope":
        position.scaling = _longrope_from_hf(c, rope)
    if rope_type == "yarn":
        position.scaling = _yarn_from_hf(c, rope, yarn_softmax)
    return position


def _longrope_from_hf(c: Any, rope: dict[str, Any]) -> RoPEScalingConfig:
    """LongRoPE's fields as transformers reads them: a missing factor is max_position_embeddings over
    original_max_position_embeddings (Phi-3's configs give none); a given attention_factor is kept as
    ``model.position.scaling.attention_factor``, else archlab derives it from factor as transformers does."""
    original = int(rope["original_max_position_embeddings"])
    given_factor = rope.get("factor")
    factor = float(given_factor if given_factor is not None else c.max_position_embeddings / original)
    if factor < 1:
        name = "rope_parameters.factor" if given_factor is not None else "max_position_embeddings"
        value = given_factor if given_factor is not None else c.max_position_embeddings
        refuse_hf(c, name, f"a factor >= 1 for longrope (max_position_embeddings >= the original {original})", value)
    given = rope.get("attention_factor")
    return RoPEScalingConfig(
        kind="longrope",
        factor=factor,
        original_context=original,
        short_factor=[float(f) for f in rope["short_factor"]],
        long_factor=[float(f) for f in rope["long_factor"]],
        attention_factor=None if given is None else float(given),
    )


def _yarn_from_hf(c: Any, rope: dict[str, Any], softmax: bool) -> RoPEScalingConfig:
    """YaRN's fields as transformers reads them: a missing factor is max_position_embeddings over the
    original context, a missing (or zero) beta_fast / beta_slow is 32 / 1, and mscale counts only with
    mscale_all_dim (a zero one is absent), a missing truncate is true (the band's ends rounded outward).
    archlab derives the attention factor from factor and the two mscales. ``softmax``: mscale_all_dim also
    scales the softmax (DeepSeek), where one mscale alone means something else, so is refused; else (the
    generic yarn) the two scale cos and sin alone (``softmax_mscale`` false), and one alone is ignored."""
    original = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor")
    scaling = RoPEScalingConfig(
        kind="yarn",
        original_context=original,
        factor=float(factor if factor is not None else c.max_position_embeddings / original),
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
    )
    mscale, all_dim = rope.get("mscale") or None, rope.get("mscale_all_dim") or None
    if not softmax and (mscale is None or all_dim is None):
        mscale = all_dim = None  # transformers' generic yarn reads neither without the other
    if (mscale is None) != (all_dim is None):
        name = "mscale" if all_dim is None else "mscale_all_dim"
        refuse_hf(
            c,
            f"rope_parameters.{name}",
            "mscale and mscale_all_dim both set, or both absent (transformers ignores mscale alone, and applies "
            "mscale_all_dim alone to the softmax only)",
            rope[name],
        )
    scaling.mscale = None if mscale is None else float(mscale)
    scaling.mscale_all_dim = None if all_dim is None else float(all_dim)
    scaling.softmax_mscale = softmax or all_dim is None
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        refuse_hf(c, "rope_parameters.truncate", "true or false", truncate)
    scaling.truncate = truncate
    given = rope.get("attention_factor")
    if given is not None and not math.isclose(given, attention_factor(scaling), rel_tol=1e-12):
        refuse_hf(
            c,
            "rope_parameters.attention_factor",
            f"absent or {attention_factor(scaling)} (archlab derives it from factor, mscale and mscale_all_dim)",
            given,
        )
    return scaling
