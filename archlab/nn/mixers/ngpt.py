"""``ngpt``: nGPT's softmax attention (Loshchilov et al. 2024, arXiv:2410.01131): each head's queries and keys
L2-normed onto the unit sphere and their product scaled per dim by a learned s_qk², the scores then times
``scale`` (1/sqrt(head_dim)) as causal attention's, s_qk starting at sqrt(head_dim): the paper's s_qk from 1
times its sqrt(head_dim); optionally Dory's output gate with a learned scale
inside its sigmoid and the heads' output L2-normed before the output projection."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.attention import AttentionConfig, CausalSelfAttention
from archlab.nn.mixers.base import MIXERS
from archlab.nn.norms import unit_norm
from archlab.nn.positions import Rotation
from archlab.nn.scaled import ScaledVector, scale_or_default, unit_along


@mixer_config("ngpt")
@dataclass
class NGPTAttentionConfig(AttentionConfig):
    """``model.attention`` with kind ngpt: causal attention's heads and masks, queries and keys on the sphere."""

    kind: str = "ngpt"
    qkv_bias: bool = False
    out_bias: bool = False
    # s_qk, H·hd wide: the rotated unit queries times s_qk² (equal to both q and k times s_qk), starting at
    # qk_scale_init (None = sqrt(head_dim)), stored as s_qk·qk_scale_scale/qk_scale_init (None = 1/sqrt(d_model))
    qk_scale_init: Optional[float] = None
    qk_scale_scale: Optional[float] = None
    # gate elementwise only: sigmoid(g·s_gate²), s_gate H·vd wide, starting at gate_scale_init (None = no s_gate),
    # stored as s_gate·gate_scale_scale/gate_scale_init (None = 1/sqrt(d_model)) (Dory's)
    gate_scale_init: Optional[float] = None
    gate_scale_scale: Optional[float] = None
    out_norm: bool = False  # the heads' (gated) output L2-normed before the output projection (Dory's attn_sub_norm)


def qk_scale_init(cfg: ModelConfig) -> float:
    """s_qk's value at init: ``qk_scale_init``, else sqrt(head_dim) (with the scores' 1/sqrt(head_dim), the
    paper's s_qk from 1 and its scores times sqrt(head_dim), as a function of the stored value alike)."""
    init = cfg.attention.qk_scale_init
    return math.sqrt(CausalSelfAttention.qk_head_dim(cfg)) if init is None else init


class NormedProjection(nn.Linear):
    """The output projection of the heads' output L2-normed over its H·vd dims (Dory's ``attn_sub_norm``)."""

    def __init__(self, d_in: int, d_out: int, bias: bool, eps: float):
        super().__init__(d_in, d_out, bias=bias)
        self.eps = eps

    def forward(self, input: Tensor) -> Tensor:  # nn.Linear's name
        return super().forward(unit_norm(input, self.eps))


