"""DeepSeek-V4's attention, ``dsv4``: queries through a low-rank bottleneck, one key/value head read as both
the keys and the values (shared-KV MQA), each head's trailing ``qk_rope_head_dim`` dims rotated, a learned
sink per head, the output's rotated dims turned back to the query's position, and a grouped low-rank output
projection; per layer (``compress``) beside its sliding window, keys pooled from blocks of ``compress_rate``
positions: every block (HCA), or overlapping blocks of which a lightning indexer picks ``index_topk`` per
query (CSA). The KV cache holds the one head's window, the pooled blocks and the projections of the
positions a block still needs."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.attention import sink_key, softmax_scale
from archlab.nn.mixers.base import (
    MIXERS,
    KVCache,
    Mixer,
    ScoreStats,
    Tokens,
    positions_seen,
    scores_of,
    visible_keys,
)
from archlab.nn.norms import NORMS, Norm, l2_norm
from archlab.nn.positions import Rotation


@mixer_config("dsv4")
@dataclass
class DSV4Config(MixerConfig):
    """``model.attention`` with kind dsv4, DeepSeek-V4's attention: its heads' sizes, the query rank, the
    grouped output projection and the sliding window."""

    kind: str = "dsv4"
    head_dim: int = 512  # dims of each query head and of the one key/value head
    qk_rope_head_dim: int = 64  # the trailing dims of each head RoPE rotates (V4: 64 of 512)
    q_lora_rank: int = 1024  # queries through a bottleneck of this rank
    o_groups: int = 8  # the heads' outputs split into this many groups, each projected on its own ...
    o_lora_rank: int = 1024  # ... to this many dims, before one projection of all groups to d_model
    window: Optional[int] = 128  # a query sees itself and the window-1 positions before it; None = all
    dropout: float = 0.0  # on the attention probabilities, in training
    scale: Optional[float] = None  # the scores' multiplier; None = 1/sqrt(head_dim)
    # keys pooled from blocks beside the window: none (V4's sliding_attention) | hca (every block of
    # compress_rate positions: heavily_compressed_attention) | csa (blocks over 2·compress_rate positions, a
    # stride of compress_rate, index_topk of them per query by a lightning indexer: compressed_sparse_attention)
    compress: str = choice("none", "hca", "csa")
    compress_rate: int = 4  # positions per block (V4: csa 4, hca 128)
    index_n_heads: int = 64  # csa: the indexer's query heads
    index_head_dim: int = 128  # csa: dims of each indexer query and of each block's indexer key
    index_topk: int = 512  # csa: blocks each query attends to, the indexer's best (all it sees where fewer)
    # csa: weight of the indexer's KL loss to the attention's distribution over the blocks it chose (its only signal)
    index_loss_weight: float = 1.0


class Compressor(nn.Module):
    """Blocks of ``rate`` positions pooled into one key each: per position a key ``kv_proj(x)`` and a gate
    ``gate_proj(x)``, plus a learned bias per position in the block; each dim of the pooled key is the
    softmax-over-positions of the gates weighting the keys, then ``kv_norm``. ``overlap`` (CSA): each
    position projects two halves, the first (``Ca``) pooled into the next block's key, the second (``Cb``)
    into its own block's; a block's key pools 2·rate positions (the first block's earlier half none)."""

    def __init__(self, cfg: ModelConfig, dim: int, rate: int, overlap: bool):
        super().__init__()
        self.dim, self.rate, self.overlap = dim, rate, overlap
        width = 2 * dim if overlap else dim
        self.kv_proj = nn.Linear(cfg.d_model, width, bias=False)
        self.gate_proj = nn.Linear(cfg.d_model, width, bias=False)
        self.position_bias = nn.Parameter(torch.empty(rate, width))
        self.kv_norm: Norm = NORMS.get(cfg.norm.kind)(cfg, dim)

    def project(self, x: Tensor) -> Tensor:
        """What a block's key is pooled from, per position: ``[B, T, 2·width]``, the keys then the gates."""
        return torch.cat((self.kv_proj(x), self.gate_proj(x)), dim=-1)

    def pool(self, buffer: Tensor, ends: Tensor, first: Tensor) -> Tensor:
        """The keys ``[B, N, dim]`` of the blocks ending at ``ends`` ``[B, N]`` (indices into ``buffer``
        ``[B, L, 2·width]``, ``project``'s of positions in order); ``first`` ``[B, N]``: the block is its
        sequence's first, with no earlier half to pool (CSA)."""
        B, N = ends.shape
        kv, gate = buffer.split(buffer.shape[-1] // 2, dim=-1)

        def taken(t: Tensor, last: Tensor) -> Tensor:  # the rate positions ending at last: [B, N, rate, width]
            idx = (last[..., None] - self.rate + 1 + torch.arange(self.rate, device=t.device)).clamp(min=0)
            return t.gather(1, idx.flatten(1)[..., None].expand(-1, -1, t.shape[-1])).view(B, N, self.rate, -1)

        keys, gates = taken(kv, ends), taken(gate, ends) + self.position_bias.to(gate.dtype)
        if self.overlap:
            earlier_keys = taken(kv, ends - self.rate)[..., : self.dim]
            earlier = (taken(gate, ends - self.rate) + self.position_bias.to(gate.dtype))[..., : self.dim]
            earlier = earlier.masked_fill(first[..., None, None], float("-inf"))
            keys = torch.cat((earlier_keys, keys[..., self.dim :]), dim=2)
            gates = torch.cat((earlier, gates[..., self.dim :]), dim=2)
        weights = gates.softmax(dim=2, dtype=torch.promote_types(gates.dtype, torch.float32)).to(keys.dtype)
        return self.kv_norm((keys * weights).sum(dim=2))


def index_kl(q: Tensor, blocks: Tensor, chosen: Tensor, scores: Tensor, scale: float) -> Tensor:
    """The indexer's loss: over the queries that chose a block, the mean of KL(p ‖ softmax of its ``scores``)
    ``[B, T, K]``, p the attention's probabilities of queries ``q`` ``[B, H, T, hd]`` over the ``blocks``
    ``[B, K, hd]`` it ``chose`` alone, averaged over heads and normalised (p carries no gradient)."""
    rows = chosen.any(-1)
    allowed = chosen | ~rows[..., None]  # a row that chose none: any, dropped from the mean
    with torch.no_grad():
        logits = (q @ blocks[:, None].transpose(-1, -2)) * scale
        p = logits.masked_fill(~allowed[:, None], float("-inf")).softmax(-1).mean(1).to(scores.dtype)
    log_q = scores.masked_fill(~allowed, float("-inf")).log_softmax(-1).masked_fill(~allowed, 0.0)
    kl = (torch.special.xlogy(p, p) - p * log_q).sum(-1)
    return (kl * rows).sum() / rows.sum().clamp(min=1)


class Indexer(Compressor):
    """CSA's lightning indexer: its own overlapping blocks of ``index_head_dim`` (a ``Compressor``), queries
    ``q_up`` of the attention's query latent, head weights ``head_weights(x)/sqrt(h)``; a query's score of
    a block is Σ_h w_h·relu(q_h·k)/sqrt(D), computed in float32 at least."""

    def __init__(self, cfg: ModelConfig):
        a = cfg.attention
        super().__init__(cfg, a.index_head_dim, a.compress_rate, overlap=True)
        self.heads, self.topk = a.index_n_heads, a.index_topk
        self.q_up = nn.Linear(a.q_lora_rank, self.heads * self.dim, bias=False)
        self.head_weights = nn.Linear(cfg.d_model, self.heads, bias=False)

    def scores(self, x: Tensor, queries: Tensor, keys: Tensor) -> Tensor:
        """Each query's score ``[B, T, K]`` of each block key ``keys`` ``[B, K, D]``; ``queries`` ``[B, T, h, D]``
        rotated, ``x`` the layer's input."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        s = F.relu(torch.einsum("bthd,bkd->bthk", queries.to(dtype), keys.to(dtype))) * self.dim**-0.5
        w = self.head_weights(x).to(dtype) * self.heads**-0.5
        return (w[..., None] * s).sum(dim=2)

    def select(self, scores: Tensor, visible: Tensor) -> Tensor:
        """The ``topk`` best-scored visible blocks of each query, ``[B, T, K]`` bool (ties to the earlier)."""
        ranked = scores.masked_fill(~visible, float("-inf")).sort(dim=-1, descending=True, stable=True).indices
        return torch.zeros_like(visible).scatter(-1, ranked[..., : self.topk], True) & visible


@MIXERS.register("dsv4")
class DeepSeekV4Attention(Mixer):
    """Queries ``q_up(q_norm(q_down(x)))``, each head RMS-normed without a weight; the one key/value head
    ``kv_norm(kv_proj(x))``; both rotated on their trailing ``qk_rope_head_dim`` dims. Softmax attention of
    every query head over that head as keys and as values, with a learned sink per head (a logit that joins
    the denominator, with no value). The values carry the keys' rotation, so each head's output is turned back
    on those dims by its query's angles: what a key adds then depends on its distance alone. The heads'
    outputs, ``n_head·head_dim`` wide, go in ``o_groups`` groups of consecutive dims each through its own
    block of ``o_a`` to ``o_lora_rank`` dims, then ``o_b`` maps the groups together to d_model."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.n_head, self.head_dim, self.rope = a.n_head, a.head_dim, a.qk_rope_head_dim
        self.groups, self.dropout, self.scale = a.o_groups, a.dropout, softmax_scale(cfg)
        self.window, self.eps = a.window, cfg.norm.eps
        norm = NORMS.get(cfg.norm.kind)
        self.q_down = nn.Linear(d, a.q_lora_rank, bias=False)
        self.q_norm = norm(cfg, a.q_lora_rank)
        self.q_up = nn.Linear(a.q_lora_rank, self.n_head * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(d, self.head_dim, bias=False)
        self.kv_norm = norm(cfg, self.head_dim)
        # o_a's weight [groups·o_lora_rank, n_head·head_dim / groups]: group g's block is rows g·o_lora_rank on
        self.o_a = nn.Linear(self.n_head * self.head_dim // self.groups, self.groups * a.o_lora_rank, bias=False)
        self.o_b = residual_projection(nn.Linear(self.groups * a.o_lora_rank, d, bias=False))
        self.sinks = nn.Parameter(torch.empty(self.n_head))
        self.rate = a.compress_rate
        self.compressor = (
            None if a.compress == "none" else Compressor(cfg, self.head_dim, self.rate, a.compress == "csa")
        )
        self.indexer = Indexer(cfg) if a.compress == "csa" else None
        # positions of projections a later block still needs: its own less one, and the earlier block's (CSA)
        self.keep = (2 if a.compress == "csa" else 1) * self.rate - 1
        self.loss_weight = a.index_loss_weight
        self.aux_losses: dict[str, tuple[float, Tensor]] = {}

    def param_roles(self) -> dict[str, Role]:
        # the ranks and the group width are widths a width sweep grows with d_model; a sink is a logit per head,
        # a position bias one per block position; an indexer's head weight reads the width into a gate per head
        names = ("q_down", "q_up", "kv_proj", "o_a", "o_b")
        names += ("compressor.kv_proj", "compressor.gate_proj", "indexer.kv_proj", "indexer.gate_proj", "indexer.q_up")
        vectors = ("sinks", "compressor.position_bias", "indexer.position_bias")
        return (
            {f"{n}.weight": Role.HIDDEN for n in names}
            | dict.fromkeys(vectors, Role.VECTOR)
            | {"indexer.head_weights.weight": Role.OUTPUT}
        )

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The sinks and position biases start at 0, as transformers' DeepSeek-V4 (``Decoder.init_weights``
        calls it)."""
        nn.init.zeros_(self.sinks)
        for part in (self.compressor, self.indexer):
            if part is not None:
                nn.init.zeros_(part.position_bias)

    @classmethod
    def mask_of(cls, scores: Optional[Tensor], tokens: Optional[Tokens]) -> Any:
        """Both: ``(scores, tokens)``, the attention mask for the window and the packed documents' starts,
        which keep a block and a query of different documents apart (``forward`` takes a mask alone too)."""
        return scores, tokens

    def rotated(self, t: Tensor, rotary: Optional[Rotation]) -> Tensor:
        """``t`` ``[B, T, heads, head_dim]`` with its trailing ``rope`` dims rotated (the others as they are)."""
        if rotary is None:
            return t
        return torch.cat((t[..., : -self.rope], rotary.rotate(t[..., -self.rope :])), dim=-1)

    def project(self, x: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor, Tensor]:
        """The queries ``[B, H, T, head_dim]`` and the key/value head ``[B, 1, T, head_dim]`` of ``x``'s
        positions, normed and rotated, and the queries' latent (the indexer's queries read it too)."""
        source = self.q_norm(self.q_down(x))
        q = l2_norm(self.q_up(source).unflatten(-1, (self.n_head, self.head_dim)), self.eps)
        kv = self.kv_norm(self.kv_proj(x))[:, :, None]
        return self.rotated(q, rotary).transpose(1, 2), self.rotated(kv, rotary).transpose(1, 2), source

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, _ = x.shape
        mask, tokens = mask if isinstance(mask, tuple) else (mask, None)
        q, kv, source = self.project(x, rotary)
        if cache is not None:  # one tensor serves as keys and values: the cache's second holds nothing
            kv, _ = cache.update(layer, kv, kv[..., :0])
        if self.compressor is None:
            return self.output(self.attend(q, kv, mask), rotary)
        assert rotary is not None, "validate: a compressing layer takes RoPE"
        starts = None if tokens is None else tokens.starts
        blocks, seen, scores = self.blocks(x, source, rotary, cache, layer, starts)
        self.aux_losses = {}
        if scores is not None and self.training and self.loss_weight > 0:
            loss = index_kl(q.detach(), blocks.detach(), seen, scores, self.scale)
            self.aux_losses = {"index_kl": (self.loss_weight, loss)}
        window = visible_keys(mask, T, kv.shape[2], x.device)
        window = window if window.dtype == torch.bool else window > float("-inf")
        window = window.expand(B, 1, T, kv.shape[2])
        keys = torch.cat((kv, blocks[:, None]), dim=2)
        return self.output(self.attend(q, keys, torch.cat((window, seen[:, None]), dim=-1)), rotary)

    def blocks(
        self,
        x: Tensor,
        source: Tensor,
        rotary: Rotation,
        cache: Optional[KVCache],
        layer: int,
        starts: Optional[Tensor] = None,
    ) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """The pooled block keys ``[B, K, head_dim]`` this step's queries may see, which each sees ``[B, T, K]``
        and the indexer's scores of them ``[B, T, K]`` (None without one): the cached blocks (by block number,
        those ending before the row's first new position), then the blocks ending among the new positions (a
        block ends at its last position, ``rate``·(w + 1) − 1; positions by row, so a padded row or a packed
        document pools its own blocks as alone). A query sees a block ending at or before it in its own
        sequence (positions counted on without a break); with an indexer, only the ``index_topk`` of those it
        scores best. ``starts`` ``[B, T]`` (packed documents' first positions): a block lies in one document
        and a query sees its own document's alone, whether or not positions restart. The indexer reads ``x``
        and ``source`` detached: no gradient crosses its choice, so it learns from its own loss alone
        (``index_kl``)."""
        B, T, _ = x.shape
        compressor = cast(Compressor, self.compressor)
        m = self.rate
        pos = cast(Tensor, rotary.positions).expand(B, T)
        projected = compressor.project(x)
        if self.indexer is not None:
            projected = torch.cat((projected, self.indexer.project(x.detach())), dim=-1)
        held = None if cache is None else cache.conv_state[layer]
        buffer = projected if held is None else torch.cat((held.to(projected.dtype), projected), dim=1)
        earlier = buffer.shape[1] - T
        ends = ((pos + 1) % m == 0) & (pos >= m - 1)  # a block's last position: its block lies in its sequence
        n = min(T, T // m + 1)  # the most blocks T positions may end, in any row
        order = torch.sort((~ends).to(torch.uint8), dim=1, stable=True).indices[:, :n]  # the ends first, in order
        valid, end_pos = ends.gather(1, order), pos.gather(1, order)
        first = end_pos < 2 * m - 1  # no earlier block in its sequence
        same_document = None
        if starts is not None:  # packed documents, a full forward (every position new): blocks within one
            assert cache is None, "packed documents are a training forward's, without a cache"
            document = starts.long().cumsum(1)
            at_end = document.gather(1, order)
            valid = valid & (document.gather(1, (order - m + 1).clamp(min=0)) == at_end)
            first = first | (order < 2 * m - 1) | (document.gather(1, (order - 2 * m + 1).clamp(min=0)) != at_end)
            same_document = document[:, :, None] == at_end[:, None, :]
        width = 4 * self.head_dim if self.indexer is not None else 2 * self.head_dim
        new = compressor.pool(buffer[..., :width], earlier + order, first)
        at = rotary.at(end_pos - m + 1)  # a block's key is rotated at its first position
        new = self.rotated(new[:, :, None], at)[:, :, 0]
        t = torch.arange(T, device=x.device)
        same = (pos[:, :, None] - end_pos[:, None, :]) == (t[None, :, None] - order[:, None, :])
        seen_new = valid[:, None, :] & (order[:, None, :] <= t[None, :, None]) & same  # [B, T, n]
        if same_document is not None:
            seen_new = seen_new & same_document
        if self.indexer is not None:
            index_new = self.indexer.pool(buffer[..., width:], earlier + order, first)
            new = torch.cat((new, self.rotated(index_new[:, :, None], at)[:, :, 0]), dim=-1)
        if cache is not None:
            stored, seen_old = self.store(cache, layer, new, valid, end_pos, pos[:, 0])
            cache.conv_state[layer] = buffer[:, -self.keep :]
            blocks, seen = torch.cat((stored, new), dim=1), torch.cat((seen_old.expand(B, T, -1), seen_new), dim=-1)
        else:
            blocks, seen = new, seen_new
        if self.indexer is None:
            return blocks, seen, None
        blocks, index_keys = blocks.split((self.head_dim, self.indexer.dim), dim=-1)
        queries = self.indexer.q_up(source.detach()).unflatten(-1, (self.indexer.heads, self.indexer.dim))
        scores = self.indexer.scores(x.detach(), self.rotated(queries, rotary), index_keys)
        return blocks, self.indexer.select(scores.detach(), seen), scores

    def store(
        self, cache: KVCache, layer: int, new: Tensor, valid: Tensor, end_pos: Tensor, first_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The blocks cached before this step ``[B, W, width]`` (by block number, W = the cache's length over
        ``rate``), which of them a row's new queries see (``[B, 1, W]``: those ending before its first new
        position ``first_pos``), and the cache's blocks replaced by them with ``new``'s valid ones written in."""
        count = cache.max_len // self.rate
        stored = cache.recurrent_state[layer]
        if stored is None:
            stored = new.new_zeros(new.shape[0], count, new.shape[-1])
        w = torch.arange(count, device=new.device)
        seen = ((w + 1) * self.rate <= first_pos[:, None])[:, None]
        slot = torch.where(valid, end_pos // self.rate, count)  # an invalid one to a slot past the end, dropped
        spare = torch.cat((stored, stored.new_zeros(stored.shape[0], 1, stored.shape[-1])), dim=1)
        written = spare.scatter(1, slot[..., None].expand(-1, -1, new.shape[-1]), new.to(stored.dtype))
        cache.recurrent_state[layer] = written[:, :count]
        return stored.to(new.dtype), seen

    def attend(self, q: Tensor, kv: Tensor, mask: Optional[Tensor]) -> Tensor:
        """Each query head's attention over the key/value head ``kv`` ``[B, 1, S, head_dim]`` with its sink,
        ``mask`` as ``Mixer.forward`` takes it: ``[B, T, H, head_dim]``."""
        T, hd = q.shape[2], q.shape[3]
        if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # autocast runs q in bf16; SDPA wants the bias in q's dtype
        q, k, v, mask = sink_key(q, kv, kv, mask, self.sinks, self.scale)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None and q.shape[2] > 1, scale=self.scale, enable_gqa=True,
        )  # fmt: skip
        return y[:, :, y.shape[2] - T :, :hd].transpose(1, 2)  # less sink_key's first query and its padding

    def output(self, y: Tensor, rotary: Optional[Rotation]) -> Tensor:
        """The heads' outputs ``y`` ``[B, T, H, head_dim]`` turned back on their rotated dims, through the
        grouped projection ``o_a`` and then ``o_b``: ``[B, T, d_model]``."""
        if rotary is not None:
            y = torch.cat((y[..., : -self.rope], rotary.unrotate(y[..., -self.rope :])), dim=-1)
        grouped = y.flatten(2).unflatten(-1, (self.groups, -1))  # [B, T, groups, H·hd / groups]
        blocks = self.o_a.weight.unflatten(0, (self.groups, -1))  # [groups, o_lora_rank, H·hd / groups]
        return self.o_b(torch.einsum("btgi,goi->btgo", grouped, blocks).flatten(2))

    @torch.no_grad()
    def score_stats(self, x, rotary=None, mask=None) -> Optional[ScoreStats]:  # typed as Mixer.score_stats
        """From the normed, rotated queries and key/value head the forward computes, and the sinks; None in a
        compressing layer (its pooled blocks, which the window's scores leave out)."""
        if self.compressor is not None:
            return None
        mask = mask[0] if isinstance(mask, tuple) else mask
        q, kv, _ = self.project(x, rotary)
        return scores_of(q, kv, mask, self.scale, sinks=cast(Tensor, self.sinks))

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``attention.head_dim``: a query and the key multiply over all of it."""
        return cfg.attention.head_dim

    @classmethod
    def rotary_head_dim(cls, cfg: ModelConfig) -> int:
        """The trailing part RoPE rotates, qk_rope_head_dim."""
        return cfg.attention.qk_rope_head_dim

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Queries d·q_r + norm(q_r) + q_r·H·hd; the key/value head d·hd + norm(hd); output H·hd·o_r
        (o_groups blocks of H·hd/o_groups by o_r) + o_groups·o_r·d; H sinks (no biases)."""
        a, d, H, hd = cfg.attention, cfg.d_model, cfg.attention.n_head, cfg.attention.head_dim
        norm = NORMS.get(cfg.norm.kind).num_params
        queries = d * a.q_lora_rank + norm(cfg, a.q_lora_rank) + a.q_lora_rank * H * hd
        output = H * hd * a.o_lora_rank + a.o_groups * a.o_lora_rank * d
        params = queries + d * hd + norm(cfg, hd) + output + H
        if a.compress == "none":
            return params
        # a compressor of width c: kv and gate projections 2·d·c, its position bias rate·c, its norm
        c = 2 * hd if a.compress == "csa" else hd
        params += 2 * d * c + a.compress_rate * c + norm(cfg, hd)
        if a.compress == "csa":  # the indexer: its compressor of 2·D, queries q_r·h·D, head weights d·h
            D, h = a.index_head_dim, a.index_n_heads
            params += 2 * d * 2 * D + a.compress_rate * 2 * D + norm(cfg, D) + a.q_lora_rank * h * D + d * h
        return params

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """The one key/value head, head_dim values per position kept (its window in a sliding layer); with a
        compressor, each of the length // rate blocks' keys (head_dim, and the indexer's D in csa), and the
        projections (keys and gates) of the last rate − 1 positions (2·rate − 1 in csa) a block still needs:
        2·head_dim each (csa: 4·head_dim + 4·D)."""
        a = cfg.attention
        window = a.head_dim * positions_seen(cfg, length, layer)
        if a.compress == "none":
            return window
        csa = a.compress == "csa"
        block = a.head_dim + csa * a.index_head_dim
        projections = 2 * (2 if csa else 1) * (a.head_dim + csa * a.index_head_dim)
        kept = min(length, (2 if csa else 1) * a.compress_rate - 1)
        return window + block * (length // a.compress_rate) + projections * kept

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Scores q·k and the weighted sum of the values, forward and backward: 12·H·head_dim per key a query
        sees: at most the window, and the blocks (hca: seq_len // rate; csa: at most index_topk of them); csa's
        indexer scores and their weighted sum, 2·h·(D + 1) per block seen, forward alone (no gradient
        crosses its choice), three times that with its loss on (its backward), which also recomputes the
        attention's scores of the blocks chosen, 2·H·head_dim each, for its target. The sinks, norms, pooling
        and turning back are elementwise, uncounted."""
        a = cfg.attention
        keys = positions_seen(cfg, seq_len, layer)
        if a.compress == "none":
            return 12 * a.n_head * a.head_dim * keys
        blocks = seq_len // a.compress_rate
        chosen = min(blocks, a.index_topk) if a.compress == "csa" else blocks
        flops = 12 * a.n_head * a.head_dim * (keys + chosen)
        if a.compress == "csa":
            flops += 2 * a.index_n_heads * (a.index_head_dim + 1) * blocks
            if a.index_loss_weight > 0:
                flops += 4 * a.index_n_heads * (a.index_head_dim + 1) * blocks + 2 * a.n_head * a.head_dim * chosen
        return flops

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 1)
        for name in ("head_dim", "q_lora_rank", "o_groups", "o_lora_rank"):
            checks.integer(f"model.attention.{name}", getattr(a, name), 1)
        checks.probability("model.attention.dropout", a.dropout)
        if a.scale is not None:
            checks.positive("model.attention.scale", a.scale, "a positive number, or null")
        if a.window is not None:
            checks.integer("model.attention.window", a.window, 1, "a positive integer (keys a query sees), or null")
        if not (isinstance(a.qk_rope_head_dim, int) and 2 <= a.qk_rope_head_dim <= a.head_dim):
            raise ConfigError(
                "model.attention.qk_rope_head_dim", a.qk_rope_head_dim, f"an integer in [2, head_dim={a.head_dim}]"
            )
        if a.qk_rope_head_dim % 2:
            raise ConfigError(
                "model.attention.qk_rope_head_dim", a.qk_rope_head_dim, "an even number (RoPE turns pairs)"
            )
        if a.compress != "none":
            checks.integer("model.attention.compress_rate", a.compress_rate, 2)
            if cfg.position.kind != "rope":
                raise ConfigError(
                    "model.position.kind",
                    cfg.position.kind,
                    f"rope for attention kind dsv4 with compress={a.compress} (its blocks are rotated at their positions)",
                )
        if a.compress == "csa":
            for name in ("index_n_heads", "index_topk"):
                checks.integer(f"model.attention.{name}", getattr(a, name), 1)
            checks.non_negative("model.attention.index_loss_weight", a.index_loss_weight)
            if not (isinstance(a.index_head_dim, int) and a.index_head_dim >= a.qk_rope_head_dim):
                raise ConfigError(
                    "model.attention.index_head_dim",
                    a.index_head_dim,
                    f"an integer >= qk_rope_head_dim={a.qk_rope_head_dim} (the indexer rotates that many dims)",
                )
        if (a.n_head * a.head_dim) % a.o_groups:
            raise ConfigError(
                "model.attention.o_groups",
                a.o_groups,
                f"a divisor of n_head·head_dim={a.n_head * a.head_dim} (the heads' outputs split into equal groups)",
            )

    @staticmethod
    def validate_rotary(cfg: ModelConfig) -> None:
        """The rotated part is its own width, qk_rope_head_dim: no ``rotary_dim`` or ``rotary_fraction``."""
        for name in ("rotary_dim", "rotary_fraction"):
            if getattr(cfg.position, name) is not None:
                raise ConfigError(
                    f"model.position.{name}",
                    getattr(cfg.position, name),
                    "null for attention kind dsv4 (it rotates model.attention.qk_rope_head_dim dims)",
                )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """Heads, their rotated part, the query rank, the output groups and the window."""
        a = cfg.attention
        window = f", window {a.window}" if a.window is not None else ""
        compress = {
            "none": "",
            "hca": f", blocks of {a.compress_rate} (hca)",
            "csa": f", blocks of {a.compress_rate} (csa: indexer {a.index_n_heads}h x {a.index_head_dim}, "
            f"top {a.index_topk})",
        }[a.compress]
        return (
            f"dsv4 {a.n_head}h x {a.head_dim} ({a.qk_rope_head_dim} rotated) over 1 shared kv head, "
            f"q_lora {a.q_lora_rank}, {a.o_groups} output groups of {a.o_lora_rank}, sinks{window}{compress}"
        )

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Every field but the compressor's where it compresses nothing, and the indexer's outside csa."""
        names = {f.name for f in fields(cfg.attention)} - {"kind"}
        if cfg.attention.compress == "none":
            names -= {"compress_rate"}
        if cfg.attention.compress != "csa":
            names -= {"index_n_heads", "index_head_dim", "index_topk", "index_loss_weight"}
        return frozenset(names)
