"""Feed-forward layers: ``gelu``, ``relu``, ``relu2`` (two matrices), ``swiglu``, ``geglu``, ``relu2_glu``
(gated, three), ``moe``, a mixture of experts of one of those kinds (archlab/nn/moe.py), and ``none``, no MLP
at all. A dense kind's ``sub_norm`` norms its hidden activations before the down projection (BitNet's
``ffn_sub_norm``).

Hidden width: ``d_ff`` if set, else ``int(multiplier * d_model)``, else 4·d_model for plain MLPs and
the LLaMA rule for gated ones: ``int(2·4d/3)``, times ``ffn_dim_multiplier``, rounded up to
``multiple_of`` (``moe``: the rules of its ``expert`` kind).

SwiGLU's gpt-oss fields (``swiglu_limit``, ``swiglu_clamp``, ``swiglu_alpha``, ``up_offset``) give
``(clamp(up, -L, L) + offset) · g·σ(α·g)`` with the gate clamped to ``g <= L`` first (gpt-oss) or
``g·σ(α·g)`` clamped to ``<= L`` after (Step-3.5); at their defaults it is the plain SwiGLU.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MLPConfig, ModelConfig, mlp_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import LayerPart, Role, residual_projection
from archlab.nn.fused import glu
from archlab.nn.norms import NORMS
from archlab.nn.sparsity import SparsityField, gaussian_topk, sparsity
from archlab.nn.sparsity import validate as validate_sparsity
from archlab.registry import Registry


@dataclass
class WidthConfig(MLPConfig):
    """What every dense kind reads: the width rules and the biases."""

    d_ff: Optional[int] = None  # explicit hidden width wins over every rule below
    multiplier: Optional[float] = None  # hidden width = int(multiplier * d_model)
    bias: bool = True
    # a norm of model.norm's kind over the hidden width, before the down projection (BitNet's ffn_sub_norm)
    sub_norm: bool = False


@dataclass
class GatedWidthConfig(WidthConfig):
    """The gated kinds' width rules: LLaMA's, when neither d_ff nor multiplier is set."""

    ffn_dim_multiplier: Optional[float] = None  # the 8d/3 width times this
    multiple_of: int = 1  # ... rounded up to a multiple of this


@dataclass
class TanhField:
    """GELU's form, where the activation is GELU."""

    approximate: str = choice("none", "tanh")  # exact GELU, or its tanh approximation


@dataclass
class ClampFields:
    """SwiGLU's clamped form (gpt-oss, Step-3.5); at the defaults the plain SwiGLU."""

    swiglu_limit: Optional[float] = None  # bound L: up clamped to [-L, L], the gate to <= L; None = no clamp
    # where the limit bounds the gate: gate (clamped before SiLU, gpt-oss) | activation (SiLU's output, Step-3.5)
    swiglu_clamp: str = choice("gate", "activation")
    swiglu_alpha: float = 1.0  # the gate's activation g·σ(α·g); 1 = SiLU (gpt-oss: 1.702)
    up_offset: float = 0.0  # added to the (clamped) up projection before the product (gpt-oss: 1)


@mlp_config("gelu")
@dataclass
class GeLUConfig(TanhField, WidthConfig):
    """``model.mlp`` with kind gelu: two matrices around GELU, exact or tanh (GPT-2)."""

    kind: str = "gelu"


@mlp_config("relu")
@dataclass
class ReLUConfig(WidthConfig):
    """``model.mlp`` with kind relu: two matrices around ReLU (the original Transformer)."""

    kind: str = "relu"


@mlp_config("relu2")
@dataclass
class ReLU2Config(WidthConfig):
    """``model.mlp`` with kind relu2: two matrices around relu(x)² (Primer, Nemotron)."""

    kind: str = "relu2"


@mlp_config("swiglu")
@dataclass
class SwiGLUConfig(ClampFields, SparsityField, GatedWidthConfig):
    """``model.mlp`` with kind swiglu: the SiLU-gated MLP (LLaMA), clamped as gpt-oss or Step-3.5 where set."""

    kind: str = "swiglu"


@mlp_config("geglu")
@dataclass
class GeGLUConfig(TanhField, SparsityField, GatedWidthConfig):
    """``model.mlp`` with kind geglu: the GELU-gated MLP (Gemma's tanh form where set)."""

    kind: str = "geglu"


