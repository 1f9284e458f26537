"""BitLinear (BitNet b1.58, Ma et al. 2024; ``model.linear.kind: bitlinear``): the layers' attention and MLP
projections with ternary weights, round(clip(W/mean|W|, -1, 1)) per projection, and activations quantised per
token to int8 by their absmax, as transformers' ``integrations/bitnet.py`` computes them. Online, the weights
are held full precision and quantised at each forward, gradients passing both quantisers unchanged (the
straight-through estimator; transformers' AutoBitLinear); offline, they are held ternary with a
``weight_scale`` per projection (1/mean|W|) and the product is taken on the integers, then divided by both
scales (transformers' BitLinear, which a packed checkpoint loads into). A fused projection (q/k/v, gate/up)
has a scale for each of the projections it fuses (``widths``), as each is its own Linear in a checkpoint."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.config import ModelConfig
from archlab.config.model import LinearConfig
from archlab.errors import ConfigError
from archlab.nn.component import is_residual_projection, residual_projection

VALUES_PER_BYTE = 4  # ternary values in 2 bits each, four to a uint8 (transformers' VALUES_PER_ITEM)


def pack(ternary: Tensor) -> Tensor:
    """Ternary ``[rows, ...]`` as uint8 ``[ceil(rows/4), ...]``, transformers' ``pack_weights`` layout: value
    row ``r`` is stored, plus 1, in bits 2i..2i+1 of packed row ``r - i·n`` for ``i = r // n``, n the packed rows."""
    rows = ternary.shape[0]
    n = -(-rows // VALUES_PER_BYTE)
    values = (ternary + 1).to(torch.uint8)
    packed = torch.zeros((n, *ternary.shape[1:]), dtype=torch.uint8, device=ternary.device)
    for i in range(VALUES_PER_BYTE):
        part = values[i * n : (i + 1) * n]
        packed[: part.shape[0]] |= part << (2 * i)
    return packed


def unpack(packed: Tensor, dtype: torch.dtype) -> Tensor:
    """``pack``'s inverse: ``[4·rows, ...]`` ternary values in ``dtype`` (transformers' ``unpack_weights``)."""
    parts = [(packed >> (2 * i)) & 3 for i in range(VALUES_PER_BYTE)]
    return torch.cat(parts).to(dtype) - 1


def absmean_ternary(weight: Tensor, widths: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Each projection's rows of ``weight`` (``widths`` of them) ternarised, and its scale 1/mean|W| (at most
    1e5), both computed in float32 as transformers' WeightQuant."""
    ternary, scales = [], []
    for part in weight.float().split(list(widths)):
        scale = 1.0 / part.abs().mean().clamp(min=1e-5)
        ternary.append((part * scale).round().clamp(-1, 1))
        scales.append(scale)
    return torch.cat(ternary), torch.stack(scales)


def absmax_scale(x: Tensor) -> Tensor:
    """127 / max|x| per token (at most 1.27e7): what int8 activations are x times."""
    return 127 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)


class WeightQuant(torch.autograd.Function):
    """Weights as their ternary values over their scale, per projection; backward passes the gradient on."""

    @staticmethod
    def forward(ctx: Any, weight: Tensor, widths: Sequence[int]) -> Tensor:
        ternary, scales = absmean_ternary(weight, widths)
        return (ternary / scales.repeat_interleave(torch.tensor(widths, device=weight.device))[:, None]).to(
            weight.dtype
        )

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor, None]:
        return grads[0], None


