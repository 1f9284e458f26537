"""The interface every model registry entry implements, in three shapes by how the model builds it:
``Component`` (what every entry answers), ``LayerPart`` (attention, MLPs, blocks: built per layer as
``Entry(cfg, layer)``) and ``ModelPart`` (positions, heads: built once as ``Entry(cfg)``). Norms, built
over a given width, derive from ``Component`` with ``num_params(cfg, dim)`` (archlab/nn/norms.py).

Every member is a closed form of the config alone, never of a module: ``archlab.accounting`` sums them
without building anything. Each family's base class (``Norm``, ``Position``, ``Mixer``, ``MLP``,
``Block``, ``Head``) adds what its callers ask of it, and its registry refuses a class not derived from it.
Entries mark their projections into the residual stream with ``residual_projection``, which
``Decoder.init_weights`` reads (``is_residual_projection``), and declare each parameter's role under μP
(``param_roles``), which ``archlab.training.parametrization`` reads.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

from torch import nn

from archlab.config import ModelConfig


def residual_projection(linear: nn.Linear) -> nn.Linear:
    """``linear`` marked as a projection into the residual stream: ``Decoder.init_weights`` scales its
    init by 1/sqrt(2·n_layer) (GPT-2)."""
    linear.residual = True  # pyright: ignore[reportArgumentType]  # a plain flag: torch types Module.__setattr__ for Tensor | Module only
    return linear


def is_residual_projection(module: nn.Module) -> bool:
    return getattr(module, "residual", False)


class Role(str, Enum):
    """How a parameter's shape grows with the model's width, which sets its μP rule (Yang et al. 2022,
    Table 3, for Adam): ``input`` (a table whose rows are width-sized: token and position embeddings, and
    the head's matrix, whose output multiplier is ``model.head.logit_scale``), ``hidden`` (fan-in and
    fan-out both grow: the projections), ``output`` (the fan-in grows, the fan-out does not: a router, a
    gate per head), ``vector`` (biases, norm scales, one value per channel or per head)."""

    INPUT = "input"
    HIDDEN = "hidden"
    OUTPUT = "output"
    VECTOR = "vector"


class Component:
    """What every entry answers: its checks, a short description and the fields it uses."""

    def param_roles(self) -> Optional[dict[str, Role]]:
        """The ``Role`` of each parameter the entry holds itself, by its name relative to the entry (the
        entries it holds, norms inside attention, answer for theirs); None: it declares none, and
        ``param=mup|completep`` refuses it."""
        return None

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Raise ``ConfigError`` naming the first field of ``cfg`` this variant cannot honour."""

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """The variant and its sizes in a few words, for ``archlab-check``'s layout line."""
        raise NotImplementedError

    @classmethod
    def reads(cls, cfg: ModelConfig) -> Optional[frozenset[str]]:
        """The fields of its family's section (``model.<family>.<field>``) this variant uses at these
        settings; one outside them set away from its default is ignored, and training and
        ``archlab-check`` say so (``nn.validation.ignored``). None: it uses them all."""
        return None

    @classmethod
    def unread(cls, cfg: ModelConfig, field: str) -> Optional[str]:
        """Why a field this variant has goes unread at these settings (another field takes its place), for
        ``nn.validation.ignored`` to say; None: the variant does not use it at all."""
        return None


class LayerPart(Component):
    """An entry built per layer, ``Entry(cfg, layer)``: a layer may differ from the others (a sliding
    window, a mixture of experts' first dense layers)."""

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Parameters of the instance of layer ``layer`` built from ``cfg``."""
        return 0

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Training FLOPs per token of the instance of layer ``layer`` beyond 6 per weight (attention's
        scores, ``seq_len`` keys at most); none unless the entry says otherwise."""
        return 0

    @classmethod
    def active_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Of those, the parameters one token's forward pass goes through (a mixture of experts: only
        the experts it is routed to); all of them unless the entry says otherwise."""
        return cls.num_params(cfg, layer)


class ModelPart(Component):
    """An entry built once per model, ``Entry(cfg)``."""

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """Parameters of the one instance built from ``cfg``."""
        return 0