@mlp_config("relu2_glu")
@dataclass
class ReLU2GLUConfig(SparsityField, GatedWidthConfig):
    """``model.mlp`` with kind relu2_glu: the gated MLP through relu(x)², ``down(relu(gate)² · up)`` (BitNet)."""

    kind: str = "relu2_glu"


@mlp_config("none")
@dataclass
class NoMLPConfig(MLPConfig):
    """``model.mlp`` with kind none: no MLP, no fields."""

    kind: str = "none"


class MLP(LayerPart, nn.Module):
    """An MLP entry, built per layer as ``Entry(cfg, layer)`` and called as ``mlp(x)``. Beside the
    Component members: ``gated(cfg)``, whether the gated width rule applies, and ``present``, whether a
    block holds it (and its norm) at all."""

    present: ClassVar[bool] = True  # False: the blocks hold no MLP and no norm before or after it (kind none)
    # True: it reads the token before too (RWKV's channel-mix), called as mlp(x, tokens, cache, layer)
    stateful: ClassVar[bool] = False
    # True: it reads the block's unnormed stream too, called as mlp(x, stream) (a MoE ``beside`` its MLP)
    reads_stream: bool = False

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()

    @staticmethod
    def gated(cfg: ModelConfig) -> bool:
        return False

    @staticmethod
    def state_values(cfg: ModelConfig) -> int:
        """Values a ``stateful`` MLP keeps in the KV cache per sequence, whatever the context: none."""
        return 0

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """The kind and its hidden width: ``swiglu d_ff=11008``."""
        return f"{cfg.mlp.kind} d_ff={d_ff(cfg)}"


MLPS: Registry[type[MLP]] = Registry("model.mlp.kind", base=MLP)


def d_ff(cfg: ModelConfig) -> int:
    """The hidden width this config asks for (see the module docstring for the rules)."""
    m, d = cfg.mlp, cfg.d_model
    if m.d_ff is not None:
        return m.d_ff
    if m.multiplier is not None:
        return int(m.multiplier * d)
    if not MLPS.get(m.kind).gated(cfg):
        return 4 * d
    hidden = int(2 * 4 * d / 3)
    if m.ffn_dim_multiplier is not None:
        hidden = int(m.ffn_dim_multiplier * hidden)
    return m.multiple_of * math.ceil(hidden / m.multiple_of)


def width_fields(cfg: ModelConfig, gated: bool) -> frozenset[str]:
    """The fields of model.mlp that ``d_ff`` reads at these settings: the first rule set wins."""
    m = cfg.mlp
    if m.d_ff is not None:
        return frozenset({"d_ff"})
    if m.multiplier is not None or not gated:
        return frozenset({"d_ff", "multiplier"})
    return frozenset({"d_ff", "multiplier", "ffn_dim_multiplier", "multiple_of"})


def width_unread(cfg: ModelConfig, field: str) -> Optional[str]:
    """Why a width rule's field goes unread (``width_fields``): the rule that wins over it is set."""
    m = cfg.mlp
    if field not in ("multiplier", "ffn_dim_multiplier", "multiple_of"):
        return None
    if m.d_ff is not None:
        return f"model.mlp.d_ff={m.d_ff} is set, which gives the width itself"
    if m.multiplier is not None:
        return f"model.mlp.multiplier={m.multiplier} is set, which gives the width as d_model times it"
    return None


def _validate_sizes(cfg: ModelConfig) -> None:
    m = cfg.mlp
    for name in ("d_ff", "multiplier", "ffn_dim_multiplier"):
        value = getattr(m, name, None)  # a plain kind has no ffn_dim_multiplier
        if value is not None and not 0 < value < math.inf:
            raise ConfigError(f"model.mlp.{name}", value, "a positive number or null")
    if isinstance(m, GatedWidthConfig):
        checks.integer("model.mlp.multiple_of", m.multiple_of)
    if d_ff(cfg) <= 0:
        raise ConfigError(
            "model.mlp.d_ff", d_ff(cfg), "a resolved hidden width >= 1: raise multiplier or ffn_dim_multiplier"
        )


