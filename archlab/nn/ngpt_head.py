"""The ``ngpt`` head (nGPT, Loshchilov et al. 2024, arXiv:2410.01131): ``linear``'s logits times a learned
s_z per vocabulary entry, a scaled parameter, which sets the softmax's temperature that the unit states
leave free (transformers' ``DoryLMHead``)."""

from __future__ import annotations

from typing import Optional, cast

import torch
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn.component import Role
from archlab.nn.head import HEADS, LINEAR_READS, LinearHead, head_vocab
from archlab.nn.scaled import ScaledVector, scale_or_default, unit_along


class NGPTHead(LinearHead):
    """``linear`` (tied or not, its bias and ``logit_scale``) times s_z ``[vocab]``, computed in float32 at least."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        h = cfg.head
        self.s_z = ScaledVector(head_vocab(cfg), h.scale_init, scale_or_default(h.scale_scale, cfg.d_model))

    def tie(self, embedding: nn.Embedding) -> None:
        """``linear``'s tie, and the token embedding kept (unregistered) to put on the sphere with the head."""
        super().tie(embedding)
        vars(self)["embedding"] = embedding  # not a submodule: the decoder holds it

    def to_sphere(self) -> None:
        """The vocabulary matrix's rows and the token embedding's unit vectors along d_model (nGPT §2.2)."""
        unit_along(cast(Tensor, self.weight), 1)  # a Parameter (tied: the embedding's)
        embedding: Optional[nn.Embedding] = vars(self).get("embedding")
        if embedding is not None:
            unit_along(embedding.weight, 1)

    def param_roles(self) -> dict[str, Role]:
        return (super().param_roles() or {}) | {"s_z.weight": Role.VECTOR}

    def forward(self, input: Tensor) -> Tensor:
        logits = super().forward(input)
        wide = torch.promote_types(logits.dtype, torch.float32)
        return logits.to(wide) * self.s_z().to(wide)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """``linear``'s and s_z, one per vocabulary entry."""
        return LinearHead.num_params(cfg) + head_vocab(cfg)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        h = cfg.head
        checks.positive("model.head.scale_init", h.scale_init)
        if h.scale_scale is not None:
            checks.positive("model.head.scale_scale", h.scale_scale, "a positive number, or null (1/sqrt(d_model))")
        if h.softcap is not None:
            raise ConfigError("model.head.softcap", h.softcap, "null with head kind ngpt (s_z scales the logits)")

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        return f"ngpt s_z {cfg.head.scale_init:g}, {LinearHead.describe(cfg)}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return (LINEAR_READS - {"softcap"}) | {"scale_init", "scale_scale"}


HEADS.register("ngpt")(NGPTHead)  # after the class, as transform: the name keeps its own type
