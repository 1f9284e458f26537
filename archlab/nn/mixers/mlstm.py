"""The mLSTM, ``mlstm`` (Beck et al. 2024, *xLSTM*, arXiv:2405.04517), as xLSTM-7B uses it: a matrix memory
per head written along keys with exponential input gates and sigmoid forget gates, read by queries over a
normaliser, so its decoding state is one ``qk_head_dim × head_dim`` matrix, a vector and a stabiliser per head.

Per head and token (q scaled by 1/sqrt(qk_head_dim), gate preactivations soft-capped by ``gate_soft_cap``):
``m_t = max(logσ(f_t) + m_{t−1}, i_t)``, ``C_t = exp(logσ(f_t) + m_{t−1} − m_t)·C_{t−1} + exp(i_t − m_t)·k_t·v_tᵀ``,
``n_t`` alike with ``k_t``, ``h_t = C_tᵀq_t / (max(|n_tᵀq_t|, exp(−m_t)) + eps)``; each head's h layer-normed,
times sigmoid(o_t). Training and prefill run the chunked form (``ops/mlstm_rule.chunked_mlstm_rule``),
decoding the recurrence (``recurrent_mlstm_rule``); both in float32 (float64 in a float64 model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.ops.mlstm_rule import chunked_mlstm_rule, pack_state, recurrent_mlstm_rule, unpack_state


@mixer_config("mlstm")
@dataclass
class MLSTMConfig(MixerConfig):
    """``model.attention`` with kind mlstm (xLSTM's layers): n_head heads, each a qk_head_dim x head_dim
    memory; q, k, v and the output gate from one projection, the input and forget gates (one each per head)
    from another, a layer norm per head, the output projection."""

    kind: str = "mlstm"
    head_dim: Optional[int] = None  # value dims per head; None = d_model // n_head
    qk_head_dim: Optional[int] = None  # query/key dims per head; None = head_dim // 2 (xLSTM's qk_dim_factor 0.5)
    bias: bool = False  # biases on q, k, v, the output gate, the output projection and the norm (use_bias)
    gate_soft_cap: Optional[float] = 15.0  # the gates' preactivations become cap·tanh(x / cap); None: uncapped
    eps: float = 1e-6  # added to the normaliser's read
    scan_chunk: int = 64  # positions per chunk of the parallel form (speed and memory only)


def dims(cfg: ModelConfig) -> tuple[int, int]:
    """Query/key and value dims per head: ``qk_head_dim`` and ``head_dim`` with their defaults."""
    a = cfg.attention
    dv = a.head_dim if a.head_dim is not None else cfg.d_model // a.n_head
    return (a.qk_head_dim if a.qk_head_dim is not None else dv // 2), dv


@MIXERS.register("mlstm")
class MLSTM(Mixer):
    """``in_proj`` to q, k, v and the output gate's preactivation o (biases with ``bias``); ``gate_weight``
    and ``gate_bias`` to each head's input and forget gate preactivations (always biased); the rule over
    ``n_head`` memories; a layer norm over each head's h (one scale of n_head·head_dim, and a bias with
    ``bias``) times sigmoid(o); the output projection. No position reaches it. Its ``mask`` (``Tokens``): a
    padded position neither decays nor writes (i = −inf, forget 1); a packed document's first position starts
    from the empty state. The KV cache keeps, per such layer, ``[B, n_head, qk·v + qk + 1]``: C, n and m."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.n_head, (self.dk, self.dv) = a.n_head, dims(cfg)
        self.scan_chunk, self.eps, self.cap, self.norm_eps = a.scan_chunk, a.eps, a.gate_soft_cap, cfg.norm.eps
        qk, width = a.n_head * self.dk, a.n_head * self.dv
        self.in_proj = nn.Linear(d, 2 * qk + 2 * width, bias=a.bias)  # q, k, v, o
        self.gate_weight = nn.Parameter(torch.empty(2 * a.n_head, d))  # i, f
        self.gate_bias = nn.Parameter(torch.empty(2 * a.n_head))
        self.norm_weight = nn.Parameter(torch.empty(width))
        self.norm_bias = nn.Parameter(torch.empty(width)) if a.bias else None
        self.proj = residual_projection(nn.Linear(width, d, bias=a.bias))

    def param_roles(self) -> dict[str, Role]:
        biases = ["in_proj.bias", "norm_bias", "proj.bias"] if self.norm_bias is not None else []
        vectors = ["gate_bias", "norm_weight", *biases]
        hidden = ("in_proj.weight", "gate_weight", "proj.weight")
        return {**{n: Role.HIDDEN for n in hidden}, **{n: Role.VECTOR for n in vectors}}

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, _ = x.shape
        f = torch.promote_types(x.dtype, torch.float32)  # the rule's dtype: float32, or a float64 model's own
        H, dk, dv = self.n_head, self.dk, self.dv
        present, starts = mask or Tokens()
        q, k, v, o = self.in_proj(x).to(f).split((H * dk, H * dk, H * dv, H * dv), dim=-1)
        gates = F.linear(x, self.gate_weight, self.gate_bias).to(f)
        if self.cap is not None:
            gates = self.cap * torch.tanh(gates / self.cap)
        i, log_f = gates[..., :H], F.logsigmoid(gates[..., H:])
        if present is not None:  # a padded position keeps the state as it is: no write, no decay
            i, log_f = i.masked_fill(~present[..., None], -torch.inf), log_f * present[..., None]
        q = q.unflatten(-1, (H, dk)) * dk**-0.5
        q, k, v = (t.transpose(1, 2) for t in (q, k.unflatten(-1, (H, dk)), v.unflatten(-1, (H, dv))))
        i, log_f = i.transpose(1, 2), log_f.transpose(1, 2)
        held = None if cache is None else cache.recurrent_state[layer]
        state = None if held is None else unpack_state(held.to(f), dk, dv)
        if T == 1:
            h, state = recurrent_mlstm_rule(q, k, v, i, log_f, self.eps, state, starts)
        else:
            h, state = chunked_mlstm_rule(q, k, v, i, log_f, self.scan_chunk, self.eps, state, starts)
        if cache is not None:
            packed = pack_state(state)
            cache.recurrent_state[layer] = packed.to(cache.dtype or packed.dtype)
        h = h.transpose(1, 2)  # [B, T, H, dv]
        h = (h - h.mean(-1, keepdim=True)) * torch.rsqrt(h.var(-1, keepdim=True, unbiased=False) + self.norm_eps)
        h = h.flatten(2) * self.norm_weight.to(f)
        if self.norm_bias is not None:
            h = h + self.norm_bias.to(f)
        return self.proj((h * torch.sigmoid(o)).to(x.dtype))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """What no Linear holds (``Decoder.init_weights`` calls it), as transformers' xLSTM initialises it:
        the gates' weights 0, the input gates' biases −10 (writing little at first), the forget gates'
        linearly from 3 to 6 over the heads (keeping most of the memory), the norm's scale 1 and bias 0."""
        H = self.n_head
        nn.init.zeros_(self.gate_weight)
        self.gate_bias[:H] = -10.0
        self.gate_bias[H:] = torch.linspace(3.0, 6.0, H)
        nn.init.ones_(self.norm_weight)
        if self.norm_bias is not None:
            nn.init.zeros_(self.norm_bias)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``attention.qk_head_dim`` (default head_dim // 2): what a query and a key multiply over."""
        return dims(cfg)[0]

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """With Q = n_head·qk_head_dim, W = n_head·head_dim: the in-projection d·(2Q + 2W), the gates 2H·d
        and 2H biases, the norm's scale W, the output W·d; with ``bias`` also 2Q + 2W, W and d biases."""
        a, d, H = cfg.attention, cfg.d_model, cfg.attention.n_head
        dk, dv = dims(cfg)
        Q, W = H * dk, H * dv
        biases = (2 * Q + 2 * W) + W + d if a.bias else 0
        return d * (2 * Q + 2 * W) + 2 * H * d + 2 * H + W + W * d + biases

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: per head the qk_head_dim × head_dim memory C, the qk_head_dim
        normaliser n and the stabiliser m."""
        dk, dv = dims(cfg)
        return cfg.attention.n_head * (dk * dv + dk + 1)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The recurrence's cost per token, at any length: two products with each head's dk × dv memory
        (written along the key, read by the query) and two with its dk normaliser, 2 FLOPs per entry each,
        forward and backward (×3): 12·H·dk·(dv + 1). The chunked form's within-chunk products, another way
        of computing the same recurrence, are not counted."""
        dk, dv = dims(cfg)
        return 12 * cfg.attention.n_head * dk * (dv + 1)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 1, "a positive integer (heads, one memory each)")
        for name in ("head_dim", "qk_head_dim"):
            if getattr(a, name) is not None:
                checks.integer(f"model.attention.{name}", getattr(a, name), 1, "a positive integer, or null")
        if a.head_dim is None and cfg.d_model % a.n_head:
            raise ConfigError("model.attention.head_dim", None, f"set, as d_model {cfg.d_model} splits into no n_head")
        if dims(cfg)[0] < 1:
            raise ConfigError("model.attention.qk_head_dim", None, "set, as head_dim // 2 is 0")
        checks.integer("model.attention.scan_chunk", a.scan_chunk, 1)
        checks.positive("model.attention.eps", a.eps)
        if a.gate_soft_cap is not None:
            checks.positive("model.attention.gate_soft_cap", a.gate_soft_cap, "a positive number, or null (uncapped)")

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``mlstm <H> x (<dk> qk, <dv> v)``."""
        dk, dv = dims(cfg)
        return f"mlstm {cfg.attention.n_head} x ({dk} qk, {dv} v)"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Every field of its config."""
        return frozenset({"n_head", "head_dim", "qk_head_dim", "bias", "gate_soft_cap", "eps", "scan_chunk"})
