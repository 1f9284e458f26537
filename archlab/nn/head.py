"""Output heads: ``linear`` maps the final hidden state to vocabulary logits with a matrix of its own,
or with the token embedding when ``tied`` (Press & Wolf 2017); ``transform`` first passes the state through
a dense layer, an activation and a norm (BERT's and ModernBERT's prediction head)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn.component import ModelPart, Role
from archlab.nn.norms import NORMS
from archlab.registry import Registry


def embedding_width(cfg: ModelConfig) -> int:
    """The width of the token embeddings and of what the head reads: ``model.embedding_dim``, else d_model."""
    return cfg.embedding_dim if cfg.embedding_dim is not None else cfg.d_model


def head_vocab(cfg: ModelConfig) -> int:
    """The head's rows, the width of the logits: ``model.head.vocab``, else ``vocab_size``."""
    return cfg.vocab_size if cfg.head.vocab is None else cfg.head.vocab


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
    def logit_params(cfg: ModelConfig) -> int:
        """The parameters one position's logits pass through (a multi-token prediction module's FLOPs count
        them once more): the vocabulary matrix, its rows × embedding width."""
        return head_vocab(cfg) * embedding_width(cfg)

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
LINEAR_READS = frozenset({"tied", "bias", "softcap", "logit_scale", "vocab", "mtp"})  # the linear head's fields


@HEADS.register("linear")
class LinearHead(Head, nn.Linear):
    """``x @ W.T (+ b)`` with ``W`` [rows, e] (rows ``model.head.vocab`` or the vocabulary; e the embedding
    width: d_model, or ``model.embedding_dim`` after the projection out of d_model), times ``logit_scale``,
    then any softcap; tied, ``W`` is the token embedding's table."""

    def __init__(self, cfg: ModelConfig):
        nn.Linear.__init__(self, embedding_width(cfg), head_vocab(cfg), bias=cfg.head.bias)
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
        V, e = head_vocab(cfg), embedding_width(cfg)
        return (0 if cfg.head.tied else V * e) + (V if cfg.head.bias else 0)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        for name in ("tied", "bias"):
            if not isinstance(getattr(cfg.head, name), bool):
                raise ConfigError(f"model.head.{name}", getattr(cfg.head, name), "true or false")
        if cfg.head.softcap is not None:
            checks.positive("model.head.softcap", cfg.head.softcap, "a positive number, or null")
        checks.positive("model.head.logit_scale", cfg.head.logit_scale)
        if cfg.head.vocab is not None:
            checks.integer(
                "model.head.vocab", cfg.head.vocab, 1, f"null, or an integer in [1, vocab_size={cfg.vocab_size}]"
            )
            if cfg.head.vocab > cfg.vocab_size:
                raise ConfigError("model.head.vocab", cfg.head.vocab, f"null, or at most vocab_size={cfg.vocab_size}")
            if cfg.head.tied and cfg.head.vocab != cfg.vocab_size:
                raise ConfigError("model.head.vocab", cfg.head.vocab, "null with a tied head (it is the whole table)")

    @staticmethod
    def shared_embedding_params(cfg: ModelConfig) -> int:
        return cfg.vocab_size * embedding_width(cfg) if cfg.head.tied else 0

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return LINEAR_READS


ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class TransformHead(LinearHead):
    """``linear`` of ``norm(act(dense(x)))``: a dense e × e (its bias with ``transform_bias``), the activation
    ``transform_activation`` and a norm of ``model.norm``'s kind and settings over e, then the vocabulary
    matrix (tied or not, its bias, logit scale and softcap as ``linear``'s). ModernBERT's ``lm_head``
    (``ModernBertPredictionHead``: dense, ``classifier_activation``, LayerNorm) before its ``decoder``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        e = embedding_width(cfg)
        self.dense = nn.Linear(e, e, bias=cfg.head.transform_bias)
        self.activation = ACTIVATIONS[cfg.head.transform_activation]
        self.transform_norm = NORMS.get(cfg.norm.kind)(cfg, e)

    def param_roles(self) -> dict[str, Role]:
        roles = {"dense.weight": Role.HIDDEN, "dense.bias": Role.VECTOR}  # e × e, as a block's matrices
        return (super().param_roles() or {}) | roles | {f"transform_norm.{n}": Role.VECTOR for n in ("weight", "bias")}

    def forward(self, input: Tensor) -> Tensor:
        return super().forward(self.transform_norm(self.activation(self.dense(input))))

    @staticmethod
    def transform_params(cfg: ModelConfig) -> int:
        """The dense e × e (+ e with its bias) and the norm over e."""
        e = embedding_width(cfg)
        return e * e + (e if cfg.head.transform_bias else 0) + NORMS.get(cfg.norm.kind).num_params(cfg, e)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return LinearHead.num_params(cfg) + TransformHead.transform_params(cfg)

    @staticmethod
    def logit_params(cfg: ModelConfig) -> int:
        return Head.logit_params(cfg) + TransformHead.transform_params(cfg)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        if not isinstance(cfg.head.transform_bias, bool):
            raise ConfigError("model.head.transform_bias", cfg.head.transform_bias, "true or false")

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        bias = ", bias" if cfg.head.transform_bias else ""
        return f"transform (dense{bias}, {cfg.head.transform_activation}, {cfg.norm.kind}) {Head.describe(cfg)}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return LINEAR_READS | {"transform_activation", "transform_bias"}


HEADS.register("transform")(TransformHead)  # after the class: the name keeps its own type for its members


def build_head(cfg: ModelConfig) -> Head:
    return HEADS.get(cfg.head.kind)(cfg)
