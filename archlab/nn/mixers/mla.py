"""Multi-head latent attention, ``mla`` (DeepSeek-V2, arXiv:2405.04434): keys and values are expanded
from one low-rank latent per position, beside one rotated key all heads share; the KV cache holds only
those two, ``kv_lora_rank + qk_rope_head_dim`` values per position and layer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.attention import sink_key, softmax_scale, validate_shared
from archlab.nn.mixers.base import MIXERS, Mixer, ScoreStats, chunk_of, positions_seen, scores_of
from archlab.nn.norms import NORMS
from archlab.nn.positions import Rotation


@mixer_config("mla")
@dataclass
class MLAConfig(MixerConfig):
    """``model.attention`` with kind mla, multi-head latent attention (DeepSeek-V2): keys and values from a
    low-rank latent the cache stores."""

    kind: str = "mla"
    dropout: float = 0.0
    scale: Optional[float] = None  # score multiplier; None = 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)
    window: Optional[int] = None  # sliding window, as the causal kind's
    chunk: Optional[int] = None  # chunked attention, as the causal kind's
    q_lora_rank: Optional[int] = None  # queries through a rank-r bottleneck (DeepSeek-V3: 1536); None = direct
    kv_lora_rank: int = 512  # width of the compressed key/value latent
    qk_nope_head_dim: int = 128  # query/key dims per head that carry no position
    qk_rope_head_dim: int = 64  # rotated query dims per head, and the one rotated key all heads share
    v_head_dim: int = 128  # value dims per head
    latent_norm_eps: Optional[float] = None  # eps of the q and kv latent norms; None = model.norm.eps (MiniCPM3)
    gate: str = choice(
        "none", "elementwise", "head"
    )  # output times sigmoid(W·x) before proj, as the causal kind's: per value dim of each head | per head (Ling)
    latent_scale: bool = False  # the normed q and kv latents times sqrt(d_model / their rank) (dots.3-note)
    rope_key_norm: bool = False  # the shared rotated key normed before RoPE, as the latents (dots.3-note)
    q_latent: str = choice("normed", "both")  # q_up reads the normed q latent | [normed, raw] (A.X K2)
    gate_input: str = choice("x", "q_latent")  # the output gate reads x | what q_up reads (A.X K2)
    sinks: bool = False  # a learned logit per head joins each softmax's denominator, as the causal kind's (HY V4)


def gate_width(cfg: ModelConfig) -> int:
    """The output gate's projection width: none 0, elementwise n_head·v_head_dim, head n_head."""
    a = cfg.attention
    return {"none": 0, "elementwise": a.n_head * a.v_head_dim, "head": a.n_head}[a.gate]


def q_in_width(cfg: ModelConfig) -> int:
    """The width q_up reads: q_lora_rank, twice that with ``q_latent`` both; d_model without a bottleneck."""
    a = cfg.attention
    if a.q_lora_rank is None:
        return cfg.d_model
    return a.q_lora_rank * (2 if a.q_latent == "both" else 1)


def gate_in_width(cfg: ModelConfig) -> int:
    """The width the output gate reads: d_model, or q_up's input (``q_in_width``) with ``gate_input`` q_latent."""
    return q_in_width(cfg) if cfg.attention.gate_input == "q_latent" else cfg.d_model


def latent_norm_config(cfg: ModelConfig) -> ModelConfig:
    """The config the latent norms are built from: ``cfg``, its norm's eps replaced by
    ``attention.latent_norm_eps`` where that is set (MiniCPM3's and DeepSeek's transformers code norms the
    latents at 1e-6 whatever eps its other norms use)."""
    eps = cfg.attention.latent_norm_eps
    if eps is None or eps == cfg.norm.eps:
        return cfg
    return dataclasses.replace(cfg, norm=dataclasses.replace(cfg.norm, eps=eps))