class DenseMLP(MLP):
    """One feed-forward of hidden width d_ff, or ``width`` (a mixture of experts' shared experts): what
    the plain and the gated kinds share, their count at a given width (``params_at``) and their checks:
    the width rules, and ``approximate`` left at none where the activation has no tanh form."""

    refuses_tanh: ClassVar[Optional[str]] = None  # why model.mlp.approximate must stay none, if it must

    def __init__(self, cfg: ModelConfig, layer: int = 0, width: Optional[int] = None):
        super().__init__(cfg, layer)
        f = d_ff(cfg) if width is None else width
        self.sub_norm = NORMS.get(cfg.norm.kind)(cfg, f) if getattr(cfg.mlp, "sub_norm", False) else None

    def hidden(self, h: Tensor) -> Tensor:
        """The hidden activations ``h`` through the sub-norm, where there is one."""
        return h if self.sub_norm is None else self.sub_norm(h)

    @staticmethod
    def sub_norm_params(cfg: ModelConfig, width: int) -> int:
        """The sub-norm's parameters at hidden width ``width``: a norm of the model's kind over it, or none."""
        return NORMS.get(cfg.norm.kind).num_params(cfg, width) if getattr(cfg.mlp, "sub_norm", False) else 0

    def param_roles(self) -> dict[str, Role]:
        # fc/proj (plain) or gate_up/down (gated): matrices between two widths, and their biases; the sub-norm's
        # scale and shift
        return {
            n: Role.HIDDEN if n.endswith("weight") and not n.startswith("sub_norm.") else Role.VECTOR
            for n, _ in self.named_parameters()
        }

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Callable[[Tensor], Tensor]:
        """What runs between the two matrices: the activation (plain kinds), or the gated product of
        ``h = [gate | up]`` (gated kinds, a ``Gate``)."""
        raise NotImplementedError

    @staticmethod
    def params_at(cfg: ModelConfig, width: int) -> int:
        """Parameters at hidden width ``width``."""
        raise NotImplementedError

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        return cls.params_at(cfg, d_ff(cfg))

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """The width rules that apply (an explicit d_ff wins over the others), the biases, the sub-norm and
        ``approximate`` (refused where there is no tanh form); none of a mixture of experts' fields."""
        return width_fields(cfg, cls.gated(cfg)) | {"bias", "sub_norm", "approximate", "activation_sparsity"}

    @classmethod
    def unread(cls, cfg: ModelConfig, field: str) -> Optional[str]:
        return width_unread(cfg, field)

    @staticmethod
    def form(cfg: ModelConfig) -> str:
        """The activation's settings that differ from its plain form, for a description (a mixture of
        experts names its experts' form with it); none by default."""
        return ""

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        approximate = getattr(cfg.mlp, "approximate", "none")  # a mixture of experts' of this kind, if any
        if cls.refuses_tanh is not None and approximate != "none":
            raise ConfigError("model.mlp.approximate", approximate, cls.refuses_tanh)
        _validate_sizes(cfg)
        validate_sparsity(cfg)


