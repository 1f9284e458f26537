"""QSA indexed attention, ``qsa`` (Qwen4-Exp's ``Qwen4ExpTextAttention`` with its ``Qwen4ExpTextQSAIndexer``):
causal attention whose each query attends to the ``index_budget`` tokens of the blocks an indexer scores
highest, beside every token of the block not yet complete. A query's visible tokens, in order, fall into
blocks of ``index_ratio``; a complete block's key is the mean of the tokens' raw indexer keys, normed and
rotated at the block's first position; its score is Σ_h relu(q_h·k)/sqrt(D) of the query's ``index_n_heads``
normed, rotated indexer queries. The choice is not differentiable: the indexer learns nothing from the loss.
The KV cache holds, beside the keys and values, each position's raw indexer key (``recurrent_state``, which
attention leaves unused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role
from archlab.nn.mixers.attention import AttentionConfig, CausalSelfAttention, qk_norm_config
from archlab.nn.mixers.base import MIXERS, key_visibility, narrow, positions_seen
from archlab.nn.norms import NORMS
from archlab.nn.positions import Rotation


@mixer_config("qsa")
@dataclass
class QSAConfig(AttentionConfig):
    """``model.attention`` with kind qsa: causal attention's fields, and the indexer's."""

    kind: str = "qsa"
    index_n_heads: int = 8  # the indexer's query heads (indexer_n_heads); it has one key head
    index_head_dim: int = 128  # dims of each indexer query and key (indexer_head_dim)
    index_budget: int = 2048  # tokens of complete blocks each query keeps at most (indexer_budget)
    index_ratio: int = 64  # tokens per block, pooled into one key (indexer_compress_ratio)


class QSAIndexer(nn.Module):
    """``qk`` ``[(heads + 1)·D, d]`` (the queries, then the one raw key), the norms ``q_norm`` and ``k_norm``
    over D (the model's QK-norm kind: the queries before rotation, a block's pooled key before its own)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        a = cfg.attention
        self.heads, self.dim, self.ratio = a.index_n_heads, a.index_head_dim, a.index_ratio
        self.blocks = a.index_budget // a.index_ratio
        self.qk = nn.Linear(cfg.d_model, (self.heads + 1) * self.dim, bias=False)
        norm, norm_cfg = NORMS.get(cfg.norm.kind), qk_norm_config(cfg)
        self.q_norm, self.k_norm = norm(norm_cfg, self.dim), norm(norm_cfg, self.dim)

    def project(self, x: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor]:
        """The normed, rotated queries ``[B, T, heads, D]`` and the raw keys ``[B, T, D]`` of ``x``."""
        q, k = self.qk(x).unflatten(-1, (self.heads + 1, self.dim)).split((self.heads, 1), dim=2)
        q = self.q_norm(q)
        return (q if rotary is None else rotary.rotate(q)), k[:, :, 0]

    def select(self, q: Tensor, keys: Tensor, visible: Tensor, rotary: Optional[Rotation]) -> Tensor:
        """Which of the keys ``[B, S, D]`` each query of ``q`` sees, ``[B, T, S]`` bool, of those ``visible``
        ``[B, T, S]`` (a contiguous run each, as causal masks with padding or documents give): the tokens of its
        best ``blocks`` complete blocks, and the rest after them."""
        r = self.ratio
        rank = visible.cumsum(-1) - 1  # each visible key's place among the query's
        counts = visible.sum(-1)  # [B, T]
        complete = counts // r
        start = torch.where(counts > 0, visible.int().argmax(-1), 0)  # the first visible key
        chosen = visible & (rank >= (complete * r).unsqueeze(-1))  # the block not yet complete
        for b in range(q.shape[0]):
            for s0 in start[b].unique().tolist():
                rows = (start[b] == s0).nonzero().flatten()
                n = (keys.shape[1] - s0) // r  # the blocks that may be complete from this start
                if n == 0:
                    continue
                pooled = keys[b, s0 : s0 + n * r].float().unflatten(0, (n, r)).mean(1).to(keys.dtype)
                pooled = self.k_norm(pooled)[None, :, None]  # [1, n, 1, D]
                if rotary is not None:
                    pooled = rotary.at(torch.arange(n, device=q.device) * r).rotate(pooled)
                dtype = torch.promote_types(q.dtype, torch.float32)  # float32 at least, as transformers'
                scores = F.relu(q[b, rows].to(dtype) @ pooled[0, :, 0].to(dtype).T.unsqueeze(0)).sum(1) / self.dim**0.5
                scores = scores.masked_fill(torch.arange(n, device=q.device) >= complete[b, rows, None], float("-inf"))
                # the best, ties to the earlier block (a row's choice never depends on how many rows run)
                best = scores.sort(dim=-1, descending=True, stable=True).indices[:, : min(self.blocks, n)]
                picked = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best, True)
                picked &= torch.arange(n, device=q.device) < complete[b, rows, None]
                tokens = picked.repeat_interleave(r, dim=-1)  # [rows, n·r] from s0 on
                chosen[b, rows, s0 : s0 + n * r] |= tokens & visible[b, rows, s0 : s0 + n * r]
        return chosen