class MultiHeadLatentAttention(Mixer):
    """Queries: ``q_proj``, or with ``q_lora_rank`` the bottleneck ``q_up(q_norm(q_down(x)))`` (with
    ``q_latent`` both, ``q_up`` of [normed, raw] latent); each head is ``[nope | rope]``. Keys and values:
    ``kv_down`` gives the latent (normed by ``kv_norm``) and the shared key's rope part (normed by
    ``k_rope_norm`` with ``rope_key_norm``); ``kv_up`` expands the latent into each head's key nope part and
    value. With ``latent_scale`` each normed latent is times sqrt(d_model / its rank). The latent norms use
    ``latent_norm_eps`` where it is set, else the model's ``norm.eps``. The rope parts of queries and the
    shared key are rotated by the model's rotary scheme; with no rotary scheme (learned, sinusoidal, alibi
    or no positions) they stay as they are, a key part shared by all heads that carries no position. The
    cache stores the latent after ``kv_norm`` (and its scale: as Hugging Face does, a decoding step then norms
    only its new positions) and the rotated shared key."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.n_head, self.rank = a.n_head, a.kv_lora_rank
        self.nope, self.rope, self.v_dim = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        self.dropout, self.scale = a.dropout, softmax_scale(cfg)
        self.window, self.chunk = cfg.attention.window, chunk_of(cfg, layer)
        norm, latent_cfg = NORMS.get(cfg.norm.kind), latent_norm_config(cfg)
        q_out = self.n_head * (self.nope + self.rope)
        q_rank = a.q_lora_rank
        self.low_rank_q, self.both_q = q_rank is not None, a.q_latent == "both"
        self.q_scale = (d / q_rank) ** 0.5 if a.latent_scale and q_rank is not None else None
        self.kv_scale = (d / self.rank) ** 0.5 if a.latent_scale else None
        if q_rank is not None:
            self.q_down = nn.Linear(d, q_rank, bias=False)
            self.q_norm = norm(latent_cfg, q_rank)
            self.q_up = nn.Linear(q_in_width(cfg), q_out, bias=False)
        else:
            self.q_proj = nn.Linear(d, q_out, bias=False)
        self.kv_down = nn.Linear(d, self.rank + self.rope, bias=False)
        self.kv_norm = norm(latent_cfg, self.rank)
        self.k_rope_norm = norm(latent_cfg, self.rope) if a.rope_key_norm else None
        self.kv_up = nn.Linear(self.rank, self.n_head * (self.nope + self.v_dim), bias=False)
        self.proj = residual_projection(nn.Linear(self.n_head * self.v_dim, d, bias=False))
        width = gate_width(cfg)
        self.gate_reads_q = a.gate_input == "q_latent"
        self.gate = nn.Linear(gate_in_width(cfg), width, bias=False) if width else None
        self.sinks = nn.Parameter(torch.empty(self.n_head)) if a.sinks else None

    def param_roles(self) -> dict[str, Role]:
        # the low-rank projections too: their ranks are widths a width sweep grows with d_model; a gate per
        # head reads the width into one value per head: an output (as the causal kind's); per value dim, hidden
        names = ("q_down", "q_up", "q_proj", "kv_down", "kv_up", "proj")
        gate = Role.OUTPUT if self.gate is not None and self.gate.out_features == self.n_head else Role.HIDDEN
        return {f"{n}.weight": Role.HIDDEN for n in names} | {"gate.weight": gate, "sinks": Role.VECTOR}

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The sinks, where there are: N(0, std), as the causal kind's."""
        if self.sinks is not None:
            nn.init.normal_(self.sinks, 0.0, std)

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        q, _, q_in = self.query_parts(x, rotary)
        latent, k_rope = self.latents(x, rotary)
        if cache is not None:
            latent, k_rope = cache.update(layer, latent, k_rope)
        return self.attend(q, *self.keys_values(latent, k_rope), mask, self.gates(x, q_in))

    @torch.no_grad()
    def score_stats(self, x, rotary=None, mask=None) -> Optional[ScoreStats]:  # typed as Mixer.score_stats
        """From every head's keys as the forward expands them from the latent and the shared rotated key."""
        q, _ = self.queries(x, rotary)
        k, _ = self.keys_values(*self.latents(x, rotary))
        return scores_of(q, k, mask, self.scale, sinks=self.sinks)

    def gates(self, x: Tensor, q_in: Tensor) -> Optional[Tensor]:
        """The output gate of ``x``'s positions, sigmoid(gate(x)) ``[B, T, H, v or 1]`` (of ``q_in``, what q_up
        read, with ``gate_input`` q_latent); None without one."""
        if self.gate is None:
            return None
        return torch.sigmoid(self.gate(q_in if self.gate_reads_q else x)).unflatten(-1, (self.n_head, -1))

    def queries(self, x: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor]:
        """The queries ``[B, H, T, nope + rope]``, their rope parts rotated, and what they were projected
        from: the normed (and scaled) latent through the bottleneck, else ``x`` (dsa's indexer reads it too)."""
        q, source, _ = self.query_parts(x, rotary)
        return q, source

    def query_parts(self, x: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor, Tensor]:
        """``queries``' two, and what q_up read: the source, or [it, the raw latent] with ``q_latent`` both
        (the output gate's input with ``gate_input`` q_latent)."""
        if self.low_rank_q:
            raw = self.q_down(x)
            source = self.q_norm(raw)
            if self.q_scale is not None:
                source = source * self.q_scale
            q_in = torch.cat((source, raw), dim=-1) if self.both_q else source
            q = self.q_up(q_in)
        else:
            source = q_in = x
            q = self.q_proj(x)
        q = q.unflatten(-1, (self.n_head, self.nope + self.rope))
        if rotary is not None:
            q = torch.cat((q[..., : self.nope], rotary.rotate(q[..., self.nope :])), dim=-1)
        return q.transpose(1, 2), source, q_in

    def latents(self, x: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor]:
        """What the cache stores of the new positions: the latent after ``kv_norm`` (and its scale)
        ``[B, 1, T, r]`` and the shared key's rotated part ``[B, 1, T, rope]`` (normed first, with
        ``rope_key_norm``)."""
        latent, k_rope = self.kv_down(x).split((self.rank, self.rope), dim=-1)
        latent = self.kv_norm(latent)
        if self.kv_scale is not None:
            latent = latent * self.kv_scale
        if self.k_rope_norm is not None:
            k_rope = self.k_rope_norm(k_rope)
        latent, k_rope = latent[:, None], k_rope[:, :, None]  # [B, 1, T, r], [B, T, 1, rope]
        if rotary is not None:
            k_rope = rotary.rotate(k_rope)
        return latent, k_rope.transpose(1, 2)

    def keys_values(self, latent: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Every head's keys ``[B, H, S, nope + rope]`` and values ``[B, H, S, v]``, expanded from the
        ``latent`` and ``k_rope`` (``[B, 1, S, ·]``) of the positions attended to."""
        B, _, S, _ = latent.shape
        k_nope, v = (
            self.kv_up(latent[:, 0])
            .unflatten(-1, (self.n_head, self.nope + self.v_dim))
            .transpose(1, 2)
            .split((self.nope, self.v_dim), dim=-1)
        )  # [B, H, S, nope], [B, H, S, v]
        return torch.cat((k_nope, k_rope.expand(B, self.n_head, S, self.rope)), dim=-1), v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], gate: Optional[Tensor]) -> Tensor:
        """The output projection of the heads' attention, ``mask`` as ``Mixer.forward`` takes it, each head's
        output times ``gate`` (``gates``) where there is one."""
        B, H, T, _ = q.shape
        if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # autocast runs q in bf16; SDPA wants the bias in q's dtype
        if self.sinks is not None:  # one more key per head, its score the sink, its value zero
            q, k, v, mask = sink_key(q, k, v, mask, self.sinks, self.scale)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None and q.shape[2] > 1, scale=self.scale,
        )  # fmt: skip
        y = y[:, :, y.shape[2] - T :, : self.v_dim].transpose(1, 2)  # [B, T, H, v] (less sink_key's additions)
        if gate is not None:
            y = y * gate
        return self.proj(y.reshape(B, T, H * self.v_dim))

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """The un-rotated and the rotated part: qk_nope_head_dim + qk_rope_head_dim."""
        return cfg.attention.qk_nope_head_dim + cfg.attention.qk_rope_head_dim

    @classmethod
    def rotary_head_dim(cls, cfg: ModelConfig) -> int:
        """The rotated part only, qk_rope_head_dim."""
        return cfg.attention.qk_rope_head_dim

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Queries d·H·(nope + rope), or d·q_r + norm(q_r) + q_in·H·(nope + rope) through the bottleneck
        (q_in: q_r, 2·q_r with ``q_latent`` both); keys and values d·(r + rope) + norm(r) + r·H·(nope + v),
        and norm(rope) with ``rope_key_norm``; output H·v·d; the gate g_in·H (head) or g_in·H·v
        (elementwise), g_in d or q_in (``gate_input``); H sinks (no biases)."""
        a, d, H = cfg.attention, cfg.d_model, cfg.attention.n_head
        norm = NORMS.get(cfg.norm.kind).num_params
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank is None:
            queries = d * H * qk
        else:
            queries = d * a.q_lora_rank + norm(cfg, a.q_lora_rank) + q_in_width(cfg) * H * qk
        r, rope = a.kv_lora_rank, a.qk_rope_head_dim
        keys_values = d * (r + rope) + norm(cfg, r) + r * H * (a.qk_nope_head_dim + a.v_head_dim)
        keys_values += norm(cfg, rope) if a.rope_key_norm else 0
        return queries + keys_values + H * a.v_head_dim * d + gate_in_width(cfg) * gate_width(cfg) + a.sinks * H

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """What layer ``layer`` caches for one sequence of ``length`` tokens: the latent and the shared
        rotated key, kv_lora_rank + qk_rope_head_dim per position kept (a sliding layer: its window)."""
        a = cfg.attention
        return (a.kv_lora_rank + a.qk_rope_head_dim) * positions_seen(cfg, length, layer)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Scores q·k over nope + rope dims and the weighted sum of v_head_dim values, forward and backward:
        6·H·(nope + rope + v) per key a query sees (causal's 12·H·hd when both are hd)."""
        a = cfg.attention
        per_key = 6 * a.n_head * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
        return per_key * positions_seen(cfg, seq_len, layer)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        if a.q_lora_rank is not None:
            checks.integer("model.attention.q_lora_rank", a.q_lora_rank, 1, "a positive integer, or null")
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            checks.integer(f"model.attention.{name}", getattr(a, name), 1)
        if a.latent_norm_eps is not None:
            checks.positive("model.attention.latent_norm_eps", a.latent_norm_eps, "a positive number, or null")
        if a.q_lora_rank is None and a.q_latent != "normed":
            raise ConfigError("model.attention.q_latent", a.q_latent, "normed without q_lora_rank (no q latent)")
        if a.gate_input != "x" and (a.gate == "none" or a.q_lora_rank is None):
            why = "x without an output gate and q_lora_rank (it reads the q latent)"
            raise ConfigError("model.attention.gate_input", a.gate_input, why)
        validate_shared(cfg)

    @staticmethod
    def validate_rotary(cfg: ModelConfig) -> None:
        """The rotated part is its own width, qk_rope_head_dim, an even number: no ``rotary_dim`` or
        ``rotary_fraction`` to rotate part of it."""
        p, rope = cfg.position, cfg.attention.qk_rope_head_dim
        for name in ("rotary_dim", "rotary_fraction"):
            if getattr(p, name) is not None:
                raise ConfigError(
                    f"model.position.{name}",
                    getattr(p, name),
                    "null for attention kind mla (it rotates model.attention.qk_rope_head_dim dims)",
                )
        if rope % 2:
            raise ConfigError("model.attention.qk_rope_head_dim", rope, "an even number for rope (it rotates pairs)")

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """Heads, their query/key parts and values, the latent's rank and the queries' path."""
        a = cfg.attention
        q = f"q_lora {a.q_lora_rank}" if a.q_lora_rank is not None else "direct q"
        eps = f", latent norm eps {a.latent_norm_eps:g}" if a.latent_norm_eps is not None else ""
        q += " of [normed, raw] latent" if a.q_latent == "both" else ""
        gate = f", {a.gate} gate" if a.gate != "none" else ""
        gate += " of q_up's input" if gate and a.gate_input == "q_latent" else ""
        extra = ", latents scaled" * a.latent_scale + ", rotated key normed" * a.rope_key_norm + ", sinks" * a.sinks
        return (
            f"mla {a.n_head}h x ({a.qk_nope_head_dim}+{a.qk_rope_head_dim} qk, {a.v_head_dim} v), "
            f"kv_lora {a.kv_lora_rank}, {q}{eps}{gate}{extra}"
        )


# registered apart from the class statement: the name keeps its own type for dsa, which subclasses it
MIXERS.register("mla")(MultiHeadLatentAttention)
