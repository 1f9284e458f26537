"""DeepSeek sparse attention, ``dsa`` (DeepSeek-V3.2-Exp): multi-head latent attention whose each query
attends only to the ``index_topk`` keys a lightning indexer scores highest among those it sees. The KV
cache holds mla's latent and shared rotated key beside the indexer's key: ``kv_lora_rank +
qk_rope_head_dim + index_head_dim`` values per position and layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, mixer_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import Role
from archlab.nn.mixers.base import MIXERS, key_visibility, narrow, positions_seen
from archlab.nn.mixers.mla import MLAConfig, MultiHeadLatentAttention
from archlab.nn.mixers.shared_index import SharedChoice
from archlab.nn.positions import Rotation


@mixer_config("dsa")
@dataclass
class DSAConfig(MLAConfig):
    """``model.attention`` with kind dsa: mla's fields, and the lightning indexer's that pick the keys."""

    kind: str = "dsa"
    index_n_heads: int = 64  # the indexer's query heads (DeepSeek-V3.2: 64; GLM-5: 32)
    index_head_dim: int = 128  # dims of each indexer query and of the one indexer key per position
    index_topk: int = 2048  # keys each query attends to, the indexer's best (all it sees where fewer)
    # the indexer's rotated pairs: model = model.position.pairing (DeepSeek-V3.2's indexer: half, its mla interleaved)
    index_pairing: str = choice("model", "half", "interleaved")
    # where the indexer's qk_rope_head_dim rotated dims sit in its heads: first (DeepSeek-V3.2) | last (HY V4)
    index_rope_at: str = choice("first", "last")
    index_norm_eps: float = 1e-6  # eps of the indexer key's LayerNorm (DeepSeek-V3.2: 1e-6; HY V4: rms_norm_eps)
    # no indexer: reuse the keys the last earlier dsa layer with its own indexer chose (HY V4's "shared" layers)
    index_shared: bool = False
    # weight of the indexer's KL loss to the attention's distribution over the chosen keys (its only signal)
    index_loss_weight: float = 1.0


class LightningIndexer(nn.Module):
    """The lightning indexer: queries ``q_up`` from the queries' source (mla's latent, else x), one key per
    position ``k_norm(k_proj(x))`` (a LayerNorm at ``index_norm_eps`` with a bias, as DeepSeek's), their
    first (or last, ``index_rope_at``) ``qk_rope_head_dim`` dims rotated; a query's score of a key is Σ_h w_h·relu(q_h·k)/sqrt(D), its head
    weights ``head_weights(x)/sqrt(H)``. Scores are computed in float32 at least."""

    def __init__(self, cfg: ModelConfig, source_dim: int):
        super().__init__()
        a = cfg.attention
        self.heads, self.dim, self.rope, self.topk = a.index_n_heads, a.index_head_dim, a.qk_rope_head_dim, a.index_topk
        self.q_up = nn.Linear(source_dim, self.heads * self.dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, self.dim, bias=False)
        self.k_norm = nn.LayerNorm(self.dim, eps=a.index_norm_eps)
        self.rope_first = a.index_rope_at == "first"
        self.head_weights = nn.Linear(cfg.d_model, self.heads, bias=False)
        # the rotated dims regrouped so that the model's rotation turns the pairs the indexer's pairing names
        model = getattr(cfg.position, "pairing", None)
        self.regroup: Optional[tuple[int, int]] = None
        if model is not None and a.index_pairing not in ("model", model):
            half = self.rope // 2  # half: (i, i + r/2) made adjacent; interleaved: (2i, 2i + 1) made halves
            self.regroup = (2, half) if a.index_pairing == "half" else (half, 2)

    def rotated(self, t: Tensor, rotary: Optional[Rotation]) -> Tensor:
        """``t`` ``[B, T, heads, D]`` with its first (or last) ``rope`` dims rotated (their pairs as the
        indexer's)."""
        if rotary is None:
            return t
        cut = self.rope if self.rope_first else self.dim - self.rope
        head, tail = t[..., :cut], t[..., cut:]
        r = head if self.rope_first else tail
        if self.regroup is not None:
            r = r.unflatten(-1, self.regroup).transpose(-1, -2).flatten(-2)
        return torch.cat((rotary.rotate(r), tail) if self.rope_first else (head, rotary.rotate(r)), dim=-1)

    def keys(self, x: Tensor, rotary: Optional[Rotation]) -> Tensor:
        """The indexer keys of the new positions, ``[B, 1, T, D]``, as the cache stores them."""
        return self.rotated(self.k_norm(self.k_proj(x))[:, :, None], rotary).transpose(1, 2)

    def scores(self, x: Tensor, source: Tensor, keys: Tensor, rotary: Optional[Rotation]) -> Tensor:
        """Each query's score of each key, ``[B, T, S]``, for queries from ``x`` and ``source`` and the
        ``keys`` ``[B, 1, S, D]`` of the positions attended to."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        q = self.rotated(self.q_up(source).unflatten(-1, (self.heads, self.dim)), rotary)  # [B, T, h, D]
        s = F.relu(q.to(dtype) @ keys.to(dtype).transpose(-1, -2) * self.dim**-0.5)  # [B, T, h, S]
        w = self.head_weights(x).to(dtype) * self.heads**-0.5  # [B, T, h]
        return (w[..., None, :] @ s)[..., 0, :]

    def select(self, scores: Tensor, visible: Tensor) -> Tensor:
        """Which keys each query attends to, ``[B, T, S]`` bool: its ``topk`` best-scored visible ones (ties
        to the earlier key, so a row's choice never depends on the keys it cannot see)."""
        ranked = scores.masked_fill(~visible, float("-inf")).sort(dim=-1, descending=True, stable=True).indices
        return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, ranked[..., : self.topk], True)


def kl_to_attention(q: Tensor, k: Tensor, bias: Optional[Tensor], allowed: Tensor, scores: Tensor, scale: float):
    """The indexer's loss: the mean over queries of KL(p ‖ softmax of its ``scores``), p the attention's
    probabilities (of ``q``, ``k``, ``bias`` at ``scale``) summed over heads and normalised, both over the
    ``allowed`` keys ``[B, T, S]`` alone (DeepSeek-V3.2-Exp's L_I; p carries no gradient)."""
    with torch.no_grad():
        logits = (q @ k.transpose(-1, -2)) * scale + (0 if bias is None else bias)
        p = logits.masked_fill(~allowed[:, None], float("-inf")).softmax(-1).mean(1).to(scores.dtype)
    log_q = scores.masked_fill(~allowed, float("-inf")).log_softmax(-1).masked_fill(~allowed, 0.0)
    return (torch.special.xlogy(p, p) - p * log_q).sum(-1).mean()


@MIXERS.register("dsa")
class DeepSeekSparseAttention(MultiHeadLatentAttention):
    """mla, with a lightning indexer (``LightningIndexer``) choosing each query's keys: the mask of the
    keys it sees narrowed to the ``index_topk`` best (where it sees more). The indexer reads the layer's
    input and the queries' source detached: the language-model loss cannot reach it through a choice, so
    in training it learns from its own loss alone, ``index_loss_weight`` times the KL divergence from the
    attention's distribution to its scores' (``aux_losses``, ``Decoder.auxiliary_losses`` collects it),
    as DeepSeek trains it; with ``index_topk`` at least the context that is its dense warm-up. An
    ``index_shared`` layer has no indexer: it keeps the keys its source layer chose in the same forward
    (``nn.mixers.shared_index``), within its own mask."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a = cfg.attention
        q_in = a.q_lora_rank if a.q_lora_rank is not None else cfg.d_model
        self.indexer = None if a.index_shared else LightningIndexer(cfg, q_in)
        self.index_dim, self.loss_weight = a.index_head_dim, a.index_loss_weight
        self.aux_losses: dict[str, tuple[float, Tensor]] = {}
        self.choice_store: Optional[SharedChoice] = None  # set by link_shared_index where a layer reuses this one's
        self.choice_source: Optional[SharedChoice] = None  # an index_shared layer's source

    def param_roles(self) -> dict[str, Role]:
        if self.indexer is None:
            return super().param_roles()
        return super().param_roles() | {
            "indexer.q_up.weight": Role.HIDDEN,
            "indexer.k_proj.weight": Role.HIDDEN,
            "indexer.k_norm.weight": Role.VECTOR,
            "indexer.k_norm.bias": Role.VECTOR,
            "indexer.head_weights.weight": Role.OUTPUT,  # one weight per indexer head, as a gate per head
        }

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        T = x.shape[1]
        q, source, q_in = self.query_parts(x, rotary)
        latent, k_rope = self.latents(x, rotary)
        gate = self.gates(x, q_in)  # before the indexer's inputs are detached: the loss reaches the gate
        self.aux_losses = {}
        if self.indexer is None:  # index_shared: the source layer's choice of this forward's keys
            assert self.choice_source is not None, "link_shared_index gives it its source"
            if cache is not None:
                latent, k_rope = cache.update(layer, latent, k_rope)
            k, v = self.keys_values(latent, k_rope)
            chosen = self.choice_source.chosen
            if chosen is None:  # the source chose every key it saw
                return self.attend(q, k, v, mask, gate)
            return self.attend(q, k, v, narrow(chosen & key_visibility(mask, T, k.shape[2], x.device), mask), gate)
        x, source = x.detach(), source.detach()  # the indexer's inputs: it learns from its own loss alone
        index_k = self.indexer.keys(x, rotary)
        if cache is not None:  # the indexer's key rides beside the shared rotated key
            latent, shared = cache.update(layer, latent, torch.cat((k_rope, index_k.to(k_rope.dtype)), dim=-1))
            k_rope, index_k = shared.split((self.rope, self.index_dim), dim=-1)
        k, v = self.keys_values(latent, k_rope)
        S = k.shape[2]
        learn = self.training and self.loss_weight > 0
        if S <= self.indexer.topk and not learn:
            if self.choice_store is not None:
                self.choice_store.chosen = None
            return self.attend(q, k, v, mask, gate)  # every key seen is chosen: mla's attention
        visible = key_visibility(mask, T, S, x.device)
        with torch.set_grad_enabled(learn and torch.is_grad_enabled()):
            scores = self.indexer.scores(x, source, index_k, rotary)
        chosen = self.indexer.select(scores.detach(), visible) & visible
        if self.choice_store is not None:
            self.choice_store.chosen = chosen
        bias = mask if mask is not None and mask.is_floating_point() else None
        if learn:
            loss = kl_to_attention(q.detach(), k.detach(), bias, chosen, scores, self.scale)
            self.aux_losses = {"index_kl": (self.loss_weight, loss)}
        return self.attend(q, k, v, narrow(chosen, mask), gate)

    def score_stats(self, x, rotary=None, mask=None):  # typed as Mixer.score_stats
        """None: the indexer narrows each query's keys, which mla's scores over every key would not show."""
        return None

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """mla's, and the indexer's: queries q_in·h·D (q_in the query rank, else d), key d·D and its
        LayerNorm 2·D, head weights d·h; an index_shared layer's: mla's alone."""
        a, d = cfg.attention, cfg.d_model
        if a.index_shared:
            return super().num_params(cfg, layer)
        q_in = a.q_lora_rank if a.q_lora_rank is not None else d
        h, D = a.index_n_heads, a.index_head_dim
        return super().num_params(cfg, layer) + q_in * h * D + d * D + 2 * D + d * h

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """mla's latent and shared rotated key, and the indexer's key: kv_lora_rank + qk_rope_head_dim +
        index_head_dim per position kept (an index_shared layer: no indexer key)."""
        a = cfg.attention
        index = 0 if a.index_shared else a.index_head_dim
        return (a.kv_lora_rank + a.qk_rope_head_dim + index) * positions_seen(cfg, length, layer)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """mla's 6·H·(nope + rope + v) per key chosen (min(index_topk, keys seen)); the indexer's scores and
        their weighted sum, 2·h·(D + 1) per key seen, three times that with its loss on (its backward), which
        also recomputes the attention's scores, 2·H·(nope + rope) per key chosen, for its target. An
        index_shared layer: the attention's alone, over its source's index_topk."""
        a = cfg.attention
        seen = positions_seen(cfg, seq_len, layer)
        chosen = min(a.index_topk, seen)
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        flops = 6 * a.n_head * (qk + a.v_head_dim) * chosen
        if a.index_shared:
            return flops
        flops += 2 * a.index_n_heads * (a.index_head_dim + 1) * seen
        if a.index_loss_weight > 0:
            flops += 4 * a.index_n_heads * (a.index_head_dim + 1) * seen + 2 * a.n_head * qk * chosen
        return flops

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        a = cfg.attention
        checks.integer("model.attention.index_n_heads", a.index_n_heads, 1)
        checks.integer("model.attention.index_topk", a.index_topk, 1)
        checks.non_negative("model.attention.index_loss_weight", a.index_loss_weight)
        checks.integer("model.attention.index_head_dim", a.index_head_dim, 1)
        checks.positive("model.attention.index_norm_eps", a.index_norm_eps)
        if a.index_head_dim < a.qk_rope_head_dim:
            raise ConfigError(
                "model.attention.index_head_dim",
                a.index_head_dim,
                f"an integer >= model.attention.qk_rope_head_dim={a.qk_rope_head_dim} (the indexer rotates "
                "that many of its dims)",
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """mla's, and the indexer's heads, their width and the keys each query keeps."""
        a = cfg.attention
        if a.index_shared:
            return f"dsa: {MultiHeadLatentAttention.describe(cfg)}; the keys an earlier layer's indexer chose"
        last = ", rotated dims last" if a.index_rope_at == "last" else ""
        return (
            f"dsa: {MultiHeadLatentAttention.describe(cfg)}; indexer {a.index_n_heads}h x {a.index_head_dim}, "
            f"top {a.index_topk} keys{last}"
        )