@MIXERS.register("qsa")
class QSAAttention(CausalSelfAttention):
    """causal attention, its keys narrowed per query by a ``QSAIndexer`` (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        self.indexer = QSAIndexer(cfg)

    def param_roles(self) -> dict[str, Role]:
        vectors = {f"indexer.{n}": Role.VECTOR for n, _ in self.indexer.named_parameters() if "norm" in n}
        return super().param_roles() | {"indexer.qk.weight": Role.HIDDEN} | vectors

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, _ = x.shape
        with torch.no_grad():  # the choice carries no gradient
            q, keys = self.indexer.project(x, rotary)
            if cache is not None:
                held = cache.recurrent_state[layer]
                keys = keys if held is None else torch.cat((held, keys), dim=1)
                cache.recurrent_state[layer] = keys
            S = keys.shape[1]
            visible = key_visibility(mask, T, S, x.device).expand(B, T, S)
            chosen = self.indexer.select(q, keys, visible, rotary)
        return super().forward(x, rotary, narrow(chosen, mask), cache, layer)

    def score_stats(self, x, rotary=None, mask=None):  # typed as Mixer.score_stats
        """None: the indexer narrows each query's keys, which attention's scores over every key would not show."""
        return None

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """causal attention's, and the indexer's: d·(h + 1)·D and its two norms over D."""
        a = cfg.attention
        norm = NORMS.get(cfg.norm.kind).num_params(qk_norm_config(cfg), a.index_head_dim)
        return super().num_params(cfg, layer) + cfg.d_model * (a.index_n_heads + 1) * a.index_head_dim + 2 * norm

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """causal attention's, and the raw indexer key: index_head_dim more per position."""
        extra = cfg.attention.index_head_dim * positions_seen(cfg, length, layer)
        return CausalSelfAttention.kv_cache_values(cfg, length, layer) + extra

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        a = cfg.attention
        checks.integer("model.attention.index_n_heads", a.index_n_heads, 1)
        checks.integer("model.attention.index_head_dim", a.index_head_dim, 1)
        checks.integer("model.attention.index_ratio", a.index_ratio, 1)
        checks.integer("model.attention.index_budget", a.index_budget, 1)
        if a.index_budget % a.index_ratio:
            raise ConfigError("model.attention.index_budget", a.index_budget, "a multiple of index_ratio")
        for name in ("window", "chunk"):  # a block's first position is its place among the visible keys
            if getattr(a, name) is not None:
                raise ConfigError(f"model.attention.{name}", getattr(a, name), "null with kind qsa")
        if a.kv_shared:
            raise ConfigError("model.attention.kv_shared", a.kv_shared, "false with kind qsa")

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """causal attention's, and the indexer's heads, width, blocks and budget."""
        a = cfg.attention
        return (
            f"qsa: {CausalSelfAttention.describe(cfg)}; indexer {a.index_n_heads}h x {a.index_head_dim}, "
            f"blocks of {a.index_ratio}, budget {a.index_budget}"
        )
