"""Position schemes: ``learned``, ``sinusoidal``, ``alibi``, ``none``, the ``Position`` base every scheme
derives from and the ``Rotation`` a rotary scheme hands attention; ``rope`` lives in rope.py.

A scheme acts at one or more of three points, each a no-op by default: ``embed`` adds an absolute
position to the token embeddings, ``rotary`` returns a ``Rotation`` that attention applies to the
queries and keys it projected, and ``bias`` returns an additive attention bias. The model calls each
once per forward. Positions are ``[T]``, shared by the batch, or ``[B, T]`` when a padded batch gives
each row its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, PositionConfig, position_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import ModelPart, Role
from archlab.registry import Registry


def uninitialised_embedding(num: int, dim: int) -> nn.Embedding:
    """An embedding table left uninitialised: ``Decoder.init_weights`` sets it. Skipping the default
    ``normal_`` also keeps a meta-device build from importing torch._dynamo (seconds, once)."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


class Rotation:
    """What a rotary scheme hands attention for one forward: ``rotate`` turns queries or keys into
    rotated ones; ``project`` gives the rotated queries and keys, and the values, of a fused q/k/v
    projection (a scheme may compute that faster than projecting, splitting and rotating). ``positions``:
    the queries' positions it rotates at, ``[T]`` or ``[B, T]`` (each row's own under left padding)."""

    positions: Optional[Tensor] = None

    def rotate(self, x: Tensor) -> Tensor:
        """``x`` ``[B, T, heads, dim]`` with every head rotated at this forward's positions."""
        raise NotImplementedError

    def unrotate(self, x: Tensor) -> Tensor:
        """``x`` ``[B, T, heads, dim]`` turned by minus this forward's angles, ``rotate``'s inverse (a scaled
        rotation scaled alike): DeepSeek-V4 turns its attention output back to the query's frame."""
        raise NotImplementedError

    def at(self, positions: Tensor) -> Rotation:
        """The same scheme's rotation at other ``positions`` ``[T]`` or ``[B, T]``: DeepSeek-V4 rotates a pooled
        block of keys at its first position."""
        raise NotImplementedError

    def project(
        self, x: Tensor, qkv: nn.Linear, n_head: int, n_kv_head: int, head_dim: int, clip: Optional[float] = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated queries, rotated keys and values ``[B, T, heads, head_dim]`` of ``qkv(x)``, whose
        output is ``n_head`` query heads, then ``n_kv_head`` key heads and as many value heads; with
        ``clip``, that output clamped to [-clip, clip] before the rotation (OLMo 1's ``clip_qkv``)."""
        out = qkv(x) if clip is None else qkv(x).clamp(-clip, clip)
        q, k, v = out.unflatten(-1, (n_head + 2 * n_kv_head, head_dim)).split((n_head, n_kv_head, n_kv_head), dim=2)
        return self.rotate(q), self.rotate(k), v


class Position(ModelPart, nn.Module):
    """Base scheme: adds nothing, rotates nothing, biases nothing (the ``none`` scheme)."""

    max_positions: Optional[int] = None  # positions from this one on have no encoding (a learned table)
    switches_at: Optional[int] = None  # a sequence longer than this is encoded anew (longrope): its KV cache goes stale
    in_attention: ClassVar[bool] = True  # acts inside attention (rotates, biases or nothing): may differ per layer

    def __init__(self, cfg: ModelConfig):
        super().__init__()

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x

    def rotary(self, pos: Tensor, dtype: torch.dtype, cached: bool = False) -> Optional[Rotation]:
        return None

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Optional[Tensor]:
        return None

    def param_roles(self) -> dict[str, Role]:
        return {}  # none, rotary or a fixed bias: no parameters

    @staticmethod
    def softmax_factor(cfg: ModelConfig) -> float:
        """What the scheme multiplies attention's softmax scale by (1: it leaves the scale alone)."""
        return 1.0

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        return cfg.position.kind


POSITIONS: Registry[type[Position]] = Registry("model.position.kind", base=Position)


@position_config("none")
@dataclass
class NoPositionConfig(PositionConfig):
    """``model.position`` with kind none: no position encoding (causal masking alone orders the tokens)."""

    kind: str = "none"


class PositionsOnly(Rotation):
    """No rotation: the queries' positions alone, for attention that scales its queries by them."""

    def __init__(self, positions: Tensor):
        self.positions = positions

    def rotate(self, x: Tensor) -> Tensor:
        return x

    def unrotate(self, x: Tensor) -> Tensor:
        return x

    def at(self, positions: Tensor) -> Rotation:
        return PositionsOnly(positions)


@POSITIONS.register("none")
class NoPosition(Position):
    """No encoding; where the layer's attention scales its queries by position (``query_scale_by: position``:
    Beam's NoPE layers) it is handed each query's position, rotated by nothing."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.hands_positions = getattr(cfg.attention, "query_scale_by", "index") == "position"

    def rotary(self, pos: Tensor, dtype: torch.dtype, cached: bool = False) -> Optional[Rotation]:
        return PositionsOnly(pos) if self.hands_positions else None


@position_config("learned")
@dataclass
class LearnedConfig(PositionConfig):
    """``model.position`` with kind learned: a table of context_length vectors (no fields of its own)."""

    kind: str = "learned"


@POSITIONS.register("learned")
class Learned(Position):
    """A trained table of ``context_length`` absolute position vectors (GPT-2)."""

    in_attention = False

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.max_positions = cfg.context_length
        self.table = uninitialised_embedding(cfg.context_length, cfg.d_model)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + self.table(pos)

    def param_roles(self) -> dict[str, Role]:
        return {"table.weight": Role.INPUT}

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return cfg.context_length * cfg.d_model


@position_config("sinusoidal")
@dataclass
class SinusoidalConfig(PositionConfig):
    """``model.position`` with kind sinusoidal: the table's layout, its row offset and its frequencies' spacing."""

    kind: str = "sinusoidal"
    layout: str = choice("interleaved", "halves")  # sin at 2i, cos at 2i + 1 | all sines, then cosines (fairseq, CTRL)
    offset: int = 0  # position p reads the table's row p + offset (fairseq's XGLM: 2)
    endpoint: bool = False  # true: frequencies 10000^(-i/(d/2 - 1)), the last exactly 1/10000 (fairseq, tensor2tensor)


@POSITIONS.register("sinusoidal")
class Sinusoidal(Position):
    """Fixed sines and cosines of geometric wavelengths (Vaswani et al. 2017); any length. Frequency i of
    d/2 is 10000^(-i/(d/2)), or 10000^(-i/(d/2 - 1)) with ``endpoint`` (tensor2tensor's, fairseq's);
    ``layout`` interleaves each sine with its cosine or puts the sines first; ``offset`` shifts every
    position (fairseq's table starts two rows before position 0)."""

    in_attention = False

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        p = cfg.position
        self.d_model, self.halves, self.offset, self.endpoint = cfg.d_model, p.layout == "halves", p.offset, p.endpoint

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        half = self.d_model // 2
        i = torch.arange(half, device=x.device, dtype=torch.float32)
        angle = (pos + self.offset).float()[..., None] * torch.exp(i * (-math.log(10000.0) / (half - self.endpoint)))
        sin, cos = torch.sin(angle), torch.cos(angle)
        table = torch.cat((sin, cos), -1) if self.halves else torch.stack((sin, cos), -1).flatten(-2)
        return x + table.to(x.dtype)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        if cfg.d_model % 2:
            raise ConfigError("model.d_model", cfg.d_model, "an even number for sinusoidal positions")
        if cfg.position.endpoint and cfg.d_model < 4:
            raise ConfigError("model.d_model", cfg.d_model, "at least 4 for sinusoidal positions with endpoint")
        checks.integer("model.position.offset", cfg.position.offset, minimum=0)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``sinusoidal``, with its layout, offset and spacing where set (``sinusoidal(halves,+2,endpoint)``)."""
        p = cfg.position
        said = [p.layout] * (p.layout != "interleaved") + [f"+{p.offset}"] * (p.offset != 0)
        said += ["endpoint"] * p.endpoint
        return "sinusoidal" + (f"({','.join(said)})" if said else "")


def alibi_slopes(n_head: int) -> Tensor:
    """Per-head slopes of Press et al. 2021: 2^(-8/n)^k for a power of two n, else interleaved."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (k + 1) for k in range(n)]

    if math.log2(n_head).is_integer():
        return torch.tensor(power_of_two(n_head))
    closest = 2 ** math.floor(math.log2(n_head))
    extra = power_of_two(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(power_of_two(closest) + extra)


@position_config("alibi")
@dataclass
class ALiBiConfig(PositionConfig):
    """``model.position`` with kind alibi: the slopes' multiplier and the rounding of the bias."""

    kind: str = "alibi"
    alibi_scale: float = 1.0  # every head's slope times this (Falcon-RW: 1/sqrt(head_dim))
    alibi_rounding: str = choice("none", "bf16")  # bf16: slope·key position in bfloat16 (Falcon-RW)


@POSITIONS.register("alibi")
class ALiBi(Position):
    """Attention with linear biases: head h adds -slope_h * distance to its scores; any length.

    ``alibi_scale`` multiplies every slope (Falcon-RW divides its bias by sqrt(head_dim) with the
    scores). ``alibi_rounding=bf16`` computes slope_h * key position in bfloat16 from the slope rounded
    to bfloat16, as Falcon-RW's ``build_alibi_tensor``: a per-query shift of the distance form, so the
    same softmax up to that rounding."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.n_head = cfg.attention.n_head
        self.scale = cfg.position.alibi_scale
        self.bf16 = cfg.position.alibi_rounding == "bf16"

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        slopes = alibi_slopes(self.n_head).to(q_pos.device)
        if self.bf16:  # an int64 position times a bf16 slope: the product rounded to bf16, as Falcon-RW's
            per_key = (slopes.bfloat16()[:, None] * k_pos[..., None, :]).float() * self.scale  # [(B,) H, Tk]
            shape = (*per_key.shape[:-1], q_pos.shape[-1], per_key.shape[-1])
            return per_key[..., None, :].expand(shape).contiguous()  # [(B,) H, Tq, Tk]
        distance = (k_pos[..., None, :] - q_pos[..., :, None]).float()  # <= 0 for every visible key
        return (slopes * self.scale)[:, None, None] * distance[..., None, :, :]  # [(B,) H, Tq, Tk]

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        checks.positive("model.position.alibi_scale", cfg.position.alibi_scale)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``alibi``, with its slope multiplier and rounding where set (``alibi×0.125,bf16``)."""
        p = cfg.position
        scale = f"×{p.alibi_scale:g}" if p.alibi_scale != 1.0 else ""
        return "alibi" + scale + (",bf16" if p.alibi_rounding == "bf16" else "")


def build_position(cfg: ModelConfig) -> Position:
    return POSITIONS.get(cfg.position.kind)(cfg)
