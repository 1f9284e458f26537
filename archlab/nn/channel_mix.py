"""RWKV's channel-mix, the MLP kind ``rwkv_channel_mix`` (transformers' ``RwkvFeedForward``): an MLP that reads
the token before as well, ``σ(receptance(x_r)) ⊙ value(relu(key(x_k))²)`` with ``x_k``, ``x_r`` the token mixed
with the previous one (the token shift, a learned mix per channel). The only MLP with a state: the previous
input, kept in the KV cache's ``shift`` beside the time-mix's own, so a block hands it the mask and the cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from archlab import checks
from archlab.config import MLPConfig, ModelConfig, mlp_config
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, KVCache, Tokens
from archlab.nn.mlp import MLP, MLPS


@mlp_config("rwkv_channel_mix")
@dataclass
class ChannelMixConfig(MLPConfig):
    """``model.mlp`` with kind rwkv_channel_mix: RWKV's channel-mix of hidden width d_ff (None = 4·d_model)."""

    kind: str = "rwkv_channel_mix"
    d_ff: Optional[int] = None  # key's width (intermediate_size); None = 4·d_model


def hidden(cfg: ModelConfig) -> int:
    """key's width: ``mlp.d_ff``, else 4·d_model."""
    return cfg.mlp.d_ff if cfg.mlp.d_ff is not None else 4 * cfg.d_model


@MLPS.register("rwkv_channel_mix")
class ChannelMix(MLP):
    """``key`` (d → d_ff), relu², ``value`` (d_ff → d), times σ(``receptance`` (d → d)), no biases; the mixes
    ``time_mix_key``, ``time_mix_receptance`` per channel. Called as ``mlp(x, tokens, cache, layer)``: the
    previous input is zero before a sequence, at a padded one and at a document's first token (``tokens``,
    as the recurrent mixers'), and the cache's ``shift`` of the layer keeps the last input ``[B, d]``."""

    stateful = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        d, f = cfg.d_model, hidden(cfg)
        self.layer, self.n_layer = layer, cfg.n_layer
        self.time_mix_key = nn.Parameter(torch.empty(d))
        self.time_mix_receptance = nn.Parameter(torch.empty(d))
        self.key = nn.Linear(d, f, bias=False)
        self.receptance = nn.Linear(d, d, bias=False)
        self.value = residual_projection(nn.Linear(f, d, bias=False))

    def param_roles(self) -> dict[str, Role]:
        hidden_ = {n: Role.HIDDEN for n in ("key.weight", "receptance.weight", "value.weight")}
        return {**hidden_, "time_mix_key": Role.VECTOR, "time_mix_receptance": Role.VECTOR}

    def forward(
        self, x: Tensor, tokens: Optional[Tokens] = None, cache: Optional[KVCache] = None, layer: int = 0
    ) -> Tensor:
        present, starts = tokens or Tokens()
        if present is not None:
            x = x * present[..., None].to(x.dtype)
        past = None if cache is None else cache.shift[layer]
        past = x.new_zeros(x.shape[0], 1, x.shape[-1]) if past is None else past[:, None].to(x.dtype)
        prev = torch.cat((past, x[:, :-1]), dim=1)
        if starts is not None:
            prev = prev * ~starts[..., None]
        if cache is not None:
            cache.shift[layer] = x[:, -1].to(cache.dtype or x.dtype)
        k = torch.relu(self.key(prev + (x - prev) * self.time_mix_key.to(x.dtype))).square()
        r = torch.sigmoid(self.receptance(prev + (x - prev) * self.time_mix_receptance.to(x.dtype)))
        return r * self.value(k)

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """RWKV-4's token-shift mixes, (c/d)^(1 − l/L) for channel c of layer l of L."""
        d = self.time_mix_key.numel()
        ramp = (torch.arange(d, dtype=torch.float64) / d) ** (1.0 - self.layer / self.n_layer)
        self.time_mix_key.copy_(ramp)
        self.time_mix_receptance.copy_(ramp)

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Two mixes of d, key d·f, value f·d, receptance d²: 2d + 2df + d²."""
        d, f = cfg.d_model, hidden(cfg)
        return 2 * d + 2 * d * f + d * d

    @staticmethod
    def state_values(cfg: ModelConfig) -> int:
        """The last input, d_model values, whatever the context."""
        return cfg.d_model

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Per token, forward and backward (×3): two token-shift mixes (a multiply-add per channel each), the
        square (f) and the receptance product (d): 12·d + 3·f + 3·d."""
        return 15 * cfg.d_model + 3 * hidden(cfg)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        if cfg.mlp.d_ff is not None:
            checks.integer("model.mlp.d_ff", cfg.mlp.d_ff, 1, "a positive integer, or null (4·d_model)")
        if not MIXERS.get(cfg.attention.kind).recurrent:
            raise ConfigError(
                "model.mlp.kind",
                cfg.mlp.kind,
                f"an MLP beside a recurrent mixer (rwkv4 ...), whose padding and document starts it reads; "
                f"not beside {cfg.attention.kind}",
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        return f"rwkv_channel_mix d_ff={hidden(cfg)}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return frozenset({"d_ff"})
