"""Rotary position embeddings, ``rope`` (Su et al. 2021): the scheme, its frequency scalings for a
longer context (``linear``, ``llama3``, ``yarn`` and ``longrope`` with their attention factors), the
angle-table op, and its ``Rotation``, which rotates a fused q/k/v projection in one pass, reordering the
projection's rows where that rotates faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, PositionConfig, position_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.fused import rotary_qkv, rotates_as_complex
from archlab.nn.mixers.base import MIXERS, rotary_head_dim
from archlab.nn.positions import POSITIONS, Position, Rotation


def rotary_dim(cfg: ModelConfig) -> int:
    """How many dims of each head RoPE rotates: ``rotary_dim``, ``rotary_fraction`` or all it may
    rotate (the attention's ``rotary_head_dim``: the whole head, or mla's rotated part)."""
    p = cfg.position
    if p.rotary_dim is not None:
        return p.rotary_dim
    if p.rotary_fraction is not None:
        return round(p.rotary_fraction * rotary_head_dim(cfg))
    return rotary_head_dim(cfg)


@dataclass
class RoPEScalingConfig:
    """``model.position.scaling``: RoPE's frequency scaling for a longer context; ``kind`` picks it and
    each kind reads its own fields of these (``_SCALING_FIELDS``), one set outside them is reported."""

    kind: str = choice("none", "linear", "llama3", "yarn", "longrope")
    factor: float = 1.0  # how much longer the context is (Llama 3.1: 8, DeepSeek-V3: 40)
    low_freq_factor: float = 1.0  # llama3: wavelengths above original_context / this are divided by factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below original_context / this are kept
    original_context: Optional[int] = None  # llama3, yarn, longrope: the context before scaling (Llama 3.1: 8192)
    beta_fast: float = 32.0  # yarn: pairs turning more than this often over original_context keep their frequency
    beta_slow: float = 1.0  # yarn: pairs turning less than this often are interpolated by factor; a ramp between
    truncate: bool = True  # yarn: the ramp's ends rounded outward to whole pairs (transformers' truncate)
    mscale: Optional[float] = None  # yarn: cos/sin scaled by mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    mscale_all_dim: Optional[float] = None  # yarn: the softmax scale times mscale(factor, this)^2 (DeepSeek)
    softmax_mscale: bool = True  # yarn with mscale_all_dim: it scales the softmax as above; false: cos/sin alone
    short_factor: Optional[List[float]] = None  # longrope: pair i's wavelength times [i] while within original_context
    long_factor: Optional[List[float]] = None  # longrope: ... past it (each list: rotary dims / 2 numbers)
    attention_factor: Optional[float] = None  # yarn, longrope: cos and sin times this; None = derived from factor
    # longrope: cos and sin times this instead of attention_factor past original_context (PhiMoE's long_mscale)
    long_attention_factor: Optional[float] = None
    switch_factors: bool = True  # longrope: long_factor past original_context; false: short_factor at any length


@position_config("rope")
@dataclass
class RoPEConfig(PositionConfig):
    """``model.position`` with kind rope: the rotation (its base, the dims it turns, how dims pair) and its
    frequency ``scaling``."""

    kind: str = "rope"
    theta: float = 10000.0  # the base of the wavelengths
    rotary_dim: Optional[int] = None  # rotate only this many dims of each head
    rotary_fraction: Optional[float] = None  # ... or this fraction of them
    pairing: str = choice("half", "interleaved")  # half (rotate_half, LLaMA/NeoX) | interleaved (GPT-J)
    # proportional RoPE (Gemma 4, LFM3's global layers): only the first int(this · dims / 2) pairs of the rotated
    # dims turn, each at its own theta^(-2i/dims), the others not at all; None = every pair turns
    turning_fraction: Optional[float] = None
    scaling: RoPEScalingConfig = field(default_factory=RoPEScalingConfig)


_ROTATION = frozenset({"theta", "rotary_dim", "rotary_fraction", "pairing", "turning_fraction"})
# model.position.scaling.kind -> the fields of the scaling it reads (its mscales outside yarn: refused by validate)
_SCALING_FIELDS = {
    "none": frozenset(),
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_context"}),
    "yarn": frozenset(
        {"factor", "original_context", "beta_fast", "beta_slow", "truncate", "attention_factor", "softmax_mscale"}
    ),
    "longrope": frozenset(
        {
            "factor",
            "original_context",
            "short_factor",
            "long_factor",
            "attention_factor",
            "long_attention_factor",
            "switch_factors",
        }
    ),
}


@POSITIONS.register("rope")
class RoPE(Position):
    """Rotary embeddings (Su et al. 2021) on the first ``rotary_dim`` dims of every q/k head.

    ``half`` pairs dim i with i + r/2 (rotate_half: LLaMA, GPT-NeoX); ``interleaved`` pairs 2i with
    2i+1 (GPT-J). Angles are computed in float32 from the positions, so any length works; YaRN and
    LongRoPE scale cos and sin by their attention factor. LongRoPE picks its factors (unless
    ``switch_factors`` is off) and its attention factor (``long_attention_factor`` past the switch, where
    set) per forward, as transformers does, from the highest position (per row of a padded batch): a
    sequence longer than ``original_context`` is rotated anew, so ``switches_at`` tells decoding that a KV
    cache built up to that length goes stale.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.dim = rotary_dim(cfg)
        if cfg.position.scaling.kind == "longrope" and not MIXERS.get(cfg.attention.kind).takes_rotary():
            self.dim = 2 * len(
                cfg.position.scaling.short_factor or ()
            )  # no head of its mixer: as many pairs as the lists
        self.position_cfg = cfg.position
        self.interleaved = cfg.position.pairing == "interleaved"
        self.attention_factor = attention_factor(cfg.position.scaling)
        self.long_attention_factor = long_attention_factor(cfg.position.scaling)
        self.switches_at = cfg.position.scaling.original_context if cfg.position.scaling.kind == "longrope" else None

    def rotary(self, pos: Tensor, dtype: torch.dtype, cached: bool = False) -> RoPERotation:
        angles = _opaque_rope_angles if torch.compiler.is_compiling() else rope_angles
        p = self.position_cfg
        inv_freq = inverse_frequencies(p, self.dim, pos.device)
        factor: float | Tensor = self.attention_factor
        if p.scaling.kind == "longrope":
            assert p.scaling.original_context is not None, (
                "model.position.scaling.original_context: longrope's validate requires it"
            )
            longer = (pos.amax(-1) + 1 > p.scaling.original_context)[
                ..., None, None, None
            ]  # [(B,) 1, 1, 1]: no device sync
            if p.scaling.switch_factors:
                inv_freq = torch.where(longer, inverse_frequencies(p, self.dim, pos.device, long=True), inv_freq)
            if self.long_attention_factor != self.attention_factor:  # each row's factor, by its length
                factor = torch.where(longer, self.long_attention_factor, self.attention_factor)
        cos, sin = angles(pos, inv_freq)
        if isinstance(factor, Tensor) or factor != 1.0:  # in float32, as Hugging Face scales them
            cos, sin = cos * factor, sin * factor
        rotation = RoPERotation(
            cos.to(dtype), sin.to(dtype), self.dim, self.interleaved, may_reorder=not self.interleaved and not cached
        )
        rotation.positions, rotation.at_positions = pos, lambda other: self.rotary(other, dtype, cached)
        return rotation

    @staticmethod
    def softmax_factor(cfg: ModelConfig) -> float:
        """YaRN with ``mscale_all_dim`` set and ``softmax_mscale`` on: ``yarn_mscale(factor, mscale_all_dim)``²
        (DeepSeek-V2/V3); else 1 (transformers' generic yarn scales cos and sin alone: Ministral 3)."""
        p = cfg.position
        if p.scaling.kind == "yarn" and p.scaling.mscale_all_dim is not None and p.scaling.softmax_mscale:
            return yarn_mscale(p.scaling.factor, p.scaling.mscale_all_dim) ** 2
        return 1.0

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``rope``, and its scaling when there is one (``rope+yarn``)."""
        p = cfg.position
        return p.kind + (f"+{p.scaling.kind}" if p.scaling.kind != "none" else "")

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """The rotation's fields and those of its scaling (``scaling.factor``)."""
        scaling = _SCALING_FIELDS[cfg.position.scaling.kind] | {"kind", "mscale", "mscale_all_dim"}
        return _ROTATION | {f"scaling.{name}" for name in scaling}

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        p = cfg.position
        checks.positive("model.position.theta", p.theta)
        if p.scaling.kind != "none":
            checks.positive("model.position.scaling.factor", p.scaling.factor)
        if p.scaling.kind == "llama3":
            checks.integer("model.position.scaling.original_context", p.scaling.original_context, 1,
                           "a positive integer for scaling.kind=llama3 (the context the model was trained at)")  # fmt: skip
            checks.positive("model.position.scaling.low_freq_factor", p.scaling.low_freq_factor)
            if not checks.finite(p.scaling.high_freq_factor) > p.scaling.low_freq_factor:
                raise ConfigError(
                    "model.position.scaling.high_freq_factor",
                    p.scaling.high_freq_factor,
                    f"a number above model.position.scaling.low_freq_factor={p.scaling.low_freq_factor}",
                )
        _validate_yarn(p)
        if p.scaling.long_attention_factor is not None:
            if p.scaling.kind != "longrope":
                raise ConfigError(
                    "model.position.scaling.long_attention_factor",
                    p.scaling.long_attention_factor,
                    "null unless model.position.scaling.kind is longrope (the factor past its original context)",
                )
            checks.positive(
                "model.position.scaling.long_attention_factor",
                p.scaling.long_attention_factor,
                "a positive number, or null",
            )
        if not isinstance(p.scaling.switch_factors, bool):
            raise ConfigError("model.position.scaling.switch_factors", p.scaling.switch_factors, "true or false")
        if p.scaling.attention_factor is not None:
            if p.scaling.kind not in ("yarn", "longrope"):
                raise ConfigError(
                    "model.position.scaling.attention_factor",
                    p.scaling.attention_factor,
                    "null unless model.position.scaling.kind is yarn or longrope (the scalings that scale cos and sin)",
                )
            checks.positive(
                "model.position.scaling.attention_factor", p.scaling.attention_factor, "a positive number, or null"
            )
        if p.rotary_dim is not None and p.rotary_fraction is not None:
            raise ConfigError(
                "model.position.rotary_fraction", p.rotary_fraction, "null when rotary_dim is set (give one of them)"
            )
        if p.rotary_fraction is not None and not 0 < p.rotary_fraction <= 1:
            raise ConfigError("model.position.rotary_fraction", p.rotary_fraction, "a fraction in (0, 1]")
        if p.turning_fraction is not None and not 0 < checks.finite(p.turning_fraction) <= 1:
            raise ConfigError("model.position.turning_fraction", p.turning_fraction, "a fraction in (0, 1], or null")
        mixer = MIXERS.get(cfg.attention.kind)
        # a recurrent mixer takes no rotation: no head of it for the rotated dims to fit (a layer kind whose
        # mixer rotates is checked against its own heads)
        if not mixer.takes_rotary():
            even = "an even number of dims >= 2, or null"
            if p.rotary_dim is not None:
                checks.integer("model.position.rotary_dim", p.rotary_dim, 2, even)
                if p.rotary_dim % 2:
                    raise ConfigError("model.position.rotary_dim", p.rotary_dim, even)
            if p.scaling.kind == "longrope":
                _validate_longrope(p, None)
            return
        mixer.validate_rotary(cfg)  # what the attention can rotate
        hd = rotary_head_dim(cfg)
        if p.rotary_fraction is not None:
            dims = p.rotary_fraction * hd
            if abs(dims - round(dims)) > 1e-6 or round(dims) % 2:
                raise ConfigError(
                    "model.position.rotary_fraction",
                    p.rotary_fraction,
                    f"a fraction of head_dim={hd} that gives an even whole number of dims",
                )
        r = rotary_dim(cfg)
        if r <= 0 or r % 2 or r > hd:
            raise ConfigError("model.position.rotary_dim", r, f"an even number of dims in [2, head_dim={hd}]")
        if p.scaling.kind == "longrope":
            _validate_longrope(p, r)


