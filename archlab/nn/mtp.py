"""Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 §2.2): ``model.head.mtp.depth`` modules after the
decoder, module k turning [norm(emb(t_{i+k})), norm(h^{k-1}_i)] through one matrix and one block into h^k_i,
whose logits (its norm, then the model's own head) predict t_{i+k+1}. h^0 is what the model's head reads
(after the final norm), h^k module k's output after its norm, so each module reads what the last one predicted
from. Training adds their mean cross-entropy times ``weight``; decoding may draft tokens with them
(``archlab.speculative``)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import Tensor, nn

from archlab import checks
from archlab.config import STREAM_OPTIONS, ModelConfig
from archlab.config.layers import kind_config
from archlab.config.model import MTPConfig
from archlab.errors import ConfigError
from archlab.nn.block import Block, build_block
from archlab.nn.norms import build_norm
from archlab.nn.streams import STREAMS


def mtp_layer(cfg: ModelConfig) -> ModelConfig:
    """The config of each module's block: layer kind ``model.head.mtp.layer``'s, or the model's own, on one
    residual stream (the model's streams are merged before the final norm the first module reads) and
    without value residual (the first layer's values are of the model's positions, which a block of a
    module does not run on)."""
    name = cfg.head.mtp.layer
    layer = cfg if name is None else kind_config(cfg, name)
    if STREAMS.get(layer.stream.kind).multiple:
        layer = dataclasses.replace(layer, stream=STREAM_OPTIONS.build({}, "model.stream"))
    if getattr(layer.attention, "value_residual", False):
        layer = dataclasses.replace(layer, attention=dataclasses.replace(layer.attention, value_residual=False))
    return layer


def mtp_layer_index(cfg: ModelConfig, k: int) -> int:
    """Module ``k``'s block (from 0) counted after the model's layers, as the checkpoints number it
    (DeepSeek-V3's ``model.layers.61``): its slot in a KV cache of the model and its modules."""
    return cfg.n_layer + k


def with_depth(cfg: ModelConfig, depth: int, layer: Optional[str] = None) -> ModelConfig:
    """``cfg`` with ``depth`` modules, their blocks of layer kind ``layer`` (None: the model's own parts)."""
    return dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, mtp=MTPConfig(depth=depth, layer=layer)))


class MTPModule(nn.Module):
    """One depth: the two norms, the projection of their concatenation, the block and the norm before the head."""

    def __init__(self, cfg: ModelConfig, layer: ModelConfig, index: int):
        super().__init__()
        self.enorm, self.hnorm = build_norm(cfg), build_norm(cfg)  # the next token's embedding, the last state
        self.eh_proj = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)
        self.block: Block = build_block(layer, index)
        self.norm = build_norm(cfg)

    def enter(self, embedded: Tensor, state: Tensor) -> Tensor:
        """The block's input from the next tokens' embeddings and the last depth's states, both ``[B, T, d]``."""
        return self.eh_proj(torch.cat((self.enorm(embedded), self.hnorm(state)), dim=-1))


class MultiTokenPrediction(nn.Module):
    """The ``depth`` modules (counted in closed form by ``accounting``, each block from ``mtp_layer``'s entries)."""

    def __init__(self, cfg: ModelConfig, layer: ModelConfig):
        """``layer``: the config of each module's block (``mtp_layer``'s)."""
        super().__init__()
        self.weight = cfg.head.mtp.weight
        self.depths = nn.ModuleList(MTPModule(cfg, layer, mtp_layer_index(cfg, k)) for k in range(cfg.head.mtp.depth))
        self.aux_losses: dict[str, tuple[float, Tensor]] = {}  # the latest training forward's (Decoder.forward)

    @staticmethod
    def validate(cfg: ModelConfig) -> None:
        mtp = cfg.head.mtp
        checks.integer("model.head.mtp.depth", mtp.depth, 0, "an integer >= 0 (0: no multi-token prediction)")
        if not mtp.depth:
            return
        checks.positive("model.head.mtp.weight", mtp.weight)
        if mtp.depth >= cfg.context_length:
            raise ConfigError("model.head.mtp.depth", mtp.depth, f"less than model.context_length={cfg.context_length}")
        kinds = sorted(cfg.layers.kinds or {})
        if mtp.layer is not None and mtp.layer not in kinds:
            named = f"a kind of model.layers.kinds ({', '.join(kinds)})" if kinds else "null (no layer kinds defined)"
            raise ConfigError("model.head.mtp.layer", mtp.layer, f"{named}, or null for the model's own parts")
        routing = getattr(mtp_layer(cfg).mlp, "routing", None)
        if routing is not None and routing.selection == "hash":  # a module's block reads states, not its ids
            raise ConfigError("model.head.mtp.layer", mtp.layer, "a layer kind whose MoE is not hash-routed")
