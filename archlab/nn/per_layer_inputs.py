"""Per-layer input embeddings (``model.per_layer_input``, Gemma 3n and 4's PLE): each layer reads an input of
its own, from a table of the tokens and a projection of their embeddings (``PerLayerInputs``, the model's),
and adds it to the stream after its sublayers through a gate (``PerLayerGate``, each block's); their counts in
closed form, their μP roles and their checks."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.config.model import PerLayerInputConfig
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.norms import NORMS
from archlab.nn.positions import uninitialised_embedding
from archlab.nn.streams.base import STREAMS

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
    "relu": F.relu,
}


def table_rows(cfg: ModelConfig) -> int:
    """The per-layer table's rows: ``per_layer_input.vocab``, else ``vocab_size``."""
    v = cfg.per_layer_input.vocab
    return cfg.vocab_size if v is None else v


def table_params(cfg: ModelConfig) -> int:
    """The per-layer table, rows × L·p (an embedding: out of the non-embedding count)."""
    p = cfg.per_layer_input.dim
    return table_rows(cfg) * cfg.n_layer * p if p else 0


def model_params(cfg: ModelConfig) -> int:
    """The model's own part beside the table: the projection d × L·p and the norm over p."""
    p = cfg.per_layer_input.dim
    return cfg.d_model * cfg.n_layer * p + NORMS.get(cfg.norm.kind).num_params(cfg, p) if p else 0


def layer_params(cfg: ModelConfig) -> int:
    """One layer's gate d × p, its projection p × d and its norm over d."""
    p = cfg.per_layer_input.dim
    return 2 * cfg.d_model * p + NORMS.get(cfg.norm.kind).num_params(cfg) if p else 0


def unread(cfg: ModelConfig) -> list[tuple[str, Any]]:
    """(field, value) of ``vocab`` and ``activation`` where set away from their defaults while ``dim`` is 0 (a
    sweep over ``dim`` from 0 sets them for every run): ``nn.validation.ignored`` reports them."""
    pli, default = cfg.per_layer_input, PerLayerInputConfig()
    if pli.dim:
        return []
    changed = [name for name in ("vocab", "activation") if getattr(pli, name) != getattr(default, name)]
    return [(f"model.per_layer_input.{name}", getattr(pli, name)) for name in changed]


def validate(cfg: ModelConfig) -> None:
    """``dim`` and ``vocab`` are sizes; blocks that run on one stream (one alone, or AltUp's active copy), no multi-token prediction modules (whose blocks
    would read no input of their own)."""
    pli = cfg.per_layer_input
    checks.integer("model.per_layer_input.dim", pli.dim, 0, "a whole number >= 0 (0: no per-layer inputs)")
    if pli.vocab is not None:
        checks.integer("model.per_layer_input.vocab", pli.vocab, 1, "a positive integer, or null (vocab_size)")
    if not pli.dim:
        return
    if STREAMS.get(cfg.stream.kind).multiple and not STREAMS.get(cfg.stream.kind).wraps_layers:
        raise ConfigError("model.per_layer_input.dim", pli.dim, f"0 with model.stream.kind={cfg.stream.kind}")
    if cfg.head.mtp.depth:
        raise ConfigError("model.per_layer_input.dim", pli.dim, "0 with multi-token prediction modules")


class PerLayerInputs(nn.Module):
    """Every layer's input ``[B, T, L, p]``: ``(norm(proj(e)·d^-1/2) + table[token]·sqrt(p))·2^-1/2``, from the
    token embeddings ``e`` as the first block reads them (scaled, before any position scheme); a token past a
    table smaller than the vocabulary reads its row 0."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_layer, self.dim, self.d_model = cfg.n_layer, cfg.per_layer_input.dim, cfg.d_model
        self.rows, self.vocab_size = table_rows(cfg), cfg.vocab_size
        self.table = uninitialised_embedding(self.rows, self.n_layer * self.dim)
        self.projection = nn.Linear(cfg.d_model, self.n_layer * self.dim, bias=False)
        self.norm = NORMS.get(cfg.norm.kind)(cfg, self.dim)

    def forward(self, idx: Tensor, embedded: Tensor) -> Tensor:
        if self.rows < self.vocab_size:  # a token past a smaller table reads its row 0 (Gemma 3n's)
            idx = torch.where(idx < self.rows, idx, 0)
        rows = self.table(idx)  # sqrt(p) in float32, rounded to the table's dtype, as Gemma scales embeddings
        rows = rows * torch.tensor(self.dim**0.5, dtype=torch.float32).to(rows.dtype)
        projected = self.projection(embedded) * self.d_model**-0.5
        projected = self.norm(projected.unflatten(-1, (self.n_layer, self.dim)))
        return (projected + rows.unflatten(-1, (self.n_layer, self.dim))) * 2**-0.5

    @staticmethod
    def param_roles() -> dict[str, Role]:
        """The table has no width-sized dim (a vector's rule); the projection reads the width into L·p."""
        return {"table.weight": Role.VECTOR, "projection.weight": Role.OUTPUT}


class PerLayerGate(nn.Module):
    """What a layer adds to the stream ``x`` from its input ``u`` ``[B, T, p]``: ``norm(up(act(gate(x))·u))``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        p = cfg.per_layer_input.dim
        self.gate = nn.Linear(cfg.d_model, p, bias=False)
        self.up = residual_projection(nn.Linear(p, cfg.d_model, bias=False))
        self.norm = NORMS.get(cfg.norm.kind)(cfg)
        self.act = ACTIVATIONS[cfg.per_layer_input.activation]

    def forward(self, x: Tensor, u: Tensor) -> Tensor:
        return self.norm(self.up(self.act(self.gate(x)) * u))

    @staticmethod
    def param_roles(prefix: str) -> dict[str, Role]:
        """The gate reads the width into p (an output's rule); the up projection writes p into it (an input's)."""
        return {f"{prefix}.gate.weight": Role.OUTPUT, f"{prefix}.up.weight": Role.INPUT}