def _validate_longrope(p: RoPEConfig, rotated: Optional[int]) -> None:
    """LongRoPE's fields: the context it extends (``original_context``), a ``factor`` >= 1 (its attention
    factor reads it) and ``short_factor`` and ``long_factor`` lists of one positive number per rotated pair
    (``rotated`` None, a mixer that takes no rotation: as many pairs as ``short_factor`` lists, one or more)."""
    checks.integer("model.position.scaling.original_context", p.scaling.original_context, 1,
                   "a positive integer for scaling.kind=longrope (the context the model was trained at)")  # fmt: skip
    if not checks.finite(p.scaling.factor) >= 1:
        raise ConfigError(
            "model.position.scaling.factor",
            p.scaling.factor,
            "a number >= 1 for scaling.kind=longrope (how much longer)",
        )
    if rotated is None:
        short = p.scaling.short_factor
        pairs = len(short) if isinstance(short, Sequence) and not isinstance(short, str) else 0
        allowed = "a non-empty list of positive numbers for scaling.kind=longrope, long_factor as long as short_factor"
    else:
        pairs = rotated // 2
        allowed = f"a list of {pairs} positive numbers for scaling.kind=longrope (one per rotated pair: rotary dims {rotated} / 2)"
    for name in ("short_factor", "long_factor"):
        factors = getattr(p.scaling, name)
        ok = isinstance(factors, Sequence) and not isinstance(factors, str) and 0 < len(factors) == pairs
        if not ok or not all(isinstance(f, (int, float)) and checks.finite(f) > 0 for f in factors):
            raise ConfigError(f"model.position.scaling.{name}", factors, allowed)


