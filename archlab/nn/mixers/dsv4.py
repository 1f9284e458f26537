"""DeepSeek-V4's attention, ``dsv4``: queries through a low-rank bottleneck, one key/value head read as both
the keys and the values (shared-KV MQA), each head's trailing ``qk_rope_head_dim`` dims rotated, a learned
sink per head, the output's rotated dims turned back to the query's position, and a grouped low-rank output
projection. The KV cache holds the one head: ``head_dim`` values per position and layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.attention import sink_key, softmax_scale
from archlab.nn.mixers.base import MIXERS, Mixer, ScoreStats, positions_seen, scores_of
from archlab.nn.norms import NORMS, l2_norm
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

    def param_roles(self) -> dict[str, Role]:
        # the ranks and the group width are widths a width sweep grows with d_model; a sink is a logit per head
        names = ("q_down", "q_up", "kv_proj", "o_a", "o_b")
        return {f"{n}.weight": Role.HIDDEN for n in names} | {"sinks": Role.VECTOR}

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The sinks start at 0, as transformers' DeepSeek-V4 (``Decoder.init_weights`` calls it)."""
        nn.init.zeros_(self.sinks)

    def rotated(self, t: Tensor, rotary: Optional[Rotation]) -> Tensor:
        """``t`` ``[B, T, heads, head_dim]`` with its trailing ``rope`` dims rotated (the others as they are)."""
        if rotary is None:
            return t
        return torch.cat((t[..., : -self.rope], rotary.rotate(t[..., -self.rope :])), dim=-1)

    def project(self, x: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor]:
        """The queries ``[B, H, T, head_dim]`` and the key/value head ``[B, 1, T, head_dim]`` of ``x``'s
        positions, normed and rotated."""
        q = l2_norm(self.q_up(self.q_norm(self.q_down(x))).unflatten(-1, (self.n_head, self.head_dim)), self.eps)
        kv = self.kv_norm(self.kv_proj(x))[:, :, None]
        return self.rotated(q, rotary).transpose(1, 2), self.rotated(kv, rotary).transpose(1, 2)

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, _ = x.shape
        q, kv = self.project(x, rotary)
        if cache is not None:  # one tensor serves as keys and values: the cache's second holds nothing
            kv, _ = cache.update(layer, kv, kv[..., :0])
        return self.output(self.attend(q, kv, mask), rotary)

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
        """From the normed, rotated queries and key/value head the forward computes, and the sinks."""
        q, kv = self.project(x, rotary)
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
        return queries + d * hd + norm(cfg, hd) + output + H

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """The one key/value head, head_dim values per position kept (its window in a sliding layer)."""
        return cfg.attention.head_dim * positions_seen(cfg, length, layer)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Scores q·k and the weighted sum of the values, forward and backward: 12·H·head_dim per key a query
        sees (at most the window); the sinks, norms and turning back are elementwise, uncounted."""
        a = cfg.attention
        return 12 * a.n_head * a.head_dim * positions_seen(cfg, seq_len, layer)

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
        return (
            f"dsv4 {a.n_head}h x {a.head_dim} ({a.qk_rope_head_dim} rotated) over 1 shared kv head, "
            f"q_lora {a.q_lora_rank}, {a.o_groups} output groups of {a.o_lora_rank}, sinks{window}"
        )
