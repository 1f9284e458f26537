"""Falcon-H1 (``FalconH1ForCausalLM``, TII's hybrid): pre-norm layers of two RMSNorms, each mixing tokens by
GQA attention with full RoPE and Mamba-2 side by side on the same normed input, outputs summed (archlab's
``parallel`` mixer: ``attention`` and ``ssm`` sub-configs), then a SwiGLU MLP.

Falcon-H1's μP multipliers map two ways. Those archlab holds as fields convert as they are:
``embedding_multiplier`` (``model.embedding_multiplier``), ``lm_head_multiplier`` (``model.head.logit_scale``)
and the mixer's ``attention_in/out_multiplier`` and ``ssm_in/out_multiplier``. The others are plain scalings
of one weight's output, folded into that weight when read (``hf_weights``) and written back as 1:
``key_multiplier`` into k_proj (weight and bias), ``ssm_multipliers`` into in_proj's z, x, B, C and dt rows
(transformers' ``mup_vector``), ``mlp_multipliers`` into gate_proj and down_proj (weights and biases). The
logits are the same to float32 rounding (a product regrouped); a model trained in archlab from such a
checkpoint differs in training only: gradients and μP's per-matrix learning rates see the folded weight,
where Falcon-H1's training scaled a weight of its own size. ``num_logits_to_keep`` (generation) changes no
logits and is not read."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig
from archlab.interop.families.bamba import mamba_tensors
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, bare
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, differences, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import split_head_dim
from archlab.nn.mixers.mamba2 import Mamba2Config
from archlab.nn.mixers.mamba2 import head_dim as mamba_head_dim
from archlab.nn.mixers.parallel import MULTIPLIERS, ParallelConfig, attention_part, ssm_part
from archlab.nn.mlp import d_ff

# FalconH1Config's gated norm flags (mamba_rms_norm, mamba_norm_before_gate) -> Mamba-2's gate_norm
GATE_NORMS = {(True, False): "after", (True, True): "before", (False, False): "none", (False, True): "none"}


def parallel_section(a: ParallelConfig, head_dim: int | None, ssm: dict[str, Any]) -> ParallelConfig:
    """The ``parallel`` section a Falcon-H1 config holds, from ``a``'s attention heads, biases and dropout
    (one attention_bias flag), the attention's ``head_dim`` and the Mamba-2 fields ``ssm``."""
    s = a.attention
    bias = s.qkv_bias
    attention = AttentionConfig(
        n_kv_head=s.n_kv_head, head_dim=head_dim, qkv_bias=bias, out_bias=bias, dropout=s.dropout
    )
    return ParallelConfig(
        n_head=a.n_head, attention=attention, ssm=Mamba2Config(**ssm), **{n: getattr(a, n) for n in MULTIPLIERS}
    )


def held_ssm(m: Mamba2Config, head_dim: int | None) -> dict[str, Any]:
    """The Mamba-2 fields of ``m`` a Falcon-H1 config holds (the dt init range is not among them)."""
    names = ("n_head", "qkv_bias", "out_bias", "state_size", "groups", "conv_kernel", "conv_bias", "scan_chunk")
    names += ("dt_limit_min", "dt_limit_max", "gate_norm")
    return {"head_dim": head_dim, **{n: getattr(m, n) for n in names}}


def fold(state: dict[str, Tensor], name: str, factor: Any) -> None:
    """``state[name]`` (and its bias, if any) times ``factor`` (a number or a per-row tensor), as new tensors."""
    for suffix in ("weight", "bias"):
        key = f"{name}.{suffix}"
        if key in state and not (isinstance(factor, float) and factor == 1.0):
            t = state[key]
            if isinstance(factor, Tensor):
                state[key] = t * (factor.to(t.dtype)[:, None] if t.ndim == 2 else factor.to(t.dtype))
            else:
                state[key] = t * factor