def _validate_yarn(p: RoPEConfig) -> None:
    """YaRN's fields: the context it extends (``original_context``), ``theta`` > 1, a ``factor`` >= 1, ``beta_fast``
    > ``beta_slow`` > 0, ``truncate`` a bool, and ``mscale`` with ``mscale_all_dim`` both positive or both null
    (alone, each means one thing to Hugging Face and another to DeepSeek's reference code). Outside yarn
    both are null. ``softmax_mscale`` false (the softmax left alone) needs ``mscale_all_dim``, which it reads."""
    if not isinstance(p.scaling.softmax_mscale, bool):
        raise ConfigError("model.position.scaling.softmax_mscale", p.scaling.softmax_mscale, "true or false")
    if not p.scaling.softmax_mscale and (p.scaling.kind != "yarn" or p.scaling.mscale_all_dim is None):
        raise ConfigError(
            "model.position.scaling.softmax_mscale",
            False,
            "true unless model.position.scaling.kind=yarn with mscale_all_dim set (it says whether that scales the softmax)",
        )
    if p.scaling.kind != "yarn":
        for name in ("mscale", "mscale_all_dim"):
            if getattr(p.scaling, name) is not None:
                raise ConfigError(
                    f"model.position.scaling.{name}",
                    getattr(p.scaling, name),
                    "null unless model.position.scaling.kind=yarn",
                )
        return
    checks.integer("model.position.scaling.original_context", p.scaling.original_context, 1,
                   "a positive integer for scaling.kind=yarn (the context the model was trained at)")  # fmt: skip
    if not checks.finite(p.theta) > 1:
        raise ConfigError(
            "model.position.theta", p.theta, "a number above 1 for scaling.kind=yarn (its band reads log theta)"
        )
    if not checks.finite(p.scaling.factor) >= 1:
        raise ConfigError(
            "model.position.scaling.factor", p.scaling.factor, "a number >= 1 for scaling.kind=yarn (how much longer)"
        )
    checks.positive("model.position.scaling.beta_slow", p.scaling.beta_slow)
    if not isinstance(p.scaling.truncate, bool):
        raise ConfigError("model.position.scaling.truncate", p.scaling.truncate, "true or false")
    if not checks.finite(p.scaling.beta_fast) > p.scaling.beta_slow:
        raise ConfigError(
            "model.position.scaling.beta_fast",
            p.scaling.beta_fast,
            f"a number above model.position.scaling.beta_slow={p.scaling.beta_slow}",
        )
    for name in ("mscale", "mscale_all_dim"):
        if getattr(p.scaling, name) is not None:
            checks.positive(f"model.position.scaling.{name}", getattr(p.scaling, name), "a positive number, or null")
    if (p.scaling.mscale is None) != (p.scaling.mscale_all_dim is None):
        name, other = ("mscale", "mscale_all_dim") if p.scaling.mscale is None else ("mscale_all_dim", "mscale")
        raise ConfigError(
            f"model.position.scaling.{name}",
            None,
            f"a positive number when model.position.scaling.{other} is set (both or neither)",
        )


