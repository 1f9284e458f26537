"""The decoder: token embedding -> position scheme -> blocks -> final norm -> head."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from archlab.config import ModelConfig
from archlab.nn.attention import KVCache, attention_mask
from archlab.nn.block import BLOCKS, build_block
from archlab.nn.head import build_head
from archlab.nn.norms import build_norm
from archlab.nn.positions import build_position, uninitialised_embedding


class Decoder(nn.Module):
    """A decoder-only transformer assembled from the registries named in ``cfg``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = uninitialised_embedding(cfg.vocab_size, cfg.d_model)
        self.position = build_position(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(build_block(cfg, i) for i in range(cfg.n_layer))
        self.final_norm = build_norm(cfg) if BLOCKS.get(cfg.block.kind).final_norm else None
        self.head = build_head(cfg)
        self.head.tie(self.tok_emb)
        # Recompute each block's activations in backward instead of keeping them: less memory, more compute.
        self.activation_checkpointing = False

    def forward(self, idx: Tensor, cache: Optional[KVCache] = None) -> Tensor:
        """Logits ``[B, T, vocab]`` for tokens ``idx`` ``[B, T]``; with ``cache``, continue after it."""
        start = cache.length if cache is not None else 0
        T = idx.shape[1]
        limit = self.position.max_positions
        if limit is not None and start + T > limit:  # checked on ints: no device sync, no graph break
            raise ValueError(
                f"position {start + T - 1} is past model.context_length={limit}: learned positions have "
                "no entry there; shorten the sequence or raise model.context_length"
            )
        q_pos = torch.arange(start, start + T, device=idx.device)
        x = self.tok_emb(idx)
        if self.cfg.scale_embedding:  # sqrt(d_model), rounded to x's dtype as Gemma does
            x = x * torch.tensor(self.cfg.d_model**0.5, dtype=x.dtype)
        x = self.drop(self.position.embed(x, q_pos))
        rotary = self.position.rotary(q_pos, x.dtype, cached=cache is not None)
        windows = {block.attn.window for block in self.blocks}
        masks = {w: self.mask(q_pos, start, cache.kept(w) if cache is not None else 0, w, x.dtype) for w in windows}
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            mask = masks[block.attn.window]
            x = (
                checkpoint(block, x, rotary, mask, cache, use_reentrant=False)
                if recompute
                else block(x, rotary, mask, cache)
            )
        if cache is not None:
            cache.length += T
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.head(x)

    def mask(self, q_pos: Tensor, start: int, kept: int, window: Optional[int], dtype: torch.dtype) -> Optional[Tensor]:
        """The attention mask (and position bias) of layers with this ``window``, for queries at
        ``q_pos`` (from ``start``) and the keys such a layer attends to: the ``kept`` cached ones, then the new ones."""
        k_pos = torch.arange(start - kept, start + len(q_pos), device=q_pos.device) if kept else q_pos
        bias = self.position.bias(q_pos, k_pos)
        return attention_mask(q_pos, k_pos, None if bias is None else bias.to(dtype), window)

    def compile_blocks(self) -> None:
        """``torch.compile`` each block in place (``compile=true`` in archlab-train and archlab-bench).
        Per block, not the whole model: every block runs the same compiled graph, so compile time does not
        grow with depth (docs/performance.md compares the two)."""
        for block in self.blocks:
            block.compile()

    def new_cache(self, batch_size: int, max_len: Optional[int] = None) -> KVCache:
        """An empty KV cache for ``batch_size`` sequences of up to ``max_len`` positions."""
        p = self.tok_emb.weight
        return KVCache(self.cfg, batch_size, max_len or self.cfg.context_length, p.device, p.dtype)

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 init: N(0, init_std) for matrices and tables, zero biases, unit norm scales, and
        residual output projections scaled by 1/sqrt(2·n_layer) (Radford et al. 2019)."""
        std = self.cfg.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                scale = 1 / math.sqrt(2 * self.cfg.n_layer) if getattr(module, "residual", False) else 1.0
                nn.init.normal_(module.weight, 0.0, std * scale)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()
