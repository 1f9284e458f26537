"""RWKV-4's time-mix, ``rwkv4`` (Peng et al. 2023, *RWKV*, arXiv:2305.13048; transformers' ``RwkvSelfAttention``):
key, value and receptance each read the token interpolated with the one before it (the token shift, a learned
mix per channel), then ``output(σ(r) ⊙ wkv(k, v))`` with the WKV of nn/mixers/ops/wkv.py: per channel a
decayed, key-weighted average of the values, the current token's raised by a learned bonus. Its decoding state
is the previous token and three numbers per channel, whatever the context."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, KVCache, Mixer, Tokens
from archlab.nn.mixers.ops.wkv import wkv


@mixer_config("rwkv4")
@dataclass
class RWKV4Config(MixerConfig):
    """``model.attention`` with kind rwkv4 (RWKV-4's time-mix): width channels of WKV; n_head is not read."""

    kind: str = "rwkv4"
    width: Optional[int] = None  # channels of key, value, receptance, WKV (attention_hidden_size); None = d_model
    scan_chunk: int = 8  # positions per chunk of the parallel WKV (speed and memory only; docs/performance.md)


def width(cfg: ModelConfig) -> int:
    """Channels of the WKV: ``attention.width``, else d_model."""
    a = cfg.attention
    return a.width if a.width is not None else cfg.d_model


def shifted(x: Tensor, present: Optional[Tensor], starts: Optional[Tensor], cache: Optional[KVCache], layer: int):
    """The token before each of ``x`` ``[B, T, d]`` (RWKV's token shift): zeros before a sequence, a padded
    position and a packed document's first token, else the previous input (the cached one for the first
    position). Padded inputs are zeroed in the ``x`` returned beside it; the cache's ``conv_state`` of
    ``layer`` then keeps the last input ``[B, d, 1]``."""
    if present is not None:
        x = x * present[..., None].to(x.dtype)
    past = None if cache is None else cache.conv_state[layer]
    past = x.new_zeros(x.shape[0], 1, x.shape[-1]) if past is None else past.transpose(1, 2).to(x.dtype)
    prev = torch.cat((past, x[:, :-1]), dim=1)
    if starts is not None:
        prev = prev * ~starts[..., None]
    if cache is not None:
        cache.conv_state[layer] = x[:, -1:].transpose(1, 2).to(cache.dtype or x.dtype)
    return x, prev


@MIXERS.register("rwkv4")
class RWKV4(Mixer):
    """Token shift, ``key``/``value``/``receptance`` (d_model → width, no bias), the WKV with ``time_decay``
    (``w = −exp(time_decay)``) and ``time_first`` (the bonus u) per channel, ``output`` (width → d_model). No
    position reaches it. Its ``mask`` (``Tokens``): a padded position shifts in and is shifted in as zeros
    and leaves the WKV state as it was; a packed document's first token sees a zero before it and an empty
    state. The KV cache keeps, per such layer, the last input ``[B, d_model, 1]`` (``conv_state``) and the
    WKV state ``[B, width, 3]`` (num, den and their exponent; ``recurrent_state``)."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        d, w = cfg.d_model, width(cfg)
        self.layer, self.n_layer, self.scan_chunk = layer, cfg.n_layer, cfg.attention.scan_chunk
        self.time_decay = nn.Parameter(torch.empty(w))
        self.time_first = nn.Parameter(torch.empty(w))
        self.time_mix_key = nn.Parameter(torch.empty(d))
        self.time_mix_value = nn.Parameter(torch.empty(d))
        self.time_mix_receptance = nn.Parameter(torch.empty(d))
        self.key = nn.Linear(d, w, bias=False)
        self.value = nn.Linear(d, w, bias=False)
        self.receptance = nn.Linear(d, w, bias=False)
        self.output = residual_projection(nn.Linear(w, d, bias=False))

    def param_roles(self) -> dict[str, Role]:
        vectors = ("time_decay", "time_first", "time_mix_key", "time_mix_value", "time_mix_receptance")
        hidden = ("key.weight", "value.weight", "receptance.weight", "output.weight")
        return {**{n: Role.HIDDEN for n in hidden}, **{n: Role.VECTOR for n in vectors}}

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        f = torch.promote_types(x.dtype, torch.float32)  # the WKV's dtype: float32, or a float64 model's own
        present, starts = mask or Tokens()
        x, prev = shifted(x, present, starts, cache, layer)

        def mix(mu: Tensor) -> Tensor:
            return prev + (x - prev) * mu.to(x.dtype)  # x·μ + prev·(1 − μ)

        k = self.key(mix(self.time_mix_key)).to(f)
        v = self.value(mix(self.time_mix_value)).to(f)
        r = torch.sigmoid(self.receptance(mix(self.time_mix_receptance)))
        state = None if cache is None else cache.recurrent_state[layer]
        state = None if state is None else state.to(f)
        w, u = -torch.exp(self.time_decay.to(f)), self.time_first.to(f)
        out, state = wkv(w, u, k, v, present, starts, state, self.scan_chunk)
        if cache is not None:
            cache.recurrent_state[layer] = state.to(cache.dtype or state.dtype)
        return self.output(r * out.to(x.dtype))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """RWKV-4's own: decays −5 + 8·(c/(W − 1))^(0.7 + 1.3·l/(L − 1)) over the channels c, bonus
        ln 0.3 + a zigzag of ±0.5, and the token-shift mixes (c/d)^(1 − l/L) (value + 0.3·l/(L − 1),
        receptance to the half power), for layer l of L."""
        w, d = self.time_decay.numel(), self.time_mix_key.numel()
        deep = self.layer / max(self.n_layer - 1, 1)  # 0 to 1
        shallow = 1.0 - self.layer / self.n_layer  # 1 to almost 0
        c = torch.arange(w, dtype=torch.float64)
        self.time_decay.copy_(-5 + 8 * (c / max(w - 1, 1)) ** (0.7 + 1.3 * deep))
        self.time_first.copy_(math.log(0.3) + 0.5 * ((c + 1) % 3 - 1))
        ramp = torch.arange(d, dtype=torch.float64) / d
        self.time_mix_key.copy_(ramp**shallow)
        self.time_mix_value.copy_(ramp**shallow + 0.3 * deep)
        self.time_mix_receptance.copy_(ramp ** (0.5 * shallow))

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """1: each channel's WKV weighs one key."""
        return 1

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Three mixes of d, decay and bonus of W, key, value and receptance d·W each, output W·d: 3d + 2W + 4dW."""
        d, w = cfg.d_model, width(cfg)
        return 3 * d + 2 * w + 4 * d * w

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: the last input (d_model) and num, den and exponent per channel (3·W)."""
        return cfg.d_model + 3 * width(cfg)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Per token, forward and backward (×3): three token-shift mixes, a multiply-add per channel of d
        (18·d); per WKV channel num and den each decayed and written and the bonus term in both (4
        multiply-adds), and the receptance product (24·W + 3·W)."""
        return 18 * cfg.d_model + 27 * width(cfg)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        if a.width is not None:
            checks.integer("model.attention.width", a.width, 1, "a positive integer, or null (d_model)")
        checks.integer("model.attention.scan_chunk", a.scan_chunk, 1)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``rwkv4 <W> wide``."""
        return f"rwkv4 {width(cfg)} wide"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its width and chunk; not n_head, which it has no use for."""
        return frozenset(f.name for f in dataclasses.fields(RWKV4Config)) - {"kind", "n_head"}