class NGPTAttention(CausalSelfAttention):
    """Causal attention (its projections, cache, windows and masks) with unit queries and keys per head, the
    queries times s_qk² after RoPE (transformers' ``DoryAttention``), an optional scaled gate and output norm."""

    takes_bitlinear: ClassVar[bool] = False  # weights on the unit sphere: not quantised

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        init, scale = qk_scale_init(cfg), scale_or_default(a.qk_scale_scale, d)
        self.qk_scale = ScaledVector(self.n_head * self.head_dim, init, scale)
        gated = a.gate_scale_init is not None
        width = self.n_head * self.v_head_dim
        self.gate_scale = (
            ScaledVector(width, a.gate_scale_init, scale_or_default(a.gate_scale_scale, d)) if gated else None
        )
        if a.out_norm:
            self.proj = residual_projection(NormedProjection(width, d, a.out_bias, cfg.norm.eps))

    def project(self, x: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values ``[B, T, heads, hd]``: each head's queries and keys onto the unit sphere, then
        rotated (Dory's order; a rotation keeps the norm), each head's dims in their own order, which s_qk reads
        (not the reordered layout of RoPE's fused pass)."""
        q, k, v = self.split(self.qkv(x))
        q, k = self.normed(q, k)
        if rotary is not None:
            q, k = rotary.rotate(q), rotary.rotate(k)
        return q, k, v

    def to_sphere(self) -> None:
        """The q/k/v and gate rows and the output projection's columns unit vectors along d_model (nGPT §2.3)."""
        unit_along(self.qkv.weight, 1)
        if self.gate is not None:
            unit_along(self.gate.weight, 1)
        unit_along(self.proj.weight, 0)

    def normed(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Each head's queries and keys onto the unit sphere."""
        return unit_norm(q, self.norm_eps), unit_norm(k, self.norm_eps)

    def scaled(self, q, rotary, cache):  # typed as CausalSelfAttention.scaled
        """Queries ``[B, H, T, hd]`` times s_qk² per head and dim."""
        s = self.qk_scale().view(self.n_head, 1, self.head_dim)
        return super().scaled(q, rotary, cache) * s.square().to(q.dtype)

    def gate_of(self, x: Tensor, B: int, T: int) -> Tensor:
        """sigmoid(gate(x)·s_gate²) ``[B, T, H, vd]`` with s_gate, else causal attention's gate."""
        if self.gate_scale is None:
            return super().gate_of(x, B, T)
        assert self.gate is not None  # validate: s_gate with gate elementwise
        return (self.gate(x) * self.gate_scale().square().to(x.dtype)).sigmoid().view(B, T, self.n_head, -1)

    def param_roles(self) -> dict[str, Role]:
        return super().param_roles() | {"qk_scale.weight": Role.VECTOR, "gate_scale.weight": Role.VECTOR}

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Causal attention's, and s_qk (H·hd) and s_gate (H·vd) where set."""
        a = cfg.attention
        hd = cls.qk_head_dim(cfg)
        vd = a.v_head_dim if a.v_head_dim is not None else hd
        return super().num_params(cfg, layer) + a.n_head * hd + (a.gate_scale_init is not None) * a.n_head * vd

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        a = cfg.attention
        if a.qk_norm != "none":
            raise ConfigError("model.attention.qk_norm", a.qk_norm, "none with kind ngpt (its q and k are unit always)")
        for name in ("v_norm", "v_from_k", "kv_shared"):  # its own projection computes q, k and v as Dory's
            if getattr(a, name):
                raise ConfigError(f"model.attention.{name}", True, "false with kind ngpt (its values are projected)")
        for name in ("qk_scale_init", "qk_scale_scale", "gate_scale_init", "gate_scale_scale"):
            if getattr(a, name) is not None:
                checks.positive(f"model.attention.{name}", getattr(a, name), "a positive number, or null")
        if a.gate_scale_init is not None and (
            a.gate != "elementwise" or a.gate_activation != "sigmoid" or a.gate_head_bias
        ):
            raise ConfigError(
                "model.attention.gate_scale_init",
                a.gate_scale_init,
                "null unless model.attention.gate=elementwise with gate_activation=sigmoid and no gate_head_bias "
                "(s_gate scales its logits)",
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        a = cfg.attention
        parts = [CausalSelfAttention.describe(cfg), f"unit q/k, s_qk {qk_scale_init(cfg):g}"]
        parts += [f"s_gate {a.gate_scale_init:g}"] if a.gate_scale_init is not None else []
        parts += ["l2 out-norm"] if a.out_norm else []
        return ", ".join(parts)

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Causal attention's less its QK-norm's (refused but none), and s_qk's, s_gate's and the out-norm."""
        a = cfg.attention
        gate = {"gate_scale_init"} | ({"gate_scale_scale"} if a.gate_scale_init is not None else set())
        own = {"qk_scale_init", "qk_scale_scale", "out_norm"} | gate
        return (super().reads(cfg) - {"qk_norm_after_rope", "qk_norm_per_head_scale", "qk_norm_bias"}) | own


MIXERS.register("ngpt")(NGPTAttention)  # after the class, as the transform head: the name keeps its own type
