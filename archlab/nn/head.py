"""Output heads: ``linear`` maps the final hidden state to vocabulary logits with a matrix of its own,
or with the token embedding when ``tied`` (Press & Wolf 2017)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn.component import ModelPart, Role
from archlab.registry import Registry


def embedding_width(cfg: ModelConfig) -> int:
    """The width of the token embeddings and of what the head reads: ``model.embedding_dim``, else d_model."""
    return cfg.embedding_dim if cfg.embedding_dim is not None else cfg.d_model


class Head(ModelPart, nn.Module):
    """A head entry, built once as ``Entry(cfg)`` and called on the final hidden state. Beside the
    Component members: ``tie`` to the token embedding, and ``shared_embedding_params``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()

    def tie(self, embedding: nn.Embedding) -> None:
        """Share what the head multiplies by with the token embedding, where it does (a tied head)."""

    @staticmethod
    def shared_embedding_params(cfg: ModelConfig) -> int:
        """Parameters of the token embedding this head also multiplies by (counted in non-embedding)."""
        return 0

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        tied = "tied" if cfg.head.tied else "untied"
        head = tied if cfg.head.logit_scale == 1.0 else f"{tied} logits×{cfg.head.logit_scale:g}"
        mtp = cfg.head.mtp
        if not mtp.depth:
            return head
        blocks = "" if mtp.layer is None else f", {mtp.layer} blocks"
        return f"{head}, MTP depth {mtp.depth} (λ {mtp.weight:g}{blocks})"


HEADS: Registry[type[Head]] = Registry("model.head.kind", base=Head)


@HEADS.register("linear")
class LinearHead(Head, nn.Linear):
    """``x @ W.T (+ b)`` with ``W`` [vocab, e] (e the embedding width: d_model, or ``model.embedding_dim``
    after the projection out of d_model), times ``logit_scale``, then any softcap; tied, ``W`` is the token
    embedding's table."""

    def __init__(self, cfg: ModelConfig):
        nn.Linear.__init__(self, embedding_width(cfg), cfg.vocab_size, bias=cfg.head.bias)
        self.tied, self.softcap, self.logit_scale = cfg.head.tied, cfg.head.softcap, cfg.head.logit_scale

    def param_roles(self) -> dict[str, Role]:
        # μP's output rule is the multiplier form here (logit_scale carries 1/width), since a tied matrix is
        # also the embedding: the matrix itself trains as an input table (Cerebras' and nanoGPT-mup's μP)
        return {"weight": Role.INPUT, "bias": Role.VECTOR}

    def forward(self, input: Tensor) -> Tensor:  # nn.Linear's parameter name
        logits = super().forward(input)
        if self.logit_scale != 1.0:  # Cohere's logit_scale, Granite's 1/logits_scaling
            logits = logits * self.logit_scale
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap  # soft-capped to (-softcap, softcap) (Gemma 2)

    def tie(self, embedding: nn.Embedding) -> None:
        """Share the embedding's table as this head's weight (after every re-allocation of either)."""
        if self.tied:
            self.weight = embedding.weight

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """The weight unless it is the embedding's, and the bias."""
        V, e = cfg.vocab_size, embedding_width(cfg)
        return (0 if cfg.head.tied else V * e) + (V if cfg.head.bias else 0)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        for name in ("tied", "bias"):
            if not isinstance(getattr(cfg.head, name), bool):
                raise ConfigError(f"model.head.{name}", getattr(cfg.head, name), "true or false")
        if cfg.head.softcap is not None:
            checks.positive("model.head.softcap", cfg.head.softcap, "a positive number, or null")
        checks.positive("model.head.logit_scale", cfg.head.logit_scale)

    @staticmethod
    def shared_embedding_params(cfg: ModelConfig) -> int:
        return cfg.vocab_size * embedding_width(cfg) if cfg.head.tied else 0


def build_head(cfg: ModelConfig) -> Head:
    return HEADS.get(cfg.head.kind)(cfg)
