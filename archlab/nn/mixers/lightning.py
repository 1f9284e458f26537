"""Lightning attention, ``lightning`` (MiniMax 2025, *MiniMax-01*, arXiv:2501.08313; Qin et al. 2024,
arXiv:2401.04658), as MiniMax-Text-01's linear-attention layers: softmax-free attention whose memory is one
``head_dim × head_dim`` state per head, decayed by a fixed rate per head, so its decoding state is constant in
the context.

Per head ``h`` and token ``t``: ``S_t = exp(−s_h)·S_{t−1} + k_t·v_tᵀ``, ``o_t = q_tᵀ·S_t``, with q, k, v the SiLU
of one projection and the slope ``s_h = 2^(−8·(h+1)/H)·(1 − l/(L − 1 + 1e-5) + 1e-5)`` for layer ``l`` of ``L``
(ALiBi's slopes, slower in deeper layers). The blockwise form (intra-block products masked by the decay,
inter-block through the carried state) is SSD's chunked scan with ``x = v``, ``B = k``, ``C = q``, ``dt = 1``
and ``A = −s`` (nn/mixers/ops/ssd.py); decoding runs the recurrence itself; both in float32 (float64 in a
float64 model)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.ops.ssd import chunked_ssd, recurrent_ssd


@mixer_config("lightning")
@dataclass
class LightningConfig(MixerConfig):
    """``model.attention`` with kind lightning (MiniMax-01's lightning attention): n_head heads of head_dim,
    each a head_dim × head_dim state decayed by its fixed slope; MiniMaxConfig's defaults but the sizes."""

    kind: str = "lightning"
    head_dim: Optional[int] = None  # None = d_model // n_head
    block_size: int = 256  # positions per block of the blockwise form (speed and memory only)
    norm_eps: float = 1e-6  # eps of the RMSNorm on the heads' outputs (MiniMax's, whatever model.norm.eps)


def head_dim(cfg: ModelConfig) -> int:
    """Dims per head of q, k and v: ``attention.head_dim``, else d_model / n_head."""
    a = cfg.attention
    return a.head_dim if a.head_dim is not None else cfg.d_model // a.n_head


def slopes(n_head: int, layer: int, n_layer: int, dtype: torch.dtype, device=None) -> Tensor:
    """The decay rate per head, ``[n_head]``: ALiBi's 2^(−8·(h+1)/H), times 1 − l/(L − 1 + 1e-5) + 1e-5 for
    layer l of L (MiniMax's: the last layer's heads barely decay)."""
    depth = 1 - layer / (n_layer - 1 + 1e-5) + 1e-5
    exponent = torch.arange(1, n_head + 1, dtype=dtype, device=device)
    return 2.0 ** (-8.0 / n_head * exponent) * depth


@MIXERS.register("lightning")
class Lightning(Mixer):
    """One projection to q, k, v (per head side by side: ``[q_h | k_h | v_h]``) through SiLU; the decayed
    linear attention per head (no scale, no softmax); an RMSNorm over all heads' outputs (scale of
    n_head·head_dim, eps ``norm_eps``); times the sigmoid of a gate projected from the input; the output
    projection. No bias anywhere, no position reaches it. Its ``mask`` (``Tokens``): a padded position has
    q, k, v zero and keeps the state (no decay, no write), so a left-padded row computes what it would alone;
    at a packed document's start the state begins empty. The KV cache keeps, per such layer, the states
    ``[B, n_head, head_dim (v), head_dim (k)]``."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.n_head, self.head_dim, self.block_size = a.n_head, head_dim(cfg), a.block_size
        self.layer, self.n_layer, self.norm_eps = layer, cfg.n_layer, a.norm_eps
        inner = self.n_head * self.head_dim
        self.qkv_proj = nn.Linear(d, 3 * inner, bias=False)
        self.output_gate = nn.Linear(d, inner, bias=False)
        self.norm_weight = nn.Parameter(torch.empty(inner))
        self.proj = residual_projection(nn.Linear(inner, d, bias=False))

    def param_roles(self) -> dict[str, Role]:
        hidden = ("qkv_proj.weight", "output_gate.weight", "proj.weight")
        return {**{n: Role.HIDDEN for n in hidden}, "norm_weight": Role.VECTOR}

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        b, T, _ = x.shape
        f = torch.promote_types(x.dtype, torch.float32)  # the scan's dtype: float32, or a float64 model's own
        H, P = self.n_head, self.head_dim
        present, starts = mask or Tokens()
        qkv = F.silu(self.qkv_proj(x))
        steps = x.new_ones(b, T, H, dtype=f)  # SSD's dt: 1 per token, decaying once and writing k·vᵀ once
        if present is not None:  # a padded position: nothing written, the state kept as it is
            qkv = qkv * present[..., None].to(qkv.dtype)
            steps = steps * present[..., None]
        q, k, v = qkv.to(f).unflatten(-1, (H, 3 * P)).split(P, dim=-1)
        A = -slopes(H, self.layer, self.n_layer, f, x.device)
        state = None if cache is None else cache.recurrent_state[layer]
        state = None if state is None else state.to(f)
        if T == 1:
            y, state = recurrent_ssd(v, steps, A, k, q, state)  # one position: no document starts within it
        else:
            y, state = chunked_ssd(v, steps, A, k, q, self.block_size, state, starts)
        if cache is not None:
            cache.recurrent_state[layer] = state.to(cache.dtype or state.dtype)
        y = y.flatten(2)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.norm_weight.to(f)
        y = y * torch.sigmoid(self.output_gate(x).to(f))
        return self.proj(y.to(x.dtype))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """What no Linear holds (``Decoder.init_weights`` calls it): the norm's scale 1."""
        nn.init.ones_(self.norm_weight)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``head_dim``: what a query and a key multiply over."""
        return head_dim(cfg)

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """q, k, v 3·d·I, the gate d·I, the norm's scale I, the output projection I·d; I = n_head·head_dim."""
        inner = cfg.attention.n_head * head_dim(cfg)
        return 5 * cfg.d_model * inner + inner

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: n_head states of head_dim × head_dim."""
        return cfg.attention.n_head * head_dim(cfg) ** 2

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The recurrence's cost per token, at any length: two products with each head's head_dim × head_dim
        state (written by k·vᵀ, read by q), 2·P² FLOPs each, forward and backward: 12·H·P². The blockwise
        form's work within a block, a way of computing the same recurrence, is not counted."""
        return 12 * cfg.attention.n_head * head_dim(cfg) ** 2

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 1, "a positive integer (heads, one state each)")
        if a.head_dim is None:
            if cfg.d_model % a.n_head:
                raise ConfigError(
                    "model.attention.n_head", a.n_head, f"a divisor of model.d_model={cfg.d_model}, or set head_dim"
                )
        else:
            checks.integer("model.attention.head_dim", a.head_dim, 1, "a positive integer, or null (d_model/n_head)")
        checks.integer("model.attention.block_size", a.block_size, 1)
        checks.positive("model.attention.norm_eps", a.norm_eps)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``lightning <H>h x <P>, blocks of <B>``."""
        a = cfg.attention
        return f"lightning {a.n_head}h x {head_dim(cfg)}, blocks of {a.block_size}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its heads, block size and norm eps: all its fields."""
        return frozenset(f.name for f in dataclasses.fields(LightningConfig)) - {"kind"}