class RoPERotation(Rotation):
    """RoPE's rotation at one forward's positions. ``project`` rotates a fused q/k/v projection in one
    pass (``rotary_qkv``), and ``half`` pairs as adjacent pairs of a projection whose q/k rows it first
    reorders (``adjacent_pairs``): one complex multiply instead of five real passes, and every q·k, so
    attention, is unchanged. Not when ``may_reorder`` is off (keys headed for a KV cache stay in the
    projection's own order: a decoding step's reorder would cost more than it saves), nor where the
    rotation cannot be complex (bf16 under autocast, an odd head size), nor under ``torch.compile``,
    whose kernel for the half rotation is faster than for the reordered one."""

    # the scheme's rotation at other positions (RoPE.rotary sets it)
    at_positions: Optional[Callable[[Tensor], Rotation]] = None

    def __init__(self, cos: Tensor, sin: Tensor, dim: int, interleaved: bool, may_reorder: bool):
        self.cos, self.sin, self.dim, self.interleaved, self.may_reorder = cos, sin, dim, interleaved, may_reorder

    def rotate(self, x: Tensor) -> Tensor:
        # rotary_qkv's single pass and hand-written backward, over heads that are all "queries"
        return rotary_qkv(x, self.cos, self.sin, self.interleaved, x.shape[2], 0)[0]

    def at(self, positions: Tensor) -> Rotation:
        assert self.at_positions is not None, "RoPE.rotary sets it"
        return self.at_positions(positions)

    def unrotate(self, x: Tensor) -> Tensor:
        # minus the angles: sin negated (times the attention factor too, as transformers' DeepSeek-V4 turns back)
        return rotary_qkv(x, self.cos, -self.sin, self.interleaved, x.shape[2], 0)[0]

    def project(
        self, x: Tensor, qkv: nn.Linear, n_head: int, n_kv_head: int, head_dim: int, clip: Optional[float] = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        weight, bias = qkv.weight, qkv.bias
        reorder = (
            self.may_reorder
            and rotates_as_complex(_projection_dtype(weight), head_dim)
            and not torch.compiler.is_compiling()  # inductor fuses the half rotation itself
        )
        if reorder:  # the rows of each pair next to each other: rotated as interleaved pairs
            qk_heads = n_head + n_kv_head
            weight = adjacent_pairs(weight, qk_heads, head_dim, self.dim)
            bias = None if bias is None else adjacent_pairs(bias, qk_heads, head_dim, self.dim)
        out = F.linear(x, weight, bias)
        if clip is not None:  # elementwise: the same with the rows reordered
            out = out.clamp(-clip, clip)
        out = out.unflatten(-1, (n_head + 2 * n_kv_head, head_dim))
        return rotary_qkv(out, self.cos, self.sin, self.interleaved or reorder, n_head, n_kv_head)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1·mscale·ln(factor) + 1`` for a context ``factor`` times longer
    (1 when it is not longer), as DeepSeek and Hugging Face write it."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(s: RoPEScalingConfig) -> float:
    """What YaRN multiplies cos and sin by (so each rotated q·k by its square): ``yarn_mscale(factor,
    mscale) / yarn_mscale(factor, mscale_all_dim)`` when both are set (DeepSeek; 1 when equal), else
    ``yarn_mscale(factor)`` (Peng et al. 2023, eq. 22: 0.1·ln(s) + 1); LongRoPE's, at short and long
    sequences alike, ``sqrt(1 + ln(factor) / ln(original_context))`` (1 for factor 1; transformers'
    default); 1 for every other scaling. ``attention_factor``, where set, replaces YaRN's and LongRoPE's
    (transformers' rope_parameters key of that name)."""
    if s.attention_factor is not None:  # validate allows it with yarn and longrope alone
        return s.attention_factor
    if s.kind == "longrope":
        assert s.original_context is not None, (
            "model.position.scaling.original_context: longrope's validate requires it"
        )
        return math.sqrt(1 + math.log(s.factor) / math.log(s.original_context)) if s.factor > 1 else 1.0
    if s.kind != "yarn":
        return 1.0
    if s.mscale is not None and s.mscale_all_dim is not None:
        return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
    return yarn_mscale(s.factor)


def long_attention_factor(s: RoPEScalingConfig) -> float:
    """What LongRoPE multiplies cos and sin by past ``original_context``: ``long_attention_factor`` where
    set (transformers' PhiMoE: its ``long_mscale``), else ``attention_factor(s)`` as within it."""
    return s.long_attention_factor if s.long_attention_factor is not None else attention_factor(s)


def inverse_frequencies(p: RoPEConfig, dim: int, device: Optional[torch.device] = None, long: bool = False) -> Tensor:
    """``scaled_frequencies``, with the pairs from int(turning_fraction · dim / 2) on at frequency 0 where
    ``turning_fraction`` is set (proportional RoPE, as transformers' ``proportional`` rope_type computes it)."""
    inv_freq = scaled_frequencies(p, dim, device, long)
    if p.turning_fraction is not None:
        inv_freq[int(p.turning_fraction * dim // 2) :] = 0.0
    return inv_freq


def scaled_frequencies(p: RoPEConfig, dim: int, device: Optional[torch.device] = None, long: bool = False) -> Tensor:
    """RoPE's angle per position of each rotated pair i, ``theta^(-2i/dim)`` in float32, rescaled as
    ``p.scaling.kind`` asks: ``linear`` divides every frequency by ``factor`` (positions interpolated, Chen et
    al. 2023); ``llama3`` divides only the low frequencies (wavelengths above ``original_context /
    low_freq_factor``) by it, keeps the high ones (below ``original_context / high_freq_factor``) and
    blends the band between (Llama 3.1); ``yarn`` keeps the pairs that turn more than ``beta_fast`` times
    over ``original_context``, divides those turning less than ``beta_slow`` times by ``factor``, and ramps
    linearly between (Peng et al. 2023, arXiv:2309.00071, the "NTK-by-parts" interpolation), from and to
    whole pairs with ``truncate``; ``longrope`` divides pair i's frequency by ``short_factor[i]``, or
    ``long_factor[i]`` with ``long`` (Ding et al. 2024, arXiv:2402.13753), as transformers computes it."""
    exponent = torch.arange(0, dim, 2, device=device, dtype=torch.int64).float() / dim
    if p.scaling.kind == "longrope":
        factors = torch.tensor(
            list((p.scaling.long_factor if long else p.scaling.short_factor) or ()), dtype=torch.float32, device=device
        )
        return 1.0 / (factors * p.theta**exponent)
    inv_freq = 1.0 / p.theta**exponent
    if p.scaling.kind == "linear":
        return inv_freq / p.scaling.factor
    if p.scaling.kind == "llama3":
        context = p.scaling.original_context
        assert context is not None, "model.position.scaling.original_context: llama3's validate requires it"
        wavelength = 2 * math.pi / inv_freq
        smooth = (context / wavelength - p.scaling.low_freq_factor) / (
            p.scaling.high_freq_factor - p.scaling.low_freq_factor
        )
        blended = (1 - smooth) * inv_freq / p.scaling.factor + smooth * inv_freq
        low = wavelength > context / p.scaling.low_freq_factor
        high = wavelength < context / p.scaling.high_freq_factor
        return torch.where(low, inv_freq / p.scaling.factor, torch.where(high, inv_freq, blended))
    if p.scaling.kind == "yarn":
        low, high = _yarn_band(p, dim)
        ramp = ((torch.arange(dim // 2, device=device, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        return inv_freq / p.scaling.factor * ramp + inv_freq * (1 - ramp)
    return inv_freq


def _yarn_band(p: RoPEConfig, dim: int) -> tuple[float, float]:
    """The pair indices where YaRN's ramp starts and ends: the pair that turns ``beta`` times over
    ``original_context`` sits at ``dim·ln(original_context / (2π·beta)) / (2·ln theta)``; rounded outward
    with ``truncate`` (Hugging Face's default; gpt-oss keeps them as computed), clipped to [0, dim - 1],
    never empty."""
    context = p.scaling.original_context
    assert context is not None, "model.position.scaling.original_context: yarn's validate requires it"

    def pair_turning(beta: float) -> float:
        return dim * math.log(context / (beta * 2 * math.pi)) / (2 * math.log(p.theta))

    low, high = pair_turning(p.scaling.beta_fast), pair_turning(p.scaling.beta_slow)
    if p.scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    return low, (high if high != low else high + 0.001)


def rope_angles(pos: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """cos and sin, ``[(B,) T, 1, dim/2]`` in float32, of RoPE's angles ``pos·inv_freq``: one angle per
    rotated pair, shared by every head."""
    angle = pos.float()[..., None, None] * inv_freq
    return angle.cos(), angle.sin()


# The same tables as one op that torch.compile cannot see into: inlined, inductor fuses the angle
# computation into the rotation kernels and redoes cos and sin for every element. An op is computed
# once per forward, as in eager mode.
_opaque_rope_angles = torch.library.custom_op(
    "archlab::rope_angles",
    rope_angles,
    mutates_args=(),
    schema="(Tensor pos, Tensor inv_freq) -> (Tensor, Tensor)",
)


@_opaque_rope_angles.register_fake
def _rope_angles_shape(pos: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    shape = (*pos.shape, 1, inv_freq.shape[-1])
    return pos.new_empty(shape, dtype=torch.float32), pos.new_empty(shape, dtype=torch.float32)


def _projection_dtype(weight: Tensor) -> torch.dtype:
    """The dtype a Linear with this weight computes in: autocast's, where it is on."""
    device = weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def adjacent_pairs(rows: Tensor, qk_heads: int, head_dim: int, rotated: int) -> Tensor:
    """A fused q/k/v projection's weight (or bias) with the rows of each ``half`` RoPE pair (i, i + r/2)
    of the first ``qk_heads`` heads moved next to each other (2i, 2i + 1); the other rows keep their
    places. Queries and keys are permuted alike, so every q·k is unchanged."""
    qk, rest = rows.split((qk_heads * head_dim, rows.shape[0] - qk_heads * head_dim))
    qk = qk.unflatten(0, (qk_heads, head_dim))
    paired = qk[:, :rotated].unflatten(1, (2, rotated // 2)).transpose(1, 2).flatten(1, 2)
    if rotated < head_dim:
        paired = torch.cat((paired, qk[:, rotated:]), dim=1)
    return torch.cat((paired.flatten(0, 1), rest))