class ActQuant(torch.autograd.Function):
    """Activations rounded to int8 levels per token, in float32, and scaled back; backward passes the gradient on."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        x32 = x.float()
        scale = absmax_scale(x32)
        return ((x32 * scale).round().clamp(-128, 127) / scale).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Tensor:
        return grads[0]


class BitLinear(nn.Linear):
    """A Linear whose output rows are the projections of ``widths``, quantised online or offline (the
    module docstring). Its parameters are a Linear's: ``weight_scale`` (offline) is a buffer."""

    weight_scale: Tensor  # offline: 1/mean|W| of each projection

    def __init__(self, linear: nn.Linear, widths: Sequence[int], offline: bool):
        """Takes ``linear``'s parameters (its residual-projection mark too)."""
        if sum(widths) != linear.out_features:
            raise ValueError(f"BitLinear widths {tuple(widths)} do not sum to {linear.out_features} output features")
        super().__init__(linear.in_features, linear.out_features, bias=False, device="meta")
        self.weight, self.bias = linear.weight, linear.bias
        self.widths, self.offline = tuple(widths), offline
        if is_residual_projection(linear):
            residual_projection(self)
        if offline:  # a checkpoint's, in the weights' dtype
            w = linear.weight
            self.register_buffer("weight_scale", torch.ones(len(widths), dtype=w.dtype, device=w.device))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, widths={self.widths}, {'offline' if self.offline else 'online'}"

    def row_scales(self) -> Tensor:
        """``weight_scale`` per output row."""
        widths = torch.tensor(self.widths, device=self.weight_scale.device)
        return self.weight_scale.repeat_interleave(widths)

    @torch.no_grad()
    def ternarise_(self) -> None:
        """Offline: the weights as drawn replaced by their ternary values, ``weight_scale`` by their scales."""
        ternary, scales = absmean_ternary(self.weight, self.widths)
        self.weight.copy_(ternary)
        self.weight_scale.copy_(scales)

    def forward(self, input: Tensor) -> Tensor:  # nn.Linear's name
        if not self.offline:
            return F.linear(ActQuant.apply(input), WeightQuant.apply(self.weight, self.widths), self.bias)
        # in float32, the scale held in the input's dtype between (transformers' compiled BitLinear, in bf16 too)
        scale = absmax_scale(input.float()).to(input.dtype).float()
        y = F.linear((input.float() * scale).round().clamp(-128, 127).to(input.dtype), self.weight)
        y = (y.float() / (self.row_scales().float() * scale)).to(y.dtype)
        return y if self.bias is None else y + self.bias


def takes(part: Any) -> bool:
    """Whether a mixer or MLP entry's projections can be BitLinear (``bitlinear_segments`` on the built module)."""
    return getattr(part, "takes_bitlinear", False) or not getattr(part, "present", True)


def validate(cfg: ModelConfig, mixer: type, mlp: type) -> None:
    """bitlinear: every projection of the layer's mixer and MLP entries (``mixer``, ``mlp``) is a Linear it
    replaces; no multi-token prediction modules (their blocks would stay dense)."""
    if cfg.linear.kind != "bitlinear":
        return
    for section, entry in (("attention", mixer), ("mlp", mlp)):
        if not takes(entry):
            kind = getattr(cfg, section).kind
            why = f"dense with model.{section}.kind={kind} (its projections are not Linear layers BitLinear replaces)"
            raise ConfigError("model.linear.kind", "bitlinear", why)
    if cfg.head.mtp.depth:
        raise ConfigError("model.linear.kind", "bitlinear", "dense with model.head.mtp.depth > 0")


def unread(cfg: ModelConfig) -> list[tuple[str, Any]]:
    """``model.linear.weights`` set away from its default while the projections are dense."""
    w = cfg.linear.weights
    return [("model.linear.weights", w)] if cfg.linear.kind == "dense" and w != LinearConfig().weights else []


def convert(blocks: nn.ModuleList, cfg: ModelConfig) -> None:
    """bitlinear: each block's attention and MLP projections replaced by BitLinear layers holding their parameters."""
    if cfg.linear.kind != "bitlinear":
        return
    for block in blocks:
        for part in (block.attn, getattr(block, "mlp", None)):
            segments: Optional[dict[str, tuple[int, ...]]] = getattr(part, "bitlinear_segments", dict)()
            for name, widths in (segments or {}).items():
                linear = getattr(part, name)
                if linear is not None:
                    setattr(part, name, BitLinear(linear, widths, cfg.linear.weights == "offline"))


def ternarise(model: nn.Module) -> None:
    """Every offline BitLinear of a freshly drawn model held as its ternary weights and scales."""
    for module in model.modules():
        if isinstance(module, BitLinear) and module.offline:
            module.ternarise_()