class FalconH1(Family):
    """FalconH1ForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "falcon_h1", "Falcon-H1", "FalconH1ForCausalLM", "FalconH1Config"
    prefix = "model."
    attention_kind = "parallel"
    parts = (
        "GQA attention (RoPE) and Mamba-2 side by side in every layer, SwiGLU MLPs, pre-norm RMSNorm, μP multipliers"
    )
    features = frozenset({"model.embedding_multiplier", "model.head.logit_scale"})
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", ("swiglu",), " (hidden_act, silu, is also its Mamba-2 convolution's)"),
            NO_HEAD_BIAS,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.part_problems``, then each field of the mixer's parts a Falcon-H1 config has no key for
        (one attention_bias flag, no QK-norm, sinks, gates, clipping or score scale; no dt init range)."""
        a = cfg.attention
        want = parallel_section(a, a.attention.head_dim, held_ssm(a.ssm, a.ssm.head_dim))
        want.attention.n_head = a.attention.n_head  # unread: the mixer's n_head is the attention's
        found = super().part_problems(cfg) + Family.full_rotary(cfg)
        for name, value, expected in differences(a, want):
            found.append(
                Problem(
                    f"model.attention.{name}", value, bare(expected), f" ({self.title} has no key for it)", (expected,)
                )
            )
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a, m = cfg.attention, cfg.attention.ssm
        attention, ssm = attention_part(cfg), ssm_part(cfg)
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            num_key_value_heads=a.attention.n_kv_head or a.n_head,
            head_dim=split_head_dim(attention),
            hidden_act="silu",
            attention_bias=a.attention.qkv_bias,
            attention_dropout=a.attention.dropout,
            mlp_bias=cfg.mlp.bias,
            rope_parameters=rope_to_hf(cfg),
            mamba_d_ssm=m.n_head * mamba_head_dim(ssm),
            mamba_n_heads=m.n_head,
            mamba_d_head=mamba_head_dim(ssm),
            mamba_n_groups=m.groups,
            mamba_d_state=m.state_size,
            mamba_d_conv=m.conv_kernel,
            mamba_chunk_size=m.scan_chunk,
            mamba_conv_bias=m.conv_bias,
            mamba_proj_bias=m.qkv_bias,
            projectors_bias=m.out_bias,
            mamba_rms_norm=m.gate_norm != "none",
            mamba_norm_before_gate=m.gate_norm == "before",
            time_step_limit=(m.dt_limit_min, math.inf if m.dt_limit_max is None else m.dt_limit_max),
            embedding_multiplier=cfg.embedding_multiplier,
            lm_head_multiplier=cfg.head.logit_scale,
            key_multiplier=1.0,
            mlp_multipliers=[1.0, 1.0],
            ssm_multipliers=[1.0] * 5,
            **{name: getattr(a, name) for name in MULTIPLIERS},
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU; its Mamba-2 convolution is SiLU'd too)")
        for name in ("embedding_multiplier", "lm_head_multiplier", *MULTIPLIERS):
            value = getattr(c, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                refuse_hf(c, name, "a positive number")
        hd, low, high = config_head_dim(c), *c.time_step_limit
        ssm = dict(
            n_head=c.mamba_n_heads,
            head_dim=c.mamba_d_head,
            qkv_bias=bool(c.mamba_proj_bias),
            out_bias=bool(c.projectors_bias),
            state_size=c.mamba_d_state,
            groups=c.mamba_n_groups,
            conv_kernel=c.mamba_d_conv,
            conv_bias=bool(c.mamba_conv_bias),
            scan_chunk=c.mamba_chunk_size,
            dt_limit_min=float(low),
            dt_limit_max=None if math.isinf(high) else float(high),
            gate_norm=GATE_NORMS[bool(c.mamba_rms_norm), bool(c.mamba_norm_before_gate)],
        )
        multipliers: dict[str, Any] = {name: float(getattr(c, name)) for name in MULTIPLIERS}
        bias, dropout = bool(c.attention_bias), float(c.attention_dropout)
        heads = ParallelConfig(
            attention=AttentionConfig(n_kv_head=c.num_key_value_heads, qkv_bias=bias, dropout=dropout), **multipliers
        )
        attention = parallel_section(heads, None if hd == c.hidden_size // c.num_attention_heads else hd, ssm)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=False, scalings=("default",)),
            attention=attention,
            mlp=mlp_section("swiglu", d_ff=c.intermediate_size, bias=bool(c.mlp_bias)),
            head=HeadConfig(bias=False, logit_scale=float(c.lm_head_multiplier)),
            embedding_multiplier=float(c.embedding_multiplier),
        )
        return self.keys_from_hf(c, cfg)

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """``key_multiplier``, ``ssm_multipliers`` (z, x, B, C, dt rows of in_proj) and ``mlp_multipliers``
        (gate_proj, down_proj) folded into their weights and biases."""
        inner, bc = c.mamba_n_heads * c.mamba_d_head, c.mamba_n_groups * c.mamba_d_state
        rows = torch.tensor(c.ssm_multipliers, dtype=torch.float64).repeat_interleave(
            torch.tensor([inner, inner, bc, bc, c.mamba_n_heads])
        )
        gate, down = (float(m) for m in c.mlp_multipliers)
        state = dict(state)
        for i in range(c.num_hidden_layers):
            h = f"model.layers.{i}"
            fold(state, f"{h}.self_attn.k_proj", float(c.key_multiplier))
            if not bool((rows == 1).all()):
                fold(state, f"{h}.mamba.in_proj", rows)
            fold(state, f"{h}.feed_forward.gate_proj", gate)
            fold(state, f"{h}.feed_forward.down_proj", down)
        return state

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, attention = Tensors(cfg), Tensors(attention_part(cfg))
        t.add("tok_emb", "model.embed_tokens")
        bias = cfg.attention.attention.qkv_bias
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.add(f"{b}.mlp_norm", f"{h}.pre_ff_layernorm")
            attention.qkv(f"{b}.attn.attention.qkv", f"{h}.self_attn", bias)
            attention.add(f"{b}.attn.attention.proj", f"{h}.self_attn.o_proj", bias)
            mamba_tensors(t, ssm_part(cfg), f"{b}.attn.ssm", f"{h}.mamba")
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.feed_forward", cfg.mlp.bias)
            t.add(f"{b}.mlp.down", f"{h}.feed_forward.down_proj", cfg.mlp.bias)
        t.add("final_norm", "model.final_layernorm")
        return attention.maps + t.head()


RECORDS: tuple[Family, ...] = (FalconH1(),)
