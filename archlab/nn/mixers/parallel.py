"""Attention and Mamba-2 side by side, ``parallel`` (Falcon-H1, TII 2025): one token mixer whose two parts,
softmax attention (``causal``) and Mamba-2 (``mamba2``), read the same normed input, each times its input
multiplier, and whose output is the sum of theirs, each times its output multiplier. Each part is the
existing mixer built from its own sub-config, so it computes, caches and counts as it does alone: the KV
cache holds the layer's keys and values and its Mamba-2 state in the layer's own slots."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from torch import Tensor

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role
from archlab.nn.mixers.attention import AttentionConfig, CausalSelfAttention
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.mamba2 import Mamba2, Mamba2Config

MULTIPLIERS = ("attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")


@mixer_config("parallel")
@dataclass
class ParallelConfig(MixerConfig):
    """``model.attention`` with kind parallel: ``attention`` (a causal config; its heads are this section's
    n_head, its own n_head unread) and ``ssm`` (a mamba2 config) on the same input, outputs summed, each
    part's input and output times its multiplier (Falcon-H1's four of the same names)."""

    kind: str = "parallel"
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    ssm: Mamba2Config = field(default_factory=Mamba2Config)
    attention_in_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0


def attention_part(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` as its attention part reads it: the ``attention`` sub-config with the mixer's n_head."""
    a = cfg.attention
    return dataclasses.replace(cfg, attention=dataclasses.replace(a.attention, n_head=a.n_head))


def ssm_part(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` as its Mamba-2 part reads it: the ``ssm`` sub-config."""
    return dataclasses.replace(cfg, attention=cfg.attention.ssm)


def _scaled(x: Tensor, multiplier: float) -> Tensor:
    return x if multiplier == 1.0 else x * multiplier


@MIXERS.register("parallel")
class ParallelMixer(Mixer):
    """``attention_out·attn(attention_in·x) + ssm_out·mamba2(ssm_in·x)``. Its mask is the pair the decoder
    derives (``mask_of``): the attention mask for the attention, the ``Tokens`` (padding, document starts)
    for Mamba-2. A rotary scheme rotates the attention's queries and keys; the parts' parameters are
    theirs (``attention.*``, ``ssm.*``), each part declaring its own μP roles."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a = cfg.attention
        self.attention = CausalSelfAttention(attention_part(cfg), layer)
        self.ssm = Mamba2(ssm_part(cfg), layer)
        self.multipliers = tuple(getattr(a, name) for name in MULTIPLIERS)

    @classmethod
    def mask_of(cls, scores: Optional[Tensor], tokens: Optional[Tokens]) -> Any:
        """Both: ``(scores, tokens)``."""
        return scores, tokens

    def param_roles(self) -> dict[str, Role]:
        return {}  # it holds no parameter itself: its two parts answer for theirs

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        scores, tokens = mask if mask is not None else (None, None)
        attention_in, attention_out, ssm_in, ssm_out = self.multipliers
        y = _scaled(self.ssm(_scaled(x, ssm_in), None, tokens, cache, layer), ssm_out)
        return y + _scaled(self.attention(_scaled(x, attention_in), rotary, scores, cache, layer), attention_out)

    def score_stats(self, x, rotary=None, mask=None):  # typed as Mixer.score_stats
        """The attention part's, of its scaled input."""
        return self.attention.score_stats(_scaled(x, self.multipliers[0]), rotary, None if mask is None else mask[0])

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """The attention part's."""
        return CausalSelfAttention.qk_head_dim(attention_part(cfg))

    @classmethod
    def rotary_head_dim(cls, cfg: ModelConfig) -> int:
        return CausalSelfAttention.rotary_head_dim(attention_part(cfg))

    @staticmethod
    def validate_rotary(cfg: ModelConfig) -> None:
        _named(CausalSelfAttention.validate_rotary, attention_part(cfg), "attention")

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """The attention part's and the Mamba-2 part's; the multipliers are constants."""
        return CausalSelfAttention.num_params(attention_part(cfg), layer) + Mamba2.num_params(ssm_part(cfg), layer)

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """The attention's keys and values for ``length`` positions, plus Mamba-2's constant state."""
        return CausalSelfAttention.kv_cache_values(attention_part(cfg), length, layer) + Mamba2.kv_cache_values(
            ssm_part(cfg), length, layer
        )

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The attention's scores and Mamba-2's recurrence, each as alone."""
        return CausalSelfAttention.extra_flops(attention_part(cfg), seq_len, layer) + Mamba2.extra_flops(
            ssm_part(cfg), seq_len, layer
        )

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Each part by its own mixer's checks, the field named under its sub-config; the parts' kinds
        fixed; no window or chunk (the layer's cache keeps every position, as a global layer's); positive
        multipliers."""
        a = cfg.attention
        for name, kind in (("attention", "causal"), ("ssm", "mamba2")):
            if getattr(a, name).kind != kind:
                why = f"{kind} (the parallel mixer's {name} part)"
                raise ConfigError(f"model.attention.{name}.kind", getattr(a, name).kind, why)
        for name in ("window", "chunk"):
            if getattr(a.attention, name) is not None:
                why = "null (a parallel layer's attention sees every earlier position)"
                raise ConfigError(f"model.attention.attention.{name}", getattr(a.attention, name), why)
        if a.attention.value_residual:
            why = "false (a parallel layer's attention takes no other layer's values)"
            raise ConfigError("model.attention.attention.value_residual", a.attention.value_residual, why)
        for name in MULTIPLIERS:
            checks.positive(f"model.attention.{name}", getattr(a, name))
        _named(CausalSelfAttention.validate, attention_part(cfg), "attention")
        _named(Mamba2.validate, ssm_part(cfg), "ssm")

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``parallel: <causal's> + <mamba2's>``, then any multiplier away from 1."""
        a = cfg.attention
        parts = CausalSelfAttention.describe(attention_part(cfg)), Mamba2.describe(ssm_part(cfg))
        scaled = [f"{name.removesuffix('_multiplier')} ×{getattr(a, name):g}" for name in MULTIPLIERS]
        extra = [s for s, name in zip(scaled, MULTIPLIERS) if getattr(a, name) != 1.0]
        return ", ".join([f"parallel: {parts[0]} + {parts[1]}", *extra])

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its heads and multipliers, and what each part reads of its sub-config (not the attention's own
        n_head: the mixer's is the attention's)."""
        attention = (CausalSelfAttention.reads(attention_part(cfg)) or frozenset()) - {"n_head"}
        ssm = Mamba2.reads(ssm_part(cfg)) or frozenset()
        return frozenset({"n_head", *MULTIPLIERS} | {f"attention.{n}" for n in attention} | {f"ssm.{n}" for n in ssm})


def _named(check: Any, part: ModelConfig, name: str) -> None:
    """Run ``check(part)``, a ConfigError's field under ``model.attention.<name>`` (the mixer's n_head kept)."""
    try:
        check(part)
    except ConfigError as err:
        prefix, field_name = "model.attention.", err.field
        if field_name.startswith(prefix) and not (name == "attention" and field_name == "model.attention.n_head"):
            field_name = f"{prefix}{name}.{field_name.removeprefix(prefix)}"
        raise ConfigError(field_name, err.value, err.allowed) from None