class PlainMLP(DenseMLP):
    """``proj(act(fc(x)))``: the GPT-2 / original Transformer feed-forward."""

    takes_bitlinear: ClassVar[bool] = True  # its matrices may be BitLinear (model.linear): bitlinear_segments

    def __init__(self, cfg: ModelConfig, layer: int = 0, width: Optional[int] = None):
        super().__init__(cfg, layer, width)
        f = d_ff(cfg) if width is None else width
        self.fc = nn.Linear(cfg.d_model, f, bias=cfg.mlp.bias)
        self.proj = residual_projection(nn.Linear(f, cfg.d_model, bias=cfg.mlp.bias))
        self.act = self.activation_of(cfg)

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Callable[[Tensor], Tensor]:
        """The activation between the two matrices."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.hidden(self.act(self.fc(x))))

    def bitlinear_segments(self) -> dict[str, tuple[int, ...]]:
        return {"fc": (self.fc.out_features,), "proj": (self.proj.out_features,)}

    @staticmethod
    def params_at(cfg: ModelConfig, width: int) -> int:
        d = cfg.d_model
        return 2 * d * width + cfg.mlp.bias * (width + d) + DenseMLP.sub_norm_params(cfg, width)


@MLPS.register("gelu")
class GeLUMLP(PlainMLP):
    """GELU; ``approximate: tanh`` is GPT-2's and GPT-J's ``gelu_new``."""

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Callable[[Tensor], Tensor]:
        return functools.partial(F.gelu, approximate=cfg.mlp.approximate)


@MLPS.register("relu")
class ReLUMLP(PlainMLP):
    """ReLU, as in the original Transformer."""

    refuses_tanh = "none for relu (only GELU has a tanh form)"

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Callable[[Tensor], Tensor]:
        return F.relu


def relu_squared(x: Tensor) -> Tensor:
    """``relu(x)²`` (Primer's squared ReLU; transformers' ``ACT2FN["relu2"]``)."""
    return F.relu(x).square()


@MLPS.register("relu2")
class ReLU2MLP(PlainMLP):
    """Squared ReLU, ``relu(x)²`` (So et al. 2021, Primer, arXiv:2109.08668): plain, two matrices, the plain
    width rule (Arcee AFM, NVIDIA Nemotron's dense models)."""

    refuses_tanh = "none for relu2 (only GELU has a tanh form)"

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Callable[[Tensor], Tensor]:
        return relu_squared


@dataclass(frozen=True)
class Gate:
    """The gated product of ``h = [gate | up]`` along the last dim: ``activation(gate) · up`` through the
    fused ``glu`` (a name it knows); with a ``limit``, an ``alpha`` other than 1 or an ``offset`` (SwiGLU
    alone sets them) the clamped SwiGLU ``(clamp(up, -L, L) + offset) · g·σ(α·g)``, with ``g <= L`` before
    the activation (``clamp="gate"``, gpt-oss) or ``g·σ(α·g) <= L`` after it (``"activation"``, Step-3.5),
    written as plain ops: autograd and ``torch.compile`` derive its backward."""

    activation: str
    limit: Optional[float] = None
    clamp: str = "gate"
    alpha: float = 1.0
    offset: float = 0.0
    sparsity: float = 0.0  # the gate's activation sparsity s (``gaussian_topk``); 0 none

    def __call__(self, h: Tensor) -> Tensor:
        if self.sparsity:  # the gate's pre-activations sparsified first (nn/sparsity.py)
            gate, up = h.chunk(2, dim=-1)
            h = torch.cat([gaussian_topk(gate, self.sparsity), up], dim=-1)
        if self.limit is None and self.alpha == 1.0 and self.offset == 0.0:
            return glu(h, self.activation)
        gate, up = h.chunk(2, dim=-1)
        if self.limit is not None:
            up = up.clamp(-self.limit, self.limit)
            if self.clamp == "gate":
                gate = gate.clamp(max=self.limit)
        act = gate * torch.sigmoid(self.alpha * gate)
        if self.limit is not None and self.clamp == "activation":
            act = act.clamp(max=self.limit)
        return act * (up + self.offset)


class GatedMLP(DenseMLP):
    """``down(act(gate(x)) * up(x))`` (Shazeer 2020): three matrices at hidden width d_ff (or ``width``).
    The gate and up matrices are one ``gate_up`` Linear with output ``[gate | up]``: one matmul, not two."""

    takes_bitlinear: ClassVar[bool] = True  # its matrices may be BitLinear (model.linear): bitlinear_segments

    def __init__(self, cfg: ModelConfig, layer: int = 0, width: Optional[int] = None):
        super().__init__(cfg, layer, width)
        f, d, bias = d_ff(cfg) if width is None else width, cfg.d_model, cfg.mlp.bias
        self.gate_up = nn.Linear(d, 2 * f, bias=bias)
        self.down = residual_projection(nn.Linear(f, d, bias=bias))
        self.gate = self.activation_of(cfg)

    @staticmethod
    def gated(cfg: ModelConfig) -> bool:
        return True

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Gate:
        """The gated product of ``[gate | up]``."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.hidden(self.gate(self.gate_up(x))))

    def bitlinear_segments(self) -> dict[str, tuple[int, ...]]:
        """gate and up: a weight scale each, as each is its own Linear in a checkpoint."""
        f = self.down.in_features
        return {"gate_up": (f, f), "down": (self.down.out_features,)}

    @staticmethod
    def params_at(cfg: ModelConfig, width: int) -> int:
        d = cfg.d_model
        return 3 * d * width + cfg.mlp.bias * (2 * width + d) + DenseMLP.sub_norm_params(cfg, width)


@MLPS.register("swiglu")
class SwiGLU(GatedMLP):
    """Gate through SiLU (LLaMA); with gpt-oss's fields, its clamped form ``(up + 1) · g·σ(1.702·g)``
    (``Gate``), or Step-3.5's clamp of the activated gate."""

    refuses_tanh = "none for swiglu (SiLU has no tanh form)"

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Gate:
        m = cfg.mlp
        return Gate("silu", m.swiglu_limit, m.swiglu_clamp, m.swiglu_alpha, m.up_offset, sparsity(cfg))

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """The gated kinds' fields and the clamped form's (``swiglu_clamp`` only with a limit)."""
        clamp = {"swiglu_clamp"} if cfg.mlp.swiglu_limit is not None else set()
        return super().reads(cfg) | {"swiglu_limit", "swiglu_alpha", "up_offset"} | clamp

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        m = cfg.mlp
        if m.swiglu_limit is not None:
            checks.positive("model.mlp.swiglu_limit", m.swiglu_limit, "a positive number (gpt-oss: 7.0) or null")
        checks.positive("model.mlp.swiglu_alpha", m.swiglu_alpha, "a positive number (1.0: SiLU; gpt-oss: 1.702)")
        if math.isnan(checks.finite(m.up_offset)):
            raise ConfigError("model.mlp.up_offset", m.up_offset, "a finite number (gpt-oss: 1.0)")

    @staticmethod
    def form(cfg: ModelConfig) -> str:
        return swiglu_form(cfg)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``swiglu d_ff=2880``, and its clamped form where set: ``, limit=7.0 on the gate, alpha=1.702, up+1.0``."""
        return f"swiglu d_ff={d_ff(cfg)}{swiglu_form(cfg)}"


def swiglu_form(cfg: ModelConfig) -> str:
    """SwiGLU's fields that differ from the plain form: ``, limit=7.0 on the gate, alpha=1.702, up+1.0``."""
    m, parts = cfg.mlp, []
    if m.swiglu_limit is not None:
        parts.append(f"limit={m.swiglu_limit} on the {m.swiglu_clamp}")
    if m.swiglu_alpha != 1.0:
        parts.append(f"alpha={m.swiglu_alpha}")
    if m.up_offset != 0.0:
        parts.append(f"up{m.up_offset:+}")
    return "".join(f", {p}" for p in parts)


@MLPS.register("geglu")
class GeGLU(GatedMLP):
    """Gate through GELU: exact, or its tanh approximation (``approximate: tanh``, Gemma's gated GELU)."""

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Gate:
        return Gate("gelu" if cfg.mlp.approximate == "none" else "gelu_tanh", sparsity=sparsity(cfg))


@MLPS.register("relu2_glu")
class ReLU2GLU(GatedMLP):
    """Gate through the squared ReLU, ``relu(gate)² · up`` (BitNet b1.58's ``relu2`` gated MLP)."""

    refuses_tanh = "none for relu2_glu (only GELU has a tanh form)"

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Gate:
        return Gate("relu2", sparsity=sparsity(cfg))


@MLPS.register("none")
class NoMLP(MLP):
    """No feed-forward at all: blocks of a model whose mixer does the work alone (pure Mamba-2) hold
    neither an MLP nor its norm (``present`` False, which the block reads); no parameters, no FLOPs."""

    present = False

    def forward(self, x: Tensor) -> Tensor:
        """Nothing to add to the residual stream (a block never builds it; here for the interface)."""
        return torch.zeros_like(x)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        return "none"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """None of model.mlp's fields: any set away from its default is reported ignored."""
        return frozenset()


def dense_kind(name: str) -> type[DenseMLP]:
    """The entry of a dense MLP kind (a mixture of experts' ``expert``), refusing any other."""
    entry = MLPS.get(name)
    if not issubclass(entry, DenseMLP):
        raise ConfigError("model.mlp.expert", name, "a dense MLP kind (one MLP, not a mixture)")
    return entry


def build_mlp(cfg: ModelConfig, layer: int = 0) -> nn.Module:
    return MLPS.get(cfg.mlp.kind)(cfg, layer)
